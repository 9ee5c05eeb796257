"""The merge rule: which sessions an event joins, and what the merged session is.

One rule. The trigger path asks :func:`merge_event` for one event; the planner's reference
(:func:`sessionstore.engine.planner.plan_reference`) is a loop of it over a batch, and the batch
paths' kernel is property-tested against that reference.

A window ``[start, end)`` joins an event's own window ``[t, t + gap)`` when they overlap; with
``inclusive_gap`` also when they touch. Sessions that already closed (``end <= closed_before``)
never join anything again.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable

from ..gap_boundary import merge_bounds


def join_range(t_ms: int, own_end_ms: int, closed_before_ms: int, inclusive: bool
               ) -> tuple[int, int]:
    """``(floor, latest_start)``: a session ``[start, end)`` of the event's key joins the event
    iff ``end >= floor and start <= latest_start``.

    The gap convention (:func:`~sessionstore.gap_boundary.merge_bounds`) and the close cursor
    together: a session ending at or before ``closed_before_ms`` is final
    (:func:`~sessionstore.gap_boundary.is_final`) and joins nothing.
    Every merge of one event (:func:`merge_event`, the event paths' one-session steps) takes
    its range from here; the fused event step (``engine/fast_event.py``) computes it inline,
    pinned by ``tests/engine/test_fast_event.py``.
    """
    earliest_end, latest_start = merge_bounds(t_ms, own_end_ms, inclusive)
    # max(earliest_end, first_open_end(closed_before_ms)), inline: per event; no event arrives
    # at the saturated cursor (it would be late). Pinned to is_final by tests/engine/test_rules.py
    if earliest_end <= closed_before_ms:
        earliest_end = closed_before_ms + 1
    return earliest_end, latest_start


_END_START = operator.itemgetter(1, 0)
END_START = _END_START
"""Sorts ``(start, end)`` bounds by (end, start), the order :func:`merge_event` returns."""


def merge_event(
    candidates: Iterable[tuple[int, int]], t_ms: int, own_end_ms: int, closed_before_ms: int,
    inclusive: bool,
) -> tuple[int, int, list[tuple[int, int]]]:
    """Merge one event into a key's sessions.

    Args:
        candidates: ``(start, end)`` of the key's sessions (any order, any superset of those
            that join).
        t_ms, own_end_ms: the event's time and its own window end.
        closed_before_ms: sessions ending at or before this are final.
        inclusive: the gap convention.

    Returns:
        ``(start, end, joined)``: the merged session and the bounds of the sessions it
        replaces, sorted by (end, start).
    """
    floor, latest_start = join_range(t_ms, own_end_ms, closed_before_ms, inclusive)
    joined = [b for b in candidates if b[1] >= floor and b[0] <= latest_start]
    if len(joined) > 1:  # most events join at most one session: no sort, no key calls
        joined.sort(key=_END_START)
    start, end = t_ms, own_end_ms
    for s, e in joined:
        if s < start:
            start = s
        if e > end:
            end = e
    return start, end, joined
