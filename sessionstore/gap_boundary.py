"""The gap-boundary convention, in one place: when does a window reach a point?

A session (or an event's own window) ``[start, end)`` reaches a point ``p`` (an event's time, or
another window's start) when ``p < end``; with ``inclusive_gap`` also when ``p == end`` (touching
windows merge, as in Spark, Flink and Kafka Streams; without it they stay apart, as in Beam).

Two windows merge when each reaches the other's start. :func:`reaches` is the rule; every path
calls it (the compiled planner kernel calls its compiled form; a sorted scan over bounded input
asks ``reaches(running_end, next_time, inclusive)`` to decide whether the next event continues
the session, and its compiled pass inlines that, pinned by ``tests/bounded/test_scan_rule.py``). :func:`merge_bounds` is the same rule as the closed range a store scans
(``find_sessions_to_merge``), tested equal to :func:`reaches` in ``tests/engine/test_rules.py``.

The close cursor's rule lives here too, beside :func:`reaches`, for the same reason:
:func:`is_final` (a session ending at or before "closed before" never changes again) is called
by every path, and compiled into the planner kernel as :func:`reaches` is;
:func:`first_open_end` is the same rule as the lower bound of a store scan.

The maximum duration's membership rule lives here too (:func:`within_max_duration`): with
``max_duration``, an event joins a session only before ``start + max_duration``; the engine's
cuts and the bounded path's array-free scans call it or, in compiled and binary-search forms,
inline it (pinned by ``tests/engine/test_max_duration_rule.py``).

This module imports nothing of the package, so that kernels, the engine and the bounded path can all use it.
"""

from __future__ import annotations

from typing import Any


def reaches(end_ms: Any, point_ms: Any, inclusive: bool) -> Any:
    """Whether a window ending at ``end_ms`` (exclusive) reaches ``point_ms``.

    Args:
        end_ms: the window's end (``start + gap`` for an event's own window).
        point_ms: an event's time or another window's start.
        inclusive: the ``inclusive_gap`` convention (touching windows merge).

    Works on ints and, elementwise, on numpy arrays (a bool array then).
    """
    return point_ms <= end_ms if inclusive else point_ms < end_ms


def merge_bounds(t_ms: int, own_end_ms: int, inclusive: bool) -> tuple[int, int]:
    """``(earliest_end, latest_start)``: a session ``[start, end)`` and the event window
    ``[t_ms, own_end_ms)`` merge iff ``end >= earliest_end and start <= latest_start``, that
    is iff ``reaches(end, t_ms) and reaches(own_end_ms, start)`` (the store's
    ``find_sessions_to_merge`` range)."""
    if inclusive:
        return t_ms, own_end_ms
    return t_ms + 1, own_end_ms - 1


def is_final(end_ms: Any, closed_before_ms: Any) -> Any:
    """The closed-before rule: whether a session ending at ``end_ms`` is final (it joins
    nothing and never changes again) when the close cursor is ``closed_before_ms``
    (:meth:`~sessionstore.engine.time.TimeKeeper.closed_before`): ``end <= closed_before``.

    Works on ints and, elementwise, on numpy arrays (a bool array then). Every path calls it;
    the per-event loops that inline it for speed are pinned to it by the tests
    ``docs/engine.md`` names for each ("One rule, one place": ``tests/engine/test_rules.py``,
    ``tests/kernels/test_plan_dense.py`` and the max-duration suites).
    """
    return end_ms <= closed_before_ms


_INT64_MAX = 2**63 - 1  # sessionstore.timeutil.INT64_MAX (this module imports nothing)


def first_open_end(closed_before_ms: int) -> int:
    """The smallest end of a session that is not final (:func:`is_final`): the closed-before
    rule as the lower bound of a store scan, ``end >= closed_before + 1`` (saturated at the
    largest int64 time, which a store time must fit)."""
    return closed_before_ms + 1 if closed_before_ms < _INT64_MAX else _INT64_MAX


def within_max_duration(t_ms: int, start_ms: int, max_duration_ms: int) -> bool:
    """The maximum duration's membership rule: an event at ``t_ms`` may belong to a session
    that started at ``start_ms`` only when ``t < start + max_duration`` (a session spans less
    than ``max_duration``; an event exactly ``max_duration`` after the start begins a new one).

    On Python ints (which never wrap). The compiled scan of the bounded path
    (``bounded.scan.scan_sessions``, with a limit saturated at the largest int64) and the
    engine's binary search over a run of events (``cuts.cut_pieces``: the first event at or
    past ``start + max_duration``) inline it; ``tests/engine/test_max_duration_rule.py`` pins
    both, and the per-event step of ``max_duration_step``, to it.
    """
    return t_ms < start_ms + max_duration_ms
