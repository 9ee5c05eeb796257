"""A ``process_batch`` that fails changes nothing, with ``max_duration_ms`` too (issue 25): a key
whose events arrive out of order with a built-in aggregation takes the event step one event at a
time, and a value check failing at one of them (an int64 sum leaving its range, a minimum over
values that do not compare) must leave the store, the held keys, the counters, the watermark and
the output as they were before the call. The same batch without the bad value then gives the
oracle's answer. With a write cache too, whose evictions write and forward changes inside the
batch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import event, example, given, settings
from hypothesis import strategies as st

from sessionstore import (
    EmitStrategy,
    InMemorySessionStore,
    SessionAggregator,
    SessionStore,
    SessionWindows,
    aggregations,
)
from sessionstore.aggregations import SumOverflowError
from sessionstore.engine import max_duration_held
from sessionstore.timeutil import INT64_MAX
from tests import oracle

CLOSE = EmitStrategy.ON_WINDOW_CLOSE
UPDATE = EmitStrategy.ON_WINDOW_UPDATE
HALF = INT64_MAX // 2
COUNTERS = ("records-in", "dropped-records", "emitted-records", "emit-final-records-total")

# (aggregation, the batch's values, the error): the values at times 300, 100, 200 of one key;
# the event at 200 joins the other two into one session, whose fold fails
REPROS = [
    (aggregations.sum_of, [HALF, HALF, 5], SumOverflowError),
    (aggregations.min_of, [1, 2, "x"], TypeError),
    (aggregations.max_of, [1, 2, "x"], TypeError),
]


def counters(engine: SessionAggregator) -> dict[str, float]:
    metrics = engine.metrics
    return {name: metrics[name] for name in COUNTERS}


def last_values(out: list[Any]) -> list[tuple[Any, ...]]:
    """Each session's last delivered value, the retracted ones left out."""
    current: dict[Any, Any] = {}
    for e in out:
        if e.retraction:
            current.pop(e.session, None)
        else:
            current[e.session] = e.value
    return sorted((s.key, s.start, s.end, v) for s, v in current.items())


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
@pytest.mark.parametrize("emit", [CLOSE, UPDATE])
@pytest.mark.parametrize("repro", REPROS, ids=["sum", "min", "max"])
def test_a_failing_disordered_batch_changes_nothing(tmp_path: Path, backend: str,
                                                    emit: EmitStrategy, repro: Any) -> None:
    make_agg, values, error = repro
    windows = SessionWindows(100, grace_ms=8000, max_duration_ms=1000)
    store = (InMemorySessionStore(retention_ms=windows.retention_ms) if backend == "memory"
             else SessionStore(tmp_path / "s", retention_ms=windows.retention_ms))
    engine = SessionAggregator(store, windows, make_agg(), emit=emit)
    try:
        out = engine.process_batch(["j"], [7], np.array([0]))  # another key's session
        before = (counters(engine), engine.watermark, engine.sessions("j"), engine.recut_counts)
        with pytest.raises(error):
            engine.process_batch(["k"] * 3, values, np.array([300, 100, 200]))
        assert engine.sessions("k") == []  # not the two sessions the loop made before failing
        assert (counters(engine), engine.watermark, engine.sessions("j"),
                engine.recut_counts) == before
        engine.commit()  # what the store holds: the same after a reopen
        if backend == "rocksdb":
            store.close()
            store = SessionStore(tmp_path / "s", retention_ms=windows.retention_ms)
            engine = SessionAggregator(store, windows, make_agg(), emit=emit)
        assert engine.sessions("k") == []
        # the engine goes on as if the call never came (and emits nothing of it)
        out += engine.process_batch(["k"] * 2, values[:2], np.array([300, 100]))
        out += engine.advance_watermark(INT64_MAX)
        assert last_values(out) == [("j", 0, 100, 7), ("k", 100, 200, values[1]),
                                    ("k", 300, 400, values[0])]
        assert len(out) == 3  # with either emission: no other update or retraction
    finally:
        store.close()


