"""Parity with Spark's native session_window, on the same rows in the same SparkSession.

Streaming: both engines and native run the same micro-batches and are compared batch by batch,
so a session closes in exactly the micro-batch native closes it (no later, no earlier).
"""

from __future__ import annotations

import datetime as dt
import decimal
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F

from spark_adapter import query_state_location, read_state_metrics, sessionize
from tests.spark.streams import run_json_stream

EPOCH = dt.datetime(2024, 1, 1)
SCHEMA = "user string, ts timestamp, amount long"
GAP, DELAY = "10 seconds", "5 seconds"


def at(seconds: float, micros: int = 0) -> str | None:
    return (EPOCH + dt.timedelta(seconds=seconds, microseconds=micros)).isoformat()


# (user, time, amount); W is Spark's watermark entering each batch
BATCHES: list[list[tuple[str, str | None, int]]] = [
    # W = 0 (Spark's start)
    [("a", at(0), 1), ("a", at(100), 2), ("b", at(3), 3),
     # microseconds: 10.000001 s apart is two sessions with a 10 s gap, 10 s exactly is one
     ("m", at(20), 1), ("m", at(30, 1), 1), ("e", at(40), 1), ("e", at(50), 1)],
    # W = 95 s: 91 s ends at 101 > W (native keeps it); 84.999999 s ends at 94.999999 <= W (late);
    # 85 s ends at exactly 95 = W (late, as native: window end <= watermark)
    [("a", at(91), 4), ("c", at(84, 999_999), 5), ("c", at(85), 6), ("n", None, 7),
     ("d", at(200), 8)],
    # W = 195 s: closes a's and the microsecond sessions, also in partitions without rows here
    [("d", at(205, 500), 9), ("z", at(300), 1)],
    [],  # no new file: W = 295 s, Spark's no-data batch must close d's session as native's does
]


def run_stream(spark: Any, root: Path, build: Any) -> tuple[dict[int, list[tuple]], str]:
    """Each micro-batch's rows (batches without rows left out), and the query's id."""
    return run_json_stream(spark, root, SCHEMA, BATCHES,
                           lambda r: {"user": r[0], "ts": r[1], "amount": r[2]}, build)


def native(stream: Any) -> Any:
    return (stream.withWatermark("ts", DELAY)
            .groupBy("user", F.session_window("ts", GAP).alias("w"))
            .agg(F.count("*").alias("n"), F.sum("amount").alias("total"))
            .select("user", "w.start", "w.end", "n", "total"))


@pytest.fixture(scope="module")
def native_batches(spark, tmp_path_factory) -> dict[int, list[tuple]]:
    return run_stream(spark, tmp_path_factory.mktemp("native"), native)[0]


@pytest.mark.parametrize("engine", ["arrow", "processor"])
def test_streaming_equals_native_batch_by_batch(spark, tmp_path, native_batches, engine):
    state = tmp_path / "state"

    def build(stream: Any) -> Any:
        return sessionize(stream, key="user", timestamp="ts", gap=GAP, watermark_delay=DELAY,
                          aggregations={"n": "count", "total": ("sum", "amount")},
                          state_location=str(state), local_dir=str(tmp_path / "local"),
                          engine=engine)

    ours, query_id = run_stream(spark, tmp_path, build)
    assert ours == native_batches
    sessions = {(r[0], r[1]): r for rows in ours.values() for r in rows}
    # the late-row rule: 91 s joined a's session; 84.999999 s and 85 s were late
    assert sessions["a", EPOCH + dt.timedelta(seconds=91)][2:4] == \
        (EPOCH + dt.timedelta(seconds=110), 2)
    assert not any(user == "c" for user, _ in sessions)
    # microseconds kept in bounds and in the gap test
    assert sessions["m", EPOCH + dt.timedelta(seconds=30, microseconds=1)][3] == 1
    assert sessions["e", EPOCH + dt.timedelta(seconds=40)][2] == EPOCH + dt.timedelta(seconds=60)
    assert sessions["d", EPOCH + dt.timedelta(seconds=200)][2] == \
        EPOCH + dt.timedelta(seconds=215, microseconds=500)
    # d's session closes in the no-data batch that follows the last file, as native's does
    assert [r[0] for r in ours[max(ours)]] == ["d"] and max(ours) == max(native_batches)
    totals = read_state_metrics(query_state_location(str(state), query_id))
    assert totals["null_times_dropped"] == 1
    if engine == "arrow":
        assert totals["dropped_records"] == 2


