"""Property tests of the engine against an offline reference sessionizer."""

from __future__ import annotations

from typing import Any
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from sessionstore import (
    EmitStrategy,
    InMemorySessionStore,
    SessionAggregator,
    SessionWindows,
    aggregations,
)
from sessionstore import engine as engine_module
from sessionstore.timeutil import INT64_MAX

KEYS = st.sampled_from(["a", "b", "c"])


@st.composite
def streams(draw: st.DrawFn) -> tuple[int, bool, list[tuple[str, int, int]]]:
    """(gap, inclusive_gap, events) where events are (key, value, t) in arrival order."""
    gap = draw(st.integers(1, 30))
    inclusive = draw(st.booleans())
    times = draw(st.lists(st.integers(-100, 300), max_size=40))
    events = [(draw(KEYS), i, t) for i, t in enumerate(times)]
    return gap, inclusive, draw(st.permutations(events))


def feed(engine: SessionAggregator, events: list, batched: bool) -> list[Any]:
    """Every event (one batch, or one at a time), then the watermark past everything."""
    out = []
    if batched and events:
        keys, values, times = zip(*events, strict=True)
        out.extend(engine.process_batch(list(keys), list(values), list(times)))
    else:
        for key, value, t in events:
            out.extend(engine.process(key, value, t))
    out.extend(engine.advance_watermark(INT64_MAX))
    return out


def reference(events: list[tuple[str, int, int]], gap: int, inclusive: bool) -> list[tuple]:
    """Sort by time (ties by arrival), split where the gap is exceeded."""
    out = []
    for key in sorted({k for k, _, _ in events}):
        mine = sorted(
            ((t, arrival, v) for arrival, (k, v, t) in enumerate(events) if k == key)
        )
        current: list[tuple[int, int, int]] = []
        for item in mine:
            if current:
                distance = item[0] - current[-1][0]
                if distance > gap or (distance == gap and not inclusive):
                    out.append(_close(key, current, gap))
                    current = []
            current.append(item)
        if current:
            out.append(_close(key, current, gap))
    return sorted(out)


def _close(key: str, items: list[tuple[int, int, int]], gap: int) -> tuple:
    return (key, items[0][0], items[-1][0] + gap, len(items), [v for _, _, v in items])


def run_close_mode(events, gap, inclusive, aggregation, batched=False) -> list[Any]:
    windows = SessionWindows(gap, inclusive_gap=inclusive)
    # the watermark only moves at the end: retention must cover the whole stream (see
    # docs/semantics.md, "External watermarks and retention")
    store = InMemorySessionStore(retention_ms=10_000)
    engine = SessionAggregator(
        store, windows, aggregation, emit=EmitStrategy.ON_WINDOW_CLOSE, watermark="external"
    )
    return feed(engine, events, batched)


@settings(max_examples=150)
@given(streams())
def test_final_sessions_equal_offline_reference(stream):
    gap, inclusive, events = stream
    agg = aggregations.combine({"n": aggregations.count(), "values": aggregations.collect()})
    emits = run_close_mode(events, gap, inclusive, agg)
    got = sorted(
        (e.session.key, e.session.start, e.session.end, e.value["n"], e.value["values"])
        for e in emits
    )
    assert got == reference(events, gap, inclusive)
    assert all(e.timestamp == e.session.end - 1 and e.pane is None for e in emits)


@settings(max_examples=100)
@given(streams())
def test_merger_fold_equals_recomputing_from_raw_events(stream):
    gap, inclusive, events = stream
    custom = aggregations.aggregate(
        lambda: [0, 0],
        lambda key, value, agg: [agg[0] + 1, agg[1] + value * value],
        lambda key, a, b: [a[0] + b[0], a[1] + b[1]],
    )
    emits = run_close_mode(events, gap, inclusive, custom)
    got = sorted((e.session.key, e.session.start, e.session.end, *e.value) for e in emits)
    want = sorted(
        (key, start, end, n, sum(v * v for v in values))
        for key, start, end, n, values in reference(events, gap, inclusive)
    )
    assert got == want


