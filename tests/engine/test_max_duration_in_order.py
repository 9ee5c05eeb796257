"""Maximum duration, the event path in time order (issue 25, item 3: any arrival order O(n log n)
per key): an event after every open event of its key extends the time-ordered fold of its
session by one ``add`` and appends to the session's events in place, so one long session fed
event by event costs O(1) amortised per event. It cost O(events in the session) per event: a
float sum copied the session's event list at every event (its accumulator check could refuse,
so the stored list was not touched), and a user function folded the whole session again.

Counted, not timed: calls of the user's functions, and the events copied out of stored event
lists (a list type that counts its slices and iterations, given to every record the step
writes)."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionstore import (
    EmitStrategy,
    InMemorySessionStore,
    SessionAggregator,
    SessionStore,
    SessionWindows,
    aggregations,
)
from sessionstore.engine import max_duration_write
from sessionstore.timeutil import INT64_MAX
from tests import oracle
from tests.engine.test_max_duration import CLOSE, UPDATE
from tests.engine.test_max_duration_disorder import left_fold  # the rule's float sum

AGGS = ["float sum", "reduce", "aggregate"]


class Tally(list[Any]):
    """A session's event list that counts the events read out of it by slices and whole
    iterations (a copy into a new list, or a fold over all of them)."""

    read = 0

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            got = super().__getitem__(index)
            Tally.read += len(got)
            return got
        return super().__getitem__(index)

    def __iter__(self) -> Any:
        Tally.read += len(self)
        return super().__iter__()


@pytest.fixture
def tallied(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every record the maximum-duration step writes keeps its events in a :class:`Tally`
    (the one it was given when it is one already: an append in place keeps it)."""
    plain = max_duration_write.record_with_events

    def tallying(acc: Any, events: list[Any], max_end_ms: int) -> list[Any]:
        return plain(acc, events if type(events) is Tally else Tally(events), max_end_ms)

    monkeypatch.setattr(max_duration_write, "record_with_events", tallying)
    Tally.read = 0


class Calls:
    """The user functions of ``reduce`` and ``aggregate``, counting their calls."""

    def __init__(self) -> None:
        self.count = 0

    def reduce(self, a: Any, b: Any) -> Any:
        self.count += 1
        return a + b

    def initializer(self) -> Any:
        self.count += 1
        return 0

    def aggregator(self, key: Any, value: Any, acc: Any) -> Any:
        self.count += 1
        return acc + value

    def merger(self, key: Any, a: Any, b: Any) -> Any:
        raise AssertionError("a maximum duration never merges accumulators")


def aggregation_of(kind: str, calls: Calls) -> aggregations.Aggregation:
    if kind == "float sum":
        return aggregations.sum_of()
    if kind == "reduce":
        return aggregations.reduce(calls.reduce)
    return aggregations.aggregate(calls.initializer, calls.aggregator, calls.merger)


def value_at(t: int) -> float:
    return t * 0.1 + 0.3  # rounds differently depending on the order of the adds


def run_in_order(n: int, kind: str, dynamic: bool, emit: EmitStrategy) -> tuple[int, int]:
    """``n`` events of one key 10 ms apart through ``process``, in time order (every tenth
    time twice: equal times join in arrival order), in one long session (and a second one
    after a cut by the maximum duration); checks the sessions and their values, bit for bit,
    against the oracle. Returns (user function calls, events copied or folded from stored
    lists plus the re-cut work the engine counts)."""
    calls = Calls()
    max_duration = n * 10 * 3 // 4
    windows = (SessionWindows(None, max_gap_ms=100, max_duration_ms=max_duration) if dynamic
               else SessionWindows(100, max_duration_ms=max_duration))
    engine = SessionAggregator(InMemorySessionStore(retention_ms=windows.retention_ms + 100),
                               windows, aggregation_of(kind, calls), emit=emit,
                               max_out_of_orderness_ms=100)
    times = [i * 10 - (i % 10 == 9) * 10 for i in range(n)]
    events: list[tuple[Any, ...]] = []
    out = []
    Tally.read = 0
    for t in times:
        gap = 100 - t % 3 if dynamic else None
        events.append(("k", value_at(t), t, 100 if gap is None else gap))
        out += engine.process("k", value_at(t), t, gap_ms=gap)
    out += engine.advance_watermark(INT64_MAX)
    want = oracle.offline_max_duration(events, 100, max_duration)  # in order: nothing late
    assert len(want) == 2
    final: dict[tuple[int, int], Any] = {}
    for e in out:  # with ON_WINDOW_UPDATE, the last delivery of each session left standing
        if e.retraction:
            final.pop((e.session.start, e.session.end), None)
        else:
            final[(e.session.start, e.session.end)] = e.value.hex()
    assert sorted(final.items()) == [((s, e), left_fold(vs).hex()) for _, s, e, vs in want]
    counts = engine.recut_counts
    return calls.count, Tally.read + counts["events"] + counts["steps"]