def test_static_microseconds_equal_native(spark):
    rows = [("m", EPOCH, 1), ("m", EPOCH + dt.timedelta(seconds=10, microseconds=1), 2),
            ("m", EPOCH + dt.timedelta(seconds=20, microseconds=1), 3),
            ("p", EPOCH + dt.timedelta(microseconds=7), 4),
            ("p", EPOCH + dt.timedelta(microseconds=9), 5)]
    df = spark.createDataFrame(rows, SCHEMA)
    gap = dt.timedelta(seconds=10)
    ours = sorted(tuple(r) for r in sessionize(
        df, key="user", timestamp="ts", gap=gap, aggregations={"n": "count"}).collect())
    theirs = sorted(tuple(r) for r in df.groupBy("user", F.session_window("ts", "10 seconds")
                                                  .alias("w")).count()
                    .select("user", "w.start", "w.end", "count").collect())
    assert ours == theirs
    assert [r[3] for r in ours] == [1, 2, 2]
    tiny = sorted(tuple(r) for r in sessionize(
        df, key="user", timestamp="ts", gap="2 microseconds", aggregations={"n": "count"})
        .collect())
    assert [(r[1].microsecond, r[2].microsecond, r[3]) for r in tiny if r[0] == "p"] == \
        [(7, 11, 2)]


TYPED_SCHEMA = ("k string, ts timestamp, b byte, s short, i int, l long, f float, d double, "
                "dec decimal(10,2), str string, bin binary, flag boolean, day date, "
                "t2 timestamp, ntz timestamp_ntz")
NUMERIC = ["b", "s", "i", "l", "f", "d", "dec"]
ORDERED = [*NUMERIC, "str", "bin", "flag", "day", "t2", "ntz"]


def typed_rows() -> list[tuple]:
    rows = []
    for j in range(12):
        k = f"k{j % 3}"
        second = (j * 7) % 40  # three keys, sessions split by the 10 s gap
        rows.append((k, EPOCH + dt.timedelta(seconds=second, microseconds=j), j - 5, 300 * j,
                     -70_000 * j, 2**40 + j, j * 0.5, -j * 0.25,
                     decimal.Decimal(j * 101) / 100, f"v{j:02d}", bytes([j, 255 - j]),
                     j % 2 == 0, dt.date(2020, 1, 1) + dt.timedelta(days=j * 40),
                     EPOCH - dt.timedelta(days=j, microseconds=j),
                     dt.datetime(1999, 12, 31, 23, 59, 59, 999_999) + dt.timedelta(hours=j)))
    rows.append(("k0", EPOCH + dt.timedelta(seconds=1), None, None, None, None, None, None,
                 None, None, None, None, None, None, None))  # nulls: skipped by sum/min/max
    return rows


def test_every_accepted_type_in_every_aggregation_equals_native(spark):
    df = spark.createDataFrame(typed_rows(), TYPED_SCHEMA)
    aggs: dict[str, Any] = {"n": "count"}
    native_aggs = [F.count("*")]
    for c in NUMERIC:
        aggs[f"sum_{c}"] = ("sum", c)
        native_aggs.append(F.sum(c))
    for c in ORDERED:
        aggs[f"min_{c}"], aggs[f"max_{c}"] = ("min", c), ("max", c)
        native_aggs += [F.min(c), F.max(c)]
    out = sessionize(df, key="k", timestamp="ts", gap="10 seconds", aggregations=aggs)
    expected = df.groupBy("k", F.session_window("ts", "10 seconds").alias("w")) \
        .agg(*[a.alias(f"c{i}") for i, a in enumerate(native_aggs)]) \
        .select("k", "w.start", "w.end", *[f"c{i}" for i in range(len(native_aggs))])
    assert [f.dataType for f in out.schema.fields[3:]] == \
        [f.dataType for f in expected.schema.fields[3:]]
    assert sorted(tuple(r) for r in out.collect()) == sorted(tuple(r) for r in expected.collect())


def test_first_last_collect_keep_types_and_time_order(spark):
    rows = typed_rows()
    df = spark.createDataFrame(rows, TYPED_SCHEMA)
    aggs: dict[str, Any] = {}
    for c in ORDERED:
        aggs[f"first_{c}"], aggs[f"last_{c}"] = ("first", c), ("last", c)
        aggs[f"all_{c}"] = ("collect", c)
    out = sessionize(df, key="k", timestamp="ts", gap="10 seconds", aggregations=aggs)
    # an independent oracle: sessions by sorting each key's rows and splitting at gaps > 10 s
    names = df.columns
    expected = set()
    by_key: dict[str, list[dict]] = {}
    for row in rows:
        by_key.setdefault(row[0], []).append(dict(zip(names, row, strict=True)))
    for k, items in by_key.items():
        items.sort(key=lambda r: r["ts"])
        groups = [[items[0]]]
        for item in items[1:]:
            if item["ts"] - groups[-1][-1]["ts"] <= dt.timedelta(seconds=10):
                groups[-1].append(item)
            else:
                groups.append([item])
        for group in groups:
            values = []
            for c in ORDERED:
                present = [r[c] for r in group if r[c] is not None]
                values += [group[0][c], group[-1][c], tuple(present)]
            expected.add((k, group[0]["ts"], group[-1]["ts"] + dt.timedelta(seconds=10),
                          *values))
    got = {tuple(_hashable(v) for v in r) for r in out.collect()}
    assert got == expected
    field_types = {f.name: f.dataType.simpleString() for f in out.schema.fields}
    assert field_types["first_day"] == "date" and field_types["all_dec"] == "array<decimal(10,2)>"
    assert field_types["last_ntz"] == "timestamp_ntz"


