"""Maximum duration under arrival disorder (issue 25, item 3): an event before every open
session of its key must not re-cut the key's open events when the cut cannot move, so a
newest-first key costs O(events), not O(events^2). Counted, not timed: ``MaxDuration``
counts the events its full re-cuts gather."""

from __future__ import annotations

import math
import random

import pytest

from sessionstore import (
    EmitStrategy,
    InMemorySessionStore,
    SessionAggregator,
    SessionWindows,
    aggregations,
)
from sessionstore.timeutil import INT64_MAX
from tests import oracle

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
    assert engine._max_duration is not None
    return engine._max_duration.recut_events


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


def test_the_counter_counts_the_re_cuts_that_remain():
    # newest first, 10 ms apart, a 100 ms maximum duration: each event moves the first event
    # of every open session, so the cut changes in all of them and is re-cut (see
    # docs/reliability.md); the count is what the work is
    n = 200
    engine = engine_for(100, 100, n * 10, aggregations.count())
    for t in reversed(range(0, n * 10, 10)):
        engine.process("k", None, t)
    assert sum(e.value for e in engine.advance_watermark(INT64_MAX)) == n
    assert n * (n - 10) // 2 <= recut(engine) <= n * (n + 1) // 2


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
