"""Session boundaries of events sorted by (key, time): the gap rule on sorted input.

:func:`scan_sessions` is the rule, written once as a sequential pass (docs/semantics.md,
"Maximum session duration": per key, as if all the events were known). The event at row ``i``
starts a session when it is the first of its key, when it is not gap-connected to the session
so far (``t > run`` with ``inclusive_gap``, ``t >= run`` without: not
:func:`~sessionstore.gap_boundary.reaches`, ``run`` being the largest ``t_j + gap_j`` of the
session's events), or when ``t >= start + max_duration``.

:func:`session_starts` answers the same question with array operations when there is no maximum
duration (the common case, no compiled code), and calls :func:`scan_sessions`, compiled, when
there is one; a property test pins the array form to the pass.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from ..gap_boundary import reaches
from ..timeutil import INT64_MAX

Int64Array = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


def scan_sessions(codes: Int64Array, times: Int64Array, ends: Int64Array, inclusive: bool,
                  max_duration: int) -> BoolArray:
    """Which rows start a session, rows being sorted by (code, time).

    Args:
        codes: int64[n], key codes, non-decreasing.
        times: int64[n], event times, non-decreasing within a code.
        ends: int64[n], each event's own window end ``t + gap`` (``> t``).
        inclusive: whether an event exactly at the session's reach joins it.
        max_duration: the maximum session duration (> 0), or 0 for none.

    Returns:
        bool[n], True where a session starts.
    """
    n = len(times)
    first = np.zeros(n, dtype=np.bool_)
    run = 0
    limit = 0
    for i in range(n):
        t = times[i]
        # not reaches(run, t, inclusive), inline: a compiled call here costs ~7% of the pass;
        # pinned to reaches by tests/bounded/test_scan_rule.py
        if i == 0 or codes[i] != codes[i - 1]:
            new = True
        elif inclusive:
            new = t > run
        else:
            new = t >= run
        # not within_max_duration(t, start, max_duration), inline as above; pinned by
        # tests/engine/test_max_duration_rule.py
        if not new and max_duration > 0 and t >= limit:
            new = True
        if new:
            first[i] = True
            run = ends[i]
            # start + max_duration, saturated: a limit past int64 is never reached
            limit = t + max_duration if t <= INT64_MAX - max_duration else INT64_MAX
        elif ends[i] > run:
            run = ends[i]
    return first


def _segmented_running_max(codes: Int64Array, ends: Int64Array) -> Int64Array | None:
    """The running maximum of ``ends`` within each run of equal codes, or None when the shift
    that separates the codes does not fit in int64."""
    low = int(ends.min())
    span = int(ends.max()) - low + 1
    top = int(codes.max()) - int(codes.min())
    if span * (top + 1) >= 2**62:
        return None
    shift = (codes - codes.min()) * np.int64(span)
    shifted = (ends - np.int64(low)) + shift
    return np.maximum.accumulate(shifted) - shift + np.int64(low)  # type: ignore[no-any-return]


def session_starts(codes: Int64Array, times: Int64Array, ends: Int64Array, *, inclusive: bool,
                   fixed_gap: bool, max_duration: int | None) -> BoolArray:
    """:func:`scan_sessions`' answer (same arguments; ``max_duration`` None for none), with
    array operations where the rule allows: ``fixed_gap`` says every event has the same gap, so
    that a session's reach is its last event's end."""
    n = len(times)
    if n == 0:
        return np.zeros(0, dtype=np.bool_)
    if max_duration is not None:
        from ..jit import compiled

        return compiled(scan_sessions)(codes, times, ends, bool(inclusive), int(max_duration))
    if fixed_gap:
        reach = ends[:-1]
    else:
        running = _segmented_running_max(codes, ends)
        if running is None:
            from ..jit import compiled

            return compiled(scan_sessions)(codes, times, ends, bool(inclusive), 0)
        reach = running[:-1]
    first = np.empty(n, dtype=np.bool_)
    first[0] = True
    later = times[1:]
    np.not_equal(codes[1:], codes[:-1], out=first[1:])
    joins = reaches(reach, later, inclusive)
    first[1:] |= ~joins
    return first


def session_bounds(starts_at: Int64Array, times: Int64Array, ends: Int64Array,
                   max_duration: int | None, *, fixed_gap: bool
                   ) -> tuple[Int64Array, Int64Array]:
    """Each session's ``[start, end)``: its first time, and the largest ``t + gap`` of its
    events, capped at ``start + max_duration``.

    Args:
        starts_at: int64[s], the row where each session starts (ascending, first is 0).
        times, ends: as :func:`scan_sessions`.
    """
    start = times[starts_at]
    if len(starts_at) == 0:
        return start, start.copy()
    if fixed_gap:
        end = ends[np.append(starts_at[1:], len(times)) - 1]
    else:
        end = np.maximum.reduceat(ends, starts_at)
    if max_duration is not None:
        end = np.minimum(end, saturated_add(start, max_duration))
    return start, end


def saturated_add(values: Int64Array, amount: int) -> Int64Array:
    """``values + amount`` (amount >= 0), INT64_MAX where that does not fit: a limit past
    int64 is never reached."""
    room = np.int64(INT64_MAX - amount)
    return np.where(values <= room, values + np.int64(amount), np.int64(INT64_MAX))
