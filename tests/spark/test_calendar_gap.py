"""A fixed gap string with calendar units (days, weeks, months, years), against native.

Native ``session_window(ts, "1 day")`` casts the string to an interval and adds it to the event
time in the session time zone: a day is 23 hours across New York's spring-forward and 25 across
its fall-back (24 for a timestamp_ntz, which has no zone), a month 28 to 31 days. The rows here
straddle both changes so that an exact 24 hours gives other sessions: ``s`` is two sessions by
the calendar (23.5 h apart, more than that day's 23 h) and one by 24 h; ``f`` is one session by
the calendar (24.5 h apart, within that day's 25 h) and two by 24 h.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from pyspark.sql import functions as F

from spark_adapter import sessionize
from spark_adapter.sessionize import _dynamic_gap, _interval_fields
from tests.spark.streams import run_json_stream

ZONE = "America/New_York"
ROWS = [  # (user, wall-clock time in the session zone, amount)
    ("s", "2024-03-09 12:00:00", 1), ("s", "2024-03-10 12:30:00", 2),
    ("f", "2024-11-02 12:00:00", 3), ("f", "2024-11-03 11:30:00", 4),
    ("p", "2024-01-10 12:00:00", 5), ("p", "2024-01-11 12:00:00", 6),  # exactly a day: joins
    ("m", "2024-01-31 00:00:00", 7), ("m", "2024-02-29 00:00:00", 8),  # a month: to Feb 29
    ("n", "2024-03-10 01:30:00", 9),  # half an hour before the jump
]
AGGS = {"n": "count", "total": ("sum", "amount")}


def frame(spark: Any, time_type: str) -> Any:
    text = spark.createDataFrame(ROWS, "user string, ts string, amount long")
    return text.withColumn("ts", F.col("ts").cast(time_type))


def native(df: Any, gap: str) -> list[tuple[Any, ...]]:
    out = df.groupBy("user", F.session_window("ts", gap).alias("w")).agg(
        F.count("*").alias("n"), F.sum("amount").alias("total"))
    return sorted(tuple(r) for r in out.select("user", "w.start", "w.end", "n", "total")
                  .collect())


def ours(df: Any, gap: str, engine: str = "arrow") -> list[tuple[Any, ...]]:
    return sorted(tuple(r) for r in sessionize(df, key="user", timestamp="ts", gap=gap,
                                               aggregations=AGGS, engine=engine).collect())


def hours(row: tuple[Any, ...]) -> float:
    return float((row[2] - row[1]) / dt.timedelta(hours=1))


@pytest.mark.parametrize(("time_type", "gap", "engine"), [
    ("timestamp", "1 day", "arrow"), ("timestamp", "1 day", "processor"),
    ("timestamp", "1 day 2 hours", "arrow"), ("timestamp", "1 month", "arrow"),
    ("timestamp_ntz", "1 day", "arrow"), ("timestamp_ntz", "1 month", "arrow"),
])
def test_static_calendar_gap_string_equals_native(new_york, time_type, gap, engine):
    """Kills a day taken as 24 hours in the session zone (the old fixed gap: ``s`` and ``f``
    come out wrong), a day taken by the calendar on a timestamp_ntz, and a month refused."""
    df = frame(new_york, time_type)
    expected = native(df, gap)
    assert ours(df, gap, engine) == expected
    by_user: dict[str, list[tuple[Any, ...]]] = {}
    for row in expected:
        by_user.setdefault(row[0], []).append(row)
    if gap == "1 day" and time_type == "timestamp":  # the rows mean what the docstring says
        assert [r[3] for r in by_user["s"]] == [1, 1] and [r[3] for r in by_user["f"]] == [2]
        assert hours(by_user["n"][0]) == 23
    if gap == "1 day" and time_type == "timestamp_ntz":  # wall-clock: 24.5 h and 23.5 h apart
        assert [r[3] for r in by_user["s"]] == [1, 1] and [r[3] for r in by_user["f"]] == [2]
        assert hours(by_user["n"][0]) == 24
    if gap == "1 month":
        assert by_user["m"][0][3] == 2 and hours(by_user["n"][0]) == 31 * 24 - (
            time_type == "timestamp")  # March 10 to April 10 loses the spring hour


def test_exact_gaps_stay_exact(spark, new_york):
    """What native measures exactly is exact here too, on the fixed path (no per-row gap
    column): a day in UTC and in a fixed offset, a day on a timestamp_ntz, hours in any zone,
    and a ``timedelta`` (native refuses a day-time interval as a gap, so it has no calendar
    meaning; it is exact microseconds, as documented)."""
    for zone, time_type, gap in [("UTC", "timestamp", "1 day"), ("+05:00", "timestamp", "2 days"),
                                 (ZONE, "timestamp_ntz", "1 day"),
                                 (ZONE, "timestamp", "24 hours")]:
        spark.conf.set("spark.sql.session.timeZone", zone)
        df = frame(spark, time_type)
        assert _dynamic_gap(df, gap, "ts") is None, (zone, time_type, gap)
        assert ours(df, gap) == native(df, gap), (zone, time_type, gap)
    spark.conf.set("spark.sql.session.timeZone", ZONE)
    df = frame(spark, "timestamp")
    assert _dynamic_gap(df, "1 day", "ts") is not None
    hour = 3_600_000_000
    # Spark's own fields of a gap string: 30 hours stay hours, a week is 7 days
    assert [_interval_fields(spark, text) for text in (
        "1 day 30 hours", "1 year 2 months", "1 week -1.5 seconds", "250 microseconds",
        "10 min")] == [(0, 1, 30 * hour), (14, 0, 0), (0, 7, -1_500_000), (0, 0, 250), None]
    by_timedelta = ours(df, dt.timedelta(days=1))  # type: ignore[arg-type]
    assert by_timedelta == native(df, "24 hours") != native(df, "1 day")
    # a numpy timedelta64 is the same exact duration (it was refused as a gap); a pandas
    # Timedelta a nanosecond over is no whole number of microseconds: refused, not truncated
    assert ours(df, np.timedelta64(24, "h")) == by_timedelta  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="gap is not a whole number of microseconds"):
        ours(df, pd.Timedelta(days=1, nanoseconds=1))  # type: ignore[arg-type]


# -- streaming --------------------------------------------------------------------------------

DELAY = "1 hour"
Row = tuple[str, str, int]
# W: the watermark entering each batch (the largest event time before it, minus an hour)
STREAM: list[list[Row]] = [
    [("s", "2024-03-09T12:00:00", 1), ("x", "2024-03-09T13:00:00", 2)],
    # W = 03-09 12:00 EST; s at 12:30 EDT is past the calendar day's end (03-10 12:00 EDT)
    [("s", "2024-03-10T12:30:00", 3)],
    # W = 03-10 11:30 EDT: "late" ends at 03-10 11:15 EDT by the calendar (late, dropped),
    # at 12:15 EDT by 24 hours (not late)
    [("late", "2024-03-09T11:15:00", 4), ("f", "2024-11-02T12:00:00", 5)],
    # W = 11-02 11:00 EDT: f's first row ends at 11-03 12:00 EST by the calendar: joins
    [("f", "2024-11-03T11:30:00", 6)],
    [("z", "2024-12-31T00:00:00", 7)],  # W passes every session above (z's stays open)
    [],  # a no-data batch closes what is left
]


def run_stream(spark: Any, root: Path, build: Any) -> dict[int, list[tuple[Any, ...]]]:
    return run_json_stream(
        spark, root, "user string, ts timestamp, amount long", STREAM,
        lambda r: {"user": r[0], "ts": r[1], "amount": r[2]}, build)[0]


@pytest.mark.parametrize("engine", ["arrow", "processor"])
def test_streaming_calendar_gap_equals_native_batch_by_batch(new_york, tmp_path, engine):
    """Kills the 24-hour day on a stream (sessions and the late rule) and a literal day gap
    that needs ``max_gap`` on a stream (its bound is inferred), on both engines. On the
    processor engine it also kills a partition whose buckets had no rows before (so no
    heartbeat timer, so an engine that never saw a watermark) keeping the row ``late``, which
    native drops by its own calendar window end though Spark's ``t + max_gap`` keeps it."""
    def by_native(stream: Any) -> Any:
        return (stream.withWatermark("ts", DELAY)
                .groupBy("user", F.session_window("ts", "1 day").alias("w"))
                .agg(F.count("*").alias("n"), F.sum("amount").alias("total"))
                .select("user", "w.start", "w.end", "n", "total"))

    def by_ours(stream: Any) -> Any:
        return sessionize(stream, key="user", timestamp="ts", gap="1 day", watermark_delay=DELAY,
                          aggregations=AGGS, state_location=str(tmp_path / "state"),
                          local_dir=str(tmp_path / "local"), engine=engine)

    expected = run_stream(new_york, tmp_path / "native", by_native)
    got = run_stream(new_york, tmp_path / "ours", by_ours)
    assert got == expected
    sessions = sorted(r for rows in expected.values() for r in rows)
    assert [r[0] for r in sessions] == ["f", "s", "s", "x"]  # "late" dropped
    assert [r[3] for r in sessions if r[0] == "f"] == [2]


