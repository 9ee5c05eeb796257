"""The maximum duration's membership rule, ``t < start + max_duration``, in one place
(:func:`sessionstore.gap_boundary.within_max_duration`), and every copy of it pinned to it at
its boundary: an event exactly ``max_duration`` after a session's start begins a new session.

The engine's cuts (``cut``, ``cut_until_unchanged``) and its in-order batch step call the rule;
the binary search of ``cut_pieces``, the per-event step of ``max_duration_step`` and the bounded
path's compiled scan inline it. Each test below fails when its copy compares with ``<=``.
Times are drawn from a small range against small durations, so that events land exactly on
``start + max_duration`` often.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionstore import (
    EmitStrategy,
    InMemorySessionStore,
    SessionAggregator,
    SessionWindows,
    aggregations,
    sessionize,
)
from sessionstore.bounded.scan import scan_sessions
from sessionstore.engine.cuts import cut, cut_pieces, cut_until_unchanged
from sessionstore.gap_boundary import reaches, within_max_duration
from sessionstore.jit import compiled


def test_the_rule_at_its_boundary() -> None:
    assert within_max_duration(109, 100, 10) and not within_max_duration(110, 100, 10)
    assert within_max_duration(-1, -5, 5) and not within_max_duration(0, -5, 5)
    assert within_max_duration(2**63 - 2, 2**63 - 3, 2**62)  # ints: no wrap


def sessions_by_the_rule(times: list[int], gap: int, md: int, inclusive: bool
                         ) -> list[tuple[int, int, int]]:
    """``(start, end, count)`` of one key's sorted events with a fixed gap, by the two rules."""
    out: list[list[int]] = []
    for t in times:
        if out and within_max_duration(t, out[-1][0], md) and reaches(out[-1][1], t, inclusive):
            out[-1][1] = max(out[-1][1], t + gap)
            out[-1][2] += 1
        else:
            out.append([t, t + gap, 1])
    return [(start, min(run, start + md), n) for start, run, n in out]


@st.composite
def cases(draw: st.DrawFn) -> tuple[list[int], int, int, bool]:
    md = draw(st.integers(1, 8))
    gap = draw(st.integers(1, 4))
    span = draw(st.sampled_from([10, 30]))
    times = sorted(draw(st.lists(st.integers(0, span), min_size=1, max_size=16)))
    return times, gap, md, draw(st.booleans())


def _events(times: list[int], gap: int) -> list[list[Any]]:
    return [[t, seq, t + gap, None] for seq, t in enumerate(times)]


def _runs(events: list[list[Any]], inclusive: bool) -> list[list[list[Any]]]:
    """The events in runs that each reach the next (how stored sessions hold them)."""
    runs = [[events[0]]]
    for event in events[1:]:
        if reaches(runs[-1][-1][2], event[0], inclusive):
            runs[-1].append(event)
        else:
            runs.append([event])
    return runs


@settings(max_examples=150)
@given(cases())
def test_the_cuts_are_the_rule(case: tuple[list[int], int, int, bool]) -> None:
    """Kills ``<=`` in the rule itself (the scans of ``cut`` and ``cut_until_unchanged`` call
    it) and ``bisect_right`` for ``cut_pieces``' search of the first event past the limit."""
    times, gap, md, inclusive = case
    want = sessions_by_the_rule(times, gap, md, inclusive)
    events = _events(times, gap)

    def bounds(cuts: list[Any]) -> list[tuple[int, int, int]]:
        low, out = 0, []
        for start, end, _, stop in cuts:
            out.append((start, end, stop - low))
            low = stop
        return out

    assert bounds(cut(events, md, inclusive)) == want
    assert bounds(cut_until_unchanged(list(events), 0, lambda i: [], md, inclusive)[0]) == want
    pieces = _runs(events, inclusive)
    recut, used, _ = cut_pieces(pieces, 0, 0, lambda i: [], md, inclusive)
    assert used == 0
    assert [(start, end, len(members)) for start, end, _, members, _ in recut] == want


