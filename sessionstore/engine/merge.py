"""The merge plan: which sessions an event joins, and what the merged session is.

One rule, used by both paths. The event path asks :func:`merge_event` for one event; the batch
path hands a whole batch to :func:`plan_batch`, whose kernel (:mod:`sessionstore.kernels`)
returns exactly what a loop of :func:`merge_event` over the same events would (the property tests
in ``tests/engine`` check that against this module and against an independent oracle).

A window ``[start, end)`` joins an event's own window ``[t, t + gap)`` when they overlap; with
``inclusive_gap`` also when they touch. Sessions that already closed (``end <= closed_before``)
never join anything again.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np


def merge_bounds(t_ms: int, own_end_ms: int, inclusive: bool) -> tuple[int, int]:
    """``(earliest_end, latest_start)``: a session joins the event iff
    ``end >= earliest_end and start <= latest_start`` (the store's ``find_sessions_to_merge``)."""
    if inclusive:
        return t_ms, own_end_ms
    return t_ms + 1, own_end_ms - 1


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
    earliest_end, latest_start = merge_bounds(t_ms, own_end_ms, inclusive)
    floor = earliest_end if earliest_end > closed_before_ms else closed_before_ms + 1
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


def plan_batch(
    key_codes: np.ndarray, times_ms: np.ndarray, ends_ms: np.ndarray,
    closed_before_ms: np.ndarray, open_codes: np.ndarray, open_starts_ms: np.ndarray,
    open_ends_ms: np.ndarray, inclusive: bool,
) -> Any:
    """The merge plan of a batch of accepted events, in arrival order.

    Returns the kernel's ``SessionPlan``: ``session_codes/starts_ms/ends_ms`` of the resulting
    sessions, ``event_session`` (the session of each event) and ``open_session`` (the session
    each open session went into, -1 when untouched). See :func:`sessionstore.kernels.plan_sessions`.
    """
    try:
        from ..kernels import plan_sessions  # type: ignore[import-not-found,unused-ignore]
    except ImportError:  # the compiled kernel is optional; the rule itself is not
        return plan_by_events(key_codes, times_ms, ends_ms, closed_before_ms, open_codes,
                              open_starts_ms, open_ends_ms, inclusive)
    return plan_sessions(key_codes, times_ms, ends_ms, closed_before_ms, open_codes,
                         open_starts_ms, open_ends_ms, inclusive)


@dataclass
class EventPlan:
    """The result of :func:`plan_by_events` (the kernel's ``SessionPlan`` fields)."""

    session_codes: np.ndarray
    session_starts_ms: np.ndarray
    session_ends_ms: np.ndarray
    event_session: np.ndarray
    open_session: np.ndarray


def plan_by_events(
    key_codes: np.ndarray, times_ms: np.ndarray, ends_ms: np.ndarray,
    closed_before_ms: np.ndarray, open_codes: np.ndarray, open_starts_ms: np.ndarray,
    open_ends_ms: np.ndarray, inclusive: bool,
) -> EventPlan:
    """The batch plan by definition: :func:`merge_event` for each event in arrival order.

    The kernel must return exactly this; it is also the exact path when no kernel is present.
    """
    codes: list[int] = []
    bounds: list[tuple[int, int]] = []
    replaced_by: list[int] = []  # session id -> the id that replaced it (itself while live)
    live: dict[int, dict[tuple[int, int], int]] = {}  # key code -> bounds -> session id
    touched = [False] * len(open_codes)
    for j, (code, s, e) in enumerate(zip(open_codes.tolist(), open_starts_ms.tolist(),
                                         open_ends_ms.tolist(), strict=True)):
        live.setdefault(code, {})[(s, e)] = j
        codes.append(code)
        bounds.append((s, e))
        replaced_by.append(j)
    event_ids: list[int] = []
    for code, t, own_end, closed in zip(key_codes.tolist(), times_ms.tolist(), ends_ms.tolist(),
                                        closed_before_ms.tolist(), strict=True):
        mine = live.setdefault(code, {})
        start, end, joined = merge_event(mine.keys(), t, own_end, closed, inclusive)
        ids = [mine[b] for b in joined]
        for j in ids:
            if j < len(touched):
                touched[j] = True
        if len(joined) == 1 and joined[0] == (start, end):
            sid = ids[0]
        else:
            sid = len(bounds)
            codes.append(code)
            bounds.append((start, end))
            replaced_by.append(sid)
            for b, j in zip(joined, ids, strict=True):
                del mine[b]
                replaced_by[j] = sid
            mine[(start, end)] = sid
        event_ids.append(sid)

    def final(sid: int) -> int:
        while replaced_by[sid] != sid:
            sid = replaced_by[sid]
        return sid

    finals = sorted({final(sid) for sid in event_ids})
    index = {sid: k for k, sid in enumerate(finals)}
    open_session = np.full(len(open_codes), -1, dtype=np.int64)
    for j in range(len(open_codes)):
        if touched[j]:
            open_session[j] = index[final(j)]
    return EventPlan(
        np.array([codes[s] for s in finals], dtype=np.int64),
        np.array([bounds[s][0] for s in finals], dtype=np.int64),
        np.array([bounds[s][1] for s in finals], dtype=np.int64),
        np.array([index[final(s)] for s in event_ids], dtype=np.int64),
        open_session,
    )