def emits(out: list[Any]) -> list[tuple[Any, ...]]:
    return [(e.session, e.value, e.retraction) for e in out]


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
@pytest.mark.parametrize("cache", [0, 1, 4, 100_000])
@pytest.mark.parametrize("repro", REPROS, ids=["sum", "min", "max"])
def test_a_failing_batch_with_the_write_cache_changes_nothing(tmp_path: Path, backend: str,
                                                              cache: int, repro: Any) -> None:
    # the write cache takes ON_WINDOW_UPDATE only. Its size decides when it writes and
    # forwards: 0 at every change, 1 at nearly every step (an eviction inside the batch, before
    # the failing event), large only at the end; with 4 it holds the changes cached before the
    # call (from the event path: "p", another key's new session, and of "k", the batch's key,
    # the removal of its delivered [2000, 2100) and the new [2000, 2150)) until the batch's
    # second step evicts them with the batch's first. "j" has a delivered session
    make_agg, values, error = repro
    windows = SessionWindows(100, grace_ms=8000, max_duration_ms=1000)
    stores: list[Any] = []

    def build(name: str) -> SessionAggregator:
        store = (InMemorySessionStore(retention_ms=windows.retention_ms) if backend == "memory"
                 else SessionStore(tmp_path / name, retention_ms=windows.retention_ms))
        stores.append(store)
        return SessionAggregator(store, windows, make_agg(), emit=UPDATE, write_cache=True,
                                 cache_max_sessions=cache)

    failing, twin = build("failing"), build("twin")
    try:
        out = {}
        for name, engine in (("failing", failing), ("twin", twin)):
            out[name] = engine.process_batch(["j"], [7], np.array([0]))
            out[name] += engine.process("p", values[1], 50)
            out[name] += engine.process_batch(["k"], [1], np.array([2000]))
            out[name] += engine.process("k", 1, 2050)  # [2000, 2100) becomes [2000, 2150)
        before = (counters(failing), failing.watermark)
        with pytest.raises(error):
            failing.process_batch(["k"] * 3, values, np.array([300, 100, 200]))
        assert (counters(failing), failing.watermark) == before
        for name, engine in (("failing", failing), ("twin", twin)):
            # not the two sessions the loop made first
            assert [s[:] for s, _ in engine.sessions("k")] == [("k", 2000, 2150)]
            out[name] += engine.process_batch(["k"] * 2, values[:2], np.array([300, 100]))
            out[name] += engine.advance_watermark(INT64_MAX) + engine.flush()
            engine.commit()
        # what the next calls deliver: the same as from an engine that never saw the call,
        # with nothing of the failing batch (no update or retraction of its sessions); with
        # 4, the changes cached before the call that the failing batch's eviction wrote come
        # with the next call, ahead of that call's own eviction
        if cache == 4:
            assert sorted(emits(out["failing"]), key=repr) == sorted(emits(out["twin"]), key=repr)
        else:
            assert emits(out["failing"]) == emits(out["twin"])
        assert last_values(out["failing"]) == [
            ("j", 0, 100, 7), ("k", 100, 200, values[1]), ("k", 300, 400, values[0]),
            ("k", 2000, 2150, 2 if make_agg is aggregations.sum_of else 1),
            ("p", 50, 150, values[1])]
        assert counters(failing) == counters(twin)
        assert [failing.sessions(key) for key in "jkp"] == [twin.sessions(key) for key in "jkp"]
    finally:
        for store in stores:
            store.close()


@pytest.mark.parametrize("emit", [CLOSE, UPDATE])
def test_an_event_added_in_place_is_taken_out_again(emit: EmitStrategy) -> None:
    # [0, 25) holds 0, 10, 20 (gap 15, maximum duration 25). The batch's event at 5 is inside
    # it and reaches no further: an int sum adds it in place, into the stored record's events;
    # the event at 12 then leaves int64. A later event at -10 re-cuts the chain and folds
    # [-10, 15) from its events: with the event at 5 left in them (an undo that forgets the
    # in-place insertion), its sum is 2 too large
    windows = SessionWindows(15, grace_ms=1000, max_duration_ms=25)
    engine = SessionAggregator(InMemorySessionStore(retention_ms=windows.retention_ms),
                               windows, aggregations.sum_of(), emit=emit)
    out = engine.process_batch(["k"] * 3, [1, 1, 1], np.array([0, 10, 20]))
    with pytest.raises(SumOverflowError):
        engine.process_batch(["k"] * 2, [2, INT64_MAX], np.array([5, 12]))
    out += engine.process("k", 4, -10)
    out += engine.advance_watermark(INT64_MAX)
    assert last_values(out) == [("k", -10, 15, 6), ("k", 20, 35, 1)]


