"""Held keys of the maximum-duration step: the events of a key that arrive out of order are held
in memory and the key is written once, when that is needed (see "Held keys" in
:mod:`sessionstore.engine.max_duration`).

:class:`HeldKeys` keeps the held keys (:class:`Held`) and a heap of their bounds (no session of
a held key closes before its bound), and writes a key (:meth:`HeldKeys.write`) when the close
cursor reaches its bound (:meth:`HeldKeys.write_upto`), before a commit, a flush and a read of
the key, at the end of a batch with ``ON_WINDOW_UPDATE`` (:meth:`HeldKeys.write_all`,
:meth:`HeldKeys.write_key`), before a step whose "closed before" reaches its bound, and when
:data:`HELD_EVENTS_LIMIT` events are held; an abort drops them (:meth:`HeldKeys.forget`).
"""

from __future__ import annotations

import bisect
import heapq
from typing import Any

from ..aggregations import Aggregation, Combined
from ..gap_boundary import first_open_end, is_final
from ..timeutil import INT64_MAX
from ..types import Session
from .cuts import Recut, cut_until_unchanged
from .emit import Emit
from .max_duration_order import OpenOrders
from .max_duration_state import (
    EVENT_ORDER,
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
from .record import check_encodable

HELD_EVENTS_LIMIT = 1 << 20
"""How many events are held unwritten (over all keys) before every held key is written."""


class HeldWriteError(RuntimeError):
    """The write of a held key failed: a function of its aggregation raised (or returned an
    accumulator the store cannot encode) while a session of the key was folded from its
    events. Only aggregations with user functions (``reduce``, ``aggregate``, a built-in
    given a function) can fail there: the built-ins are held only while their write cannot
    fail.

    The rule (docs/semantics.md, "Maximum duration"): nothing is written and the key stays
    held with every one of its events, so the call that raises changed nothing (a write is
    done before the call changes anything else: before an event is stepped or the watermark
    moves; a ``process_batch`` of more events than :data:`HELD_EVENTS_LIMIT` may write every
    key between two of its events). Every later call that needs the key (a watermark move
    reaching its bound, ``commit()``, ``flush()``, ``sessions(key)``, ``process`` of one of
    its events that cannot be held) raises this again, until ``abort()`` drops the events
    held since the last commit.

    Attributes:
        aggregation: the name of the failing aggregation (its output's label in a
            combination).
        session: the session being folded (its bounds in the cut of the held events).
        held_events: how many events of the key are held.
    """

    def __init__(self, aggregation: str, session: Session, held_events: int,
                 cause: BaseException) -> None:
        self.aggregation = aggregation
        self.session = session
        self.held_events = held_events
        super().__init__(
            f"the aggregation {aggregation!r} failed on key {session.key!r} folding "
            f"{session} ({type(cause).__name__}: {cause}); its events arrived out of order "
            f"and were held, so this write came later: nothing was written and the key stays "
            f"held, so every call that needs it raises this until abort() drops its "
            f"{held_events} held events")


def _failing_part(agg: Aggregation, key: Any, events: list[Any], check: bool) -> str | None:
    """The label of the part of ``agg`` whose fold of ``events`` fails (its name for a
    single aggregation); None when none does."""
    parts = (list(zip(agg.names, agg.parts, strict=True)) if isinstance(agg, Combined)
             else [(agg.name, agg)])
    for label, part in parts:
        try:
            acc = fold_events(part, key, events)
            if check:
                check_encodable(acc, "an accumulator")
        except Exception:
            return label
    return None


def _start_of(stored: tuple[tuple[int, int], Any]) -> int:
    return int(stored[0][0])


class Held:
    """A key whose open sessions are written lazily.

    Its bound: the sessions of a cut end in increasing order, so none ends before the first
    one, which starts at the key's first open event. If that is the first stored event ``f``,
    the session keeps every event of the first stored session (the scan from ``f`` only gains
    events and reach when events are added), so it ends at or after that session's stored
    end; if it is a held event before ``f``, it ends at or after that event's own-window end.
    The bound is no later than the stored end either way, so the key is written before the
    close cursor reaches a stored session.

    Attributes:
        stored: the open sessions stored when it became held, ``[(bounds, record)]`` in order;
            they stay as stored until the key is written.
        events: the events that came since, ``[t, seq, own_end, value]`` in arrival order.
        first_t: ``f``, the time of the first stored open event.
        bound: a lower bound of the end of every session the key's open events can form: the
            first stored session's end, the smallest own-window end of a held event before
            ``f`` if earlier, ``floor`` if later.
        floor: the "closed before" when it became held, + 1: no step creates a session closed
            on creation, so every session of the key ends at or after it.
        magnitude: with sums, the sum of the magnitudes of their int values (no partial sum of
            a fold can leave int64 while it is at most ``INT64_MAX``).
    """

    __slots__ = ("stored", "events", "first_t", "bound", "floor", "magnitude")

    def __init__(self, stored: list[tuple[tuple[int, int], Any]], floor: int,
                 magnitude: int) -> None:
        self.stored = stored
        self.events: list[list[Any]] = []
        self.first_t = stored[0][0][0]
        self.floor = floor
        first_end = stored[0][0][1]
        self.bound = first_end if first_end > floor else floor
        self.magnitude = magnitude


class HeldKeys:
    """The held keys and the heap of their bounds.

    Args:
        state: the shared state of the maximum-duration step.
        orders: the open-session orders (a written key's order is dropped).

    Attributes:
        by_key: ``{key: Held}``, read by the event step and the batch path to find whether a
            key is held; changed only through this class.
        events_held: the events held over all keys.
    """

    __slots__ = ("_state", "_orders", "_md", "_magnitude", "by_key", "events_held", "_due",
                 "_tie")

    def __init__(self, state: DurationState, orders: OpenOrders) -> None:
        self._state = state
        self._orders = orders
        self._md = state.max_duration_ms
        self._magnitude = state.magnitude  # once per held event
        self.by_key: dict[Any, Held] = {}
        self.events_held = 0
        self._due: list[tuple[int, int, Any, Held]] = []  # (bound, tie, key, entry), a heap
        self._tie = 0

    def start_holding(self, key: Any, view: Any, bounds: list[tuple[int, int]],
                      event: list[Any], closed_before: int, horizon: int, out: list[Emit],
                      log: ChangeLog | None) -> bool:
        """Start holding ``key``'s events, ``event`` first; False (nothing changed) when an
        open or the new value is one whose adds could fail (see
        :meth:`~sessionstore.engine.max_duration_state.DurationState.magnitude`), or when the
        key's bound would be at or before ``horizon``.

        Args:
            key: the key, with open sessions ``bounds`` (in order) in the cache's ``view``.
            event: ``[t, seq, own_end, value]``, not late.
            closed_before: the "closed before" the event meets.
            horizon: as :meth:`hold`.
            out, log: as :meth:`hold`.

        The bound is that of :class:`Held`: read from the first stored session alone."""
        state = self._state
        magnitude = state.magnitude(event[3])
        if magnitude is None:
            return False
        stored = [(b, view[b][0]) for b in bounds]
        state.recut_steps += len(stored)
        if state.numeric:
            for b, raw in stored:
                kept = stored_events(raw, key, b)[0]
                for e in kept:
                    more = state.magnitude(e[3])
                    if more is None:
                        return False
                    magnitude += more
                state.recut_steps += len(kept)
        if magnitude > INT64_MAX:
            return False
        held = Held(stored, first_open_end(closed_before), magnitude)
        if held.bound <= horizon:  # not a bound this call's own close could reach
            return False
        if self.events_held >= HELD_EVENTS_LIMIT:
            self.write_all(out, log)  # first: holding this one must not reach the limit
        self.by_key[key] = held
        if not self.hold(key, held, event, horizon, out, log):  # (indexes its bound)
            del self.by_key[key]  # nothing held
            return False
        return True

    def full(self, more: int) -> bool:
        """Whether holding ``more`` events would pass :data:`HELD_EVENTS_LIMIT` (a caller
        whose writes can fail then writes every key first, before it changes anything)."""
        return self.events_held + more > HELD_EVENTS_LIMIT

    def _push_due(self, key: Any, held: Held) -> None:
        """Index a held key's (new, lower) bound for :meth:`write_upto`; a driver that wakes
        the engine on close times (``drain_close_times``) gets the bound as one: no session of
        the key closes before it, and the wake-up writes the key, whose ends then follow."""
        self._tie += 1
        heapq.heappush(self._due, (held.bound, self._tie, key, held))
        engine = self._state.engine
        if engine.record_close_times:
            engine.new_close_times.append(held.bound)

    def hold(self, key: Any, held: Held, event: list[Any], horizon: int, out: list[Emit],
             log: ChangeLog | None) -> bool:
        """Hold ``event`` (not late; its key's bound is after its "closed before") for
        ``key``, whose entry is ``held``; False (nothing changed but the writes below) when
        its value is one whose adds could fail or its sums could leave int64, when it would
        bring the key's bound to ``horizon`` or before (the close cursor this call moves to:
        a write this call's own close would need must be done before the call changes
        anything, so that a failing write changes nothing), or when :data:`HELD_EVENTS_LIMIT`
        events are held: then every key is written first (:meth:`write_all`, with ``out``
        and ``log``)."""
        magnitude = self._magnitude(event[3])
        if magnitude is None or held.magnitude + magnitude > INT64_MAX:
            return False
        bound = held.bound
        if event[0] < held.first_t:  # a new first event: the first session ends after its
            end = own_window_end(event[0], event[2], self._md)  # own window
            if end < bound:
                bound = end if end > held.floor else held.floor
        if bound <= horizon:
            return False
        if self.events_held >= HELD_EVENTS_LIMIT:
            self.write_all(out, log)
            return False
        index = bound < held.bound or not held.events  # a lower bound, or its first one
        held.magnitude += magnitude
        held.events.append(event)
        held.bound = bound
        if index:
            self._push_due(key, held)
        self.events_held += 1
        return True

    def write_upto(self, upto: int, out: list[Emit]) -> None:
        """Write every held key whose bound is at or before ``upto`` (the engine calls this
        before it closes the sessions ending up to ``upto``)."""
        due = self._due
        pending = self.by_key
        while due and is_final(due[0][0], upto):
            entry = heapq.heappop(due)
            key, held = entry[2], entry[3]
            if pending.get(key) is held:
                try:
                    self.write(key, out, None)
                except HeldWriteError:
                    heapq.heappush(due, entry)  # still held: still due
                    raise

    def write_all(self, out: list[Emit], log: ChangeLog | None = None) -> None:
        """Write every held key (before a commit, a flush, at the end of a batch with
        ``ON_WINDOW_UPDATE``, or when too many events are held)."""
        for key in list(self.by_key):
            self.write(key, out, log)
        self._due.clear()  # every entry is stale

    def write_key(self, key: Any) -> None:
        """Write ``key`` if it is held (before its sessions are read)."""
        if key in self.by_key:
            self.write(key, [], None)

    def forget(self) -> None:
        """Drop every held event (an abort)."""
        self.by_key.clear()
        self._due.clear()
        self.events_held = 0

    def write(self, key: Any, out: list[Emit], log: ChangeLog | None) -> None:
        """Cut the held ``key``'s open events (its stored open sessions and its held events)
        by the rule and write the difference to the stored sessions, as one re-cut (emits to
        ``out``, or changes to ``log``, as
        :func:`~sessionstore.engine.max_duration_write.publish_changes` does).

        The sessions before the one the earliest held event falls into cannot change (the
        cut is a left-to-right scan); from there on, every open event is cut again (in
        (time, arrival) order). A session of a cut holds exactly the open events in
        ``[start, end)``, so one with stored bounds and no held event is the stored one.
        Every other session gets its accumulator folded from its events in (time, arrival)
        order. If that fails, nothing is written and the key stays held.

        Raises:
            HeldWriteError: a function of the aggregation failed on a session's events (or
                gave an accumulator the store cannot encode); nothing changed.
        """
        state = self._state
        held = self.by_key[key]
        engine = state.engine
        md = state.max_duration_ms
        stored = held.stored
        news = sorted(held.events, key=EVENT_ORDER)
        first = max(bisect.bisect_right(stored, news[0][0], key=_start_of) - 1, 0)
        last = max(bisect.bisect_right(stored, news[-1][0], key=_start_of) - 1, first)
        gathered: list[Any] = []
        for b, raw in stored[first:last + 1]:
            gathered += stored_events(raw, key, b)[0]
        gathered += news
        gathered.sort(key=EVENT_ORDER)  # two sorted runs: one merge

        def events_of(i: int) -> list[Any]:
            b, raw = stored[last + 1 + i]
            return stored_events(raw, key, b)[0]

        cuts, used = cut_until_unchanged(gathered, len(stored) - last - 1, events_of, md,
                                         engine.config.inclusive_gap)
        state.recut_steps += len(gathered) + last + 1 + used - first
        new_times = list(map(EVENT_TIME, news))
        sessions: list[Recut] = []
        low = 0
        for start, end, max_end, stop in cuts:
            at = bisect.bisect_left(new_times, start)  # a held event in [start, end)?
            sessions.append((start, end, max_end, gathered[low:stop],
                             at < len(new_times) and new_times[at] < end))
            low = stop
        removed, added = self._changes(key, held, sessions,
                                       dict(stored[first:last + 1 + used]))
        del self.by_key[key]
        self.events_held -= len(held.events)
        self._orders.forget(key)  # read again from the view at the key's next step
        write_changes(engine, key, removed, added)
        publish_changes(engine, key, removed, added, out, log)

    def _changes(self, key: Any, held: Held, sessions: list[Recut],
                 old: dict[tuple[int, int], Any]) -> tuple[list[Removed], list[Added]]:
        """:func:`~sessionstore.engine.max_duration_write.diff_cut` of a held key's cut, with
        the accumulators checked as the event step checks them.

        Raises:
            HeldWriteError: a fold failed (the first failing session, and the part of the
                aggregation that fails on it, are named).
        """
        engine = self._state.engine
        try:
            removed, added = diff_cut(self._state, key, sessions, old)
            if engine.check_acc:
                for start, end, acc, *_ in added:
                    check_encodable(acc, f"the accumulator of {Session(key, start, end)}")
        except Exception as exc:
            agg = engine.aggregation
            for start, end, _, events, _ in sessions:
                label = _failing_part(agg, key, events, engine.check_acc)
                if label is not None:
                    raise HeldWriteError(label, Session(key, start, end), len(held.events),
                                         exc) from exc
            first, last = sessions[0], sessions[-1]
            raise HeldWriteError(agg.name, Session(key, first[0], last[1]), len(held.events),
                                 exc) from exc
        return removed, added
