"""What every part of the maximum-duration step shares (:mod:`sessionstore.engine.max_duration`
describes the rule and how the parts fit): the options and what they imply, the work counters,
the end of a capped window, and the helpers over a session's kept events.

An event is a list ``[t, seq, own_end, value]`` (:data:`EVENT_TIME`, :data:`EVENT_SEQ`,
:data:`EVENT_VALUE` read it); a session's events are in (time, arrival) order
(:data:`EVENT_ORDER`). The parts' changes to a key's open sessions are :data:`Removed` and
:data:`Added` items.
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any

import numpy as np

from ..aggregations import Aggregation, Combined, is_count
from ..types import Session
from .columnar import NUMERIC_KINDS, columnar_parts
from .record import events_of

if TYPE_CHECKING:
    from .host import EngineHost

EVENT_TIME = operator.itemgetter(0)
"""An event's time ``t``."""
EVENT_SEQ = operator.itemgetter(1)
"""An event's arrival number."""
EVENT_VALUE = operator.itemgetter(3)
"""An event's value."""
EVENT_ORDER = operator.itemgetter(0, 1)
"""The (time, arrival) order of events."""

ChangeLog = dict[Session, list[Any]]
"""Per session touched in a batch: ``[accumulator delivered before the batch or None,
accumulator now or None]``."""

Removed = tuple[tuple[int, int], Any]
"""A stored open session a step removes: ``(bounds, its accumulator)``."""

Added = tuple[int, int, Any, list[Any], int, bool, Any]
"""A session a step writes: ``(start, end, acc, events, max_end, whether the bounds are new,
the old accumulator of a session changed in place)``."""


_NUMBERS = frozenset((int, bool, float, np.float64))
"""The numbers a held key's sums may add and its minima and maxima compare (class 0; numpy's
``float64`` is a float: an element of an array or a pandas column)."""
_CLASSES: dict[type, int] = {str: 1, bytes: 2}
"""The classes of values a held key's minima and maxima may compare besides numbers (class 0)
and lists of numbers (:data:`_NUMBER_LISTS`)."""
_NUMBER_LISTS = 3
"""The class of a list whose items are all numbers (:data:`_NUMBERS`; the empty list too): two
such lists compare item by item, numbers with numbers, which cannot fail."""
_EXACT_EXTREMES = frozenset((int, bool, str, bytes))
"""The types whose equal values are indistinguishable (a minimum or maximum of one of them
does not depend on which equal value came first)."""


def own_window_end(t_ms: int, own_end_ms: int, max_duration_ms: int) -> int:
    """The end of the session an event at ``t_ms`` forms alone: ``t + min(gap, max_duration)``.

    The same capped end, ``min(max_end, start + max_duration)``, is that of any session
    starting at ``t_ms`` whose events' largest own end is ``own_end_ms``. The late rule
    (:meth:`~sessionstore.engine.time.TimeKeeper.is_late`) takes it as the event's own window
    end. :func:`own_window_ends` is its form over arrays.
    """
    capped = t_ms + max_duration_ms
    return own_end_ms if own_end_ms < capped else capped


def own_window_ends(times_ms: np.ndarray, own_ends_ms: np.ndarray, max_duration_ms: int
                    ) -> np.ndarray:
    """:func:`own_window_end` of each event of a batch (int64 arrays), without overflowing
    int64 where ``t + max_duration`` would (``own_end - t`` is the event's gap, at most
    ``max_gap_ms``)."""
    return np.asarray(times_ms + np.minimum(own_ends_ms - times_ms, max_duration_ms))


def stored_events(raw: Any, key: Any, bounds: tuple[int, int]) -> tuple[list[Any], int]:
    """The events and largest own end the stored record ``raw`` of ``key``'s session
    ``bounds`` keeps.

    Raises:
        ValueError: the record was written without ``max_duration_ms`` (or is damaged).
    """
    kept = events_of(raw)
    if kept is None:
        raise ValueError(
            f"session {Session(key, *bounds)} was stored without max_duration_ms (its record "
            f"keeps no events); open this store with the windows it was written with"
        )
    return kept


def fold_events(agg: Aggregation, key: Any, events: list[Any]) -> Any:
    """The accumulator of ``events`` (in (time, arrival) order): ``initial()``, then each
    event's ``add`` (``add_run`` gives the same by its contract; count's ``add_run`` is the
    number of events, which needs no lists)."""
    if is_count(agg):
        return agg.initial() + len(events)
    return agg.add_run(key, list(map(EVENT_VALUE, events)), list(map(EVENT_TIME, events)),
                       list(map(EVENT_SEQ, events)), agg.initial())