@st.composite
def live_streams(draw: st.DrawFn):
    gap = draw(st.integers(1, 30))
    grace = draw(st.integers(0, 20))
    ooo = draw(st.integers(0, 15))
    times = draw(st.lists(st.integers(0, 400), max_size=50))
    # mostly increasing, with some disorder
    events = [(draw(KEYS), i, t) for i, t in enumerate(sorted(times))]
    swaps = draw(st.lists(st.tuples(st.integers(0, 49), st.integers(0, 49)), max_size=10))
    for i, j in swaps:
        if i < len(events) and j < len(events):
            events[i], events[j] = events[j], events[i]
    emit = draw(st.sampled_from(list(EmitStrategy)))
    inclusive = draw(st.booleans())
    return gap, grace, ooo, inclusive, emit, events


def run_live(params, events, batched, on_late=None):
    gap, grace, ooo, inclusive, emit, _ = params
    windows = SessionWindows(gap, grace, inclusive)
    store = InMemorySessionStore(retention_ms=windows.retention_ms + ooo,
                                 segment_interval_ms=max(1, gap))
    agg = aggregations.combine({
        "values": aggregations.collect(), "sum": aggregations.sum_of(),
        "min": aggregations.min_of(), "max": aggregations.max_of(),
        "first": aggregations.first_of(), "last": aggregations.last_of(),
    })
    engine = SessionAggregator(store, windows, agg, emit=emit,
                               max_out_of_orderness_ms=ooo, on_late=on_late)
    return feed(engine, events, batched)


@settings(max_examples=300)
@given(live_streams())
def test_process_batch_equals_a_loop_of_process(params):
    events = params[-1]
    loop = run_live(params, events, batched=False)
    assert run_live(params, events, batched=True) == loop
    with mock.patch.object(engine_module, "_MIN_RUN_BATCH", 1):  # runs even for tiny batches
        assert run_live(params, events, batched=True) == loop


@settings(max_examples=150)
@given(streams(), st.booleans())
def test_runs_path_equals_the_loop_with_external_watermark(stream, advance):
    gap, inclusive, events = stream
    agg = aggregations.combine({"n": aggregations.count(), "values": aggregations.collect()})
    windows = SessionWindows(gap, 3, inclusive)

    def run(batched: bool) -> list[Any]:
        store = InMemorySessionStore(retention_ms=windows.retention_ms,
                                     segment_interval_ms=max(1, gap))
        engine = SessionAggregator(store, windows, agg, emit=EmitStrategy.ON_WINDOW_CLOSE,
                                   watermark="external")
        out = engine.advance_watermark(50) if advance else []
        half = len(events) // 2
        for part in (events[:half], events[half:]):
            if batched and part:
                keys, values, times = zip(*part, strict=True)
                out += engine.process_batch(list(keys), list(values), list(times))
            else:
                for key, value, t in part:
                    out += engine.process(key, value, t)
            out += engine.advance_watermark(engine.watermark + 40)
        return out + engine.advance_watermark(INT64_MAX)

    loop = run(False)
    with mock.patch.object(engine_module, "_MIN_RUN_BATCH", 1):
        assert run(True) == loop


@settings(max_examples=150)
@given(live_streams())
def test_late_events_never_change_the_output(params):
    events = params[-1]
    late: list[int] = []
    with_late = run_live(params, events, False, on_late=lambda k, v, t: late.append(v))
    without = run_live(params, [e for e in events if e[1] not in set(late)], False)
    assert with_late == without


@settings(max_examples=100)
@given(live_streams())
def test_close_mode_emits_each_session_once_and_only_closed(params):
    gap, grace, ooo, inclusive, _, events = params
    params = (gap, grace, ooo, inclusive, EmitStrategy.ON_WINDOW_CLOSE, events)
    emits = run_live(params, events, False)
    sessions = [e.session for e in emits]
    assert len(sessions) == len(set(sessions))
    ends = [s.end for s in sessions]
    assert ends == sorted(ends)