def test_held_keys_a_failing_batch_wrote_at_the_limit_are_held_again(monkeypatch) -> None:
    # a's event at -50 is held (before its session [0, 200)); with a limit of two held
    # events, b's second early event writes every held key (a's too) before it is re-cut,
    # and b's event at 30 then leaves int64. The undo holds a's event again, and indexes a
    # by its bound again (the write emptied that index): without it, closing would emit a's
    # stored session [0, 200) and never write [-50, 200)
    monkeypatch.setattr(max_duration_held, "HELD_EVENTS_LIMIT", 2)
    windows = SessionWindows(100, grace_ms=1000, max_duration_ms=1000)
    engine = SessionAggregator(InMemorySessionStore(retention_ms=windows.retention_ms),
                               windows, aggregations.sum_of(), emit=CLOSE)
    engine.process_batch(["a", "a", "a", "b", "b"], [1, 1, 1, 1, 1],
                         np.array([0, 50, 100, 0, 60]))
    engine.process("a", 1, -50)
    core = engine._core
    assert core.max_duration is not None and core.max_duration.held.events_held == 1
    with pytest.raises(SumOverflowError):
        engine.process_batch(["b", "b", "b"], [1, 1, INT64_MAX], np.array([-40, -45, 30]))
    held = core.max_duration.held
    assert list(held.by_key) == ["a"] and held.events_held == len(held.by_key["a"].events) == 1
    out = engine.advance_watermark(INT64_MAX)
    assert last_values(out) == [("a", -50, 200, 4), ("b", 0, 160, 2)]


GOOD_VALUES = st.integers(1, 1000)
BAD = {"sum": (aggregations.sum_of, INT64_MAX), "min": (aggregations.min_of, "x"),
       "max": (aggregations.max_of, "x")}
FOLD = {"sum": sum, "min": min, "max": max}


@st.composite
def disordered_batches(draw: st.DrawFn) -> list[tuple[str, int, int]]:
    """``(key, value, t)`` of one or two keys, shuffled within a few gaps' worth of time."""
    n = draw(st.integers(1, 25))
    keys = draw(st.sampled_from([["a"], ["a", "b"]]))
    base = sorted(draw(st.lists(st.integers(0, 300), min_size=n, max_size=n)))
    rows = [(draw(st.sampled_from(keys)), draw(GOOD_VALUES), t) for t in base]
    return draw(st.permutations(rows))


@st.composite
def configs(draw: st.DrawFn) -> dict[str, Any]:
    return {"gap": draw(st.integers(1, 40)), "md": draw(st.integers(1, 80)),
            "grace": draw(st.sampled_from([0, 5, 50, 1000])),
            "ooo": draw(st.sampled_from([0, 10, 100])), "inclusive": draw(st.booleans()),
            "cache": draw(st.sampled_from([None, None, 0, 1, 3, 100_000]))}


def build(cfg: dict[str, Any], agg_name: str, emit: EmitStrategy) -> SessionAggregator:
    """``cfg["cache"]``: None, or with ``ON_WINDOW_UPDATE`` a write cache of that size."""
    windows = SessionWindows(cfg["gap"], cfg["grace"], cfg["inclusive"],
                             max_duration_ms=cfg["md"])
    store = InMemorySessionStore(retention_ms=windows.retention_ms + cfg["ooo"] + 10_000)
    cache = cfg.get("cache") if emit is UPDATE else None
    if cache is None:
        return SessionAggregator(store, windows, BAD[agg_name][0](), emit=emit,
                                 max_out_of_orderness_ms=cfg["ooo"])
    return SessionAggregator(store, windows, BAD[agg_name][0](), emit=emit,
                             max_out_of_orderness_ms=cfg["ooo"], write_cache=True,
                             cache_max_sessions=cache)


