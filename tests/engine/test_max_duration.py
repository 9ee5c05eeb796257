"""Maximum session duration (issue 12): the event path, the batch path (split anywhere),
``process_table`` and the independent oracle (``tests/oracle.py``) agree, and the result does
not depend on the arrival order within the allowed disorder."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from sessionstore import (
    AfterWatermark,
    EmitStrategy,
    InMemorySessionStore,
    SessionAggregator,
    SessionStore,
    SessionWindows,
    aggregations,
)
from sessionstore.engine import required_retention_ms
from sessionstore.engine.max_duration_state import own_window_end, own_window_ends
from sessionstore.timeutil import INT64_MAX, INT64_MIN
from tests import oracle
from tests.engine.test_engine_properties import (
    Driver,
    as_rows,
    changelog_table,
    check_table_path,
    cuts_strategy,
    dynamic_configs,
    dynamic_steps,
)
from tests.strategies import ENGINE_KEYS, engine_configs, engine_steps


@st.composite
def md_configs(draw: st.DrawFn, dynamic: bool = False) -> dict[str, Any]:
    """The engine property tests' adversarial configurations (fixed or, with ``dynamic``, per
    event gaps), plus a maximum duration from below the gap to well above it."""
    cfg = draw(dynamic_configs() if dynamic else engine_configs())
    cfg["md"] = draw(st.integers(1, 40))
    return cfg


@st.composite
def md_cases(draw: st.DrawFn) -> tuple[dict[str, Any], list[tuple[Any, ...]]]:
    """A configuration and steps; half of them with a gap per event (None, 0 and negative
    gaps included, which drop their event)."""
    cfg = draw(md_configs(dynamic=draw(st.booleans())))
    steps = draw(dynamic_steps(cfg["max_gap"]) if cfg.get("dynamic") else engine_steps())
    return cfg, steps


class MaxDurationDriver(Driver):
    """The property tests' driver, with ``max_duration_ms`` added to its windows."""

    def __init__(self, cfg: dict[str, Any], *args: Any, **kwargs: Any) -> None:
        super().__init__(cfg, *args, **kwargs)  # its engine is replaced below
        w = self.windows
        self.windows = SessionWindows(
            w.gap_fn if w.dynamic else w.gap_ms, w.grace_ms, w.inclusive_gap,
            max_gap_ms=w.max_gap_ms if w.dynamic else None, max_duration_ms=cfg["md"])
        retention = required_retention_ms(self.windows, cfg["ooo"], cfg["watermark"])
        self.store = InMemorySessionStore(retention_ms=retention + cfg["extra_retention"],
                                          segment_interval_ms=cfg["segment"])
        self.engine = self._engine()


