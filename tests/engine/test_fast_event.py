"""The fused event step (sessionstore/engine/fast_event.py) against the chain of calls it
replaces (the class's ``process``): the same emits, counters, stored sessions and committed
state, step by step, over configurations varied as hard as the input (cache sizes 1, 2 and
large, 1 ms segments, minimum retention, both watermark modes and gap conventions, both emit
strategies, count and custom aggregations, commits and aborts, late and rejected events).

The oracle comparison of the event path is in test_engine_properties.py; this test pins the
fused step to the full step, which is the definition it must keep."""

from __future__ import annotations

import decimal
from typing import Any

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
from sessionstore.engine import required_retention_ms
from sessionstore.timeutil import INT64_MAX
from tests.strategies import engine_configs, engine_steps

AGGREGATIONS = {
    "count": aggregations.count,
    "sum": aggregations.sum_of,
    "combined": lambda: aggregations.combine(
        {"n": aggregations.count(), "values": aggregations.collect()}),
}


def _engine(cfg: dict[str, Any], emit: EmitStrategy, agg: str) -> SessionAggregator:
    windows = SessionWindows(cfg["gap"], cfg["grace"], cfg["inclusive"])
    retention = required_retention_ms(windows, cfg["ooo"], cfg["watermark"])
    store = InMemorySessionStore(retention_ms=retention + cfg["extra_retention"],
                                 segment_interval_ms=cfg["segment"])
    return SessionAggregator(store, windows, AGGREGATIONS[agg](), emit=emit,
                             watermark=cfg["watermark"], max_out_of_orderness_ms=cfg["ooo"],
                             cache_max_sessions=cfg["cache"])


def _counters(engine: SessionAggregator) -> dict[str, float]:
    return {name: value for name, value in engine.metrics.items()
            if not name.endswith(("-rate", "-latency-avg", "-latency-max"))
            or name.startswith("emit-final-latency")}


def _fused(engine: SessionAggregator) -> bool:
    """Whether the engine's ``process`` is the fused step (a closure), not the core's method
    (the engine installs one of them on itself, so that a call costs no layer)."""
    return not hasattr(vars(engine)["process"], "__self__")


def _call(process: Any, *args: Any) -> tuple[str, Any]:
    try:
        return "ok", process(*args)
    except (TypeError, ValueError) as exc:
        return type(exc).__name__, str(exc)


@given(cfg=engine_configs(), steps=engine_steps(max_events=60),
       emit=st.sampled_from([EmitStrategy.ON_WINDOW_CLOSE, EmitStrategy.ON_WINDOW_UPDATE]),
       agg=st.sampled_from(sorted(AGGREGATIONS)),
       odd=st.lists(st.sampled_from([None, "float", "bad value", "bool key", "far"]),
                    min_size=1, max_size=8))
def test_the_fused_step_equals_the_full_step(cfg: dict[str, Any], steps: list[Any],
                                             emit: EmitStrategy, agg: str,
                                             odd: list[Any]) -> None:
    fused = _engine(cfg, emit, agg)
    full = _engine(cfg, emit, agg)
    uses_fused = _fused(fused)
    assert uses_fused == (cfg["cache"] > 0)  # the fused step is installed where it applies
    keys: set[Any] = set()
    for i, step in enumerate(steps):
        kind = step[0]
        if kind == "event":
            key, value, t = step[1:4]
            twist = odd[i % len(odd)]
            if agg == "sum" and value is not None and twist == "float":
                value = value + 0.5
            elif twist == "bad value":
                value = decimal.Decimal(1)
            elif twist == "bool key":
                key = True
            elif twist == "far":
                t = INT64_MAX
            keys.add(key)
            got = _call(fused.process, key, value, t)
            want = _call(lambda *a: SessionAggregator.process(full, *a), key, value, t)
            assert got == want
        elif kind == "watermark":
            assert fused.advance_watermark(step[1]) == full.advance_watermark(step[1])
        elif kind == "commit":
            assert fused.commit(i) == full.commit(i)
        else:  # abort and reopen: both abort (a reopen is the abort's restore path)
            fused.abort()
            full.abort()
            assert _fused(fused) == uses_fused
        assert fused.watermark == full.watermark
        assert _counters(fused) == _counters(full)
    for key in keys:
        if key is not True:
            assert fused.sessions(key) == full.sessions(key)
    assert fused.advance_watermark(INT64_MAX) == full.advance_watermark(INT64_MAX)
    assert fused.commit("end") == full.commit("end")
    assert _counters(fused) == _counters(full)