@pytest.mark.parametrize("emit", [CLOSE, UPDATE], ids=["close", "update"])
@pytest.mark.parametrize("dynamic", [False, True], ids=["fixed gap", "gap per event"])
@pytest.mark.parametrize("kind", AGGS)
def test_an_in_order_long_session_costs_one_add_per_event(tallied, kind, dynamic, emit):
    # kills: a float sum copying the session's event list at every event (its accumulator
    # check could refuse, so the stored list was not touched: 313,000 and 1,251,000 events
    # copied at 1,000 and 2,000 events, a session of 750 or 1,500 and one of 250 or 500);
    # a user function folding the whole session again at every event (reduce: 312,000 and
    # 1,249,000 calls, aggregate 314,000 and 1,253,000, each with as many events re-cut).
    # Now: one call per event (reduce: one fewer per session, whose first value starts it;
    # aggregate: one more, its initializer), no event copied (closing reads each once)
    for n in (1_000, 2_000):
        calls, copied = run_in_order(n, kind, dynamic, emit)
        assert calls == {"float sum": 0, "reduce": n - 2, "aggregate": n + 2}[kind]
        assert copied <= n  # (closing reads each event once)


class Mutating:
    """An ``aggregate`` whose aggregator changes the accumulator it is given (a dict), then
    refuses the value "bad" (raising) or makes the accumulator unstorable ("set")."""

    @staticmethod
    def initializer() -> Any:
        return {"n": 0, "s": 0.0}

    @staticmethod
    def aggregator(key: Any, value: Any, acc: Any) -> Any:
        acc["n"] += 1
        if value == "bad":
            raise ValueError("bad value")
        if value == "set":
            acc["s"] = {1}
            return acc
        acc["s"] += value
        return acc

    @staticmethod
    def merger(key: Any, a: Any, b: Any) -> Any:
        raise AssertionError("a maximum duration never merges accumulators")


@pytest.mark.parametrize("emit", [CLOSE, UPDATE], ids=["close", "update"])
def test_a_failing_user_function_at_an_in_order_event_changes_nothing(emit):
    # the in-order add is given a copy of the stored accumulator, and the event is appended
    # only after the add and the accumulator check passed. Kills: the add given the stored
    # accumulator itself (a failing aggregator that changed it leaves the session counting
    # an event it lacks: n 4, not 3; and with ON_WINDOW_UPDATE the update emitted before is
    # changed after the fact), and the event appended before the check (the refused event
    # stays among the session's events: the event before it, inside the session, folds it
    # again and fails too, or counts it)
    windows = SessionWindows(100, max_duration_ms=10_000)
    engine = SessionAggregator(InMemorySessionStore(retention_ms=windows.retention_ms + 100),
                               windows, aggregations.aggregate(
                                   Mutating.initializer, Mutating.aggregator, Mutating.merger),
                               emit=emit, max_out_of_orderness_ms=100, cache_max_sessions=8)
    out = [*engine.process("k", 1.5, 0), *engine.process("k", 2.0, 10)]
    delivered = [e.value for e in out]
    snapshot = repr(delivered)
    with pytest.raises(ValueError, match="bad value"):
        engine.process("k", "bad", 20)
    with pytest.raises(TypeError, match="accumulator"):
        engine.process("k", "set", 20)
    assert repr(delivered) == snapshot  # what was emitted stays as it was
    assert [(tuple(s), v) for s, v in engine.sessions("k")] == [
        (("k", 0, 110), {"n": 2, "s": 3.5})]
    out = [*engine.process("k", 0.25, 30), *engine.process("k", 4.0, 5)]  # 5: inside
    out += engine.advance_watermark(INT64_MAX)
    assert [(e.session.start, e.session.end, e.value) for e in out if not e.retraction][-1] \
        == (0, 130, {"n": 4, "s": 1.5 + 4.0 + 2.0 + 0.25})