# Micro-batches that follow one another with data, each moving the watermark (no no-data batch
# between them): a row of batch b is late against the watermark of batch b - 1, sessions close
# at the watermark of batch b. Hours after midnight UTC, January 1 2024; the watermark delay is 0.
BACK_TO_BACK: list[list[tuple[str, float, str]]] = [
    [("a", 0, "1 hour"), ("b", 0, "2 hours")],
    [("a", 10, "1 hour"), ("b", 10, "1 hour")],  # W = 0h
    [("a", 20, "1 hour"), ("b", 20, "1 hour")],  # W = 10h: a's and b's first sessions close
    # late-events W = 10h: "c" ends at 10.5h (kept, closes at once, at W = 20h); "d" at 9h,
    # late by its own end though not by t + max_gap (18h)
    [("c", 9.5, "1 hour"), ("d", 8, "1 hour"), ("a", 30, "1 hour")],
]


def _hours(value: float) -> str:
    return (dt.datetime(2024, 1, 1) + dt.timedelta(hours=value)).isoformat()


def test_back_to_back_batches_with_per_row_gap_equal_native(spark, tmp_path):
    """Kills the processor engine's heartbeat deleting its own due timer: in a micro-batch with
    rows that moves the watermark, each bucket with rows replaced the timer due in it by one past
    the new watermark, so with every bucket of a partition holding rows (one bucket here) no
    timer fired. The engine then closed nothing in that batch (native emits ``a`` and ``b``'s
    first sessions there) and judged the next batch's rows against the watermark of two
    batches back (it kept ``d``, which native drops as late by its own window end)."""
    before = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    try:
        results = {}
        for name in ("native", "arrow", "processor"):
            results[name] = _run_back_to_back(spark, tmp_path / name, name)
    finally:
        spark.conf.set("spark.sql.session.timeZone", before)
    expected = results["native"]
    assert results["arrow"] == expected
    assert results["processor"] == expected
    # the rows mean what the comments say: four data batches back to back (0-3), then a
    # no-data one; each batch closes what ends by its own watermark, and "d" is dropped
    users = {b: [(r[0], r[1].hour) for r in rows] for b, rows in expected.items()}
    assert users == {2: [("a", 0), ("b", 0)], 3: [("a", 10), ("b", 10), ("c", 9)],
                     4: [("a", 20), ("b", 20)]}