def test_an_unencodable_value_changes_nothing_on_the_fused_step() -> None:
    store = InMemorySessionStore(retention_ms=1_000)
    engine = SessionAggregator(store, SessionWindows(10), aggregations.collect(),
                               emit=EmitStrategy.ON_WINDOW_CLOSE)
    assert _fused(engine)
    engine.process("k", 1, 5)
    with pytest.raises(TypeError, match="value"):
        engine.process("k", {1, 2}, 6)
    assert engine.metrics["records-in"] == 1
    assert [s for s, _ in engine.sessions("k")] == [s for s, _ in engine.sessions("k")]
    emits = engine.advance_watermark(100)
    assert [(e.session.start, e.session.end, e.value) for e in emits] == [(5, 15, [1])]


@given(cfg=engine_configs(), steps=engine_steps(max_events=60))
def test_closing_from_the_cache_counts_finals_as_reading_the_store(
        cfg: dict[str, Any], steps: list[Any]) -> None:
    """Emit-on-close from the cache's memory (a cache) and from store reads (no cache): the same
    emits and the same emit-final counters (count, latency sum and maximum)."""
    cached = _engine({**cfg, "cache": 100_000}, EmitStrategy.ON_WINDOW_CLOSE, "count")
    direct = _engine({**cfg, "cache": 0}, EmitStrategy.ON_WINDOW_CLOSE, "count")
    for i, step in enumerate(steps):
        kind = step[0]
        if kind == "event":
            assert cached.process(*step[1:4]) == direct.process(*step[1:4])
        elif kind == "watermark":
            assert cached.advance_watermark(step[1]) == direct.advance_watermark(step[1])
        elif kind == "commit":
            cached.commit(i)
            direct.commit(i)
        else:
            cached.abort()
            direct.abort()
        got, want = cached.metrics, direct.metrics
        for name in ("emitted-records", "emit-final-records-total", "emit-final-latency-max",
                     "emit-final-latency-avg", "records-in", "dropped-records"):
            assert got[name] == want[name], name
    assert cached.advance_watermark(INT64_MAX) == direct.advance_watermark(INT64_MAX)
    assert cached.metrics["emit-final-latency-avg"] == direct.metrics["emit-final-latency-avg"]


@pytest.mark.parametrize("emit", [EmitStrategy.ON_WINDOW_CLOSE, EmitStrategy.ON_WINDOW_UPDATE])
@pytest.mark.parametrize("inclusive", [False, True])
@pytest.mark.parametrize("grace", [0, 3])
def test_a_session_ending_at_the_close_cursor_never_joins(emit: EmitStrategy, inclusive: bool,
                                                          grace: int) -> None:
    """The boundary the random steps rarely hit: an event at exactly ``W - grace`` touching a
    session that ends there (closed, so it must not join), on both steps."""
    cfg = {"gap": 10, "grace": grace, "inclusive": inclusive, "ooo": 0,
           "watermark": "external", "cache": 100_000, "segment": None, "extra_retention": 0}
    fused = _engine(cfg, emit, "count")
    full = _engine(cfg, emit, "count")
    steps: list[tuple[Any, ...]] = [("event", "k", 1, 0), ("watermark", 10 + grace),
                                    ("event", "k", 2, 10), ("event", "k", 3, 9 + grace),
                                    ("watermark", 30 + grace), ("event", "k", 4, 30)]
    for step in steps:
        if step[0] == "event":
            got = fused.process(*step[1:])
            assert got == SessionAggregator.process(full, *step[1:])
        else:
            assert fused.advance_watermark(step[1]) == full.advance_watermark(step[1])
        assert fused.sessions("k") == full.sessions("k")
    assert [s for s, _ in fused.sessions("k")] == [s for s, _ in full.sessions("k")]
    assert fused.advance_watermark(INT64_MAX) == full.advance_watermark(INT64_MAX)


