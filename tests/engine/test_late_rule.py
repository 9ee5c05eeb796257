"""The late rule, ``W >= t + gap + grace`` (with a maximum duration ``t + min(gap,
max_duration) + grace``), at its boundary on every path (issue 25): the rule lives in
``TimeKeeper.is_late`` / ``late_in_batch``, and the event steps that inline it for speed are
pinned to it here. An event whose own window end plus grace equals the watermark it meets is
dropped; one a millisecond later is accepted."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sessionstore import (
    EmitStrategy,
    InMemorySessionStore,
    SessionAggregator,
    SessionWindows,
    aggregations,
)
from sessionstore.engine.config import EngineConfig
from sessionstore.engine.time import TimeKeeper
from sessionstore.timeutil import INT64_MAX, INT64_MIN
from sessionstore.triggers import AfterWatermark

GAP, GRACE, FIRST = 10, 5, 100
# the watermark is FIRST after the first event: t + GAP + GRACE == FIRST is late
LATE, ON_TIME = FIRST - GAP - GRACE, FIRST - GAP - GRACE + 1


def build(*, trigger: bool = False, write_cache: bool = False, dynamic: bool = False,
          max_duration_ms: int | None = None,
          aggregation: aggregations.Aggregation | None = None) -> SessionAggregator:
    windows = (SessionWindows(None, max_gap_ms=GAP, grace_ms=GRACE) if dynamic
               else SessionWindows(GAP, grace_ms=GRACE, max_duration_ms=max_duration_ms))
    return SessionAggregator(
        InMemorySessionStore(retention_ms=windows.retention_ms), windows,
        aggregation or aggregations.count(),
        trigger=AfterWatermark() if trigger else None,
        emit=None if trigger else (EmitStrategy.ON_WINDOW_UPDATE if write_cache
                                   else EmitStrategy.ON_WINDOW_CLOSE),
        write_cache=write_cache)


def by_events(engine: SessionAggregator, **extra: Any) -> list[Any]:
    return [emit for key, t in (("a", FIRST), ("late", LATE), ("on-time", ON_TIME))
            for emit in engine.process(key, 1, t, **extra)]


def by_batch(engine: SessionAggregator) -> list[Any]:
    return engine.process_batch(["a", "late", "on-time"], [1, 1, 1],
                                np.array([FIRST, LATE, ON_TIME]))


def by_table(engine: SessionAggregator) -> list[Any]:
    out = engine.process_table(pa.table({"k": ["a", "late", "on-time"],
                                         "t": [FIRST, LATE, ON_TIME], "v": [1, 1, 1]}),
                               key="k", time="t", value="v")
    return list(out.column("k").to_pylist())  # the emitted keys


CUSTOM = aggregations.aggregate(lambda: 0, lambda k, v, acc: acc + 1, lambda k, a, b: a + b)
PATHS: dict[str, tuple[Callable[[], SessionAggregator],
                       Callable[[SessionAggregator], list[Any]]]] = {
    "fused event step": (build, by_events),
    "lean event step": (lambda: build(write_cache=True), by_events),
    "trigger event step": (lambda: build(trigger=True), by_events),
    "dynamic gap": (lambda: build(dynamic=True), lambda e: by_events(e, gap_ms=GAP)),
    "max duration event": (lambda: build(max_duration_ms=1_000), by_events),
    "max duration, duration below the gap": (lambda: build(max_duration_ms=GAP), by_events),
    "columnar batch": (build, by_batch),
    "exact batch": (lambda: build(aggregation=CUSTOM), by_batch),
    "reduce batch": (lambda: build(aggregation=aggregations.reduce(lambda a, b: a + b)),
                     by_batch),
    "max duration batch": (lambda: build(max_duration_ms=1_000), by_batch),
    "table": (build, by_table),
}


@pytest.mark.parametrize("path", PATHS)
def test_an_event_whose_window_end_plus_grace_is_the_watermark_is_late(path):
    make, feed = PATHS[path]
    engine = make()
    fed = feed(engine)
    assert engine.metrics["dropped-records"] == 1
    emitted = [*fed, *engine.advance_watermark(INT64_MAX), *engine.flush()]
    assert {e if isinstance(e, str) else e.session.key for e in emitted} == {"a", "on-time"}


def test_time_keeper_rule():
    windows = SessionWindows(GAP, grace_ms=GRACE)
    engine = SessionAggregator(InMemorySessionStore(retention_ms=windows.retention_ms),
                               windows, aggregations.count())
    keeper: TimeKeeper = engine._core.times
    keeper.observe(FIRST)
    assert keeper.is_late(LATE + GAP) and not keeper.is_late(ON_TIME + GAP)
    mask = keeper.late_in_batch(np.array([FIRST, FIRST]), np.array([LATE + GAP, ON_TIME + GAP]))
    assert mask.tolist() == [True, False]


EXTREMES = st.sampled_from([INT64_MIN, INT64_MIN + 1, -1, 0, 1, INT64_MAX - 1, INT64_MAX])
TIMES = st.one_of(st.integers(-50, 400), EXTREMES)


@given(st.lists(st.tuples(TIMES, st.integers(0, 60) | EXTREMES), max_size=30),
       st.integers(0, 40), st.integers(0, 40), st.sampled_from(["event_time", "external"]),
       st.one_of(st.none(), st.integers(-100, 300), EXTREMES),
       st.one_of(st.none(), st.integers(-100, 300)), st.integers(0, 5))
def test_arrive_batch_is_its_reference(events, grace, out_of_orderness, watermark, w0,
                                       last_close, seq):
    """The compiled arrival pass against the rules' own composition, at int64's ends too
    (wrapping as numpy's int64 does): kills a watermark taken after the event instead of
    before it, a cursor or late flag off by the grace, and a lost ``external`` mode."""
    config = EngineConfig(gap_ms=10, grace_ms=grace, inclusive_gap=False,
                          max_out_of_orderness_ms=out_of_orderness, watermark=watermark,
                          cache_max_sessions=0)
    keeper = TimeKeeper(config)
    if w0 is not None:
        keeper.watermark = w0
    if last_close is not None:
        keeper.last_close = last_close
    keeper.seq = seq
    times = np.array([t for t, _ in events], dtype=np.int64)
    with np.errstate(over="ignore"):
        ends = times + np.array([g for _, g in events], dtype=np.int64)
    fast = keeper.arrive_batch(times, ends)
    with np.errstate(over="ignore"):
        slow = keeper.arrive_batch_reference(times, ends)
    for got, want in zip(fast, slow, strict=True):
        assert got.dtype == want.dtype
        assert got.tolist() == want.tolist()
