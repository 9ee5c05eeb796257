"""The built-in aggregations over a planned batch: per-session count, sum, min, max, first, last
and collect, vectorised over the groups the planner returns (:mod:`sessionstore.kernels`).
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np
import numpy.typing as npt

from .arrays import Int64Array, first_row, int64_column
from .jit import compiled
from .kernels import EventGroups, SessionPlan
from .timeutil import INT64_MAX, INT64_MIN

# -- aggregations over a plan ----------------------------------------------------------------
#
# Order of combination, the contract the event path must match to be bit-for-bit equal: a
# session's events are taken in (time, arrival) order; a float sum is a left fold in that order
# (((v0 + v1) + v2) + ...), starting from ``initial`` when one is given and from v0 otherwise.
# np.add.reduceat cannot be used for floats: it sums pairwise in blocks, which is not a left
# fold (measured: it differs from the fold in the last bits on long segments). Integer sums do
# not depend on the order: they are computed modulo 2**64 and checked to fit in int64.
# min/max order NaN above every value (a minimum skips NaN unless all are NaN: np.fmin; a
# maximum is NaN when one is: np.maximum), so their result does not depend on order either.


def group_events(
    event_session: Any, times_ms: Any, sessions: int, *, by_time: bool = True
) -> EventGroups:
    """Group the events of a batch by the session that holds them.

    Args:
        event_session: int64[n], each event's session index (``SessionPlan.event_session``).
        times_ms: int64[n], event times, to order each group by (time, arrival).
        sessions: how many sessions there are; every one must hold at least one event.
        by_time: False orders each group by arrival alone.

    Returns:
        :class:`EventGroups`.

    Raises:
        ValueError: lengths differ, an index is outside ``[0, sessions)``, or a session holds no
            event.
    """
    owner = int64_column("event_session", event_session)
    times = int64_column("times_ms", times_ms)
    if len(times) != len(owner):
        raise ValueError(f"times_ms has {len(times)} rows, event_session has {len(owner)}")
    if len(owner) and (owner.min() < 0 or owner.max() >= sessions):
        row = first_row((owner < 0) | (owner >= sessions))
        raise ValueError(f"event_session[{row}] = {owner[row]} is not in [0, {sessions})")
    counts = np.bincount(owner, minlength=sessions)
    if sessions and counts.min() == 0:
        raise ValueError(f"session {int(np.argmin(counts))} holds no event")
    order = np.lexsort((times, owner)) if by_time else np.argsort(owner, kind="stable")
    offsets = np.zeros(sessions + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    return EventGroups(order.astype(np.int64), offsets)


def _numeric_column(name: str, values: Any, n: int) -> npt.NDArray[Any]:
    array = np.asarray(values)
    if array.dtype.kind == "f" and array.ndim == 1 and len(array) == n:
        return array.astype(np.float64, copy=False)
    try:
        return int64_column(name, array, n)
    except TypeError:
        raise TypeError(f"{name} must hold ints or floats, got dtype {array.dtype}") from None


def count_per_session(groups: EventGroups) -> Int64Array:
    """How many events of the batch each session holds."""
    return np.diff(groups.offsets)


def sum_per_session(
    groups: EventGroups, values: Any, initial: Any = None
) -> npt.NDArray[Any]:
    """The sum of each session's event values, combined in the documented order.

    Args:
        groups: from :func:`group_events`.
        values: int or float [n], one per event.
        initial: optional [s], each session's accumulator before the batch; the fold starts
            from it (for floats the order matters: ``((initial + v0) + v1) + ...``).

    Returns:
        int64[s] for integer values, float64[s] for floats (floats win if either is float).

    Raises:
        OverflowError: an integer sum does not fit in int64 (the message names the session).
        TypeError / ValueError: values that are not numbers, or of the wrong length.
    """
    order, offsets = groups
    sessions = len(offsets) - 1
    data = _numeric_column("values", values, len(order))
    start = None if initial is None else _numeric_column("initial", initial, sessions)
    if data.dtype.kind == "f" or (start is not None and start.dtype.kind == "f"):
        data = data.astype(np.float64, copy=False)
        first = np.zeros(sessions, dtype=np.float64) if start is None else start.astype(
            np.float64, copy=False)
        return cast(npt.NDArray[Any], compiled(_fold_add)(
            order, offsets, data, first, start is not None))
    if sessions == 0:
        return np.zeros(0, dtype=np.int64)
    sorted_values = data[order]
    with np.errstate(over="ignore"):
        total = np.add.reduceat(sorted_values, offsets[:-1])  # exact modulo 2**64
        if start is not None:
            total = total + start
    # The wrapped total is the true sum whenever the true sum fits in int64. A float estimate
    # (off by far less than 2**61 here) finds the sessions that might not fit; those are
    # recomputed with Python ints.
    estimate = np.add.reduceat(sorted_values.astype(np.float64), offsets[:-1])
    if start is not None:
        estimate = estimate + start.astype(np.float64)
    for j in np.flatnonzero(np.abs(estimate) >= 2.0**62).tolist():
        exact = sum(sorted_values[offsets[j]:offsets[j + 1]].tolist())
        if start is not None:
            exact += int(start[j])
        if not INT64_MIN <= exact <= INT64_MAX:
            raise OverflowError(f"the sum of session {j} is {exact}, which does not fit in int64")
    return cast(Int64Array, total)


def _fold_add(order: Int64Array, offsets: Int64Array, values: npt.NDArray[np.float64],
              initial: npt.NDArray[np.float64], use_initial: bool) -> npt.NDArray[np.float64]:
    sessions = len(offsets) - 1
    out = np.empty(sessions, dtype=np.float64)
    for j in range(sessions):
        k = offsets[j]
        if use_initial:
            acc = initial[j]
        else:
            acc = values[order[k]]
            k += 1
        for q in range(k, offsets[j + 1]):
            acc += values[order[q]]
        out[j] = acc
    return out


def _reduce_per_session(groups: EventGroups, values: Any,
                        ufunc: np.ufunc) -> npt.NDArray[Any]:
    order, offsets = groups
    data = _numeric_column("values", values, len(order))
    if len(offsets) == 1:
        return data[:0]
    return ufunc.reduceat(data[order], offsets[:-1])


def min_per_session(groups: EventGroups, values: Any) -> npt.NDArray[Any]:
    """The smallest event value of each session; NaN only if every value is NaN."""
    return _reduce_per_session(groups, values, np.fmin)


def max_per_session(groups: EventGroups, values: Any) -> npt.NDArray[Any]:
    """The largest event value of each session; NaN if any value is NaN."""
    return _reduce_per_session(groups, values, np.maximum)


def signed_zero_extremes(best: npt.NDArray[Any], kind: str,
                         sources: list[tuple[Int64Array, npt.NDArray[Any]]]
                         ) -> npt.NDArray[Any]:
    """Each session's ``min``/``max`` (``best``) with the sign of a zero result set by the rule of
    :func:`sessionstore.aggregations.smaller` and ``larger``: -0.0 is below 0.0, whatever the
    order numpy's ties took.

    Args:
        best: the per-session results of ``np.minimum``/``np.maximum`` over ``sources``.
        kind: ``"min"`` or ``"max"``.
        sources: ``(session index, value)`` arrays of every value that went into ``best``.

    Returns:
        ``best`` itself when no float result is zero (the common case costs one comparison),
        else a corrected copy.
    """
    if best.dtype.kind != "f":
        return best
    zero = best == 0
    if not zero.any():
        return best
    negative_wins = kind == "min"
    winner = np.zeros(len(best), dtype=bool)
    for owner, values in sources:
        data = np.asarray(values, dtype=np.float64)
        hit = (data == 0) & (np.signbit(data) == negative_wins)
        winner[owner[hit]] = True
    signs = np.where(winner[zero], -0.0 if negative_wins else 0.0,
                     0.0 if negative_wins else -0.0)
    fixed = best.copy()
    fixed[zero] = signs
    return fixed


def first_per_session(groups: EventGroups, values: Any) -> npt.NDArray[Any]:
    """The value of each session's first event by (time, arrival): any dtype, objects too."""
    order, offsets = groups
    return np.asarray(values)[order[offsets[:-1]]]


