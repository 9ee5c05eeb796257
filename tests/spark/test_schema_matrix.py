"""Column types and nullability against native ``session_window``, static and streaming.

Static: six cells, each one small DataFrame, together covering string, int, long, date and
multi-column keys, timestamp and timestamp_ntz time columns, and nullable and non-nullable key,
time and value columns, with int, long, double and decimal values holding nulls (and a
non-nullable value). Each cell runs on both engines, the Arrow one on its row path (decimals take
it) and on its columnar path (count, sum, min, max over int, long and double).

Streaming: a representative cell (a file source makes every column nullable, so a literal key
column and a coalesced value are the non-nullable ones; a stream's watermark needs a timestamp),
on both engines, batch by batch.
"""

from __future__ import annotations

import datetime as dt
import decimal
import random
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark_adapter import sessionize
from tests.spark.streams import run_json_stream

EPOCH = dt.datetime(2024, 1, 1)
GAP = "10 seconds"
VALUES = ["i", "l", "d", "dec", "nn"]  # nn: never null, declared non-nullable
COLUMNAR = ["i", "l", "d", "nn"]
KEY_TYPES: dict[str, T.DataType] = {"string": T.StringType(), "int": T.IntegerType(),
                                    "long": T.LongType(), "date": T.DateType()}
# (key columns as (kind, nullable), time type, time nullable)
CELLS = [
    ([("string", True)], T.TimestampType(), True),
    ([("string", False)], T.TimestampNTZType(), True),
    ([("int", False)], T.TimestampType(), False),
    ([("long", True)], T.TimestampNTZType(), False),
    ([("date", True)], T.TimestampType(), True),
    ([("string", False), ("int", True)], T.TimestampNTZType(), True),
]


def key_value(kind: str, k: int) -> Any:
    return {"string": f"k{k}", "int": k - 1, "long": 2**40 + k,
            "date": dt.date(2023, 12, 30) + dt.timedelta(days=k)}[kind]


def cell_frame(spark: Any, keys: list[tuple[str, bool]], time_type: T.DataType,
               time_nullable: bool) -> Any:
    rng = random.Random(len(keys) * 10 + int(time_nullable))
    fields = [T.StructField(f"k{j}", KEY_TYPES[kind], nullable)
              for j, (kind, nullable) in enumerate(keys)]
    fields += [T.StructField("ts", time_type, time_nullable),
               T.StructField("i", T.IntegerType()), T.StructField("l", T.LongType()),
               T.StructField("d", T.DoubleType()), T.StructField("dec", T.DecimalType(12, 3)),
               T.StructField("nn", T.LongType(), nullable=False)]

    def maybe(value: Any) -> Any:
        return None if rng.random() < 0.3 else value

    rows = []
    for k in range(3):
        clock = 0.0
        for _ in range(7):
            clock += rng.choice([1, 4, 10, 10.000001, 30])
            rows.append((*[key_value(kind, (k + j) % 3) for j, (kind, _) in enumerate(keys)],
                         EPOCH + dt.timedelta(seconds=clock),
                         maybe(rng.randrange(-50, 50)), maybe(rng.randrange(-2**40, 2**40)),
                         maybe(rng.randrange(-400, 400) / 4),
                         maybe(decimal.Decimal(rng.randrange(-10**6, 10**6)) / 1000),
                         rng.randrange(100)))
        # a session of nulls only
        rows.append((*[key_value(kind, (k + j) % 3) for j, (kind, _) in enumerate(keys)],
                     EPOCH + dt.timedelta(hours=1), None, None, None, None, 0))
    if time_nullable:
        rows.append((*[key_value(kind, 0) for kind, _ in keys], None, 1, 1, 1.0,
                     decimal.Decimal(1), 1))  # dropped, as native drops a null time
    frame = spark.createDataFrame(rows, T.StructType(fields))
    assert [f.nullable for f in frame.schema.fields] == [f.nullable for f in fields]
    return frame


def our_aggs(columns: list[str]) -> dict[str, Any]:
    aggs: dict[str, Any] = {"n": "count"}
    for c in columns:
        aggs[f"sum_{c}"], aggs[f"min_{c}"], aggs[f"max_{c}"] = ("sum", c), ("min", c), ("max", c)
    return aggs