def _hashable(value: Any) -> Any:
    """A collected value as the oracle holds it: lists as tuples, and binary as bytes (PySpark
    3.5 returns bytearray, 4.x bytes)."""
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    return bytes(value) if isinstance(value, bytearray) else value


@pytest.mark.parametrize(
    ("schema", "aggs", "match"),
    [
        ("k string, ts timestamp, v string", {"x": ("sum", "v")},
         "sum cannot run over column 'v' of type string"),
        ("k string, ts timestamp, v array<int>", {"x": ("min", "v")},
         "min cannot run over column 'v' of type array<int>"),
        ("k string, ts timestamp, v struct<a:int>", {"x": ("first", "v")},
         "first cannot run over column 'v' of type struct<a:int>"),
        ("k string, ts timestamp, v map<string,int>", {"x": ("collect", "v")},
         "collect cannot run over column 'v' of type map<string,int>"),
        ("k array<int>, ts timestamp, v int", {"x": "count"},
         "key column 'k' has type array<int>"),
    ],
)
def test_unusable_types_are_refused_on_the_driver(spark, schema, aggs, match):
    df = spark.createDataFrame([], schema)
    with pytest.raises(ValueError, match=match.replace("(", r"\(").replace(")", r"\)")):
        sessionize(df, key="k", timestamp="ts", gap="1 second", aggregations=aggs)


NUMBERS_SCHEMA = "user string, ts timestamp, i int, d double"
# (user, seconds, i, d): sessions span micro-batches, so the columnar path's stored accumulators
# (values and counts of present rows) are read back; "n" has only nulls in i and d
NUMBER_BATCHES: list[list[tuple[str, float, int | None, float | None]]] = [
    [("a", 0, 5, 1.5), ("a", 4, None, -2.25), ("n", 1, None, None), ("b", 2, -7, None)],
    [("a", 9, 3, None), ("n", 8, None, None), ("b", 30, 2, 0.5), ("c", 31, None, 4.0)],
    [("z", 200, 1, 1.0)],
    [],
]


@pytest.mark.parametrize("engine", ["arrow", "processor"])
def test_streaming_sum_min_max_with_nulls_equal_native(spark, tmp_path, engine):
    """The streaming columnar path (count, and sum/min/max over int and double columns with
    nulls; engine="arrow") gives native's rows in native's micro-batches, and so does the row
    path (engine="processor", Spark >= 4)."""
    def as_json(row: tuple[Any, ...]) -> dict[str, Any]:
        return {"user": row[0], "ts": at(row[1]), "i": row[2], "d": row[3]}

    def run(name: str, build: Any) -> dict[int, list[tuple]]:
        return run_json_stream(spark, tmp_path / name, NUMBERS_SCHEMA, NUMBER_BATCHES, as_json,
                               build)[0]

    def ours(engine: str) -> Any:
        def build(stream: Any) -> Any:
            return sessionize(
                stream, key="user", timestamp="ts", gap=GAP, watermark_delay=DELAY,
                aggregations={"n": "count", "si": ("sum", "i"), "sd": ("sum", "d"),
                              "lo": ("min", "i"), "hi": ("max", "d")},
                state_location=str(tmp_path / engine / "state"),
                local_dir=str(tmp_path / engine / "local"), engine=engine)
        return build

    expected = run("native", lambda stream: (
        stream.withWatermark("ts", DELAY)
        .groupBy("user", F.session_window("ts", GAP).alias("w"))
        .agg(F.count("*"), F.sum("i"), F.sum("d"), F.min("i"), F.max("d"))
        .select("user", "w.start", "w.end", *[f"`{c}`" for c in (
            "count(1)", "sum(i)", "sum(d)", "min(i)", "max(d)")])))
    got = run(engine, ours(engine))
    assert got == expected
    sessions = {r[0]: r for rows in got.values() for r in rows}
    assert sessions["n"][3:] == (2, None, None, None, None)
    assert sessions["a"][3:] == (3, 8, -0.75, 3, 1.5)
