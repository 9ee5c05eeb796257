"""The undo of a failing batch of the maximum-duration step (see "The batch path" in
:mod:`sessionstore.engine.max_duration`): the keys a batch steps one event at a time
(:meth:`.BatchStep.process_many`) are changed event by event, and a value check failing at one
of them (an int64 sum leaving its range, a minimum over values that do not compare, an
accumulator the store cannot encode) or a failing store must leave the engine as it was
before the call. :class:`BatchUndo` keeps what those steps change, per key at its first step,
and puts it back.
"""

from __future__ import annotations

from typing import Any

from ..types import Session
from .max_duration_held import HeldKeys, HeldMemo
from .max_duration_order import OpenOrders
from .max_duration_state import DurationState
from .max_duration_step import EventStep


class BatchUndo:
    """What the event steps of one batch change, kept until the batch ends.

    Args:
        state: the shared state of the maximum-duration step.
        orders: the open-session orders (a key put back is read again from the view).
        held: the held keys.
        event: the event step (its in-place insertions are logged while this is active).
        floor: the "closed before" of the batch's first event: no step of the batch touches
            a session ending at or before it (no session closes until the batch's end).

    What it keeps, per key at its first step (:meth:`touch`): the key's open sessions (bounds
    and record objects, O(sessions); a step that inserts an event into a record's events in
    place logs it, :attr:`.EventStep.inserted`, and the undo takes it out again) and its held
    state (:meth:`.HeldKeys.memo`); for the batch: the count of held events, the close times
    recorded and the work counters. The watermark, the arrival counter, ``records-in`` and
    the dropped events are the caller's, changed only after every step succeeded; so are the
    batch's emits and change log (the steps write none but to them, and a raising batch
    returns neither). The close heap may keep the ends of sessions the undo removed: closing
    meets them and finds nothing there.
    """

    __slots__ = ("_state", "_orders", "_held_keys", "_event", "_floor", "_sessions", "_memos",
                 "_events_held", "_close_times", "_recut")

    def __init__(self, state: DurationState, orders: OpenOrders, held: HeldKeys,
                 event: EventStep, floor: int) -> None:
        engine = state.engine
        self._state = state
        self._orders = orders
        self._held_keys = held
        self._event = event
        self._floor = floor
        self._sessions: dict[Any, dict[tuple[int, int], Any]] = {}
        self._memos: dict[Any, HeldMemo | None] = {}
        self._events_held = held.events_held
        self._close_times = len(engine.new_close_times)
        self._recut = (state.recut_steps, state.recut_events)
        event.inserted = []

    def touch(self, key: Any) -> None:
        """Keep ``key``'s open sessions and held state before its first step in the batch."""
        if key in self._sessions:
            return
        view = self._state.engine.cache.sessions_of(key, self._floor)
        floor = self._floor
        self._sessions[key] = {b: cached[0] for b, cached in view.items() if b[1] > floor}
        self._memos[key] = self._held_keys.memo(key)

    def touch_held(self) -> None:
        """:meth:`touch` every held key (a step may write them all: the held-events limit)."""
        for key in list(self._held_keys.by_key):
            self.touch(key)

    def done(self) -> None:
        """The steps succeeded: stop logging in-place insertions."""
        self._event.inserted = None

    def undo(self) -> None:
        """Put back what the steps changed (after one failed)."""
        inserted = self._event.inserted
        self._event.inserted = None
        for events, pos in reversed(inserted or ()):
            del events[pos]
        state = self._state
        engine = state.engine
        cache = engine.cache
        floor = self._floor
        for key, kept in self._sessions.items():
            view = cache.sessions_of(key, floor)
            for b in [b for b in view if b[1] > floor and b not in kept]:
                cache.remove(Session(key, b[0], b[1]))
            for b, raw in kept.items():
                now = view.get(b)
                if now is None or now[0] is not raw:
                    cache.put(Session(key, b[0], b[1]), raw)
            self._orders.forget(key)
        del engine.new_close_times[self._close_times:]
        self._held_keys.put_back(self._memos, self._events_held)
        state.recut_steps, state.recut_events = self._recut
