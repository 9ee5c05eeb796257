"""Unit tests of SessionAggregator and BatchAggregator: options, inputs, metrics, restarts."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from sessionstore import (
    AccumulationMode,
    AfterWatermark,
    BatchAggregator,
    BatchWindows,
    EmitStrategy,
    InMemorySessionStore,
    ManualClock,
    Session,
    SessionAggregator,
    SessionStore,
    SessionWindows,
    aggregations,
)
from sessionstore.timeutil import INT64_MAX


def engine(gap=10, grace=0, emit=EmitStrategy.ON_WINDOW_CLOSE, retention=None, **kwargs):
    windows = SessionWindows(gap, grace)
    store = InMemorySessionStore(retention_ms=retention or windows.retention_ms)
    return SessionAggregator(store, windows, kwargs.pop("aggregation", aggregations.count()),
                             emit=emit, **kwargs)


def triples(emits):
    return [(e.session.key, e.session.start, e.session.end, e.value, e.retraction) for e in emits]


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"gap_ms": 0}, ValueError, "gap_ms must be > 0, got 0"),
        ({"gap_ms": -5}, ValueError, "gap_ms must be > 0, got -5"),
        ({"gap_ms": 10, "grace_ms": -1}, ValueError, "grace_ms must be >= 0, got -1"),
        ({"gap_ms": 10, "grace_ms": 5, "retention_ms": 14}, ValueError,
         "retention_ms must be >= gap_ms \\+ grace_ms = 15, got 14"),
        ({"gap_ms": "ten minutes"}, ValueError, "gap_ms"),
        ({"gap_ms": 1.5}, TypeError, "gap_ms"),
        ({"gap_ms": 10, "inclusive_gap": "yes"}, TypeError, "inclusive_gap"),
    ],
)
def test_session_windows_validation(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        SessionWindows(**kwargs)


def test_durations_accept_strings_and_timedeltas():
    w = SessionWindows("10 minutes", dt.timedelta(seconds=30), retention_ms="1h")
    assert (w.gap_ms, w.grace_ms, w.retention_ms) == (600_000, 30_000, 3_600_000)
    assert SessionWindows("1 hour 30 minutes").gap_ms == 5_400_000
    assert SessionWindows("250 ms").gap_ms == 250
    assert BatchWindows("5s").size_ms == 5000


def test_engine_argument_errors():
    windows = SessionWindows(10, 5)
    small = InMemorySessionStore(retention_ms=14)
    with pytest.raises(ValueError, match="store retention_ms=14 must be >= 15"):
        SessionAggregator(small, windows, aggregations.count())
    store = InMemorySessionStore(retention_ms=100)
    with pytest.raises(ValueError, match="must be >= 115"):
        SessionAggregator(store, windows, aggregations.count(), max_out_of_orderness_ms=100)
    with pytest.raises(TypeError, match="aggregation"):
        SessionAggregator(store, windows, len)
    with pytest.raises(ValueError, match="watermark"):
        SessionAggregator(store, windows, aggregations.count(), watermark="wall")
    with pytest.raises(ValueError, match="not both"):
        SessionAggregator(store, windows, aggregations.count(), emit=EmitStrategy.ON_WINDOW_CLOSE,
                          trigger=AfterWatermark())
    with pytest.raises(ValueError, match="needs a trigger"):
        SessionAggregator(store, windows, aggregations.count(),
                          accumulation=AccumulationMode.ACCUMULATING)
    with pytest.raises(TypeError, match="store"):
        SessionAggregator(object(), windows, aggregations.count())


@pytest.mark.parametrize(
    ("key", "t", "exc", "match"),
    [
        (None, 0, ValueError, "None"),
        ("k", 1.5, TypeError, "timestamp_ms"),
        ("k", float("nan"), TypeError, "timestamp_ms"),
        ("k", "12", TypeError, "timestamp_ms"),
        ("k", True, TypeError, "timestamp_ms"),
        ("k", 2**63, ValueError, "timestamp_ms"),
        ("k", 2**63 - 5, ValueError, "overflows"),
        ([1], 0, TypeError, "key"),
    ],
)
def test_process_rejects_bad_events_without_changing_state(key, t, exc, match):
    e = engine()
    e.process("k", 1, 0)
    with pytest.raises(exc, match=match):
        e.process(key, 1, t)
    assert e.sessions("k") == [(Session("k", 0, 10), 1)]
    assert e.metrics["records-in"] == 1


def test_process_accepts_datetimes():
    e = engine(gap=1000)
    e.process("k", 1, dt.datetime(1970, 1, 1, 0, 0, 1, tzinfo=dt.timezone.utc))
    e.process("k", 1, dt.datetime(1970, 1, 1, 0, 0, 1, 500_000))
    assert [tuple(s) for s, _ in e.sessions("k")] == [("k", 1000, 2500)]


@pytest.mark.parametrize(
    "make",
    [
        lambda k, v, t: (k, v, t),
        lambda k, v, t: (np.array(k, dtype=object), np.array(v), np.array(t, dtype=np.int64)),
        lambda k, v, t: (pa.array(k), pa.array(v), pa.array(t, type=pa.int64())),
        lambda k, v, t: (pd.Series(k), pd.Series(v), pd.Series(t)),
        lambda k, v, t: (pa.array(k), pa.array(v),
                         pa.array(t, type=pa.int64()).cast(pa.timestamp("ms"))),
    ],
    ids=["lists", "numpy", "arrow", "pandas", "arrow-timestamps"],
)
def test_process_batch_accepts_columns(make):
    keys, values, times = ["a", "b", "a", "a"], [1, 2, 3, 4], [0, 5, 8, 40]
    loop = engine(aggregation=aggregations.sum_of())
    want = [e for k, v, t in zip(keys, values, times, strict=True) for e in loop.process(k, v, t)]
    want += loop.advance_watermark(INT64_MAX)
    batch = engine(aggregation=aggregations.sum_of())
    got = batch.process_batch(*make(keys, values, times)) + batch.advance_watermark(INT64_MAX)
    assert got == want
    assert triples(got) == [("b", 5, 15, 2, False), ("a", 0, 18, 4, False), ("a", 40, 50, 4, False)]


@pytest.mark.parametrize(
    ("times", "exc", "match"),
    [
        ([0, 1.5], TypeError, "timestamps_ms"),
        (np.array([0.0, np.nan]), TypeError, "timestamps_ms"),
        ([0, None], ValueError, "null"),
        ([0, "x"], TypeError, "timestamps_ms"),
        ([0, 2**63 - 3], ValueError, "overflows"),
        ([0], ValueError, "rows"),
    ],
)
def test_process_batch_validates_everything_first(times, exc, match):
    e = engine()
    with pytest.raises(exc, match=match):
        e.process_batch(["a", "b"], [1, 2], times)
    with pytest.raises(ValueError, match=r"keys\[1\]"):
        e.process_batch(["a", None], [1, 2], [0, 1])
    assert list(e.store.find_sessions(-(2**63), 2**63 - 1)) == []


def test_late_events_are_dropped_counted_and_reported():
    late = []
    e = engine(grace=5, on_late=lambda k, v, t: late.append((k, v, t)))
    e.process("k", "a", 100)  # W = 100
    assert e.process("k", "b", 85) == []  # 100 >= 85 + 10 + 5
    e.process("k", "c", 86)  # within grace: allowed
    assert late == [("k", "b", 85)]
    assert e.metrics["dropped-records"] == 1
    assert [tuple(s) for s, _ in e.sessions("k")] == [("k", 86, 96), ("k", 100, 110)]


def test_emit_final_metrics():
    e = engine(gap=10, grace=0)
    e.process("a", 1, 0)
    e.process("b", 1, 2)
    e.process("a", 1, 40)  # closes a [0,10) (latency 30) and b [2,12) (latency 28)
    m = e.metrics
    assert m["emit-final-records-total"] == 2
    assert m["emit-final-latency-max"] == 30
    assert m["emit-final-latency-avg"] == 29
    assert m["emit-final-records-rate"] > 0


def test_update_mode_with_write_cache_deduplicates_until_flush():
    e = engine(emit=EmitStrategy.ON_WINDOW_UPDATE, write_cache=True, retention=1000,
               watermark="external")
    assert e.process("k", 1, 0) == []
    e.process("k", 1, 5)
    e.process("j", 1, 100)
    with pytest.raises(ValueError, match="flush"):
        e.commit()
    flushed = e.flush()
    # [0,10) and [0,15) were never delivered: only the latest per session, no retraction
    assert triples(flushed) == [("k", 0, 15, 2, False), ("j", 100, 110, 1, False)]
    e.commit()
    e.process("k", 1, 12)  # replaces the delivered [0, 15)
    assert triples(e.flush()) == [("k", 0, 15, 2, True), ("k", 0, 22, 3, False)]


def test_emit_on_close_restarts_from_rocksdb(tmp_path: Path):
    windows = SessionWindows(10)

    def open_engine():
        store = SessionStore(tmp_path / "s", retention_ms=100)
        return SessionAggregator(store, windows, aggregations.count(),
                                 emit=EmitStrategy.ON_WINDOW_CLOSE)

    e = open_engine()
    out = e.process("a", 1, 0) + e.process("b", 1, 50)
    assert triples(out) == [("a", 0, 10, 1, False)]
    e.commit({"offset": 2})
    e.process("b", 1, 55)  # not committed
    e.store.close()
    e = open_engine()
    assert e.committed_metadata == {"offset": 2}
    assert e.watermark == 50
    out = e.process("b", 1, 55) + e.process("c", 1, 200)
    assert triples(out) == [("b", 50, 65, 2, False)]
    e.store.close()


def test_external_watermark_far_behind_data_keeps_sessions_open(tmp_path: Path):
    windows = SessionWindows(10)
    store = SessionStore(tmp_path / "s", retention_ms=10, segment_interval_ms=10)
    e = SessionAggregator(store, windows, aggregations.count(),
                          emit=EmitStrategy.ON_WINDOW_CLOSE, watermark="external")
    e.process("a", 1, 0)
    assert e.process("b", 1, 1000) == []  # store time runs far ahead of W: nothing expires
    e.commit()
    assert e.process("a", 1, 5) == []  # still open: W has not closed it
    assert e.metrics["store-dropped-records"] == 0 and e.metrics["dropped-records"] == 0
    out = e.advance_watermark(100)  # closes a; expiry may now drop its segment
    assert triples(out) == [("a", 0, 15, 2, False)]
    out = e.advance_watermark(2000)
    assert triples(out) == [("b", 1000, 1010, 1, False)]
    e.process("c", 1, 2000)  # expiry runs on the next write, now that a was emitted
    e.commit()
    assert list(store.fetch("a")) == []  # expired after it was emitted
    store.close()


def test_trigger_needs_manual_clock_for_advance_processing_time():
    e = engine(emit=None, trigger=AfterWatermark())
    with pytest.raises(TypeError, match="ManualClock"):
        e.advance_processing_time(5)
    clocked = engine(emit=None, trigger=AfterWatermark(), clock=ManualClock(10))
    with pytest.raises(ValueError, match="cannot go back"):
        clocked.advance_processing_time(5)


def test_interactive_query_of_current_sessions():
    e = engine(emit=EmitStrategy.ON_WINDOW_UPDATE, aggregation=aggregations.collect())
    e.process("k", "x", 3)
    e.process("k", "y", 1)
    assert e.sessions("k") == [(Session("k", 1, 13), ["y", "x"])]


def test_batch_windows_follow_stream_time_and_never_drop():
    store = InMemorySessionStore(retention_ms=100)
    b = BatchAggregator(store, BatchWindows(10), aggregations.collect())
    out = b.process("k", "a", 1) + b.process("k", "b", 5)
    assert out == []
    out = b.process("k", "c", 12)  # stream time 12 closes [0, 10)
    assert triples(out) == [("k", 0, 10, ["a", "b"], False)]
    out = b.process("k", "late", 3)  # never late: joins the window of stream time 12
    out += b.advance_watermark(20)
    assert triples(out) == [("k", 10, 20, ["late", "c"], False)]
    assert b.metrics["dropped-records"] == 0
    with pytest.raises(ValueError, match="size_ms must be > 0"):
        BatchWindows(0)


def test_batch_windows_batch_path_and_restart(tmp_path: Path):
    def open_agg():
        return BatchAggregator(SessionStore(tmp_path / "b", retention_ms=100), BatchWindows(10),
                               aggregations.count())

    b = open_agg()
    assert b.process_batch(["a", "b", "a"], [1, 1, 1], np.array([1, 2, 3])) == []
    b.commit()
    b.store.close()
    b = open_agg()
    out = b.process_batch(["a"], [1], [15])
    assert triples(out) == [("a", 0, 10, 2, False), ("b", 0, 10, 1, False)]
    b.store.close()