def last_per_session(groups: EventGroups, values: Any) -> npt.NDArray[Any]:
    """The value of each session's last event by (time, arrival): any dtype, objects too."""
    order, offsets = groups
    return np.asarray(values)[order[offsets[1:] - 1]]


def collect_per_session(groups: EventGroups, values: Any) -> list[list[Any]]:
    """Each session's event values as a Python list, ordered by (time, arrival)."""
    order, offsets = groups
    flat = np.asarray(values)[order].tolist()
    bounds = offsets.tolist()
    return [flat[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def group_open_sessions(plan: SessionPlan, open_starts_ms: Any) -> EventGroups:
    """The open sessions each planned session absorbed, ordered by start.

    Folding their accumulators in this order, then continuing with the session's events (see
    ``initial`` of :func:`sum_per_session`), is the documented order for merges. Sessions that
    absorbed nothing have an empty group.

    Returns:
        :class:`EventGroups` over open-session indices (``order`` lists only absorbed ones).
    """
    starts = int64_column("open_starts_ms", open_starts_ms)
    owner = plan.open_session
    if len(starts) != len(owner):
        raise ValueError(f"open_starts_ms has {len(starts)} rows, the plan has {len(owner)}")
    absorbed = np.flatnonzero(owner >= 0)
    order = absorbed[np.lexsort((starts[absorbed], owner[absorbed]))]
    sessions = len(plan.session_codes)
    offsets = np.zeros(sessions + 1, dtype=np.int64)
    np.cumsum(np.bincount(owner[absorbed], minlength=sessions), out=offsets[1:])
    return EventGroups(order.astype(np.int64), offsets)
