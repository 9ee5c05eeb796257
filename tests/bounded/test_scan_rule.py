"""The bounded path's compiled scan inlines the gap rule for speed; this pins that copy to
:func:`sessionstore.gap_boundary.reaches` (and the array form with it), at the boundary: events
exactly at the session's reach, both conventions, with and without a maximum duration."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from sessionstore.bounded.scan import scan_sessions, session_starts
from sessionstore.gap_boundary import reaches, within_max_duration
from sessionstore.jit import compiled


def starts_by_the_rule(rows: list[tuple[int, int, int]], inclusive: bool,
                       max_duration: int) -> list[bool]:
    """Which rows start a session, asking :func:`reaches` (rows sorted by (code, time))."""
    out = []
    previous = None
    run = start = 0
    for code, t, end in rows:
        new = code != previous or not reaches(run, t, inclusive) or (
            max_duration > 0 and not within_max_duration(t, start, max_duration))
        if new:
            run, start = end, t
        else:
            run = max(run, end)
        out.append(new)
        previous = code
    return out


@st.composite
def sorted_rows(draw: st.DrawFn) -> list[tuple[int, int, int]]:
    rows = draw(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 40), st.integers(1, 8)),
                         min_size=1, max_size=30))
    return sorted((code, t, t + gap) for code, t, gap in rows)


def columns(rows: list[tuple[int, int, int]]) -> list[Any]:
    return [np.array(column, dtype=np.int64) for column in zip(*rows, strict=True)]


@given(sorted_rows(), st.booleans(), st.sampled_from([0, 3, 10, 1000]))
def test_the_compiled_scan_is_the_gap_rule(rows: list[tuple[int, int, int]], inclusive: bool,
                                           max_duration: int) -> None:
    codes, times, ends = columns(rows)
    want = starts_by_the_rule(rows, inclusive, max_duration)
    assert compiled(scan_sessions)(codes, times, ends, inclusive, max_duration).tolist() == want
    assert scan_sessions(codes, times, ends, inclusive, max_duration).tolist() == want
    if max_duration == 0:
        for fixed in (False, True):
            if fixed and len({e - t for _, t, e in rows}) > 1:
                continue
            assert session_starts(codes, times, ends, inclusive=inclusive, fixed_gap=fixed,
                                  max_duration=None).tolist() == want


def test_an_event_exactly_at_the_reach_joins_only_when_inclusive() -> None:
    codes, times, ends = columns([(0, 0, 5), (0, 5, 10)])
    for inclusive in (True, False):
        want = [True, not inclusive]
        assert compiled(scan_sessions)(codes, times, ends, inclusive, 0).tolist() == want
        assert session_starts(codes, times, ends, inclusive=inclusive, fixed_gap=True,
                              max_duration=None).tolist() == want