def reference(cfg: dict[str, Any], steps: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    ooo = cfg["ooo"] if cfg["watermark"] == "event_time" else None
    gap = None if cfg.get("dynamic") else cfg["gap"]
    sessions, _ = oracle.sessionize_max_duration(steps, gap, cfg["md"], cfg["grace"],
                                                 cfg["inclusive"], ooo)
    return sessions


def check_bounds(cfg: dict[str, Any], rows: list[tuple[Any, ...]]) -> None:
    """No session spans more than the maximum duration (a check of the oracle, too)."""
    for _, start, end, values in rows:
        assert 0 < end - start <= cfg["md"] and values


CLOSE = EmitStrategy.ON_WINDOW_CLOSE
UPDATE = EmitStrategy.ON_WINDOW_UPDATE


def deliveries(emits: list[Any]) -> list[tuple[Any, ...]]:
    """A changelog without the updates that deliver a session's current value again (float
    values by their bits). A batch with ON_WINDOW_UPDATE emits what changed between before the
    batch and now; the event path's write cache also re-delivers a session that one event
    removed and a later one put back as it was (its events held by the batch path, which
    writes the key once: no such session shows)."""
    current: dict[Any, Any] = {}
    out = []
    for e in emits:
        value = repr(e.value) if not isinstance(e.value, dict) else repr(
            {k: v.hex() if isinstance(v, float) else v for k, v in e.value.items()})
        if e.retraction:
            current.pop(e.session, None)
        elif current.get(e.session) == value:
            continue
        else:
            current[e.session] = value
        out.append((e.session, value, e.retraction))
    return out


@given(md_cases(), cuts_strategy, st.none() | st.integers(0, 5))
@example(  # an early event re-anchors the chain: [12, 22) becomes [3, 13) and [15, 25)
    ({"gap": 20, "grace": 0, "inclusive": True, "ooo": 20, "watermark": "event_time",
      "cache": 0, "segment": 1, "extra_retention": 0, "md": 10},
     [("event", "a", 0, 12), ("event", "a", 1, 15), ("event", "a", 2, 22),
      ("event", "a", 3, 3)]),
    [False], None)
@example(  # per-event gaps: a long gap keeps the chain connected, the cap still cuts it
    ({"gap": 1, "grace": 0, "inclusive": False, "ooo": 0, "watermark": "external", "cache": 2,
      "segment": 1, "extra_retention": 0, "dynamic": "column", "max_gap": 25, "md": 8},
     [("event", "a", 0, 10, 25), ("event", "a", 1, 30, 1), ("event", "a", 2, 17, 2),
      ("event", "a", 3, 12, None), ("event", "a", 4, 2, 9), ("event", "a", 5, 18, 0)]),
    [True, False], 1)
def test_close_mode_event_path_batch_path_and_oracle_agree(case, cuts, bad_row):
    cfg, steps = case
    emits, effective = MaxDurationDriver(cfg, CLOSE, False, cuts).run(steps)
    want = reference(cfg, effective)
    check_bounds(cfg, want)
    assert as_rows(emits) == want
    assert len({e.session for e in emits}) == len(emits)  # each session once
    ends = [e.session.end for e in emits]
    assert ends == sorted(ends) or any(s[0] in ("abort", "reopen") for s in steps)
    batched, effective_b = MaxDurationDriver(cfg, CLOSE, True, cuts, bad_row=bad_row).run(steps)
    assert effective_b == effective
    assert batched == emits


@given(md_cases(), cuts_strategy)
def test_update_mode_changelogs_rebuild_the_oracle_sessions(case, cuts):
    cfg, steps = case
    plain, effective = MaxDurationDriver(cfg, UPDATE, False, cuts).run(steps)
    want = reference(cfg, effective)
    assert changelog_table(plain) == want
    small_cache, _ = MaxDurationDriver(cfg, UPDATE, False, cuts, write_cache=True).run(steps)
    assert changelog_table(small_cache) == want  # evictions forward early, correctly
    cached, _ = MaxDurationDriver({**cfg, "cache": 100_000}, UPDATE, False, cuts,
                                  write_cache=True).run(steps)
    batched, _ = MaxDurationDriver(cfg, UPDATE, True, cuts).run(steps)
    # the batch path is the event path with its (unbounded) write cache flushed per batch
    assert deliveries(batched) == deliveries(cached)


@given(md_cases(), cuts_strategy, st.sampled_from([CLOSE, UPDATE]))
def test_process_table_equals_process_batch_and_the_oracle(case, cuts, emit):
    cfg, steps = case
    check_table_path(cfg, steps, cuts, emit, MaxDurationDriver, reference)


@st.composite
def disordered(draw: st.DrawFn) -> tuple[dict[str, Any], list[tuple[Any, ...]],
                                         list[tuple[Any, ...]]]:
    """A configuration, events in time order, and the same events in an arrival order whose
    disorder stays within ``max_out_of_orderness_ms`` (each event arrives before the watermark
    passes it), with commits (and reopens right after them) mixed in."""
    cfg = draw(md_configs())
    cfg["watermark"] = "event_time"
    n = draw(st.integers(0, 40))
    times = sorted(draw(st.lists(st.integers(-50, 300), min_size=n, max_size=n)))
    events = [(draw(ENGINE_KEYS), i, t) for i, t in enumerate(times)]
    seed = draw(st.integers(0, 2**32 - 1))
    rng = random.Random(seed)
    # sorting by t + u with u in [0, ooo] moves an event at most ooo behind any earlier one
    jitter = [rng.randint(0, cfg["ooo"]) for _ in events]
    order = sorted(range(n), key=lambda i: (events[i][2] + jitter[i], i))
    steps: list[tuple[Any, ...]] = []
    for i in order:
        steps.append(("event", *events[i]))
        extra = draw(st.sampled_from([None] * 6 + ["commit", "reopen"]))
        if extra == "commit":
            steps.append(("commit",))
        elif extra == "reopen":
            steps += [("commit",), ("reopen",)]
    return cfg, events, steps


@given(disordered(), cuts_strategy, st.sampled_from([CLOSE, UPDATE]), st.booleans())
def test_arrival_order_within_the_disorder_does_not_change_the_result(case, cuts, emit,
                                                                      batched):
    cfg, events, steps = case
    arrived = [s[1:] for s in steps if s[0] == "event"]  # ties in time go by arrival
    want = oracle.offline_max_duration(arrived, cfg["gap"], cfg["md"], cfg["inclusive"])
    emits, effective = MaxDurationDriver(cfg, emit, batched, cuts).run(steps)
    assert len(effective) == len(events)  # nothing lost, nothing late
    rows = as_rows(emits) if emit is CLOSE else changelog_table(emits)
    assert rows == want
    in_order, _ = MaxDurationDriver(cfg, emit, batched, cuts).run(
        [("event", *e) for e in events])
    in_order_rows = as_rows(in_order) if emit is CLOSE else changelog_table(in_order)
    assert in_order_rows == oracle.offline_max_duration(events, cfg["gap"], cfg["md"],
                                                        cfg["inclusive"])
    # the same sessions whatever the order; only the order of equal-time values may differ
    assert [r[:3] for r in in_order_rows] == [r[:3] for r in rows]
    assert [sorted(r[3]) for r in in_order_rows] == [sorted(r[3]) for r in rows]


@given(md_configs(), st.lists(st.tuples(ENGINE_KEYS, st.integers(-50, 300)), max_size=40),
       st.randoms(use_true_random=False))
def test_any_permutation_gives_the_offline_answer_before_the_watermark_moves(cfg, events,
                                                                             rng):
    cfg = {**cfg, "watermark": "external"}
    events = [(k, i, t) for i, (k, t) in enumerate(events)]
    shuffled = list(events)
    rng.shuffle(shuffled)
    # arrival order breaks time ties: the oracle sees the shuffled order too
    want = oracle.offline_max_duration(shuffled, cfg["gap"], cfg["md"], cfg["inclusive"])
    for emit in (CLOSE, UPDATE):
        emits, _ = MaxDurationDriver(cfg, emit, False, [True]).run(
            [("event", *e) for e in shuffled])
        assert (as_rows(emits) if emit is CLOSE else changelog_table(emits)) == want


def worked_example_engine(store: Any, emit: EmitStrategy) -> SessionAggregator:
    windows = SessionWindows(gap_ms=20, max_duration_ms=10)
    return SessionAggregator(store, windows, aggregations.collect(), emit=emit,
                             watermark="external")


def test_the_worked_example_re_anchors_and_moves_events(tmp_path):
    """docs/semantics.md's example on RocksDB, across a commit and reopen."""
    windows = SessionWindows(gap_ms=20, max_duration_ms=10)
    store = SessionStore(str(tmp_path), retention_ms=windows.retention_ms)
    engine = worked_example_engine(store, UPDATE)
    out = []
    for value, t in [("a", 12), ("b", 15), ("c", 22)]:
        out += engine.process("k", value, t)
    engine.commit()
    store.close()
    store = SessionStore(str(tmp_path), retention_ms=windows.retention_ms)
    engine = worked_example_engine(store, UPDATE)
    assert [(s.start, s.end, v) for s, v in engine.sessions("k")] == [
        (12, 22, ["a", "b"]), (22, 32, ["c"])]
    out = engine.process("k", "d", 3)
    assert [(e.session.start, e.session.end, e.value, e.retraction) for e in out] == [
        (12, 22, ["a", "b"], True), (22, 32, ["c"], True),
        (3, 13, ["d", "a"], False), (15, 25, ["b", "c"], False)]
    store.close()


def test_lateness_caps_the_own_window_at_the_maximum_duration():
    windows = SessionWindows(gap_ms=100, max_duration_ms=10)
    late: list[int] = []
    engine = SessionAggregator(InMemorySessionStore(retention_ms=windows.retention_ms), windows,
                               aggregations.count(), emit=CLOSE,
                               on_late=lambda k, v, t: late.append(t))
    engine.process("k", 1, 50)
    engine.process("k", 1, 41)  # W = 50 < 41 + min(100, 10): kept, and it re-anchors [50, 60)
    engine.process("k", 1, 40)  # W = 50 >= 40 + 10 + 0: the session it forms alone is closed
    assert late == [40] and engine.metrics["dropped-records"] == 1
    out = engine.advance_watermark(INT64_MAX)
    assert [(e.session.start, e.session.end, e.value) for e in out] == [(41, 51, 2)]


def test_triggers_and_a_store_written_without_max_duration_are_refused():
    windows = SessionWindows(gap_ms=10, max_duration_ms=20)
    with pytest.raises(ValueError, match="max_duration_ms does not combine with trigger"):
        SessionAggregator(InMemorySessionStore(retention_ms=windows.retention_ms), windows,
                          aggregations.count(), trigger=AfterWatermark())
    store = InMemorySessionStore(retention_ms=windows.retention_ms)
    plain = SessionAggregator(store, SessionWindows(gap_ms=10), aggregations.count())
    plain.process("k", 1, 0)
    plain.commit()
    engine = SessionAggregator(store, windows, aggregations.count())
    with pytest.raises(ValueError, match="stored without max_duration_ms"):
        engine.process("k", 1, 5)
    assert [(s.start, s.end, v) for s, v in engine.sessions("k")] == [(0, 10, 1)]


def test_max_duration_validation():
    with pytest.raises(ValueError, match="max_duration_ms must be > 0"):
        SessionWindows(gap_ms=10, max_duration_ms=0)
    with pytest.raises(TypeError, match="max_duration_ms"):
        SessionWindows(gap_ms=10, max_duration_ms=[1])
    assert SessionWindows(gap_ms=10, max_duration_ms="12 hours").max_duration_ms == 43_200_000


def _no_merger(key: Any, a: Any, b: Any) -> Any:
    raise AssertionError("a maximum duration folds custom aggregations from their events")


CUSTOM = aggregations.combine({
    "n": aggregations.count(),
    # (time, value) pairs, appended in the order add() sees them: (time, arrival) order
    "values": aggregations.aggregate(list, lambda key, value, acc: [*acc, value], _no_merger),
})


@given(md_cases(), cuts_strategy, st.sampled_from([CLOSE, UPDATE]))
def test_custom_aggregations_are_folded_from_the_events_on_both_paths(case, cuts, emit):
    cfg, steps = case
    plain, effective = MaxDurationDriver(cfg, emit, False, cuts, aggregation=CUSTOM).run(steps)
    batched, _ = MaxDurationDriver(cfg, emit, True, cuts, aggregation=CUSTOM).run(steps)
    rows = as_rows(plain) if emit is CLOSE else changelog_table(plain)
    assert rows == reference(cfg, effective)
    if emit is CLOSE:
        assert batched == plain
    else:
        assert changelog_table(batched) == rows


def test_a_refused_accumulator_changes_nothing():
    """A custom accumulator msgpack cannot store is refused (TypeError naming the session)
    before any change: the key's sessions, their events and the counters stay as they were."""
    windows = SessionWindows(gap_ms=20, max_duration_ms=10)
    agg = aggregations.aggregate(
        list, lambda key, value, acc: [*acc, {1} if value == "bad" else value], _no_merger)
    engine = SessionAggregator(InMemorySessionStore(retention_ms=windows.retention_ms), windows,
                               agg, watermark="external", cache_max_sessions=2)
    engine.process("k", "a", 12)
    engine.process("k", "b", 15)
    before = [(tuple(s), v) for s, v in engine.sessions("k")]
    with pytest.raises(TypeError, match=r"accumulator of Session\(key='k'"):
        engine.process("k", "bad", 3)  # would re-cut [12, 22) into [3, 13) and [15, 25)
    with pytest.raises(TypeError, match="accumulator"):
        engine.process("k", "bad", 16)  # would extend [12, 22) in place
    assert [(tuple(s), v) for s, v in engine.sessions("k")] == before
    assert engine.metrics["records-in"] == 2 + 2  # counted in, like the event path's refusals
    out = engine.process("k", "c", 3)
    assert [(e.session.start, e.session.end, e.value) for e in out if not e.retraction] == [
        (3, 13, ["c", "a"]), (15, 25, ["b"])]


@pytest.mark.parametrize("max_duration_ms", [1, 2, 7, 1 << 40, 1 << 62])
def test_the_batch_form_of_the_capped_own_window_end_is_the_event_form(max_duration_ms: int
                                                                       ) -> None:
    """The batch path's late rule takes :func:`own_window_ends`, the event path's
    :func:`own_window_end`: both are ``t + min(gap, max_duration)`` (Python ints here, which
    never wrap), at int64's edges too. Kills an array form that adds ``t + max_duration``
    first (it wraps past INT64_MAX where an event's own window does not) and either form
    taking the larger end."""
    rng = random.Random(max_duration_ms)
    times: list[int] = []
    ends: list[int] = []
    for gap in (1, 2, 7, 1 << 40, 1 << 62):
        for t in (INT64_MIN, INT64_MIN + 1, -1, 0, 1, INT64_MAX - gap - 1, INT64_MAX - gap,
                  *(rng.randint(INT64_MIN, INT64_MAX - gap) for _ in range(20))):
            times.append(t)
            ends.append(t + gap)
    want = [t + min(end - t, max_duration_ms) for t, end in zip(times, ends, strict=True)]
    assert [own_window_end(t, end, max_duration_ms)
            for t, end in zip(times, ends, strict=True)] == want
    got = own_window_ends(np.array(times, dtype=np.int64), np.array(ends, dtype=np.int64),
                          max_duration_ms)
    assert got.dtype == np.int64 and got.tolist() == want


def test_the_maximum_duration_modules_import_only_the_ones_before_them() -> None:
    """The order :mod:`sessionstore.engine.max_duration` states (state, order, write, held,
    step, undo, batch, then the façade): a part that imports a later one (the held keys calling back
    into the event step, say) fails here before it can form a circle elsewhere."""
    from tests.engine.test_imports import engine_imports

    layers = ["max_duration_state", "max_duration_order", "max_duration_write",
              "max_duration_held", "max_duration_step", "max_duration_undo", "max_duration_batch",
              "max_duration"]
    edges = engine_imports()
    assert {name for name in edges if name.startswith("max_duration")} == set(layers)
    for i, name in enumerate(layers):
        assert edges[name] & set(layers) <= set(layers[:i]), name
