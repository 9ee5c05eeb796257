"""The order of each key's open sessions for the maximum-duration step, kept beside the cache's
view of the key so that an event finds its session by binary search instead of sorting the
key's sessions at every event (see :mod:`sessionstore.engine.max_duration`)."""

from __future__ import annotations

import bisect
from typing import Any

from .max_duration_state import Added, DurationState, Removed

# how many keys' open-session orders are kept beyond the keys the cache holds
_ORDERS_SLACK = 1024

OrderChange = tuple[int, int, list[tuple[int, int]]]
"""A re-cut's change to an order: ``order[low:high]`` is replaced by ``bounds``."""


class OpenOrders:
    """Per key, the bounds of its open sessions in order, and the cache's view they were read
    from.

    The order is kept with the view it was read from, and used only while the cache returns
    that same view: every change of a key's open sessions goes through the maximum-duration
    step, which updates the order (:func:`reindex`) or drops it (:meth:`forget`); the cache
    itself only forgets sessions that closed, which are a prefix (ends increase), or starts a
    new view (an eviction, an abort, a reload).
    """

    __slots__ = ("_state", "_orders")

    def __init__(self, state: DurationState) -> None:
        self._state = state
        # key -> (the cache's view of it, the bounds of its open sessions in order)
        self._orders: dict[Any, tuple[Any, list[tuple[int, int]]]] = {}

    def bounds(self, key: Any, view: Any, closed_before: int) -> list[tuple[int, int]]:
        """The bounds of ``key``'s open sessions (ending after ``closed_before``) in ``view``
        (what the cache's ``sessions_of`` returned), in order (disjoint: start order is end
        order). The list is the kept order itself: the caller changes it with
        :func:`reindex` as it changes the sessions."""
        entry = self._orders.get(key)
        if entry is not None and entry[0] is view:
            order = entry[1]
            closed = 0  # is_final(end, closed_before), inline: per event (test_closed_before)
            while closed < len(order) and order[closed][1] <= closed_before:
                closed += 1
            if closed:
                del order[:closed]
            return order
        # not is_final(end, closed_before), inline: per session read (test_closed_before)
        order = sorted(b for b in view if b[1] > closed_before)
        self._state.recut_steps += len(view)
        held = self._state.engine.cache.held_keys
        if held.get(key) is view:  # not when the cache writes through (a view per call)
            orders = self._orders
            if len(orders) >= len(held) + _ORDERS_SLACK:
                for gone in [k for k, e in orders.items() if held.get(k) is not e[0]]:
                    del orders[gone]  # views the cache no longer holds
            orders[key] = (view, order)
        return order

    def forget(self, key: Any) -> None:
        """Drop ``key``'s order: it is read again from the view at the key's next step."""
        self._orders.pop(key, None)

    def clear(self) -> None:
        """Drop every order (an abort)."""
        self._orders.clear()


def reindex(order: list[tuple[int, int]], removed: list[Removed], added: list[Added],
            recut: OrderChange | None) -> None:
    """Apply a step's changes to the order :meth:`OpenOrders.bounds` returned: a re-cut
    replaces ``order[low:high]`` by its sessions; otherwise the removed bounds leave and the
    new ones (those whose bounds are new) are inserted."""
    if recut is not None:
        low, high, bounds = recut
        order[low:high] = bounds
        return
    for b, _ in removed:
        del order[bisect.bisect_left(order, b)]
    for start, end, _, _, _, fresh, _ in added:
        if fresh:
            bisect.insort(order, (start, end))