def feed(engine: SessionAggregator, rows: list[tuple[Any, Any, int]]) -> list[Any]:
    if not rows:
        return []
    keys, values, times = zip(*rows, strict=True)
    return engine.process_batch(list(keys), list(values), np.array(times, dtype=np.int64))


def emitted(out: list[Any]) -> list[tuple[Any, ...]]:
    return [(e.session, e.value, e.retraction) for e in out]


@settings(max_examples=60)
@given(configs(), disordered_batches(), disordered_batches(), st.data(),
       st.sampled_from(sorted(BAD)), st.sampled_from([CLOSE, UPDATE]))
@example(  # the repro: the event at 200 joins the sessions at 100 and 300
    {"gap": 100, "md": 1000, "grace": 1000, "ooo": 0, "inclusive": True}, [],
    [("k", 2, 300), ("k", 3, 100)], None, "sum", CLOSE)
@example(  # the same with a write cache that evicts at the batch's second step
    {"gap": 100, "md": 1000, "grace": 1000, "ooo": 0, "inclusive": True, "cache": 1}, [],
    [("k", 2, 300), ("k", 3, 100)], None, "sum", UPDATE)
def test_an_injected_failure_changes_nothing(cfg: dict[str, Any],
                                             prior: list[tuple[str, int, int]],
                                             batch: list[tuple[str, int, int]],
                                             data: st.DataObject | None, agg_name: str,
                                             emit: EmitStrategy) -> None:
    """A bad value, at the time of one of the batch's events (so in its session), put at a
    random place of a disordered batch: the batch raises iff a loop of ``process`` raises, and
    when it does, the engine afterwards is indistinguishable from one that never saw the
    call (every later emit, counter and session), and the same batch without the bad value
    gives the oracle's sessions.

    With a write cache that may evict (sizes 1 and 3), the failing batch leaves it holding
    other keys (an eviction forgets every key, and the batch's keys are read): later
    evictions may then come at other points, so later calls deliver the same sessions and
    values, and may deliver intermediate updates at other points."""
    if data is None:  # the example: the bad value at 200, last
        at, partner = len(batch), ("k", 0, 200)
        batch = [*batch, partner]
    else:
        at = data.draw(st.integers(0, len(batch)))
        partner = data.draw(st.sampled_from(batch))
    bad_value = BAD[agg_name][1]
    bad_row = (partner[0], bad_value, partner[2])
    bad_batch = [*batch[:at], bad_row, *batch[at:]]
    failing, twin, loop = (build(cfg, agg_name, emit) for _ in range(3))
    out_prior = feed(failing, prior)
    assert emitted(out_prior) == emitted(feed(twin, prior))
    for key, value, t in prior:
        loop.process(key, value, t)
    loop_error: type[BaseException] | None = None
    try:
        for key, value, t in bad_batch:
            loop.process(key, value, t)
    except (SumOverflowError, TypeError) as exc:
        loop_error = type(exc)
    before = (counters(failing), failing.watermark)
    event(f"the loop raises: {loop_error is not None}")
    if loop_error is None:  # the bad event was late (or its partner was): the batch is fine
        feed(failing, bad_batch)
        return
    with pytest.raises(loop_error):
        feed(failing, bad_batch)
    assert (counters(failing), failing.watermark) == before
    out_failing = feed(failing, batch) + failing.advance_watermark(INT64_MAX)
    out_twin = feed(twin, batch) + twin.advance_watermark(INT64_MAX)
    if emit is UPDATE and cfg.get("cache") in (1, 3):
        assert last_values(out_failing) == last_values(out_twin)
        assert ({**counters(failing), "emitted-records": 0}
                == {**counters(twin), "emitted-records": 0})
    else:
        assert emitted(out_failing) == emitted(out_twin)
        assert counters(failing) == counters(twin)
    steps = [("event", *row) for row in [*prior, *batch]]
    expected, _ = oracle.sessionize_max_duration(steps, cfg["gap"], cfg["md"], cfg["grace"],
                                                 cfg["inclusive"], cfg["ooo"])
    fold = FOLD[agg_name]
    want = sorted((key, start, end, fold(values)) for key, start, end, values in expected)
    assert last_values(out_prior + out_failing) == want



