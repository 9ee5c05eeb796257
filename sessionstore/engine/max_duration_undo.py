"""The undo of a failing batch of the maximum-duration step (see "The batch path" in
:mod:`sessionstore.engine.max_duration`): the keys a batch steps one event at a time
(:meth:`.BatchStep.process_many`) are changed event by event, and a value check failing at one
of them (an int64 sum leaving its range, a minimum over values that do not compare, an
accumulator the store cannot encode) or a failing store must leave the engine as it was
before the call. :class:`BatchUndo` keeps what those steps change, per key at its first step,
and puts it back.

With a write cache (every event of the batch takes the event step) the cache may write and
forward changes while the steps run: when it evicts, and at every change with
``cache_max_sessions=0``. :class:`BatchUndo` holds back what it forwards until the batch ends:
delivered as it came when the steps succeed; after a failure, the keys put back are written
too (so that the store holds what it held before the call), and only what the store held
before the call and the user has not seen is delivered (see :meth:`BatchUndo.undo`).
"""

from __future__ import annotations

from typing import Any

from .. import keyschema
from ..store.caching import CLEAN
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

    With a write cache, the cache's ``forward`` is replaced by a recorder until :meth:`done`
    or :meth:`undo` (see the module docstring).
    """

    __slots__ = ("_state", "_orders", "_held_keys", "_event", "_floor", "_sessions", "_memos",
                 "_events_held", "_close_times", "_recut", "_floors", "_forward",
                 "_forwarded")

    def __init__(self, state: DurationState, orders: OpenOrders, held: HeldKeys,
                 event: EventStep, floor: int) -> None:
        engine = state.engine
        self._state = state
        self._orders = orders
        self._held_keys = held
        self._event = event
        self._floor = floor
        # key -> {bounds: (record, its state in the cache)}, read above the key's floor
        self._sessions: dict[Any, dict[tuple[int, int], tuple[Any, int]]] = {}
        self._floors: dict[Any, int] = {}
        self._memos: dict[Any, HeldMemo | None] = {}
        self._events_held = held.events_held
        self._close_times = len(engine.new_close_times)
        self._recut = (state.recut_steps, state.recut_events)
        # with a write cache: its forward, and what it forwarded since (session, new, old)
        self._forward = engine.cache.forward if engine.write_cache else None
        self._forwarded: list[tuple[Session, Any, Any]] = []
        if self._forward is not None:
            engine.cache.forward = self._record
        event.inserted = []

    def _record(self, session: Session, new: Any, old: Any) -> None:
        """The cache's ``forward`` while the batch runs: keep the change."""
        self._forwarded.append((session, new, old))

    def touch(self, key: Any, floor: int | None = None) -> None:
        """Keep ``key``'s open sessions (those ending after ``floor``, the "closed before" of
        its first step, or by default the batch's) and held state before its first step in
        the batch."""
        if key in self._sessions:
            return
        if floor is None:
            floor = self._floor
        view = self._state.engine.cache.sessions_of(key, floor)
        self._sessions[key] = {b: cached for b, cached in view.items() if b[1] > floor}
        self._floors[key] = floor
        self._memos[key] = self._held_keys.memo(key)

    def touch_held(self) -> None:
        """:meth:`touch` every held key (a step may write them all: the held-events limit)."""
        for key in list(self._held_keys.by_key):
            self.touch(key)

    def done(self) -> None:
        """The steps succeeded: stop logging in-place insertions; with a write cache, give it
        its forward back and deliver what it forwarded, in order."""
        self._event.inserted = None
        forward = self._forward
        if forward is not None:
            self._state.engine.cache.forward = forward
            for change in self._forwarded:
                forward(*change)

    def undo(self) -> None:
        """Put back what the steps changed (after one failed).

        With a write cache, the keys put back are then written (the cache's ``fetch`` writes
        a key's changes), so that the store holds what it held before the call and no change
        the undo made is forwarded later; of what the cache forwarded meanwhile, only what the
        user has not seen is delivered (with the next call): a change of another key (a change
        cached before the call, written by an eviction, as a loop of ``process`` would), and
        for the batch's keys each session's change from what the store held before the call
        to what it holds now, where the cache held a change before the call (a change of such
        a key cached before the call is thus delivered at once, not at the next flush)."""
        inserted = self._event.inserted
        self._event.inserted = None
        for events, pos in reversed(inserted or ()):
            del events[pos]
        state = self._state
        engine = state.engine
        cache = engine.cache
        try:
            for key, kept in self._sessions.items():
                floor = self._floors[key]
                view = cache.sessions_of(key, floor)
                for b in [b for b in view if b[1] > floor and b not in kept]:
                    cache.remove(Session(key, b[0], b[1]))
                for b, (raw, _) in kept.items():
                    now = view.get(b)
                    if now is None or now[0] is not raw:
                        cache.put(Session(key, b[0], b[1]), raw)
                self._orders.forget(key)
            if self._forward is not None:
                for key in self._sessions:
                    cache.fetch(key)  # writes the key's changes first (the read is dropped)
        finally:
            del engine.new_close_times[self._close_times:]
            self._held_keys.put_back(self._memos, self._events_held)
            state.recut_steps, state.recut_events = self._recut
            if self._forward is not None:
                cache.forward = self._forward
        if self._forward is not None:
            self._deliver_unseen()

    def _deliver_unseen(self) -> None:
        """After :meth:`undo` with a write cache: forward what the user has not seen of what
        the cache forwarded during the batch and the undo (see :meth:`undo`)."""
        forward = self._forward
        assert forward is not None
        touched = self._sessions
        first: dict[Session, tuple[Any, Any]] = {}  # session -> (old of its first change, new)
        for session, new, old in self._forwarded:
            if session.key not in touched:
                forward(session, new, old)  # another key's change, cached before the call
                continue
            seen = first.get(session)
            first[session] = (old if seen is None else seen[0], new)
        for session in sorted(first, key=keyschema.session_order):
            before, now = first[session]  # what the store held before the call, and now
            if now is None:
                if before is not None:  # a removal cached before the call
                    forward(session, None, before)
                continue
            kept = touched[session.key].get((session.start, session.end))
            if kept is None or kept[1] != CLEAN:  # a change cached before the call
                forward(session, now, before)