@settings(max_examples=150)
@given(cases())
def test_the_compiled_scan_is_the_rule(case: tuple[list[int], int, int, bool]) -> None:
    """Kills ``t > limit`` for ``t >= limit`` in the bounded path's compiled scan (and, through
    ``sessionize``, its array bounds)."""
    times, gap, md, inclusive = case
    want = sessions_by_the_rule(times, gap, md, inclusive)
    array = np.array(times, dtype=np.int64)
    codes = np.zeros(len(times), dtype=np.int64)
    starts = compiled(scan_sessions)(codes, array, array + gap, inclusive, md)
    assert np.flatnonzero(starts).tolist() == \
        np.cumsum([0] + [n for _, _, n in want[:-1]]).tolist()
    table = sessionize(pa.table({"k": ["a"] * len(times), "t": times}), key="k", time="t",
                       gap=gap, aggregations={"n": "count"}, max_duration=md,
                       inclusive_gap=inclusive)
    got = sorted(zip(table.column("session_start").to_pylist(),
                     table.column("session_end").to_pylist(),
                     table.column("n").to_pylist(), strict=True))
    assert got == want


def _engine(gap: int, md: int, inclusive: bool, updates: bool) -> SessionAggregator:
    """ON_WINDOW_CLOSE holds a key's out-of-order events and cuts them later (``cut``);
    ON_WINDOW_UPDATE re-cuts at each event (``max_duration_step``)."""
    windows = SessionWindows(gap, max_duration_ms=md, inclusive_gap=inclusive)
    return SessionAggregator(
        InMemorySessionStore(retention_ms=windows.retention_ms), windows, aggregations.count(),
        emit=EmitStrategy.ON_WINDOW_UPDATE if updates else EmitStrategy.ON_WINDOW_CLOSE,
        watermark="external")


def _sessions(times: list[int], gap: int, md: int, inclusive: bool, updates: bool,
              by_batch: bool) -> list[tuple[int, int, int]]:
    """The engine's sessions of one key's events arriving at ``times``, the watermark left
    where it was (nothing closes)."""
    engine = _engine(gap, md, inclusive, updates)
    if by_batch:
        engine.process_batch(["a"] * len(times), [1] * len(times), np.array(times))
    else:
        for t in times:
            engine.process("a", 1, t)
    return sorted((s.start, s.end, n) for s, n in engine.sessions("a"))


@settings(max_examples=100, deadline=None)
@given(cases(), st.booleans(), st.booleans(), st.randoms(use_true_random=False))
def test_the_engine_paths_are_the_rule(case: tuple[list[int], int, int, bool], updates: bool,
                                       by_batch: bool, rng: Any) -> None:
    """Kills ``<=`` in the per-event step (``max_duration_step``: joining the last session)
    and in the batch path's in-order step (``max_duration_batch``, which calls the rule).
    Nothing closes, so the sessions are the rule's over all events, whatever their arrival
    order."""
    times, gap, md, inclusive = case
    arrival = list(times)
    if rng.random() < 0.6:
        rng.shuffle(arrival)
    assert _sessions(arrival, gap, md, inclusive, updates, by_batch) == \
        sessions_by_the_rule(times, gap, md, inclusive)


def test_an_early_event_does_not_take_an_event_at_its_own_limit() -> None:
    """Kills ``<=`` in ``max_duration_step``'s shortcut for an event before every open session
    (it takes that session's events only when the last is before its own ``t + md``): events
    2 and 5 form one session; 0 then arrives, and 5 = 0 + md begins a session of its own."""
    want = sessions_by_the_rule([0, 2, 5], 4, 5, True)
    assert want == [(0, 5, 2), (5, 9, 1)]
    for updates in (False, True):
        for by_batch in (False, True):
            assert _sessions([2, 5, 0], 4, 5, True, updates, by_batch) == want