@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
@pytest.mark.parametrize("emit", [CLOSE, UPDATE])
def test_an_event_appended_in_place_is_taken_out_again(tmp_path: Path, backend: str,
                                                       emit: EmitStrategy) -> None:
    # The batch's key is disordered, so it takes the event step: its first event lands at the
    # end of the stored session [100, 200) and an int sum appends it to the stored record's
    # event list in place; the second is added inside; the third leaves int64. The undo must
    # take the appended event out of the record it puts back: left in, the next cut (the
    # third batch's chain passes the maximum duration, so the session's events are cut
    # again) would count it (kills logging only the inserts inside a session for the undo).
    chain = list(range(240, 1300, 90))

    def run(fail: bool) -> tuple[list[tuple[Any, ...]], Any]:
        windows = SessionWindows(100, grace_ms=8000, max_duration_ms=1000)
        where = tmp_path / f"{fail}"
        store = (InMemorySessionStore(retention_ms=windows.retention_ms) if backend == "memory"
                 else SessionStore(where, retention_ms=windows.retention_ms))
        engine = SessionAggregator(store, windows, aggregations.sum_of(), emit=emit)
        try:
            out = engine.process_batch(["k"], [HALF], np.array([100]))
            if fail:
                with pytest.raises(SumOverflowError):
                    engine.process_batch(["k"] * 3, [HALF, 1, 5], np.array([180, 120, 130]))
            out += engine.process_batch(["k"] * (2 + len(chain)), [-HALF, 3] + [1] * len(chain),
                                        np.array([150, 110, *chain]))
            sessions = engine.sessions("k")
            out += engine.advance_watermark(10**6)
            return last_values(out), sessions
        finally:
            store.close()

    assert run(fail=True) == run(fail=False)
    values, _ = run(fail=False)
    first = [t for t in [100, 110, 150, *chain] if t < 1100]
    assert values[0] == ("k", 100, min(max(first) + 100, 1100), len(first))


@settings(max_examples=30)
@given(st.integers(0, 2**32 - 1), st.integers(2, 30), st.sampled_from([0, 1, 2, 3, 7]),
       st.integers(20, 200), st.sampled_from([0, 300, 1000]))
def test_batches_with_a_small_write_cache_emit_what_the_loop_emits(
        seed: int, n_keys: int, cache: int, batch_size: int, grace: int) -> None:
    """With a write cache that evicts (and forwards) inside a batch, ``process_batch`` emits
    exactly what a loop of ``process`` and a ``flush`` emit, batch after batch, over a dense
    stream of slightly disordered events: the batch reads each key as the loop's step does (a
    key first read below its event's "closed before" loads more sessions, and the cache then
    evicts at other points)."""
    rng = np.random.default_rng(seed)
    n = 500
    keys = [f"k{i}" for i in rng.integers(0, n_keys, n).tolist()]
    times = np.sort(rng.integers(0, n * 50, n)) + rng.integers(-300, 300, n)
    values = rng.integers(0, 100, n).tolist()
    windows = SessionWindows(100, grace_ms=grace, max_duration_ms=1000)

    def build_cached() -> SessionAggregator:
        return SessionAggregator(InMemorySessionStore(retention_ms=windows.retention_ms + 1000),
                                 windows, aggregations.sum_of(), emit=UPDATE, write_cache=True,
                                 cache_max_sessions=cache)

    batched, looped = build_cached(), build_cached()
    for a in range(0, n, batch_size):
        rows = range(a, min(a + batch_size, n))
        out_batch = batched.process_batch([keys[i] for i in rows], [values[i] for i in rows],
                                          times[a:a + batch_size])
        out_loop = [e for i in rows for e in looped.process(keys[i], values[i], int(times[i]))]
        assert emitted(out_batch) == emitted(out_loop + looped.flush())
    assert counters(batched) == counters(looped)