class DurationState:
    """The state the maximum-duration parts share.

    Args:
        engine: the engine served (its store, cursors, aggregation and emission).
        max_duration_ms: the maximum session duration.

    Attributes:
        engine, max_duration_ms: as given.
        incremental: the aggregation is a built-in one (or a combination of them): a session's
            accumulator extends a copy of the stored one (merge into ``initial()`` copies it
            exactly), and its keys may be held (their adds cannot fail on ints and floats
            whose sums stay in int64, and their accumulators of encodable values encode);
            any other aggregation is folded again from the events (an event after every
            event of its session is added to a fresh copy of the stored accumulator:
            :meth:`.EventStep._grow`), so that only its initializer and aggregator are used,
            on fresh accumulators, and fails at the event that breaks it.
        fixed_gap: every event has the windows' fixed gap.
        lazy: the event path holds keys (``ON_WINDOW_CLOSE``); a batch holds keys with either
            emission.
        numeric: ``(is a sum, column, index in the accumulator or None)`` of the parts whose
            adds look at the value's number.
        order_free_adds: no such part: the adds of the other built-ins (count, first, last,
            collect) give the fold in (time, arrival) order whatever order they come in.
        checked_sums_only: the accumulator is checked (``engine.check_acc``) only for its sums
            (every other part of a built-in encodes whatever encodable values it adds): a sum
            of ints that stays in int64 is an int, which encodes, so such an add needs no
            check (:meth:`in_place_add`).
        recut_events: the events of the sessions re-cuts wrote (each is copied into its record
            and folded).
        recut_steps: the steps of re-cuts done one by one in Python: binary searches (or,
            with a gap per event, events scanned) and sessions written (operation counts:
            tests bound the work of disordered input with them, without timing).
    """

    __slots__ = ("engine", "max_duration_ms", "incremental", "fixed_gap", "lazy", "numeric",
                 "order_free_adds", "checked_sums_only", "recut_events", "recut_steps")

    def __init__(self, engine: EngineHost, max_duration_ms: int) -> None:
        self.engine = engine
        self.max_duration_ms = max_duration_ms
        parts = columnar_parts(engine.aggregation)
        self.incremental = parts is not None
        self.fixed_gap = not engine.config.dynamic
        self.lazy = not engine.updates
        combined = isinstance(engine.aggregation, Combined)
        self.numeric = [(kind == "sum", column, i if combined else None)
                        for i, (kind, column) in enumerate(parts or []) if kind in NUMERIC_KINDS]
        self.order_free_adds = not self.numeric
        aggregation = engine.aggregation
        members = aggregation.parts if isinstance(aggregation, Combined) else [aggregation]
        self.checked_sums_only = self.incremental and all(
            part.acc_always_encodable or part.columnar_kind == "sum" for part in members)
        self.recut_events = 0
        self.recut_steps = 0

    def magnitude(self, value: Any) -> tuple[int, int] | None:
        """What holding ``value`` needs to know so that writing its key cannot fail: ``(the
        sum of the magnitudes of its int numbers that sums add, the classes of what its
        minima and maxima compare)``; None when a number a sum adds is not an int, a bool or
        a float (numpy's ``float64`` too: an element of an array), or one a minimum or
        maximum compares is none of those, a str, bytes or a list of numbers (or it is
        missing): the event then takes the exact step, whose add fails at that event if it
        must. Other subclasses (an ``IntEnum``, say) are none of those: their operators are the
        user's. Other numpy scalars and ``Decimal`` never get here: the store refuses them at
        the event (a record keeps its events' values). The classes (:data:`_CLASSES`:
        numbers, strs, bytes, lists of numbers; two bits per minimum or maximum) must be the
        same for every event of a held key: what one class holds never fails to compare
        with itself, nor is it compared with another."""
        total = 0
        classes = 0
        for i, (is_sum, column, _) in enumerate(self.numeric):
            try:
                number = value if column is None else value[column]
            except (KeyError, TypeError, IndexError):
                return None
            kind = type(number)
            if kind is int or kind is bool:
                if is_sum:
                    total += number if number >= 0 else -number
            elif kind not in _NUMBERS:  # (a float: numpy's float64 too)
                cls = _CLASSES.get(kind)
                if kind is list and _NUMBERS.issuperset(map(type, number)):
                    cls = _NUMBER_LISTS
                if cls is None or is_sum:
                    return None
                classes |= cls << 2 * i
        return total, classes

    def in_place_add(self, acc: Any, value: Any) -> bool:
        """Whether adding ``value`` to a session's accumulator ``acc`` (of a built-in
        aggregation: ``incremental``) anywhere among its events gives the fold in (time,
        arrival) order and needs no accumulator check, so that it can be done in place (the
        event path, inside a session, and its in-place insert).

        Without a check: the order-free built-ins (count, first, last, collect), or sums,
        minima and maxima whose adds are exact (:meth:`exact_adds`: ints, and strs for minima
        and maxima). With one, only when the sums are what is checked (``checked_sums_only``)
        and the adds are exact: an int sum is exact and order-free, its overflow raises at
        the event (:func:`~sessionstore.aggregations.int64_sum`, before anything changes),
        and an int in int64 encodes, as does a str. A float sum keeps the time-ordered fold
        (its rounding depends on the order of the adds: bit-identical to the static path),
        and user functions are folded again from the events (they are not
        ``incremental``)."""
        if self.engine.check_acc:
            return self.checked_sums_only and self.exact_adds(acc, value)
        return self.order_free_adds or self.exact_adds(acc, value)

    def exact_adds(self, acc: Any, value: Any) -> bool:
        """Whether the sums of ``acc`` and ``value`` are ints and their minima and maxima
        ints, bools, strs or bytes (the accumulator's of the value's type), so that an
        ``add`` anywhere gives the fold in (time, arrival) order: int sums are exact, and the
        minimum of ints (or of strs...) is the same whichever equal one is seen first, equal
        ones being indistinguishable (not so for floats: -0.0 and 0.0 are equal, nor for an
        int and a bool; a sum stays an int only while every value added was one)."""
        for is_sum, column, index in self.numeric:
            try:
                number = value if column is None else value[column]
            except (KeyError, TypeError, IndexError):
                return False
            kind = type(number)
            if kind is not int and (is_sum or kind not in _EXACT_EXTREMES):
                return False
            if type(acc if index is None else acc[index]) is not kind:
                return False
        return True
