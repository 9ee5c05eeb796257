"""The offline rule of a maximum duration, as functions of a key's events: :func:`cut` cuts
them from scratch; :func:`cut_until_unchanged` and :func:`cut_pieces` re-cut from the session an
event falls into and stop where the new cut meets the stored one (see
:mod:`sessionstore.engine.max_duration` for the rule and how the engine uses these).

An event is a list ``[t, seq, own_end, value]``; events are in (time, arrival) order.
"""

from __future__ import annotations

import bisect
import operator
from collections.abc import Callable
from typing import Any

from ..gap_boundary import reaches, within_max_duration

_FIRST = operator.itemgetter(0)

Cut = tuple[int, int, int, int]
"""``(start, end, max_end, stop)`` of one session of a cut: its events are
``events[previous stop:stop]``."""

def cut(events: list[Any], max_duration_ms: int, inclusive: bool) -> list[Cut]:
    """Cut a key's events by the rule above.

    Args:
        events: ``[t, seq, own_end, value]`` lists sorted by (t, seq).
        max_duration_ms: the maximum session duration (> 0).
        inclusive: the gap convention (``inclusive_gap``).

    Returns:
        One :data:`Cut` per session, in order.
    """
    out: list[Cut] = []
    n = len(events)
    i = 0
    while i < n:
        first = events[i]
        start = first[0]
        limit = start + max_duration_ms
        run, j = _run_from(events, i + 1, first[2], start, max_duration_ms, inclusive)
        # own_window_end(start, run, max_duration_ms), inline (tests/engine/test_rules.py)
        out.append((start, run if run < limit else limit, run, j))
        i = j
    return out


def _run_from(events: list[Any], j: int, run: int, start: int, max_duration_ms: int,
              inclusive: bool) -> tuple[int, int]:
    """Extend a session that started at ``start``, whose largest own end is ``run``, over
    ``events[j:]`` while they are gap-connected and within its maximum duration; return the
    new largest own end and the index after its last event."""
    n = len(events)
    while j < n:
        event = events[j]
        t = event[0]
        if not within_max_duration(t, start, max_duration_ms) or not reaches(run, t, inclusive):
            break
        if event[2] > run:
            run = event[2]
        j += 1
    return run, j


def cut_until_unchanged(gathered: list[Any], following: int,
                        events_of: Callable[[int], list[Any]], max_duration_ms: int,
                        inclusive: bool) -> tuple[list[Cut], int]:
    """:func:`cut` of a key's open events from the start of one open session on, reading the
    sessions after it only while the new cut reaches them.

    The cut is a left-to-right scan, so where a session of the new cut ends right before the
    first event of a stored session, the cut from there on is the stored one: the scan stops.
    Over all the events it gives what :func:`cut` gives (the tests compare both with the
    oracle).

    Args:
        gathered: ``[t, seq, own_end, value]`` lists sorted by (t, seq): the events of an open
            session, the new event among them; extended in place with the events read.
        following: how many open sessions come after those events.
        events_of: the events of the ``i``-th of those, ``0 <= i < following``.
        max_duration_ms, inclusive: as :func:`cut`.

    Returns:
        The cuts over ``gathered`` as extended, and how many following sessions were read
        (those are replaced by the cuts; the rest stay as stored).
    """
    out: list[Cut] = []
    used = 0
    i = 0
    while i < len(gathered):
        first = gathered[i]
        start = first[0]
        limit = start + max_duration_ms
        run, j = _run_from(gathered, i + 1, first[2], start, max_duration_ms, inclusive)
        while j == len(gathered) and used < following:
            more = _reached(events_of, used, run, start, max_duration_ms, inclusive)
            if more is None:
                break
            gathered.extend(more)
            used += 1
            run, j = _run_from(gathered, j, run, start, max_duration_ms, inclusive)
        # own_window_end(start, run, max_duration_ms), inline (tests/engine/test_rules.py)
        out.append((start, run if run < limit else limit, run, j))
        i = j
    return out, used


Recut = tuple[int, int, int, list[Any], bool]
"""``(start, end, max_end, events, holds the new event)`` of one session of a re-cut."""


