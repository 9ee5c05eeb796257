"""Per-row gaps (SPARK-36465) and a maximum session duration in ``sessionize``.

Dynamic gaps are compared with Spark's native ``session_window(ts, gapExpr)`` on the same rows,
static and streaming (micro-batch by micro-batch), on both engines. Native has no maximum
duration, so that is compared with the offline rule written out here.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F

from spark_adapter import query_state_location, read_state_metrics, sessionize
from spark_adapter.sessionize import GAP_COLUMN, _dynamic_gap

EPOCH = dt.datetime(2024, 1, 1)
SCHEMA = "user string, ts timestamp, dur string, kind string, amount long"
ENGINES = ["arrow", "processor"]
SECOND = 1_000_000  # us


def at(seconds: float, micros: int = 0) -> dt.datetime:
    return EPOCH + dt.timedelta(seconds=seconds, microseconds=micros)


def sorted_rows(frame: Any) -> list[tuple]:
    return sorted(tuple(r) for r in frame.collect())


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


def test_gap_arguments_are_checked_on_the_driver(spark):
    df = spark.createDataFrame([], SCHEMA)
    kw: dict[str, Any] = {"key": "user", "timestamp": "ts", "aggregations": {"n": "count"}}
    with pytest.raises(ValueError, match="is per row: give max_gap="):
        sessionize(df, gap=F.col("dur"), **kw)
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
        ("c", at(60, 1), "1 second", "x", 4),  # past 60.000249: a new session
        ("d", at(0), "1 minute", "y", 7),
    ]
    return rows


@pytest.mark.parametrize("engine", ENGINES)
def test_static_dynamic_gaps_equal_native(spark, engine):
    df = spark.createDataFrame(static_rows(), SCHEMA)
    when = F.when(F.col("kind") == "x", "5 seconds").otherwise(F.col("dur"))
    sql = "CASE WHEN kind = 'x' THEN '5 seconds' ELSE dur END"
    aggs = {"n": "count", "total": ("sum", "amount")}
    for gap in (F.col("dur"), when, sql):
        ours = sorted_rows(sessionize(df, key="user", timestamp="ts", gap=gap,
                                      max_gap="1 minute", aggregations=aggs, engine=engine))
        native_gap = F.expr(gap) if isinstance(gap, str) else gap
        native = sorted_rows(df.groupBy("user", F.session_window("ts", native_gap).alias("w"))
                             .agg(F.count("*"), F.sum("amount"))
                             .select("user", "w.start", "w.end", "count(1)", "sum(amount)"))
        assert ours == native, gap
    # the column case, spelled out
    ours = sorted_rows(sessionize(df, key="user", timestamp="ts", gap=F.col("dur"),
                                  max_gap="1 minute", aggregations=aggs, engine=engine))
    assert [r[1:] for r in ours if r[0] == "a"] == [(at(0), at(25), 3, 6), (at(30), at(35), 1, 4)]
    assert [r[1:] for r in ours if r[0] == "b"] == [(at(4), at(7), 1, 5)]
    assert [r[1:3] for r in ours if r[0] == "c"] == [(at(10), at(60, 249)), (at(60, 1), at(61, 1))]


def test_gap_over_max_gap_fails_naming_the_column(spark):
    df = spark.createDataFrame([("a", at(0), "5 seconds", "x", 1),
                                ("b", at(3), "2 minutes", "x", 2)], SCHEMA)
    for engine in ENGINES:
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
