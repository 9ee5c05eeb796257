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
from ..gap_boundary import first_open_end, is_final, reaches
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

HeldMemo = tuple["Held", int, int, int, int, list[tuple[int, int]] | None, int]
"""A held key's state as :meth:`HeldKeys.memo` keeps it: ``(entry, held events, bound,
magnitude, run, waiting, detached)``."""

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
    events and reach when events are added) and every held event its run reaches (see
    :meth:`extend`), so it ends at or after ``min(run, f + max_duration)``, where ``run`` is
    the largest own end of those events (at first the first stored session's end); if it is a
    held event before ``f``, it ends at or after that event's own-window end. Since the
    bound only counts events already held, it is also a lower bound of every session the
    key's events formed at each step since it became held: none of them closed.

    Attributes:
        stored: the open sessions stored when it became held, ``[(bounds, record)]`` in order;
            they stay as stored until the key is written, but for the first ``detached``.
        events: the events that came since, ``[t, seq, own_end, value]`` in arrival order.
        first_t: ``f``, the time of the first stored open event.
        bound: a lower bound of the end of every session the key's open events can form: the
            end of the first session as far as :meth:`extend` knows it, the smallest
            own-window end of a held event before ``f`` if earlier, ``floor`` if later.
        floor: the "closed before" when it became held, + 1: no step creates a session closed
            on creation, so every session of the key ends at or after it.
        magnitude: with sums, the sum of the magnitudes of their int values (no partial sum of
            a fold can leave int64 while it is at most ``INT64_MAX``).
        classes: the classes of what its minima and maxima compare (numbers, strs, bytes or
            lists of numbers: the same for every open event, so a str is never compared with a
            number).
        run, limit: the largest own end of the events known to be in the first session, and
            ``f + max_duration`` (the first stored session's end stands for its events' largest
            own end: they are equal unless that end is the limit).
        waiting: the ``(t, own_end)`` of held events at or after ``f`` and before ``limit``
            that the run does not reach yet (a heap); None once a held event came before
            ``f`` (the first session then starts elsewhere: the bound stops rising).
        detached: how many of ``stored`` (a prefix) were removed from the store because the
            close cursor passed their ends while the bound was later: the key's write would
            remove them, and closing must not emit them (:meth:`HeldKeys.write_upto`).
        queued: the bound of its newest entry in the heap of bounds (None before the first).
    """

    __slots__ = ("stored", "events", "first_t", "bound", "floor", "magnitude", "classes", "run",
                 "limit", "waiting", "detached", "queued")

    def __init__(self, stored: list[tuple[tuple[int, int], Any]], floor: int,
                 magnitude: int, classes: int, max_duration_ms: int) -> None:
        self.stored = stored
        self.events: list[list[Any]] = []
        self.first_t = stored[0][0][0]
        self.floor = floor
        first_end = stored[0][0][1]
        self.bound = first_end if first_end > floor else floor
        self.magnitude = magnitude
        self.classes = classes
        self.run = first_end
        self.limit = self.first_t + max_duration_ms
        self.waiting: list[tuple[int, int]] | None = []
        self.detached = 0
        self.queued: int | None = None

    def extend(self, t: int, own_end: int, inclusive: bool) -> None:
        """Raise the bound with a held event at ``t >= f`` (own end ``own_end``).

        An event before the limit that the run of known members reaches is in the first
        session (the scan from ``f`` stops only at an event it does not reach or past the
        limit, and every event before this one that the scan meets is reached too), so the run
        takes its own end, and then every waiting event it now reaches (the earliest first:
        if the earliest is not reached, no later one is). O(log n) per event, amortised."""
        waiting = self.waiting
        assert waiting is not None
        limit = self.limit
        run = self.run
        if t >= limit:
            return  # never in the first session
        if not reaches(run, t, inclusive):
            heapq.heappush(waiting, (t, own_end))
            return
        if own_end > run:
            run = own_end
        while waiting and waiting[0][0] < limit and reaches(run, waiting[0][0], inclusive):
            reached = heapq.heappop(waiting)[1]
            if reached > run:
                run = reached
        self.run = run
        end = run if run < limit else limit  # own_window_end(f, run, max_duration), inline
        if end > self.bound:
            self.bound = end

    def due(self) -> int:
        """When the key must be looked at again: its bound, or the end of its first stored
        session not detached if earlier (closing must not meet it while it is stale)."""
        if self.detached < len(self.stored):
            end = int(self.stored[self.detached][0][1])
            if end < self.bound:
                return end
        return self.bound


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
                 "_tie", "_inclusive")

    def __init__(self, state: DurationState, orders: OpenOrders) -> None:
        self._state = state
        self._orders = orders
        self._md = state.max_duration_ms
        self._magnitude = state.magnitude  # once per held event
        self.by_key: dict[Any, Held] = {}
        self.events_held = 0
        self._due: list[tuple[int, int, Any, Held]] = []  # (due, tie, key, entry), a heap
        self._tie = 0
        self._inclusive = state.engine.config.inclusive_gap

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
        found = state.magnitude(event[3])
        if found is None:
            return False
        magnitude, classes = found
        stored = [(b, view[b][0]) for b in bounds]
        state.recut_steps += len(stored)
        if state.numeric:
            for b, raw in stored:
                kept = stored_events(raw, key, b)[0]
                for e in kept:
                    more = state.magnitude(e[3])
                    if more is None or more[1] != classes:
                        return False
                    magnitude += more[0]
                state.recut_steps += len(kept)
        if magnitude > INT64_MAX:
            return False
        held = Held(stored, first_open_end(closed_before), magnitude, classes, self._md)
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
        """Index when a held key is due (:meth:`Held.due`: its new, lower bound, or the end of
        a stored session its bound passed) for :meth:`write_upto`; a driver that wakes the
        engine on close times (``drain_close_times``) gets it as one: no session of the key
        closes before it, and the wake-up writes the key (whose ends then follow) or indexes
        it again."""
        due = held.due()
        held.queued = due
        self._tie += 1
        heapq.heappush(self._due, (due, self._tie, key, held))
        engine = self._state.engine
        if engine.record_close_times:
            engine.new_close_times.append(due)

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
        found = self._magnitude(event[3])
        if found is None or found[1] != held.classes or held.magnitude + found[0] > INT64_MAX:
            return False
        magnitude = found[0]
        bound = held.bound
        t = event[0]
        early = t < held.first_t
        if early:  # a new first event: the first session ends after its own window
            end = own_window_end(t, event[2], self._md)
            if end < bound:
                bound = end if end > held.floor else held.floor
        if bound <= horizon:  # (an event at or after f only raises the bound)
            return False
        if self.events_held >= HELD_EVENTS_LIMIT:
            self.write_all(out, log)
            return False
        held.magnitude += magnitude
        held.events.append(event)
        held.bound = bound
        if early:
            held.waiting = None  # the first session may start elsewhere: no longer raised
        elif held.waiting is not None:
            held.extend(t, event[2], self._inclusive)
        if held.queued is None or held.due() < held.queued:  # its first, or earlier
            self._push_due(key, held)
        self.events_held += 1
        return True

    def write_upto(self, upto: int, out: list[Emit], closing: bool = True) -> None:
        """Write every held key whose bound is at or before ``upto``.

        Args:
            upto: the close cursor about to be reached.
            out: emits of the writes.
            closing: the engine closes the sessions ending up to ``upto`` next: the stored
                sessions of a key whose bound is later, ending up to ``upto``, are removed
                from the store first (the key's write would remove them: no session of its
                cut ends before its bound). Without it (a write before a call that may fail
                changes anything), such a key is only indexed again, at ``upto``, so that the
                closing finds it.
        """
        due = self._due
        pending = self.by_key
        later: list[tuple[int, int, Any, Held]] = []
        while due and is_final(due[0][0], upto):
            entry = heapq.heappop(due)
            key, held = entry[2], entry[3]
            if pending.get(key) is not held:
                continue  # written since
            if not is_final(held.bound, upto):  # the bound rose since it was indexed
                if closing:
                    self._detach(key, held, upto)
                    if is_final(held.queued, upto):  # no entry after upto yet
                        self._push_due(key, held)
                else:
                    later.append(entry)
                continue
            try:
                self.write(key, out, None)
            except HeldWriteError:
                heapq.heappush(due, entry)  # still held: still due
                for kept in later:
                    heapq.heappush(due, kept)
                raise
        for kept in later:
            heapq.heappush(due, kept)

    def _detach(self, key: Any, held: Held, upto: int) -> None:
        """Remove from the store the stored sessions of the held ``key`` ending at or before
        ``upto``, which is before its bound: the key's cut has no session ending before its
        bound, so its write removes them, and the closing up to ``upto`` must not emit
        them. Their records stay in ``held.stored`` for the write."""
        stored = held.stored
        i = held.detached
        cache = self._state.engine.cache
        while i < len(stored) and is_final(stored[i][0][1], upto):
            b = stored[i][0]
            cache.remove(Session(key, b[0], b[1]))
            i += 1
        if i > held.detached:
            held.detached = i
            self._orders.forget(key)

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

    def memo(self, key: Any) -> HeldMemo | None:
        """What :meth:`put_back` needs to give ``key`` back its held state as it is now (None:
        not held). O(1) but for a copy of its waiting heap: the held events are only
        appended to until the key is written (the count of them is kept)."""
        held = self.by_key.get(key)
        if held is None:
            return None
        waiting = held.waiting
        return (held, len(held.events), held.bound, held.magnitude, held.run,
                None if waiting is None else list(waiting), held.detached)

    def put_back(self, memos: dict[Any, HeldMemo | None], events_held: int) -> None:
        """Give the keys of ``memos`` back the held state :meth:`memo` kept (a key whose memo
        is None is held no longer), and the count of held events ``events_held``: a failing
        batch's undo (:class:`~sessionstore.engine.max_duration_undo.BatchUndo`). Each key
        still held is indexed again by its bound (an entry of the heap the batch may have
        dropped, by :meth:`write_all`; a stale entry is skipped when met)."""
        by_key = self.by_key
        for key, memo in memos.items():
            if memo is None:
                by_key.pop(key, None)
                continue
            held, count, bound, magnitude, run, waiting, detached = memo
            del held.events[count:]
            held.bound, held.magnitude, held.run = bound, magnitude, run
            held.waiting, held.detached = waiting, detached
            by_key[key] = held
            self._push_due(key, held)
        self.events_held = events_held

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
        gone = {b for b, _ in stored[:held.detached]}  # detached: removed from the store
        write_changes(engine, key, [r for r in removed if r[0] not in gone] if gone else removed,
                      added)
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