@st.composite
def in_order_cases(draw: st.DrawFn) -> tuple[list[tuple[int, float, int | None]], int,
                                              bool, bool]:
    """Events of one key in time order (equal times too), each ``(t, value, gap or None)``,
    with a maximum duration and gap convention."""
    dynamic = draw(st.booleans())
    n = draw(st.integers(1, 60))
    deltas = draw(st.lists(st.integers(0, 30), min_size=n, max_size=n))
    times = [sum(deltas[:i + 1]) for i in range(n)]
    values = draw(st.lists(st.floats(-1e6, 1e6, allow_nan=False) | st.sampled_from(
        [0.1, 1e16, -1e16, 3.3]), min_size=n, max_size=n))
    gaps = draw(st.lists(st.integers(1, 40), min_size=n, max_size=n)) if dynamic else [None] * n
    return (list(zip(times, values, gaps, strict=True)), draw(st.integers(1, 120)),
            draw(st.booleans()), dynamic)


@settings(max_examples=60)
@given(in_order_cases(), st.sampled_from(AGGS), st.sampled_from([CLOSE, UPDATE]),
       st.lists(st.sampled_from(["commit", "abort", "reopen", "none"]), min_size=1,
                max_size=4))
def test_in_order_events_with_commits_aborts_and_reopens_equal_the_oracle(
        tmp_path_factory, case, kind, emit, controls):
    # real RocksDB files: in-order appends between commits; an abort drops the events since
    # the commit (their appends changed only the cache's records, which the abort forgets),
    # a reopen reads the committed records (decoded lists) and appends to them. The sessions
    # must equal the oracle over the events that were committed or not aborted, with float
    # sums bit-identical to the time-ordered left fold
    events, max_duration, inclusive, dynamic = case
    path = tmp_path_factory.mktemp("s")
    windows = (SessionWindows(None, inclusive_gap=inclusive, max_gap_ms=40,
                              max_duration_ms=max_duration) if dynamic
               else SessionWindows(25, inclusive_gap=inclusive, max_duration_ms=max_duration))

    def engine_on() -> SessionAggregator:
        return SessionAggregator(SessionStore(path, retention_ms=windows.retention_ms + 10_000),
                                 windows, aggregation_of(kind, Calls()), emit=emit,
                                 watermark="external")

    engine = engine_on()
    kept: list[tuple[Any, ...]] = []  # the oracle's steps for what survives
    since: list[tuple[Any, ...]] = []
    chunk = math.ceil(len(events) / len(controls))
    for i, control in enumerate(controls):
        for t, value, gap in events[i * chunk:(i + 1) * chunk]:
            engine.process("k", value, t, gap_ms=gap)
            since.append(("event", "k", value, t, 25 if gap is None else gap))
        if control == "commit":
            engine.commit({"i": i})
            kept += since
            since = []
        elif control == "abort":
            engine.abort()
            since = []
        elif control == "reopen":
            engine.commit({"i": i})
            kept += since
            since = []
            engine.store.close()
            engine = engine_on()
    kept += since
    want, _ = oracle.sessionize_max_duration(kept, 25, max_duration, 0, inclusive, None)
    got = sorted((s.start, s.end, v.hex()) for s, v in engine.sessions("k"))
    engine.store.close()
    assert got == [(s, e, left_fold(vs).hex()) for _, s, e, vs in want]
