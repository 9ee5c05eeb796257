"""Maximum duration under arrival disorder (issue 25, item 3): an event before every open
session of its key must not re-cut the key's open events when the cut cannot move, so a
newest-first key costs O(events), not O(events^2); a re-cut finds each session's end by binary
search, and a key's open sessions are not sorted again at every event. Counted, not timed:
``MaxDuration`` counts the events of the sessions its re-cuts write (``recut_events``) and the
steps they take one by one (``recut_steps``)."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionstore import (
    EmitStrategy,
    InMemorySessionStore,
    SessionAggregator,
    SessionWindows,
    aggregations,
)
from sessionstore.engine.max_duration import cut, cut_pieces
from sessionstore.timeutil import INT64_MAX
from tests import oracle
from tests.engine.test_engine_properties import as_rows, changelog_table, cuts_strategy
from tests.engine.test_max_duration import CLOSE, UPDATE, MaxDurationDriver, reference
from tests.strategies import engine_configs

DAY_MS = 86_400_000


def engine_for(gap: int, max_duration: int, lateness: int, aggregation=None,
               inclusive: bool = True, dynamic: bool = False) -> SessionAggregator:
    windows = (SessionWindows(None, inclusive_gap=inclusive, max_gap_ms=gap,
                              max_duration_ms=max_duration) if dynamic
               else SessionWindows(gap, inclusive_gap=inclusive, max_duration_ms=max_duration))
    return SessionAggregator(
        InMemorySessionStore(retention_ms=windows.retention_ms + lateness), windows,
        aggregation or aggregations.combine({"n": aggregations.count(),
                                             "values": aggregations.collect()}),
        emit=EmitStrategy.ON_WINDOW_CLOSE, max_out_of_orderness_ms=lateness)


def recut(engine: SessionAggregator) -> int:
    return engine.recut_counts["events"]


def steps(engine: SessionAggregator) -> int:
    return engine.recut_counts["steps"]


def test_recut_counts_start_at_zero_and_exist_only_with_a_maximum_duration() -> None:
    engine = engine_for(100, 1_000, 0)
    assert engine.recut_counts == {"events": 0, "steps": 0}
    windows = SessionWindows(100)
    plain = SessionAggregator(InMemorySessionStore(retention_ms=windows.retention_ms), windows,
                              aggregations.count())
    assert plain.recut_counts == {}


@pytest.mark.parametrize("layout", ["one session", "sessions apart"])
def test_a_newest_first_key_is_never_re_cut(layout):
    n = 20_000
    # one session: 10 ms apart, 100 ms gap, well inside a day; apart: groups of 50 events,
    # 1 s between groups
    times = ([i * 10 for i in range(n)] if layout == "one session"
             else [(i // 50) * 1_000 + (i % 50) * 10 for i in range(n)])
    engine = engine_for(100, DAY_MS, times[-1] + 1, aggregations.count())
    for t in reversed(times):
        engine.process("k", None, t)
    out = engine.advance_watermark(INT64_MAX)
    assert sum(e.value for e in out) == n
    assert len(out) == (1 if layout == "one session" else n // 50)
    assert recut(engine) <= 2 * n * math.log2(n)  # O(n log n); it re-cuts nothing here
    assert recut(engine) == 0


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("seed", range(12))
def test_disordered_keys_equal_the_oracle(seed, dynamic):
    rng = random.Random(seed)
    gap, max_duration = rng.choice([(10, 35), (10, 1_000), (25, 60), (5, 5)])
    inclusive = rng.random() < 0.5
    times = sorted(rng.randrange(0, 400) for _ in range(rng.randrange(1, 120)))
    order = rng.choice(["reversed", "shuffled", "mostly reversed"])
    if order == "reversed":
        times.reverse()
    elif order == "shuffled":
        rng.shuffle(times)
    else:
        times.reverse()
        for _ in range(len(times) // 10):
            i, j = rng.randrange(len(times)), rng.randrange(len(times))
            times[i], times[j] = times[j], times[i]
    keys = [rng.choice("ab") for _ in times]
    # with a gap per event, an event before a session may reach further than its events do
    gaps = [rng.randrange(1, gap + 1) if dynamic else gap for _ in times]
    engine = engine_for(gap, max_duration, 1_000, inclusive=inclusive, dynamic=dynamic)
    for i, (key, t, g) in enumerate(zip(keys, times, gaps, strict=True)):
        engine.process(key, i, t, gap_ms=g if dynamic else None)
    out = engine.advance_watermark(INT64_MAX)
    steps = [("event", key, i, t, g)
             for i, (key, t, g) in enumerate(zip(keys, times, gaps, strict=True))]
    expected, dropped = oracle.sessionize_max_duration(steps, None, max_duration, 0, inclusive,
                                                       1_000)
    assert not dropped
    got = sorted(((e.session.key, e.session.start, e.session.end, e.value["values"])
                  for e in out), key=lambda r: (repr(r[0]), r[1], r[2]))
    assert got == expected


def test_a_chain_re_cut_writes_every_session_behind_the_event():
    # newest first, 10 ms apart, a 100 ms maximum duration: each event moves the first event
    # of every open session, so every one of them is written again (the store must hold each
    # session's events; see docs/reliability.md): recut_events counts their events, which is
    # the copying that remains; the steps taken one by one stay O(sessions written)
    n = 200
    engine = engine_for(100, 100, n * 10, aggregations.count())
    for t in reversed(range(0, n * 10, 10)):
        engine.process("k", None, t)
    assert sum(e.value for e in engine.advance_watermark(INT64_MAX)) == n
    assert n * (n - 10) // 2 <= recut(engine) <= n * (n + 1) // 2
    sessions_written = sum(-(-(n - i) // 10) for i in range(n))  # ceil((n - i) / 10)
    assert steps(engine) <= 3 * sessions_written


def chained_newest_first(n: int, sessions: int = 8) -> int:
    """The re-cut steps of ``n`` events 10 ms apart, newest first, under a maximum duration
    that cuts them into a chain of ``sessions`` sessions (each newest-first event moves the
    first event of every session of the chain)."""
    engine = engine_for(100, n * 10 // sessions, n * 10, aggregations.count())
    for t in reversed(range(0, n * 10, 10)):
        engine.process("k", None, t)
    out = engine.advance_watermark(INT64_MAX)
    assert [e.value for e in out] == [n // sessions] * sessions
    return steps(engine)


def shuffled(n: int, max_duration: int | None) -> int:
    """The re-cut steps of ``n`` events 10 ms apart in a random order; ``max_duration`` None:
    a chain of 8 sessions."""
    times = list(range(0, n * 10, 10))
    random.Random(n).shuffle(times)
    engine = engine_for(100, max_duration or n * 10 // 8, n * 10, aggregations.count())
    for t in times:
        engine.process("k", None, t)
    out = engine.advance_watermark(INT64_MAX)
    assert sum(e.value for e in out) == n
    assert len(out) == (1 if max_duration else 8)
    return steps(engine)


def test_a_chained_newest_first_key_takes_steps_linear_in_its_events():
    # kills: a re-cut that scans the events of the sessions it reads (4.0x at twice the
    # events: O(n^2)), as it did before the binary search
    small, large = chained_newest_first(4_000), chained_newest_first(8_000)
    assert small > 0 and large <= 2.5 * small
    assert large <= 20 * 8_000


@pytest.mark.parametrize("max_duration", [DAY_MS, None])
def test_a_shuffled_key_takes_steps_near_linear_in_its_events(max_duration):
    # kills: sorting a key's open sessions again at every event (3.6x and 3.9x at twice the
    # events), as the step did before it kept their order
    small, large = shuffled(4_000, max_duration), shuffled(8_000, max_duration)
    assert small > 0 and large <= 2.5 * small


@st.composite
def piece_cases(draw: st.DrawFn) -> tuple[list[list[int]], int, int, bool, list[int]]:
    """Events with a fixed gap, cut by the rule into stored sessions, and a new event."""
    gap = draw(st.integers(1, 20))
    max_duration = draw(st.integers(1, 60))
    inclusive = draw(st.booleans())
    times = sorted(draw(st.lists(st.integers(0, 300), min_size=1, max_size=40)))
    events = [[t, i, t + gap, None] for i, t in enumerate(times)]
    t = draw(st.integers(-20, 320))
    return events, gap, max_duration, inclusive, [t, len(events), t + gap, None]


@given(piece_cases())
def test_the_binary_search_re_cut_equals_the_cut(case):
    # the engine's fixed-gap re-cut (cut_pieces) against the rule (cut), from the stored
    # session the new event falls into (or the first one) over all the sessions after it
    events, _, max_duration, inclusive, new = case
    stored = []
    low = 0
    for _, _, _, stop in cut(events, max_duration, inclusive):
        stored.append(events[low:stop])
        low = stop
    first = max(0, sum(1 for s in stored if s[0][0] <= new[0]) - 1)
    held = stored[first]
    pos = sum(1 for e in held if e[0] <= new[0])
    pieces = [p for p in (held[:pos], [new], held[pos:]) if p]
    after = stored[first + 1:]
    sessions, used, _ = cut_pieces(pieces, 1 if pos else 0, len(after), after.__getitem__,
                                   max_duration, inclusive)
    merged = [e for s in stored[first:first + 1 + used] for e in s]
    merged.insert(sum(1 for e in merged if e[0] <= new[0]), new)
    want = []
    low = 0
    for start, end, max_end, stop in cut(merged, max_duration, inclusive):
        want.append((start, end, max_end, merged[low:stop], any(e is new for e in
                                                                 merged[low:stop])))
        low = stop
    assert sessions == want
    # the sessions left as stored start where the new cut's last session ends, or later
    if first + 1 + used < len(stored):
        assert stored[first + 1 + used][0][0] >= sessions[-1][1]


@st.composite
def long_disorder(draw: st.DrawFn) -> tuple[dict[str, Any], list[tuple[Any, ...]]]:
    """Events spanning many maximum durations, arriving newest first, shuffled or mostly
    newest first, with a lateness that sometimes covers them all and sometimes not (late
    events are dropped), and watermark moves, commits, aborts and reopens between them."""
    cfg = draw(engine_configs())
    cfg["md"] = draw(st.integers(1, 30))
    n = draw(st.integers(1, 70))
    step = draw(st.integers(1, 8))
    times = [i * step + draw(st.integers(0, step)) for i in range(n)]
    order = draw(st.sampled_from(["reversed", "shuffled", "mostly reversed"]))
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    if order == "shuffled":
        rng.shuffle(times)
    else:
        times.reverse()
        if order == "mostly reversed":
            for _ in range(n // 8):
                i, j = rng.randrange(n), rng.randrange(n)
                times[i], times[j] = times[j], times[i]
    cfg["ooo"] = draw(st.sampled_from([0, cfg["md"], n * step // 2, n * step + 10]))
    steps_: list[tuple[Any, ...]] = []
    for i, t in enumerate(times):
        steps_.append(("event", draw(st.sampled_from(["a", "a", "a", "b"])), i, t))
        extra = draw(st.sampled_from([None] * 12 + ["watermark", "commit", "abort", "reopen"]))
        if extra == "watermark":
            steps_.append(("watermark", t - draw(st.integers(0, 40))))
        elif extra is not None:
            steps_.append((extra,))
    return cfg, steps_


@settings(max_examples=60)
@given(long_disorder(), cuts_strategy)
def test_long_disordered_chains_equal_the_oracle(case, cuts):
    cfg, steps_ = case
    emits, effective = MaxDurationDriver(cfg, CLOSE, False, cuts).run(steps_)
    assert as_rows(emits) == reference(cfg, effective)
    batched, effective_b = MaxDurationDriver(cfg, CLOSE, True, cuts).run(steps_)
    assert effective_b == effective and batched == emits
    updates, effective_u = MaxDurationDriver(cfg, UPDATE, False, cuts).run(steps_)
    assert changelog_table(updates) == reference(cfg, effective_u)


@pytest.mark.parametrize("max_duration", [DAY_MS, 10_000])
def test_a_shuffled_key_re_cuts_o_n_log_n_events(max_duration):
    # a re-cut reads the sessions after the one an event falls into only while the new cut
    # reaches them; before, it re-read every later open session (12.7 n log2 n events at 16k)
    n = 20_000
    times = list(range(0, n * 10, 10))
    random.Random(1).shuffle(times)
    engine = engine_for(100, max_duration, n * 10, aggregations.count())
    for t in times:
        engine.process("k", None, t)
    out = engine.advance_watermark(INT64_MAX)
    assert sum(e.value for e in out) == n
    assert len(out) == (1 if max_duration == DAY_MS else n * 10 // max_duration)
    assert recut(engine) <= 2 * n * math.log2(n)


def test_a_re_cut_stops_at_the_next_stored_session_its_scan_does_not_join():
    # exclusive gap: events 10 ms apart with a 10 ms gap are sessions of their own; a second
    # event at 0 re-cuts [0, 10) only: the stored session at 10 starts exactly at its run
    engine = engine_for(10, DAY_MS, 10_000, inclusive=False)
    for i, t in enumerate(range(0, 1_000, 10)):
        engine.process("k", i, t)
    engine.process("k", "again", 0)
    assert recut(engine) == 2
    out = engine.advance_watermark(INT64_MAX)
    assert len(out) == 100 and out[0].value["values"] == [0, "again"]