STEPS_TO_TRACK = {
    # a grown session: a's view is loaded by the full step, then the fused step grows it
    "grown": [("event", "a", 0, 0), ("event", "b", 0, 0), ("event", "c", 0, 20),  # evicts
              ("event", "a", 0, 5),
              ("watermark", 10),  # b closes from the store: a ranged flush
              ("event", "a", 0, 12),  # the fused step grows a's NEW session
              ("watermark", 30)],
    # a written session changed in place: c's view is loaded (its session CLEAN) by the full
    # step, which opens another session beside it
    "changed": [("event", "a", 0, 0), ("event", "b", 0, 0), ("event", "c", 0, 20),  # evicts
                ("watermark", 10),  # a and b close from the store: a ranged flush
                ("event", "c", 0, 50),
                ("event", "c", 0, 20),  # the fused step: c's CLEAN [20, 30), same bounds
                ("watermark", 30)],
    # a written session replaced: its removal must reach the store before the close reads it
    "replaced": [("event", "a", 0, 0), ("event", "b", 0, 0), ("event", "c", 0, 20),  # evicts
                 ("watermark", 10),  # a and b close from the store: a ranged flush
                 ("event", "c", 0, 50),
                 ("event", "c", 0, 25),  # the fused step: c's CLEAN [20, 30) grows
                 ("watermark", 40)],
}
EMITTED = {"grown": [("b", 0, 10, 1), ("a", 0, 22, 3), ("c", 20, 30, 1)],
           "changed": [("a", 0, 10, 1), ("b", 0, 10, 1), ("c", 20, 30, 2)],
           "replaced": [("a", 0, 10, 1), ("b", 0, 10, 1), ("c", 20, 35, 2)]}


@pytest.mark.parametrize("case", sorted(STEPS_TO_TRACK))
def test_the_fused_step_tracks_its_changes_for_a_ranged_flush(case: str) -> None:
    """After an eviction the cache is not complete, so a close reads the store after a ranged
    flush, which writes only the changes it tracks: a session the fused step grew, changed in
    place from a written one, or replaced (its removal), must be among them, or the close
    misses it (or emits the replaced one too)."""
    cfg = {"gap": 10, "grace": 0, "inclusive": False, "ooo": 0, "watermark": "external",
           "cache": 2, "segment": None, "extra_retention": 0}
    fused = _engine(cfg, EmitStrategy.ON_WINDOW_CLOSE, "count")
    full = _engine(cfg, EmitStrategy.ON_WINDOW_CLOSE, "count")
    assert _fused(fused)
    emitted = []
    for step in STEPS_TO_TRACK[case]:
        if step[0] == "event":
            got = fused.process(*step[1:])
            assert got == SessionAggregator.process(full, *step[1:])
        else:
            got = fused.advance_watermark(step[1])
            assert got == full.advance_watermark(step[1])
        emitted += [(e.session.key, e.session.start, e.session.end, e.value) for e in got]
    assert emitted == EMITTED[case]


@pytest.mark.parametrize("emit", [EmitStrategy.ON_WINDOW_CLOSE, EmitStrategy.ON_WINDOW_UPDATE])
@pytest.mark.parametrize("inclusive", [False, True])
def test_touching_windows_join_only_under_the_inclusive_gap_on_both_steps(
        emit: EmitStrategy, inclusive: bool) -> None:
    """The gap convention at its boundary, which the random steps rarely hit: an event at a
    session's end, and one whose own window ends at a session's start, join it only with
    ``inclusive_gap`` (the fused step takes the convention from ``merge_bounds``, inline)."""
    cfg = {"gap": 10, "grace": 0, "inclusive": inclusive, "ooo": 0, "watermark": "external",
           "cache": 100_000, "segment": None, "extra_retention": 0}
    fused = _engine(cfg, emit, "count")
    full = _engine(cfg, emit, "count")
    assert _fused(fused)
    for t in (10, 20, 0, 40, 29):  # 20 touches [10, 20); 0's window touches 10; 29 inside
        assert fused.process("k", 1, t) == SessionAggregator.process(full, "k", 1, t)
        assert fused.sessions("k") == full.sessions("k")
    got = [(s.start, s.end, value) for s, value in fused.sessions("k")]
    if inclusive:
        assert [(start, end) for start, end, _ in got] == [(0, 39), (40, 50)]
    else:
        assert [(start, end) for start, end, _ in got] == [(0, 10), (10, 20), (20, 39),
                                                           (40, 50)]
    assert fused.advance_watermark(INT64_MAX) == full.advance_watermark(INT64_MAX)
