"""An integer sum that leaves int64 is an error naming the aggregation, the key and the event
(issue 25): on every path, as Spark's ``sum`` in ANSI mode (its default) raises, never a wrapped,
widened or crashing value, and the failed call changes nothing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from sessionstore import (
    EmitStrategy,
    InMemorySessionStore,
    SessionAggregator,
    SessionStore,
    SessionWindows,
    aggregations,
)
from sessionstore.aggregations import SumOverflowError
from sessionstore.timeutil import INT64_MAX

LOW = -(2**63)
HIGH = 2**63 - 1
# (first value, second value): below int64, and above it where msgpack would still store the
# sum as an unsigned 64-bit int
PAIRS = [(LOW, -1), (HIGH, 1)]


def engine_for(tmp_path: Path, backend: str, *, max_duration_ms: int | None = None,
               emit: EmitStrategy = EmitStrategy.ON_WINDOW_CLOSE) -> SessionAggregator:
    windows = SessionWindows(10, max_duration_ms=max_duration_ms)
    store = (InMemorySessionStore(retention_ms=windows.retention_ms) if backend == "memory"
             else SessionStore(tmp_path / "s", retention_ms=windows.retention_ms))
    agg = aggregations.combine({"n": aggregations.count(),
                                "s": aggregations.sum_of(column="v")})
    return SessionAggregator(store, windows, agg, emit=emit)


def sessions_of(engine: SessionAggregator) -> list[tuple[object, int, int, object]]:
    """The sessions of the keys these tests use, read through the engine (its cache and held
    keys included: the store below may not hold them yet)."""
    return sorted((s.key, s.start, s.end, repr(v))
                  for key in ("a", "b") for s, v in engine.sessions(key))


def assert_refused(exc: pytest.ExceptionInfo[SumOverflowError]) -> None:
    text = str(exc.value)
    assert "'s'" in text and "'a'" in text and "int64" in text, text
    assert exc.value.aggregation == "s" and exc.value.key == "a"
    assert not -(2**63) <= exc.value.total <= 2**63 - 1


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
@pytest.mark.parametrize("pair", PAIRS)
@pytest.mark.parametrize("max_duration_ms", [None, 100])
def test_event_path(tmp_path, backend, pair, max_duration_ms):
    engine = engine_for(tmp_path, backend, max_duration_ms=max_duration_ms)
    engine.process("a", {"v": pair[0]}, 1)
    before = sessions_of(engine)
    with pytest.raises(SumOverflowError) as exc:
        engine.process("a", {"v": pair[1]}, 2)
    assert_refused(exc)
    assert exc.value.timestamp_ms == 2
    assert sessions_of(engine) == before  # nothing changed
    # the engine goes on: another key, and closing
    engine.process("b", {"v": 1}, 3)
    out = engine.advance_watermark(INT64_MAX)
    assert sorted((e.session.key, e.value["s"]) for e in out) == [("a", pair[0]), ("b", 1)]


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
@pytest.mark.parametrize("pair", PAIRS)
@pytest.mark.parametrize("max_duration_ms", [None, 100])
@pytest.mark.parametrize("split", [False, True])
def test_process_batch(tmp_path, backend, pair, max_duration_ms, split):
    engine = engine_for(tmp_path, backend, max_duration_ms=max_duration_ms)
    values = [{"v": pair[0]}, {"v": pair[1]}]
    if split:  # the second batch merges into the stored session
        engine.process_batch(["a"], values[:1], np.array([1]))
        values = values[1:]
    before = sessions_of(engine)
    with pytest.raises(SumOverflowError) as exc:
        engine.process_batch(["a"] * len(values), values, np.array([1, 2][-len(values):]))
    assert_refused(exc)
    assert sessions_of(engine) == before


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
@pytest.mark.parametrize("pair", PAIRS)
@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("max_duration_ms", [None, 100])
def test_process_table(tmp_path, backend, pair, split, max_duration_ms):
    engine = engine_for(tmp_path, backend, max_duration_ms=max_duration_ms)
    table = pa.table({"k": ["b", "a", "a"], "t": [0, 1, 2],
                      "v": pa.array([5, *pair], pa.int64())})
    if split:
        engine.process_table(table.slice(0, 2), key="k", time="t")
        table = table.slice(2)
    before = sessions_of(engine)
    with pytest.raises(SumOverflowError) as exc:
        engine.process_table(table, key="k", time="t")
    assert_refused(exc)
    assert sessions_of(engine) == before


def test_a_merge_of_two_sessions_that_leaves_int64_is_refused():
    windows = SessionWindows(10, grace_ms=100)
    engine = SessionAggregator(InMemorySessionStore(retention_ms=windows.retention_ms), windows,
                               aggregations.combine({"s": aggregations.sum_of()}),
                               emit=EmitStrategy.ON_WINDOW_UPDATE)
    engine.process("a", HIGH, 0)
    engine.process("a", 1, 20)  # a second session
    with pytest.raises(SumOverflowError) as exc:
        engine.process("a", 0, 10)  # bridges them: HIGH + 0 + 1
    assert exc.value.aggregation == "s" and exc.value.key == "a"


def test_sums_inside_int64_stay_exact_whatever_the_order():
    # partial sums may pass through any value inside int64: only leaving it is refused
    windows = SessionWindows(10)
    engine = SessionAggregator(InMemorySessionStore(retention_ms=windows.retention_ms), windows,
                               aggregations.sum_of(), emit=EmitStrategy.ON_WINDOW_CLOSE)
    engine.process_batch(["a"] * 3, [HIGH, LOW, HIGH], np.array([0, 1, 2]))
    (emit,) = engine.advance_watermark(INT64_MAX)
    assert emit.value == HIGH - 1


def test_partial_sums_that_leave_and_come_back_follow_what_each_path_keeps():
    # documented in docs/semantics.md: the event path keeps a sum per event, a batch per batch
    def engine() -> SessionAggregator:
        windows = SessionWindows(10)
        return SessionAggregator(InMemorySessionStore(retention_ms=windows.retention_ms),
                                 windows, aggregations.combine({"s": aggregations.sum_of()}),
                                 emit=EmitStrategy.ON_WINDOW_CLOSE)

    values, times = [HIGH, 1, -1], np.array([0, 1, 2])
    batch = engine()
    batch.process_batch(["a"] * 3, values, times)
    assert [e.value["s"] for e in batch.advance_watermark(INT64_MAX)] == [HIGH]
    table = engine()
    table.process_table(pa.table({"k": ["a"] * 3, "t": times, "v": values}), key="k", time="t",
                        value="v")
    assert [e.value["s"] for e in table.advance_watermark(INT64_MAX)] == [HIGH]
    event = engine()
    event.process("a", HIGH, 0)
    with pytest.raises(SumOverflowError):
        event.process("a", 1, 1)