def _run_back_to_back(spark: Any, root: Path, engine: str) -> dict[int, list[tuple[Any, ...]]]:
    """Every file is in place before the query starts (distinct modification times, one file a
    micro-batch), so the data batches run one after another with no no-data batch between."""
    source = root / "source"
    source.mkdir(parents=True)
    for i, rows in enumerate(BACK_TO_BACK):
        path = source / f"b{i:03d}.json"
        path.write_text("".join(json.dumps({"user": u, "ts": _hours(h), "g": g}) + "\n"
                                for u, h, g in rows))
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))
    stream = spark.readStream.schema("user string, ts timestamp, g string") \
        .option("maxFilesPerTrigger", 1).json(str(source))
    if engine == "native":
        built = (stream.withWatermark("ts", "0 seconds")
                 .groupBy("user", F.session_window("ts", F.col("g")).alias("w"))
                 .agg(F.count("*").alias("n"))
                 .select("user", "w.start", "w.end", "n"))
    else:
        built = sessionize(stream, key="user", timestamp="ts", gap=F.col("g"),
                           max_gap="10 hours", watermark_delay="0 seconds",
                           aggregations={"n": "count"}, engine=engine, n_buckets=1
                           if engine == "processor" else None,
                           state_location=str(root / "state"), local_dir=str(root / "local"))
    got: dict[int, list[tuple[Any, ...]]] = {}

    def sink(frame: Any, batch_id: int) -> None:
        got[batch_id] = sorted(tuple(r) for r in frame.collect())

    query = (built.writeStream.foreachBatch(sink).outputMode("append")
             .option("checkpointLocation", str(root / "checkpoint")).start())
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    return {b: rows for b, rows in got.items() if rows}
