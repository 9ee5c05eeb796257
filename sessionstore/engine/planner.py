"""The planner: what a batch of accepted events does to the open sessions of its keys.

``plan(events, open) -> plan``. Given the batch's accepted events (key code, time, own window
end, and the "closed before" cursor each saw on arrival) and the open sessions of its keys, the
plan lists the sessions the batch leaves behind (their bounds), which session holds each event,
which open session went into which resulting session (the removes and retractions are the
absorbed ones whose bounds changed), and each session's events and absorbed sessions in the
order the aggregations fold them. Applying it is the caller's step (the batch paths').

Its definition is :func:`plan_reference`: a loop of :func:`~sessionstore.engine.merge.merge_event`
over the events in arrival order, in plain Python. :func:`plan` is the same answer from the one
compiled kernel (:func:`sessionstore.kernels.plan_dense`), property-tested against the reference
(``tests/kernels/test_plan_dense.py``), and the reference is property-tested against the
independent oracle (``tests/engine/test_planner.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import kernels
from ..arrays import int64_column
from ..kernels import DensePlan, EventGroups, SessionPlan
from .merge import merge_event

Plan = DensePlan
"""The plan: a :class:`~sessionstore.kernels.SessionPlan` and the two groupings."""


def plan(key_codes: Any, times_ms: Any, ends_ms: Any, closed_before_ms: Any, open_codes: Any,
         open_starts_ms: Any, open_ends_ms: Any, inclusive: bool, *, keys: int | None = None,
         by_time: bool = True) -> Plan:
    """The plan of a batch, computed by the compiled kernel.

    Args:
        key_codes: int64[n], each event's key code. With ``keys``, codes are dense
            (``0 <= code < keys``) and the resulting sessions come ordered by code; without,
            any integers, and the order is by the codes' rank.
        times_ms, ends_ms: int64[n], each event's time and own window end (``> time``).
        closed_before_ms: int64[n], the "closed before" cursor on the event's arrival: sessions
            of its key ending at or before it are final. It must not decrease within a key.
        open_codes, open_starts_ms, open_ends_ms: int64[m], the open sessions of the batch's
            keys, any order; those not final at the key's first event are disjoint.
        inclusive: the gap convention (:func:`~sessionstore.engine.merge.merge_bounds`).
        keys: the number of dense key codes, or None.
        by_time: order each session's events by (time, arrival), else by arrival.

    Returns:
        :class:`Plan`, equal to :func:`plan_reference`'s answer.

    Raises:
        TypeError / ValueError: as :func:`sessionstore.kernels.plan_dense`, naming the
            argument and the row.
    """
    if keys is not None:
        return kernels.plan_dense(key_codes, keys, times_ms, ends_ms, closed_before_ms,
                                  open_codes, open_starts_ms, open_ends_ms, inclusive,
                                  by_time=by_time)
    codes = int64_column("key_codes", key_codes)
    o_codes = int64_column("open_codes", open_codes)
    uniques, dense = np.unique(np.concatenate((codes, o_codes)), return_inverse=True)
    dense = dense.astype(np.int64).reshape(-1)
    answer = kernels.plan_dense(dense[:len(codes)], len(uniques), times_ms, ends_ms,
                                closed_before_ms, dense[len(codes):], open_starts_ms,
                                open_ends_ms, inclusive, by_time=by_time)
    sessions = answer.plan
    return Plan(sessions._replace(session_codes=uniques[sessions.session_codes].astype(np.int64)),
                answer.events, answer.absorbed)


def plan_reference(key_codes: Any, times_ms: Any, ends_ms: Any, closed_before_ms: Any,
                   open_codes: Any, open_starts_ms: Any, open_ends_ms: Any, inclusive: bool, *,
                   by_time: bool = True) -> Plan:
    """The plan by definition: :func:`merge_event` for each event in arrival order.

    Takes the arguments of :func:`plan` (valid ones: it checks nothing) and returns what it
    returns. Session identity, which only decides the order of sessions with equal bounds: the
    open sessions are numbered by (code, start, position given), the sessions events open
    follow in creation order, and a merge keeps the number of the earliest session it joins.
    The resulting sessions are listed by (code, start, end, number).
    """
    codes = [int(c) for c in np.asarray(key_codes).tolist()]
    times = [int(t) for t in np.asarray(times_ms).tolist()]
    ends = [int(e) for e in np.asarray(ends_ms).tolist()]
    closed = [int(c) for c in np.asarray(closed_before_ms).tolist()]
    o_codes = [int(c) for c in np.asarray(open_codes).tolist()]
    o_starts = [int(s) for s in np.asarray(open_starts_ms).tolist()]
    o_ends = [int(e) for e in np.asarray(open_ends_ms).tolist()]
    m = len(o_codes)
    numbered = sorted(range(m), key=lambda j: (o_codes[j], o_starts[j], j))
    number_of_open = {j: p for p, j in enumerate(numbered)}
    bounds: list[tuple[int, int, int]] = [(o_codes[j], o_starts[j], o_ends[j]) for j in numbered]
    parent = list(range(m))
    touched = [False] * m
    # code -> (start, end) -> number. merge_event passes over final sessions; the others are
    # disjoint, and every session an event makes ends after its cursor, so after every final
    # one: bounds never repeat, except between open sessions final from the start (which no
    # event touches, so which of them the dict keeps does not matter)
    live: dict[int, dict[tuple[int, int], int]] = {}
    for p, (code, start, end) in enumerate(bounds):
        live.setdefault(code, {})[(start, end)] = p
    event_number: list[int] = []
    for code, t, own_end, closed_before in zip(codes, times, ends, closed, strict=True):
        mine = live.setdefault(code, {})  # bounds are distinct: see below
        start, end, joined = merge_event(mine.keys(), t, own_end, closed_before, inclusive)
        if not joined:
            number = len(bounds)
            bounds.append((code, start, end))
            parent.append(number)
        else:
            numbers = [mine.pop(b) for b in joined]
            number = numbers[0]  # joined come by (end, start): the earliest one
            for other in numbers:
                parent[other] = number
                if other < m:
                    touched[other] = True
            bounds[number] = (code, start, end)
        mine[(start, end)] = number
        event_number.append(number)

    def root(number: int) -> int:
        while parent[number] != number:
            number = parent[number]
        return number

    finals = sorted({root(x) for x in event_number}, key=lambda x: (*bounds[x], x))
    rank = {x: r for r, x in enumerate(finals)}
    event_session = [rank[root(x)] for x in event_number]
    open_session = [rank[root(number_of_open[j])] if touched[number_of_open[j]] else -1
                    for j in range(m)]
    sessions = SessionPlan(
        np.array([bounds[x][0] for x in finals], dtype=np.int64),
        np.array([bounds[x][1] for x in finals], dtype=np.int64),
        np.array([bounds[x][2] for x in finals], dtype=np.int64),
        np.array(event_session, dtype=np.int64),
        np.array(open_session, dtype=np.int64),
    )
    members: list[list[int]] = [[] for _ in finals]
    for i, s in enumerate(event_session):
        members[s].append(i)
    if by_time:
        for group in members:
            group.sort(key=lambda i: times[i])  # stable: (time, arrival)
    absorbed: list[list[int]] = [[] for _ in finals]
    for j in sorted(range(m), key=lambda j: (o_codes[j], o_starts[j], j)):
        if open_session[j] >= 0:
            absorbed[open_session[j]].append(j)
    return Plan(sessions, _groups(members), _groups(absorbed))


def _groups(members: list[list[int]]) -> EventGroups:
    offsets = np.zeros(len(members) + 1, dtype=np.int64)
    np.cumsum([len(group) for group in members], out=offsets[1:])
    return EventGroups(np.array([i for group in members for i in group], dtype=np.int64),
                       offsets)
