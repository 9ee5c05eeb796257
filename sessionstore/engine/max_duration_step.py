"""The event step of the maximum-duration engine: one event re-cuts its key's open sessions, or
is held (see "Re-cut per event" and "Held keys" in :mod:`sessionstore.engine.max_duration`)."""

from __future__ import annotations

import bisect
from typing import Any

from ..gap_boundary import reaches
from ..types import Session
from .cuts import Recut, cut_pieces, cut_until_unchanged
from .emit import Emit
from .max_duration_held import HeldKeys
from .max_duration_order import OpenOrders, OrderChange, reindex
from .max_duration_state import (
    EVENT_TIME,
    Added,
    ChangeLog,
    DurationState,
    Removed,
    fold_events,
    own_window_end,
    stored_events,
)
from .max_duration_write import diff_cut, publish_changes, write_changes
from .record import acc_of, as_stored, check_encodable


class EventStep:
    """The per-event step (:meth:`.MaxDuration.process` takes an event's lateness and
    cursors, then calls :meth:`step`).

    Args:
        state: the shared state of the maximum-duration step.
        orders: the open-session orders, updated as the step changes a key's sessions.
        held: the held keys: the step holds an event out of order (with ``lazy``), and writes
            a held key before it steps an event of it that is not held.
    """

    __slots__ = ("_state", "_orders", "_held_keys", "_engine", "_md", "_holdable",
                 "_incremental", "_fixed_gap", "_order_free_adds", "inserted")

    def __init__(self, state: DurationState, orders: OpenOrders, held: HeldKeys) -> None:
        self._state = state
        self._orders = orders
        self._held_keys = held
        self._engine = state.engine
        self._md = state.max_duration_ms
        # built-in accumulators are held on every path that holds; the others only with
        # ON_WINDOW_CLOSE, where a write that fails can come before the call changes anything
        self._holdable = state.incremental or state.lazy
        self._incremental = state.incremental
        self._fixed_gap = state.fixed_gap
        self._order_free_adds = state.order_free_adds
        #: while a batch may undo its steps (:class:`.BatchUndo`): each event list an event
        #: was inserted into in place, and where, in order (None: not kept)
        self.inserted: list[tuple[list[Any], int]] | None = None

    def step(self, key: Any, value: Any, t: int, own_end: int, closed_before: int,
             horizon: int, out: list[Emit], log: ChangeLog | None, seq: int, lazy: bool
             ) -> None:
        """Re-cut the key's open sessions with the new event (not late; arrival number
        ``seq``, meeting ``closed_before``) and apply the difference (the caller advances the
        engine's arrival counter); with ``lazy``, hold the event instead
        (:class:`~sessionstore.engine.max_duration_held.HeldKeys`) unless it comes after
        every open event of its key, or its key's bound would be at or before ``horizon``
        (``closed_before``, or with an aggregation whose writes can fail, the close cursor
        the caller's call moves to: see :meth:`.HeldKeys.hold`).

        Emits are appended to ``out`` (closing, and ``ON_WINDOW_UPDATE`` without ``log``); with
        ``ON_WINDOW_UPDATE`` in a batch, the changes are recorded in ``log`` instead
        (:func:`~sessionstore.engine.max_duration_write.emit_log` emits them at the end of the
        batch).

        No session this creates is closed on creation. The first re-cut session starts at an
        open session's first event (it keeps all that session's events, so it ends no earlier,
        after ``closed_before``) or at the new event (it ends at ``t + min(gap, max_duration)``
        or later, after ``closed_before`` since the event is not late). Every later one starts
        at an event at or past the end of the one before, so after ``closed_before`` too.
        """
        engine = self._engine
        md = self._md
        inclusive = engine.config.inclusive_gap
        agg = engine.aggregation
        event = [t, seq, own_end, value]
        held_keys = self._held_keys
        pending = held_keys.by_key
        if pending and key in pending:
            held = pending[key]
            # not is_final(bound, closed_before), inline: per event (test_closed_before)
            if lazy and held.bound > closed_before and held_keys.hold(key, held, event,
                                                                       horizon, out, log):
                return
            if key in pending:  # (a hold at the limit wrote every key)
                held_keys.write(key, out, log)  # the key may close: write it, then step
        view = engine.cache.sessions_of(key, closed_before)
        bounds = self._orders.bounds(key, view, closed_before)
        j = bisect.bisect_right(bounds, t, key=EVENT_TIME) - 1
        if lazy and self._holdable and bounds and (
                j != len(bounds) - 1
                or t < stored_events(view[bounds[j]][0], key, bounds[j])[0][-1][0]
        ) and not self._cheap_inside(key, value, t, own_end, view, bounds, j) \
                and held_keys.start_holding(key, view, bounds, event, closed_before, horizon,
                                            out, log):
            return  # held: before the last open event of its key
        removed: list[Removed] = []
        added: list[Added] = []
        last = len(bounds) - 1
        appended = True  # the cases that need no re-cut
        grown = False  # a session grew by the event (_grow checked its accumulator)
        if j >= 0:
            b = bounds[j]
            raw = view[b][0]
            events, max_end = stored_events(raw, key, b)
            start = b[0]
            if j == last and t >= events[-1][0]:
                # after every open event of the key: it extends the last session or starts one
                if t < start + md and reaches(max_end, t, inclusive):
                    new_max = own_end if own_end > max_end else max_end
                    cap = start + md  # own_window_end(start, new_max, md), inline: per event
                    end = new_max if new_max < cap else cap
                    acc, events = self._grow(key, value, t, seq, acc_of(raw), events, event,
                                             len(events), start, end)
                    grown = True
                    moved = end != b[1]
                    if moved:
                        removed.append((b, acc_of(raw)))
                    added.append((start, end, acc, events, new_max, moved,
                                  None if moved else acc_of(raw)))
                else:
                    added.append((t, own_window_end(t, own_end, md),
                                  agg.add(key, value, t, seq, agg.initial()), [event], own_end,
                                  True, None))
            elif t < events[-1][0] and own_end <= max_end:
                # inside a session, before its last event, reaching no further than it does:
                # it joins that session (the events around it are connected, and stay so) and
                # no bound or later cut moves, so it is an update in place, not a re-cut
                pos = bisect.bisect_right(events, t, key=EVENT_TIME)  # after equal times
                acc, events = self._grow(key, value, t, seq, acc_of(raw), events, event, pos,
                                         start, b[1])
                grown = True
                added.append((start, b[1], acc, events, max_end, False, acc_of(raw)))
            else:
                appended = False
        elif bounds:
            # before every open session of the key; the scan from t meets the first one
            b = bounds[0]
            raw = view[b][0]
            events, max_end = stored_events(raw, key, b)
            limit = t + md
            first_t = b[0]  # its first event's time
            if first_t >= limit or not reaches(own_end, first_t, inclusive):
                # the scan stops before the first open event: a session of its own, and the
                # cut from that event on is the one stored
                added.append((t, own_window_end(t, own_end, md),
                              agg.add(key, value, t, seq, agg.initial()), [event], own_end,
                              True, None))
            elif own_end <= max_end and events[-1][0] < limit:
                # it becomes the first event of the first session, which keeps every event
                # (their runs only grow, all are before the new limit) and reaches no further
                # (the run and the limit only move back): only that session's bounds change
                end = max_end if max_end < limit else limit
                acc, events = self._grow(key, value, t, seq, acc_of(raw), events, event, 0, t,
                                         end)
                grown = True
                removed.append((b, acc_of(raw)))
                added.append((t, end, acc, events, max_end, True, None))
            else:
                appended = False
        else:  # no open session
            added.append((t, own_window_end(t, own_end, md),
                          agg.add(key, value, t, seq, agg.initial()), [event], own_end, True,
                          None))
        recut: OrderChange | None = None
        if not appended:
            # the event falls at or after the start of bounds[first] and before the next one
            first = j if j > 0 else 0
            stored = stored_events(view[bounds[first]][0], key, bounds[first])[0]
            pos = bisect.bisect_right(stored, t, key=EVENT_TIME)  # after equal times: arrival
            following = len(bounds) - first - 1

            def events_of(i: int) -> list[Any]:
                b = bounds[first + 1 + i]
                return stored_events(view[b][0], key, b)[0]

            sessions: list[Recut]
            if self._fixed_gap:
                pieces = [part for part in (stored[:pos], [event], stored[pos:]) if part]
                sessions, used, searches = cut_pieces(pieces, 1 if pos else 0, following,
                                                      events_of, md, inclusive)
                self._state.recut_steps += searches
            else:  # a gap per event: whether events reach each other depends on the start
                gathered = [*stored[:pos], event, *stored[pos:]]
                cuts, used = cut_until_unchanged(gathered, following, events_of, md, inclusive)
                self._state.recut_steps += len(gathered)
                sessions = []
                low = 0
                for start, end, max_end, stop in cuts:
                    sessions.append((start, end, max_end, gathered[low:stop],
                                     low <= pos < stop))
                    low = stop
            removed, added = diff_cut(self._state, key, sessions, {
                b: view[b][0] for b in bounds[first:first + 1 + used]})
            recut = (first, first + 1 + used, [(c[0], c[1]) for c in sessions])
        if engine.check_acc and not grown:
            for start, end, acc, *_ in added:
                check_encodable(acc, f"the accumulator of {Session(key, start, end)}")
        # apply: nothing below fails on the event's content (a store failure while the cache
        # writes drops the key's order: it is read again from the view)
        try:
            write_changes(engine, key, removed, added)
            reindex(bounds, removed, added, recut)
        except BaseException:
            self._orders.forget(key)
            raise
        publish_changes(engine, key, removed, added, out, log)

    def _cheap_inside(self, key: Any, value: Any, t: int, own_end: int, view: Any,
                      bounds: list[tuple[int, int]], j: int) -> bool:
        """Whether an event at ``t`` in the ``j``-th open session (before its last event)
        that reaches no further than it does is cheaper added in place than held: it moves
        no bound and no later cut, and its add keeps the (time, arrival) fold (count, first,
        last, collect, or sums, minima and maxima whose adds are exact, see :meth:`_grow`). Holding
        it would write the key again when the close cursor reaches the session's end: a long
        session taking slightly disordered events was written again every gap's worth of
        events (issue 25)."""
        if j < 0 or not self._incremental:
            return False
        b = bounds[j]
        raw = view[b][0]
        events, max_end = stored_events(raw, key, b)
        # the in-place case of step(), "inside a session, reaching no further"
        return t < events[-1][0] and own_end <= max_end \
            and self._state.in_place_add(acc_of(raw), value)

    def _grow(self, key: Any, value: Any, t: int, seq: int, acc: Any, events: list[Any],
              event: list[Any], pos: int, start_ms: int, end_ms: int) -> tuple[Any, list[Any]]:
        """A session's accumulator and events with ``event`` inserted at ``pos`` (its place in
        (time, arrival) order); the session's bounds become ``[start_ms, end_ms)``.

        The accumulator is the fold of the events in (time, arrival) order: an add extends it
        at the end (for every aggregation: that is the fold, so a float sum keeps the bits of
        the static path's), or anywhere for the built-ins whose adds keep that order
        themselves; otherwise (sums, minima and maxima: a float sum rounds by order; user
        functions) it is folded again, unless their adds are exact (ints; strs for minima and
        maxima: :meth:`~sessionstore.engine.max_duration_state.DurationState.exact_adds`).
        A built-in's add extends a copy of the stored accumulator (merged into ``initial()``);
        a user function's, the accumulator as a store with the default serde returns it
        (:func:`~sessionstore.engine.record.as_stored`: a fresh copy, so a function that
        changes its argument changes nothing stored or emitted; tuples become lists), and
        only its initializer and aggregator are called.

        Appends (or inserts) the event to ``events`` in place, O(1) at the end, and only once
        the add and the accumulator check passed: the stored record this step replaces is
        the only holder of the list (the stores copy what they write; an abort forgets the
        cache's records), and nothing after this fails on the event. A fold again builds a
        new list.

        Raises:
            TypeError: the accumulator cannot be stored (``engine.check_acc``), naming the
                session; whatever the add raises. Nothing has changed then.
        """
        agg = self._engine.aggregation
        state = self._state
        at_end = pos == len(events)
        old = acc
        if at_end and not self._incremental:
            acc = agg.add(key, value, t, seq, as_stored(acc))
        elif not self._incremental or (not at_end and not self._order_free_adds
                                       and not state.exact_adds(acc, value)):
            events = [*events[:pos], event, *events[pos:]]
            state.recut_events += len(events)
            acc = fold_events(agg, key, events)
            self._check(key, acc, old, value, start_ms, end_ms)
            return acc, events
        else:
            acc = agg.add(key, value, t, seq, agg.merge(key, agg.initial(), acc))
        self._check(key, acc, old, value, start_ms, end_ms)
        # in place (O(1) at the end): a batch's undo keeps the record this step replaces,
        # and takes the event out again (``inserted``)
        if at_end:
            events.append(event)
        else:
            events.insert(pos, event)
        if self.inserted is not None:
            self.inserted.append((events, pos))
        return acc, events

    def _check(self, key: Any, acc: Any, old: Any, value: Any, start_ms: int, end_ms: int
               ) -> None:
        """Refuse the accumulator ``acc`` of the session ``[start_ms, end_ms)`` (``old``
        before ``value`` was added) when the engine checks accumulators and the store could
        not keep it: a built-in's add that needs no check
        (:meth:`~sessionstore.engine.max_duration_state.DurationState.in_place_add`) is not
        checked."""
        if self._engine.check_acc and not (self._incremental
                                           and self._state.in_place_add(old, value)):
            check_encodable(acc, f"the accumulator of {Session(key, start_ms, end_ms)}")
