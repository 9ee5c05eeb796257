"""The planner's compiled kernel: the session plan of a batch (the built-in aggregations over a
plan are in :mod:`sessionstore.folds`, array utilities in :mod:`sessionstore.arrays`).

``plan_dense`` is the one compiled kernel of the planner
(:mod:`sessionstore.engine.planner`): for a whole batch at once, it answers the question the event
path answers one event at a time: which session does each event end up in, and which stored open
sessions does that session absorb. It is exact: it returns what the planner's reference (a
per-event loop) returns, given the same per-event ``closed_before_ms``.

Why a per-key sequential pass is exact: an event only ever merges with sessions of its own key,
and once ``closed_before_ms`` is fixed per event, nothing that happens to one key changes what
happens to another. So a stable sort by key code (which keeps arrival order inside a key) followed
by one sequential pass per key reproduces the loop exactly. Inside a key, the sessions that are not
yet final never overlap (two that did would have merged), so they sit in an array ordered by start
whose ends are ordered too: finding what an event overlaps is two binary searches, and sessions
that become final drop off the front.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from .arrays import Int64Array, first_row, int64_column
from .gap_boundary import is_final, reaches
from .jit import compiled, register_helpers

# Status codes the per-key pass reports instead of raising (a compiled kernel cannot raise with
# a useful message); plan_dense turns them into errors that name the argument and the row.
_OK = 0
_CLOSED_BEFORE_DECREASES = 1
_OPEN_SESSIONS_OVERLAP = 2


class SessionPlan(NamedTuple):
    """The sessions a batch produces, and where every event and open session went.

    Attributes:
        session_codes: int64[s], the key code of each resulting session.
        session_starts_ms: int64[s], its start: the earliest of its events' times and of the
            starts of the open sessions it absorbed.
        session_ends_ms: int64[s], its end: the latest of their window ends.
        event_session: int64[n], the index into the session arrays of the session that holds
            each event, in the order the events were given.
        open_session: int64[m], for each open session given, the index of the session that
            absorbed it (possibly with the same bounds), or -1 when no event touched it.

    Only sessions that hold at least one event of the batch are listed, ordered by
    ``(code, start, end)`` (then by creation, for the equal bounds that only events already
    final on arrival can produce); untouched open sessions are not listed. Every listed session replaces
    exactly the open sessions that map to it.
    """

    session_codes: Int64Array
    session_starts_ms: Int64Array
    session_ends_ms: Int64Array
    event_session: Int64Array
    open_session: Int64Array


def _plan_inputs(key_codes: Any, times_ms: Any, ends_ms: Any, closed_before_ms: Any,
                 open_codes: Any, open_starts_ms: Any, open_ends_ms: Any
                 ) -> tuple[Int64Array, ...]:
    """The planners' arguments as int64 arrays, checked: lengths per group, ``ends > times``,
    ``open start < open end``; errors name the argument and the row."""
    codes = int64_column("key_codes", key_codes)
    times = int64_column("times_ms", times_ms)
    ends = int64_column("ends_ms", ends_ms)
    closed = int64_column("closed_before_ms", closed_before_ms)
    o_codes = int64_column("open_codes", open_codes)
    o_starts = int64_column("open_starts_ms", open_starts_ms)
    o_ends = int64_column("open_ends_ms", open_ends_ms)
    n = len(codes)
    for name, array in (("times_ms", times), ("ends_ms", ends), ("closed_before_ms", closed)):
        if len(array) != n:
            raise ValueError(f"{name} has {len(array)} rows, key_codes has {n}")
    m = len(o_codes)
    for name, array in (("open_starts_ms", o_starts), ("open_ends_ms", o_ends)):
        if len(array) != m:
            raise ValueError(f"{name} has {len(array)} rows, open_codes has {m}")
    bad = ends <= times
    if bad.any():
        row = first_row(bad)
        raise ValueError(
            f"ends_ms[{row}] = {ends[row]} must be > times_ms[{row}] = {times[row]}"
        )
    bad = o_starts >= o_ends
    if bad.any():
        row = first_row(bad)
        raise ValueError(
            f"open_starts_ms[{row}] = {o_starts[row]} must be < open_ends_ms[{row}] = "
            f"{o_ends[row]}"
        )
    return codes, times, ends, closed, o_codes, o_starts, o_ends


def _reach(active: Int64Array, front: int, size: int, sess_start: Int64Array,
           sess_end: Int64Array, t: int, e: int, inclusive: bool) -> tuple[int, int]:
    """``[lo, hi)``: the active sessions (``active[front:size]``, ordered by start, disjoint)
    that the window ``[t, e)`` merges with. ``lo`` is the first whose end reaches ``t``, ``hi``
    the first from ``lo`` on that starts beyond ``e``; ``lo == hi`` when it merges with none."""
    lo = front
    hi = size
    while lo < hi:
        mid = (lo + hi) // 2
        mid_end = sess_end[active[mid]]
        if reaches(mid_end, t, inclusive):
            hi = mid
        else:
            lo = mid + 1
    hi = lo
    top = size
    while hi < top:
        mid = (hi + top) // 2
        mid_start = sess_start[active[mid]]
        if reaches(e, mid_start, inclusive):
            hi = mid + 1
        else:
            top = mid
    return lo, hi


def _insert_at(active: Int64Array, size: int, at: int, sid: int) -> None:
    """Insert session ``sid`` at ``active[at]``, shifting ``active[at:size]`` right by one."""
    for q in range(size, at, -1):
        active[q] = active[q - 1]
    active[at] = sid


def _drop_merged(active: Int64Array, size: int, lo: int, hi: int) -> int:
    """Remove ``active[lo + 1:hi]`` (merged into ``active[lo]``); return the new size."""
    gone = hi - lo - 1
    if gone > 0:
        for q in range(hi, size):
            active[q - gone] = active[q]
        size -= gone
    return size


def _find_root(parent: Int64Array, sid: int) -> int:
    """The session that finally holds ``sid`` (union-find), compressing the path to it."""
    root = sid
    while parent[root] != root:
        root = parent[root]
    while parent[sid] != root:
        following = parent[sid]
        parent[sid] = root
        sid = following
    return root


class EventGroups(NamedTuple):
    """Events grouped by session, each group in (time, arrival) order (or arrival order).

    Attributes:
        order: int64[n], event indices; the events of session ``j`` are
            ``order[offsets[j]:offsets[j + 1]]``.
        offsets: int64[s + 1], ascending, ``offsets[0] == 0`` and ``offsets[-1] == n``.
    """

    order: Int64Array
    offsets: Int64Array


# -- the fused plan of the batch path: plan, groups and absorbed sessions in one pass -------


class DensePlan(NamedTuple):
    """What :func:`plan_dense` returns: the plan and both groupings the aggregations need.

    Attributes:
        plan: the :class:`SessionPlan` (exactly the planner's reference answer).
        events: the events of each planned session (:class:`EventGroups`), each group in
            (time, arrival) order when asked for (``by_time``), else in arrival order.
        absorbed: the open sessions each planned session absorbed, ordered by start (what
            :func:`group_open_sessions` returns).
    """

    plan: SessionPlan
    events: EventGroups
    absorbed: EventGroups


def plan_dense(
    key_codes: Any,
    keys: int,
    times_ms: Any,
    ends_ms: Any,
    closed_before_ms: Any,
    open_codes: Any,
    open_starts_ms: Any,
    open_ends_ms: Any,
    inclusive: bool,
    *,
    by_time: bool = True,
) -> DensePlan:
    """The plan of one batch of accepted events, with each session's events and absorbed open
    sessions, in one compiled pass, for key codes that are dense (``0 <= code < keys``, as a
    factorisation gives them).

    The loop being reproduced (:func:`sessionstore.engine.planner.plan_reference`): events are
    taken in the order given (arrival order). Event ``i`` of key ``k`` has the window
    ``[times_ms[i], ends_ms[i])``. The sessions of ``k`` whose end is ``<= closed_before_ms[i]``
    are final: they never merge again. The event merges with every session of ``k`` that is not
    final and whose window overlaps its own (``inclusive=True``: overlaps or touches;
    ``inclusive=False``: overlaps strictly); the merged session spans all of them and the event.
    If nothing merges, the event opens a session of its own.

    The events and the open sessions are put in key order by counting sorts (no comparison
    sort over the batch), each key's sessions come out of its sequential pass already in
    ``(start, end, creation)`` order, and each session's events are ordered by time within
    the session (most are short and already in order), so the batch is never sorted as a
    whole. The answer is the reference's (property-tested against it).

    Args:
        key_codes: int64[n], each event's key code, in ``[0, keys)``.
        keys: how many key codes there are.
        times_ms, ends_ms: int64[n], each event's time and own window end (``> time``).
        closed_before_ms: int64[n], the close cursor on each event's arrival; it must not
            decrease from one event of a key to the next.
        open_codes: int64[m], each open session's key code, in ``[0, keys)``.
        open_starts_ms, open_ends_ms: int64[m], the open sessions (``start < end``), any
            order; those of a key not final at its first event must be disjoint (and not
            touch, when ``inclusive``).
        inclusive: whether windows that merely touch merge.
        by_time: False leaves each session's events in arrival order (enough for count,
            integer sums, min and max, which do not depend on the order).

    Returns:
        A :class:`DensePlan`.

    Raises:
        TypeError: an argument does not hold integers.
        ValueError: lengths differ; an event has ``ends_ms <= times_ms``; an open session has
            ``start >= end``; ``closed_before_ms`` decreases within a key; open sessions
            overlap; a key code outside ``[0, keys)`` (naming the argument and the row).
    """
    codes, times, ends, closed, o_codes, o_starts, o_ends = _plan_inputs(
        key_codes, times_ms, ends_ms, closed_before_ms, open_codes, open_starts_ms, open_ends_ms)
    keys = int(keys)
    for name, array in (("key_codes", codes), ("open_codes", o_codes)):
        bad = (array < 0) | (array >= keys)
        if bad.any():
            row = first_row(bad)
            raise ValueError(f"{name}[{row}] = {array[row]} is not in [0, {keys})")
    (status, bad_row, s_codes, s_starts, s_ends, event_session, open_session, event_order,
     event_offsets, absorbed_order, absorbed_offsets) = compiled(_plan_dense)(
        codes, keys, times, ends, closed, o_codes, o_starts, o_ends, bool(inclusive),
        bool(by_time))
    if status == _CLOSED_BEFORE_DECREASES:
        raise ValueError(
            f"closed_before_ms[{bad_row}] = {closed[bad_row]} is below an earlier event's of "
            f"the same key (key code {codes[bad_row]}): it must not decrease within a key"
        )
    if status == _OPEN_SESSIONS_OVERLAP:
        rule = "overlap or touch" if inclusive else "overlap"
        raise ValueError(
            f"open session {bad_row} (key code {o_codes[bad_row]}, [{o_starts[bad_row]}, "
            f"{o_ends[bad_row]})) and another open session of that key {rule}; open sessions "
            f"that are not final must be disjoint"
        )
    return DensePlan(
        SessionPlan(s_codes, s_starts, s_ends, event_session, open_session),
        EventGroups(event_order, event_offsets),
        EventGroups(absorbed_order, absorbed_offsets),
    )


def _before(x: int, y: int, a: Int64Array, b: Int64Array, c: Int64Array) -> bool:
    """Whether row ``x`` sorts strictly before row ``y`` by ``(a, b, c)``."""
    if a[x] != a[y]:
        return bool(a[x] < a[y])
    if b[x] != b[y]:
        return bool(b[x] < b[y])
    return bool(c[x] < c[y])


def _sort_rows(idx: Int64Array, lo: int, hi: int, a: Int64Array, b: Int64Array,
               c: Int64Array, buffer: Int64Array) -> None:
    """Sort ``idx[lo:hi]`` (row numbers) stably by ``(a, b, c)`` of the rows, in place.

    Already sorted slices (the common case) cost one pass; short ones an insertion sort;
    longer ones a bottom-up merge sort through ``buffer`` (at least ``hi - lo`` long), so no
    input makes it quadratic.
    """
    if hi - lo < 2:
        return
    ordered = True
    for q in range(lo + 1, hi):
        if _before(idx[q], idx[q - 1], a, b, c):
            ordered = False
            break
    if ordered:
        return
    if hi - lo <= 16:
        for q in range(lo + 1, hi):
            row = idx[q]
            p = q
            while p > lo and _before(row, idx[p - 1], a, b, c):
                idx[p] = idx[p - 1]
                p -= 1
            idx[p] = row
        return
    size = hi - lo
    width = 1
    while width < size:
        for left in range(0, size, 2 * width):
            mid = min(left + width, size)
            right = min(left + 2 * width, size)
            i = left
            j = mid
            out = left
            while i < mid and j < right:
                if _before(idx[lo + j], idx[lo + i], a, b, c):
                    buffer[out] = idx[lo + j]
                    j += 1
                else:
                    buffer[out] = idx[lo + i]
                    i += 1
                out += 1
            while i < mid:
                buffer[out] = idx[lo + i]
                i += 1
                out += 1
            while j < right:
                buffer[out] = idx[lo + j]
                j += 1
                out += 1
        for q in range(size):
            idx[lo + q] = buffer[q]
        width *= 2


def _plan_dense(
    codes: Int64Array,
    keys: int,
    times: Int64Array,
    ends: Int64Array,
    closed: Int64Array,
    open_codes: Int64Array,
    open_starts: Int64Array,
    open_ends: Int64Array,
    inclusive: bool,
    by_time: bool,
) -> tuple[int, int, Int64Array, Int64Array, Int64Array, Int64Array, Int64Array, Int64Array,
           Int64Array, Int64Array, Int64Array]:
    """The compiled pass of :func:`plan_dense` (a per-key sequential loop, with counting sorts
    around it).

    Returns ``(status, bad_row, session codes, starts, ends, event_session, open_session,
    event order, event offsets, absorbed order, absorbed offsets)``.
    """
    n = len(times)
    m = len(open_starts)
    capacity = n + m
    # counting sorts by key code: arrival order (events) and given order (open sessions) kept
    event_bounds = np.zeros(keys + 1, dtype=np.int64)
    for i in range(n):
        event_bounds[codes[i] + 1] += 1
    open_bounds = np.zeros(keys + 1, dtype=np.int64)
    for j in range(m):
        open_bounds[open_codes[j] + 1] += 1
    largest = 0
    for g in range(keys):
        size = event_bounds[g + 1] + open_bounds[g + 1]
        if size > largest:
            largest = size
        event_bounds[g + 1] += event_bounds[g]
        open_bounds[g + 1] += open_bounds[g]
    # the events' columns are gathered in key order, so that the pass reads them in sequence
    event_order = np.empty(n, dtype=np.int64)
    key_times = np.empty(n, dtype=np.int64)
    key_ends = np.empty(n, dtype=np.int64)
    key_closed = np.empty(n, dtype=np.int64)
    fill = event_bounds[:-1].copy()
    for i in range(n):
        k = fill[codes[i]]
        fill[codes[i]] += 1
        event_order[k] = i
        key_times[k] = times[i]
        key_ends[k] = ends[i]
        key_closed[k] = closed[i]
    open_order = np.empty(m, dtype=np.int64)
    fill = open_bounds[:-1].copy()
    for j in range(m):
        open_order[fill[open_codes[j]]] = j
        fill[open_codes[j]] += 1
    buffer = np.empty(max(capacity, 1), dtype=np.int64)
    for g in range(keys):  # each key's open sessions by start (ties: given order)
        _sort_rows(open_order, open_bounds[g], open_bounds[g + 1], open_starts, open_starts,
                   open_starts, buffer)

    # Session ids: the open session at position p of open_order has id p (so a key's open
    # sessions have neighbouring ids); the sessions events open get ids m, m+1, ... in creation
    # order. A merge keeps the id of the earliest-starting session it absorbs and points the
    # others at it (parent); roots are resolved at the end.
    parent = np.arange(capacity, dtype=np.int64)
    sess_start = np.empty(capacity, dtype=np.int64)
    sess_end = np.empty(capacity, dtype=np.int64)
    for p in range(m):
        sess_start[p] = open_starts[open_order[p]]
        sess_end[p] = open_ends[open_order[p]]
    touched = np.zeros(m, dtype=np.bool_)
    event_id = np.empty(n, dtype=np.int64)  # by position in key order
    rank_of_id = np.full(capacity, -1, dtype=np.int64)
    out_codes = np.empty(capacity, dtype=np.int64)
    out_starts = np.empty(capacity, dtype=np.int64)
    out_ends = np.empty(capacity, dtype=np.int64)
    ids = np.arange(capacity, dtype=np.int64)  # the last sort column: creation order
    active = np.empty(max(largest, 1), dtype=np.int64)  # the not-final sessions, by start
    mine = np.empty(max(largest, 1), dtype=np.int64)  # sessions the key's events made/touched
    next_id = m
    sessions = 0
    empty = np.empty(0, dtype=np.int64)
    for g in range(keys):
        e_lo = event_bounds[g]
        e_hi = event_bounds[g + 1]
        if e_lo == e_hi:
            continue
        first_closed = key_closed[e_lo]
        size = 0
        for sid in range(open_bounds[g], open_bounds[g + 1]):
            if is_final(sess_end[sid], first_closed):
                continue  # final before the key's first event: no event can touch it
            if size > 0:
                prev_end = sess_end[active[size - 1]]
                if reaches(prev_end, sess_start[sid], inclusive):
                    return (_OPEN_SESSIONS_OVERLAP, open_order[sid], empty, empty, empty, empty,
                            empty, empty, empty, empty, empty)
            active[size] = sid
            size += 1
        made = 0
        front = 0
        previous_closed = first_closed
        for k in range(e_lo, e_hi):
            t = key_times[k]
            e = key_ends[k]
            c = key_closed[k]
            if c < previous_closed:
                return (_CLOSED_BEFORE_DECREASES, event_order[k], empty, empty, empty, empty,
                        empty, empty, empty, empty, empty)
            previous_closed = c
            while front < size and is_final(sess_end[active[front]], c):
                front += 1
            lo, hi = _reach(active, front, size, sess_start, sess_end, t, e, inclusive)
            if lo == hi:
                sid = next_id
                next_id += 1
                sess_start[sid] = t
                sess_end[sid] = e
                _insert_at(active, size, lo, sid)
                size += 1
                mine[made] = sid
                made += 1
            else:
                sid = active[lo]
                new_start = sess_start[sid]
                if t < new_start:
                    new_start = t
                new_end = sess_end[active[hi - 1]]
                if e > new_end:
                    new_end = e
                if sid < m and not touched[sid]:
                    touched[sid] = True
                    mine[made] = sid
                    made += 1
                for q in range(lo + 1, hi):
                    other = active[q]
                    parent[other] = sid
                    if other < m:
                        touched[other] = True
                sess_start[sid] = new_start
                sess_end[sid] = new_end
                size = _drop_merged(active, size, lo, hi)
            event_id[k] = sid
        # the key's resulting sessions: those it made or touched that nothing absorbed, in
        # (start, end, creation) order; they take the next ranks, so the output is in
        # (code, start, end, creation) order without a sort over the batch
        roots = 0
        for q in range(made):
            sid = mine[q]
            if parent[sid] == sid:
                mine[roots] = sid
                roots += 1
        _sort_rows(mine, 0, roots, sess_start, sess_end, ids, buffer)
        for q in range(roots):
            sid = mine[q]
            rank_of_id[sid] = sessions
            out_codes[sessions] = g
            out_starts[sessions] = sess_start[sid]
            out_ends[sessions] = sess_end[sid]
            sessions += 1
    # every event and touched open session to the rank of the session that finally holds it
    event_session = np.empty(n, dtype=np.int64)
    open_session = np.full(m, -1, dtype=np.int64)
    for q in range(n + m):
        if q < n:
            sid = event_id[q]
        elif touched[q - n]:
            sid = q - n
        else:
            continue
        root = _find_root(parent, sid)
        if q < n:
            event_session[event_order[q]] = rank_of_id[root]
        else:
            open_session[open_order[q - n]] = rank_of_id[root]
    # each session's events: arrival order by a counting sort, then (time, arrival) order
    event_offsets = np.zeros(sessions + 1, dtype=np.int64)
    for i in range(n):
        event_offsets[event_session[i] + 1] += 1
    for s in range(sessions):
        event_offsets[s + 1] += event_offsets[s]
    grouped = np.empty(n, dtype=np.int64)
    fill = event_offsets[:-1].copy()
    for i in range(n):
        grouped[fill[event_session[i]]] = i
        fill[event_session[i]] += 1
    if by_time:
        for s in range(sessions):
            _sort_rows(grouped, event_offsets[s], event_offsets[s + 1], times, times, times,
                       buffer)
    # each session's absorbed open sessions, by start (open_order is by key, then start)
    absorbed_offsets = np.zeros(sessions + 1, dtype=np.int64)
    absorbed = 0
    for j in range(m):
        if open_session[j] >= 0:
            absorbed_offsets[open_session[j] + 1] += 1
            absorbed += 1
    for s in range(sessions):
        absorbed_offsets[s + 1] += absorbed_offsets[s]
    absorbed_order = np.empty(absorbed, dtype=np.int64)
    fill = absorbed_offsets[:-1].copy()
    for q in range(m):
        j = open_order[q]
        if open_session[j] >= 0:
            absorbed_order[fill[open_session[j]]] = j
            fill[open_session[j]] += 1
    return (_OK, -1, out_codes[:sessions].copy(), out_starts[:sessions].copy(),
            out_ends[:sessions].copy(), event_session, open_session, grouped, event_offsets,
            absorbed_order, absorbed_offsets)


register_helpers({
    "_sort_rows": (_before,),
    "_reach": (reaches,),
    "_plan_dense": (_sort_rows, _reach, _insert_at, _drop_merged, _find_root, reaches,
                    is_final),
})