def native_rows(df: Any, keys: list[str], columns: list[str]) -> list[tuple]:
    aggs = [F.count("*").alias("n")]
    for c in columns:
        aggs += [F.sum(c).alias(f"sum_{c}"), F.min(c).alias(f"min_{c}"),
                 F.max(c).alias(f"max_{c}")]
    out = df.groupBy(*keys, F.session_window("ts", GAP).alias("w")).agg(*aggs) \
        .select(*keys, "w.start", "w.end", *[a for a in our_aggs(columns)])
    return sorted(tuple(r) for r in out.collect())


@pytest.mark.parametrize("cell", range(len(CELLS)))
def test_static_cell_equals_native_on_both_engines(spark, cell):
    keys, time_type, time_nullable = CELLS[cell]
    df = cell_frame(spark, keys, time_type, time_nullable)
    names = [f"k{j}" for j in range(len(keys))]
    expected = native_rows(df, names, VALUES)
    assert len(expected) > 6 and any(r[len(names) + 3] is None for r in expected)
    runs = [("arrow", VALUES), ("processor", VALUES), ("arrow", COLUMNAR)]
    for engine, columns in runs:
        out = sessionize(df, key=names, timestamp="ts", gap=GAP, aggregations=our_aggs(columns),
                         engine=engine)
        want = expected if columns == VALUES else native_rows(df, names, columns)
        assert [f.dataType for f in out.schema.fields][:len(names) + 2] == \
            [*[f.dataType for f in df.schema.fields[:len(names)]], time_type, time_type]
        assert sorted(tuple(r) for r in out.collect()) == want, (engine, columns)


STREAM_SCHEMA = "user string, ts timestamp, i int, l long, d double, dec decimal(12,3)"
STREAM_BATCHES: list[list[tuple[Any, ...]]] = [
    [("a", 0, 1, None, 0.5, "1.250"), ("a", 4, None, 2**40, None, None), ("b", 2, 3, 5, -1.0,
                                                                           "-3.000")],
    [("a", 9, -2, 7, 2.25, None), ("b", 40, None, None, None, None), ("c", 41, 8, 9, 0.0,
                                                                        "0.001")],
    [("z", 200, 1, 1, 1.0, "1.000")],
    [],
]


def stream_as_json(row: tuple[Any, ...]) -> dict[str, Any]:
    return {"user": row[0], "ts": (EPOCH + dt.timedelta(seconds=row[1])).isoformat(),
            "i": row[2], "l": row[3], "d": row[4], "dec": row[5]}


def stream_prepared(stream: Any) -> Any:
    """A multi-column key (string, date, a non-nullable int literal) and a non-nullable value."""
    return (stream.withColumn("day", F.to_date("ts")).withColumn("src", F.lit(7))
            .withColumn("nn", F.coalesce(F.col("l"), F.lit(0))))


@pytest.fixture(scope="module")
def native_stream(spark: Any, tmp_path_factory: Any) -> dict[int, list[tuple]]:
    def build(stream: Any) -> Any:
        frame = stream_prepared(stream).withWatermark("ts", "5 seconds")
        aggs = [F.count("*").alias("n")]
        for c in VALUES:
            aggs += [F.sum(c).alias(f"sum_{c}"), F.min(c).alias(f"min_{c}"),
                     F.max(c).alias(f"max_{c}")]
        return frame.groupBy("user", "day", "src", F.session_window("ts", GAP).alias("w")) \
            .agg(*aggs).select("user", "day", "src", "w.start", "w.end", *our_aggs(VALUES))
    return run_json_stream(spark, tmp_path_factory.mktemp("native"), STREAM_SCHEMA,
                           STREAM_BATCHES, stream_as_json, build)[0]


@pytest.mark.parametrize("engine", ["arrow", "processor"])
def test_streaming_cell_equals_native_batch_by_batch(spark, tmp_path: Path, native_stream,
                                                     engine):
    def build(stream: Any) -> Any:
        return sessionize(stream_prepared(stream), key=["user", "day", "src"], timestamp="ts",
                          gap=GAP, watermark_delay="5 seconds", aggregations=our_aggs(VALUES),
                          engine=engine, state_location=str(tmp_path / "state"),
                          local_dir=str(tmp_path / "local"))

    got = run_json_stream(spark, tmp_path, STREAM_SCHEMA, STREAM_BATCHES, stream_as_json,
                          build)[0]
    assert got == native_stream
    sessions = {r[0]: r for rows in got.values() for r in rows}
    assert sessions["a"][5] == 3 and sessions["a"][6] == -1  # count, sum of i over a null