def cut_pieces(pieces: list[list[Any]], new: int, following: int,
               events_of: Callable[[int], list[Any]], max_duration_ms: int, inclusive: bool
               ) -> tuple[list[Recut], int, int]:
    """:func:`cut_until_unchanged` for a fixed gap, by binary search instead of a scan.

    With a fixed gap an event's own end is ``t + gap``, so the largest own end of a session's
    events is that of its latest one, and whether an event reaches the next one does not depend
    on where the session starts. A stored session holds consecutive events that reach each
    other; so does any run of its events. Inside such a run a session ends only at its
    ``start + max_duration``: the first event at or past it is found by binary search, and the
    gap rule is checked only where two runs meet. A re-cut costs O(log n) per session it
    writes, not O(its events).

    Args:
        pieces: non-empty runs of events in (time, arrival) order, each taken from one stored
            session (or the new event alone), together the events from the start of the first
            session re-cut; extended in place with the sessions read.
        new: the index of the piece ``[new event]``.
        following: how many open sessions come after those events.
        events_of: the events of the ``i``-th of those, ``0 <= i < following``.
        max_duration_ms, inclusive: as :func:`cut`.

    Returns:
        The sessions of the cut over ``pieces`` as extended, how many following sessions were
        read (those are replaced; the rest stay as stored), and the binary searches made.
    """
    out: list[Recut] = []
    used = 0
    searches = 0
    p = i = 0
    while p < len(pieces):
        piece = pieces[p]
        first = piece[i]
        start = first[0]
        limit = start + max_duration_ms
        run = first[2]
        parts: list[list[Any]] = []
        holds = False
        while True:
            # every event of the run from i on reaches the next; the limit cuts the run: the
            # first event not within_max_duration, by binary search (the rule inline, pinned
            # by tests/engine/test_max_duration_rule.py)
            stop = bisect.bisect_left(piece, limit, i, key=_FIRST)
            searches += 1
            parts.append(piece[i:stop])
            holds = holds or p == new
            if piece[stop - 1][2] > run:
                run = piece[stop - 1][2]
            if stop < len(piece):
                i = stop  # the next session starts inside this run
                break
            p += 1
            i = 0
            if p == len(pieces):
                more = None if used == following else _reached(
                    events_of, used, run, start, max_duration_ms, inclusive)
                if more is None:
                    break
                pieces.append(more)
                used += 1
            else:
                t = pieces[p][0][0]
                if not within_max_duration(t, start, max_duration_ms) \
                        or not reaches(run, t, inclusive):
                    break
            piece = pieces[p]
        events = _joined(parts)
        # own_window_end(start, run, max_duration_ms), inline (tests/engine/test_rules.py)
        out.append((start, run if run < limit else limit, run, events, holds))
    return out, used, searches


def _joined(parts: list[list[Any]]) -> list[Any]:
    """The concatenation of fresh lists, built on the longest one (the others are copied into
    it; its own items only move)."""
    if len(parts) == 1:
        return parts[0]
    longest = max(range(len(parts)), key=lambda k: len(parts[k]))
    out = parts[longest]
    for part in parts[longest + 1:]:
        out += part
    if longest:
        out[:0] = [e for part in parts[:longest] for e in part] if longest > 1 else parts[0]
    return out


def _reached(events_of: Callable[[int], list[Any]], used: int, run: int, start: int,
             max_duration_ms: int, inclusive: bool) -> list[Any] | None:
    """The events of the ``used``-th stored session after a re-cut's events when the session
    being cut (started at ``start``, largest own end ``run``) takes its first event; None when
    it does not: that stored session starts where it did, and the cut from there on is the
    stored one."""
    more = events_of(used)
    t = more[0][0]
    if not within_max_duration(t, start, max_duration_ms) or not reaches(run, t, inclusive):
        return None
    return more


def scan_on(events: list[Any], head: list[int], max_duration_ms: int, inclusive: bool) -> None:
    """Continue the scan of a first session ``head = [start, run, limit, stop]`` (the largest
    own end so far, ``start + max_duration``, and the index after its last event) over
    ``events[stop:]``, in place."""
    head[1], head[3] = _run_from(events, head[3], head[1], head[0], max_duration_ms, inclusive)
