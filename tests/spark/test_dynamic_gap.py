"""Per-row gaps (SPARK-36465) and a maximum session duration in ``sessionize``.

Dynamic gaps are compared with Spark's native ``session_window(ts, gapExpr)`` on the same rows,
static and streaming (micro-batch by micro-batch), on both engines. Native has no maximum
duration, so that is compared with the offline rule written out here.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F

from sessionstore import AfterWatermark
from spark_adapter import query_state_location, read_state_metrics, sessionize
from spark_adapter.sessionize import GAP_COLUMN, _dynamic_gap
from tests.spark.streams import run_json_stream

EPOCH = dt.datetime(2024, 1, 1)
SCHEMA = "user string, ts timestamp, dur string, kind string, amount long"
ENGINES = ["arrow", "processor"]
SECOND = 1_000_000  # us


def at(seconds: float, micros: int = 0) -> dt.datetime:
    return EPOCH + dt.timedelta(seconds=seconds, microseconds=micros)


def sorted_rows(frame: Any) -> list[tuple]:
    return sorted(tuple(r) for r in frame.collect())


@pytest.mark.parametrize("engine", ENGINES)
def test_static_per_row_gap_needs_no_max_gap(spark, engine):
    """A static query retains nothing, so, as native, a per-row gap needs no bound: gaps of
    seconds and of a thousand years alike."""
    rows = [("a", at(0), "5 seconds", "x", 1), ("a", at(4), "1000 days", "x", 2),
            ("a", at(86_400 * 900), "1 second", "x", 3), ("b", at(0), "1000 years", "x", 4),
            ("b", at(10), None, "x", 5)]
    df = spark.createDataFrame(rows, SCHEMA)
    got = sorted_rows(sessionize(df, key="user", timestamp="ts", gap=F.col("dur"),
                                 aggregations={"n": "count", "s": ("sum", "amount")},
                                 engine=engine))
    expected = sorted_rows(df.groupBy("user", F.session_window("ts", F.col("dur")).alias("w"))
                           .agg(F.count("*"), F.sum("amount"))
                           .select("user", "w.start", "w.end", "count(1)", "sum(amount)"))
    assert got == expected
    assert [r[3:] for r in got] == [(3, 6), (1, 4)]


# -- the per-row gap itself ----------------------------------------------------------------------

GAP_ROWS = [  # (user, wall-clock time in the session zone, gap expression value)
    ("dst", "2024-03-10 01:30:00", "1 hour"),  # across New York's spring-forward
    ("day", "2024-03-09 12:00:00", "1 day"),  # a calendar day: 23 h there, 24 h without zone
    ("month", "2024-01-31 00:00:00", "1 month"),  # to Feb 29: a calendar month
    ("mixed", "2024-01-01 00:00:00", "1 day -1 hour"),
    ("micro", "2024-01-01 00:00:00", "250 microseconds"),
    ("neg", "2024-01-01 00:00:00", "-5 seconds"), ("zero", "2024-01-01 00:00:00", "0 s"),
    ("net", "2024-01-01 00:00:00", "1 month -40 days"), ("null", "2024-01-01 00:00:00", None),
    ("junk", "2024-01-01 00:00:00", "soon"),
]


def test_per_row_gap_is_native_window_length(spark):
    """The hidden gap column is, row by row, the length of native's session window (both time
    types, calendar units in a DST zone), and null or <= 0 exactly where native drops the row."""
    previous = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "America/New_York")
    try:
        text = spark.createDataFrame(GAP_ROWS, "user string, ts string, dur string")
        base = text.withColumn("ts", F.col("ts").cast("timestamp"))
        for frame in (base, text.withColumn("ts", F.col("ts").cast("timestamp_ntz"))):
            with_gap = _dynamic_gap(frame, F.col("dur"), "ts")
            assert with_gap is not None
            ours = {r.user: r[GAP_COLUMN] for r in with_gap[0].collect()}
            ntz = frame is not base
            # the window's length in Spark's own micros (timestampdiff would count wall-clock
            # time in the session zone for a timestamp; a timestamp_ntz has no zone)
            length = F.expr("timestampdiff(MICROSECOND, w.start, w.end)") if ntz else \
                F.unix_micros("w.end") - F.unix_micros("w.start")
            native = {r.user: r.g for r in frame.groupBy(
                "user", F.session_window("ts", F.col("dur")).alias("w")).count()
                .select("user", length.alias("g")).collect()}
            kept = {user: gap for user, gap in ours.items() if gap is not None and gap > 0}
            assert kept == native
            assert set(ours) - set(kept) == {"neg", "zero", "net", "null", "junk"}
            assert native["day"] == (24 if ntz else 23) * 3600 * SECOND
            assert native["micro"] == 250
            assert native["month"] == 29 * 86400 * SECOND
    finally:
        spark.conf.set("spark.sql.session.timeZone", previous)


def test_gap_arguments_are_checked_on_the_driver(spark, tmp_path):
    df = spark.createDataFrame([], SCHEMA)
    kw: dict[str, Any] = {"key": "user", "timestamp": "ts", "aggregations": {"n": "count"}}
    stream = spark.readStream.schema(SCHEMA).json(str(tmp_path))
    with pytest.raises(ValueError, match="is per row: give max_gap="):
        sessionize(stream, gap=F.col("dur"), watermark_delay="1 second",
                   state_location=str(tmp_path / "state"), **kw)
    with pytest.raises(ValueError, match="max_gap bounds a per-row gap"):
        sessionize(df, gap="10 seconds", max_gap="1 minute", **kw)
    with pytest.raises(ValueError, match="has type bigint; a per-row gap must be a duration"):
        sessionize(df, gap=F.col("amount"), max_gap="1 minute", **kw)
    with pytest.raises(ValueError, match="does not resolve against the DataFrame"):
        sessionize(df, gap=F.col("nope"), max_gap="1 minute", **kw)
    with pytest.raises(ValueError, match="neither a duration"):
        sessionize(df, gap="10 secnds (", max_gap="1 minute", **kw)
    with pytest.raises(ValueError, match="max_duration must be > 0"):
        sessionize(df, gap="10 seconds", max_duration=0, **kw)
    with pytest.raises(ValueError, match="engine refuses these settings: max_duration_ms does "
                                         "not combine with trigger="):
        sessionize(df, gap="10 seconds", max_duration="1 minute", trigger=AfterWatermark(), **kw)
    with pytest.raises(TypeError, match="gap must be milliseconds"):
        sessionize(df, gap=1.5, **kw)  # type: ignore[arg-type]


# -- static: sessions against native ------------------------------------------------------------

def static_rows() -> list[tuple]:
    rows = [
        # a: gap 5 s then 20 s: one session [0, 24) then a new one at 30
        ("a", at(0), "5 seconds", "x", 1), ("a", at(4), "20 seconds", "y", 2),
        ("a", at(24), "1 second", "x", 3),  # exactly at the end: joins (inclusive gap)
        ("a", at(30), "5 seconds", "x", 4),
        # b: every row's gap is invalid, except one
        ("b", at(0), None, "x", 1), ("b", at(1), "0 seconds", "x", 2),
        ("b", at(2), "-5 seconds", "x", 3), ("b", at(3), "soon", "x", 4),
        ("b", at(4), "3 seconds", "x", 5),
        # c: a long gap early keeps a later short-gap row in the session
        ("c", at(10), "50 seconds", "y", 1), ("c", at(40), "1 second", "x", 2),
        ("c", at(59, 999_999), "250 microseconds", "x", 3),
        ("c", at(60, 250), "1 second", "x", 4),  # just past 60.000249: a new session
        ("d", at(0), "1 minute", "y", 7),
    ]
    return rows


@pytest.mark.parametrize("engine", ENGINES)
def test_static_dynamic_gaps_equal_native(spark, engine):
    df = spark.createDataFrame(static_rows(), SCHEMA)
    when = F.when(F.col("kind") == "x", "5 seconds").otherwise(F.col("dur"))
    sql = "CASE WHEN kind = 'x' THEN '5 seconds' ELSE dur END"
    aggs = {"n": "count", "total": ("sum", "amount")}
    # the SQL string is the same query as F.when for the engine: run it on one engine only
    forms = [F.col("dur"), when] + ([sql] if engine == "arrow" else [])
    results = {}
    for gap in forms:
        ours = sorted_rows(sessionize(df, key="user", timestamp="ts", gap=gap,
                                      max_gap="1 minute", aggregations=aggs, engine=engine))
        native_gap = F.expr(gap) if isinstance(gap, str) else gap
        native = sorted_rows(df.groupBy("user", F.session_window("ts", native_gap).alias("w"))
                             .agg(F.count("*"), F.sum("amount"))
                             .select("user", "w.start", "w.end", "count(1)", "sum(amount)"))
        assert ours == native, gap
        results[str(gap)] = ours
    # the column case, spelled out
    ours = results[str(F.col("dur"))]
    assert [r[1:] for r in ours if r[0] == "a"] == [(at(0), at(25), 3, 6), (at(30), at(35), 1, 4)]
    assert [r[1:] for r in ours if r[0] == "b"] == [(at(4), at(7), 1, 5)]
    assert [r[1:3] for r in ours if r[0] == "c"] == [(at(10), at(60, 249)),
                                                    (at(60, 250), at(61, 250))]
    assert results[str(when)] != ours  # the forms differ, so each comparison means something


@pytest.mark.parametrize("engine", ENGINES)
def test_gap_over_max_gap_fails_naming_the_column(spark, engine):
    df = spark.createDataFrame([("a", at(0), "5 seconds", "x", 1),
                                ("b", at(3), "2 minutes", "x", 2)], SCHEMA)
    out = sessionize(df, key="user", timestamp="ts", gap=F.col("dur"), max_gap="1 minute",
                     aggregations={"n": "count"}, engine=engine)
    with pytest.raises(Exception) as failure:
        out.collect()
    text = str(failure.value)
    assert "gap Column<'dur'> is 120000000 us for the row with key 'b'" in text, engine
    assert "over max_gap=60000000 us" in text


# -- max_duration: the offline rule ---------------------------------------------------------------

def offline(rows: list[tuple[str, int, int | None, int]], max_duration: int | None,
            inclusive: bool = True) -> list[tuple[str, int, int, int, int]]:
    """Sessions by the contract's offline rule: (key, start, end, count, sum), times in us.

    Per key, rows in time order (ties by arrival); rows with a null or non-positive gap are
    dropped; a row joins the open session iff it is gap-connected to it (``t <= end``, or
    ``t < end`` without ``inclusive``, ``end`` the largest ``t + gap`` so far) and
    ``t < start + max_duration``; the end is ``min(largest t + gap, start + max_duration)``.
    """
    by_key: dict[str, list[tuple[int, int, int]]] = {}
    for key, t, gap, amount in rows:
        if gap is not None and gap > 0:
            by_key.setdefault(key, []).append((t, gap, amount))
    out = []
    for key, items in by_key.items():
        items.sort(key=lambda item: item[0])  # stable: ties keep arrival order
        sessions: list[list[int]] = []  # [start, largest t + gap, count, sum]
        for t, gap, amount in items:
            if sessions:
                last = sessions[-1]
                connected = t <= last[1] if inclusive else t < last[1]
                if connected and (max_duration is None or t < last[0] + max_duration):
                    last[1] = max(last[1], t + gap)
                    last[2] += 1
                    last[3] += amount
                    continue
            sessions.append([t, t + gap, 1, amount])
        for start, end, count, total in sessions:
            if max_duration is not None:
                end = min(end, start + max_duration)
            out.append((key, start, end, count, total))
    return sorted(out)


def test_offline_rule_on_the_contract_example():
    """The oracle itself, on a hand-checked case: a gap of 10, max_duration 25."""
    rows = [("k", t, 10, 1) for t in (0, 8, 16, 24, 26, 34)]
    # 26 is within the gap of 24 but at or past 0 + 25: it starts a new session
    assert offline(rows, 25) == [("k", 0, 25, 4, 4), ("k", 26, 44, 2, 2)]
    assert offline(rows, None) == [("k", 0, 44, 6, 6)]
    assert offline([("k", 0, 10, 1), ("k", 25, 10, 1)], 25) == \
        [("k", 0, 10, 1, 1), ("k", 25, 35, 1, 1)]
    assert offline([("k", 0, 10, 1), ("k", 10, 10, 1)], 30, inclusive=False) == \
        [("k", 0, 10, 1, 1), ("k", 10, 20, 1, 1)]


# -- streaming: against native, micro-batch by micro-batch ----------------------------------------

DELAY = "5 seconds"
Row = tuple[str, dt.datetime, str | None, str, int]
# W is Spark's watermark entering each batch (the largest event time before it, minus 5 s)
STREAM: list[list[Row]] = [
    # W = 0
    [("a", at(0), "5 seconds", "x", 1), ("a", at(4), "20 seconds", "x", 2),
     ("b", at(0), None, "x", 1), ("b", at(1), "0 seconds", "x", 1),
     ("b", at(2), "-5 seconds", "x", 1), ("b", at(3), "soon", "x", 1),
     ("c", at(10), "50 seconds", "x", 3), ("d", at(100), "10 seconds", "x", 4)],
    # W = 95 s: e at 80 s with a 20 s gap ends at 100 > W (not late, though 80 < W);
    # f at 80 s + 10 s ends at 90 <= W and g at 85 s + 10 s at exactly 95 = W: both late
    [("e", at(80), "20 seconds", "x", 5), ("f", at(80), "10 seconds", "x", 6),
     ("g", at(85), "10 seconds", "x", 7), ("d", at(104), "3 seconds", "x", 8),
     ("z", at(200), "1 second", "x", 9)],
    # W = 195 s: closes a, c, d, e, also in partitions without rows in this batch
    [("z", at(200, 500), "40 seconds", "x", 10), ("y", at(300), "2 seconds", "x", 11)],
    [],  # no new file: W = 295 s, the no-data batch closes z's session as native's does
]


def run_stream(spark: Any, root: Path, batches: list[list[Row]],
               build: Callable[[Any], Any]) -> tuple[dict[int, list[tuple]], str]:
    """Each micro-batch's output rows (batches without any left out), and the query's id."""
    return run_json_stream(
        spark, root, SCHEMA, batches,
        lambda r: {"user": r[0], "ts": r[1].isoformat(), "dur": r[2], "kind": r[3],
                   "amount": r[4]}, build)


@pytest.fixture(scope="module")
def native_stream(spark, tmp_path_factory) -> dict[int, list[tuple]]:
    def native(stream: Any) -> Any:
        return (stream.withWatermark("ts", DELAY)
                .groupBy("user", F.session_window("ts", F.col("dur")).alias("w"))
                .agg(F.count("*").alias("n"), F.sum("amount").alias("total"))
                .select("user", "w.start", "w.end", "n", "total"))

    return run_stream(spark, tmp_path_factory.mktemp("native"), STREAM, native)[0]


@pytest.mark.parametrize("engine", ENGINES)
def test_streaming_dynamic_gaps_equal_native_batch_by_batch(spark, tmp_path, native_stream,
                                                            engine):
    state = tmp_path / "state"

    def build(stream: Any) -> Any:
        return sessionize(stream, key="user", timestamp="ts", gap=F.col("dur"),
                          max_gap="1 minute", watermark_delay=DELAY,
                          aggregations={"n": "count", "total": ("sum", "amount")},
                          state_location=str(state), local_dir=str(tmp_path / "local"),
                          engine=engine)

    ours, query_id = run_stream(spark, tmp_path, STREAM, build)
    assert ours == native_stream
    sessions = {(r[0], r[1]): r[2:] for rows in ours.values() for r in rows}
    assert sessions["e", at(80)] == (at(100), 1, 5)
    assert not any(user in ("b", "f", "g") for user, _ in sessions)
    assert sessions["d", at(100)] == (at(110), 2, 12)
    assert [r[0] for r in ours[max(ours)]] == ["z"] and max(ours) == max(native_stream)
    totals = read_state_metrics(query_state_location(str(state), query_id))
    assert totals["invalid_gaps_dropped"] == 4
    # the processor's Spark watermark is on t + max_gap: Spark drops none of these rows, the
    # engine drops f and g by their own window ends
    assert totals["dropped_records"] == 4 + 2


# -- max_duration ---------------------------------------------------------------------------------

def duration_rows(seed: int, n: int) -> list[tuple[str, int, int | None, int]]:
    """(user, t us, gap us or None, amount) in a shuffled arrival order, with ties and events
    exactly at start + max_duration."""
    import random

    rng = random.Random(seed)
    rows: list[tuple[str, int, int | None, int]] = []
    for i in range(n):
        t = rng.randrange(0, 600) * SECOND + rng.choice([0, 0, 1, 999_999])
        gap = rng.choice([None, 0, 5 * SECOND, 10 * SECOND, 30 * SECOND, 250])
        rows.append((f"k{rng.randrange(4)}", t, gap, i))
    rows += [("edge", 0, 10 * SECOND, 1), ("edge", 8 * SECOND, 10 * SECOND, 2),
             ("edge", 16 * SECOND, 10 * SECOND, 3), ("edge", 24 * SECOND, 10 * SECOND, 4),
             ("edge", 25 * SECOND, 10 * SECOND, 5), ("edge", 30 * SECOND, 10 * SECOND, 6)]
    rng.shuffle(rows)
    return rows


def as_frame_rows(rows: list[tuple[str, int, int | None, int]]) -> list[Row]:
    return [(u, at(0, t), None if g is None else f"{g} microseconds", "x", a)
            for u, t, g, a in rows]


def micros(value: dt.datetime) -> int:
    return (value - EPOCH) // dt.timedelta(microseconds=1)


@pytest.mark.parametrize("engine", ENGINES)
def test_static_max_duration_equals_offline_rule(spark, engine):
    rows = duration_rows(7, 300)
    df = spark.createDataFrame(as_frame_rows(rows), SCHEMA).repartition(3)
    aggs = {"n": "count", "total": ("sum", "amount")}
    cap = 25 * SECOND
    got = sorted((r[0], micros(r[1]), micros(r[2]), r[3], r[4]) for r in sessionize(
        df, key="user", timestamp="ts", gap=F.col("dur"), max_gap="30 seconds",
        max_duration=dt.timedelta(seconds=25), aggregations=aggs, engine=engine).collect())
    assert got == offline(rows, cap)
    assert [s[1:4] for s in got if s[0] == "edge"] == [(0, cap, 4), (cap, 40 * SECOND, 2)]
    fixed = [(u, t, 10 * SECOND, a) for u, t, _, a in rows]
    df_fixed = spark.createDataFrame(as_frame_rows(fixed), SCHEMA)
    got_fixed = sorted((r[0], micros(r[1]), micros(r[2]), r[3], r[4]) for r in sessionize(
        df_fixed, key="user", timestamp="ts", gap="10 seconds", max_duration="25 seconds",
        aggregations=aggs, engine=engine).collect())
    assert got_fixed == offline(fixed, cap)


@pytest.mark.parametrize("engine", ENGINES)
def test_streaming_max_duration_equals_offline_rule(spark, tmp_path, engine):
    """Rows arrive out of order (within the watermark delay, so none is late); the emitted
    sessions equal the offline rule, whatever micro-batch they arrived in."""
    rows = duration_rows(11, 200)
    ordered = sorted(rows, key=lambda r: r[1])
    # four micro-batches of event-time slices, each shuffled; a far key pushes the watermark
    # past every session in the last one
    slices = [ordered[i::4] for i in range(4)]
    batches = [as_frame_rows(s) for s in slices]
    batches.append([("zz", at(7200), "1 second", "x", 0)])
    batches.append([])

    def build(stream: Any) -> Any:
        return sessionize(stream, key="user", timestamp="ts", gap=F.col("dur"),
                          max_gap="30 seconds", max_duration="25 seconds",
                          watermark_delay="1 hour", aggregations={
                              "n": "count", "total": ("sum", "amount")},
                          state_location=str(tmp_path / "state"),
                          local_dir=str(tmp_path / "local"), engine=engine)

    out, _ = run_stream(spark, tmp_path, batches, build)
    got = sorted((r[0], micros(r[1]), micros(r[2]), r[3], r[4])
                 for b in out.values() for r in b)
    assert got == offline(rows, 25 * SECOND)
