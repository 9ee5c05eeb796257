"""Maximum session duration (issue 12): a session never spans more than ``max_duration_ms``.

**The rule**, per key, offline: sort the events by time (ties by arrival). A session starts at
its first event ``s``; the next event ``t`` joins it iff it is gap-connected (``t <= end`` with
``inclusive_gap``, ``t < end`` without, where ``end = max(t_i + gap_i)`` over the session's events
so far) *and* ``t < s + max_duration``; otherwise ``t`` starts a new session. A session's bounds
are ``[s, min(max(t_i + gap_i), s + max_duration))``. Along one cut the sessions are disjoint and
their ends increase strictly (a session ends at or before the next one's first event).

**Lateness.** With a maximum duration, an event alone forms the session
``[t, t + min(gap, max_duration))``: that is its own window, and the event is late when
``W >= t + min(gap, max_duration) + grace`` (without a maximum duration this is the usual
``t + gap + grace``). With that definition no session is ever created already closed, which
keeps closing in end order and keeps a new session from ever taking the bounds of a final one
(see the proof in :meth:`MaxDuration._step`).

**Out of order.** An event earlier than a session's start (or inside it) can re-anchor a chain:
the cuts move and events move between sessions, which aggregates alone cannot follow. So while a
session is open, its record keeps its events, ``[t, seq, own_end, value]`` in (time, arrival)
order, and the largest ``t + gap`` over them. A session's accumulator is the fold of its events
in (time, arrival) order (``initial()``, then ``add`` each): a float sum is the left fold in
time order, whatever the arrival order and the path. An event that comes after every open event
of its key (the in-order case) only extends the last session or starts a new one, at the cost
of one ``add``, on every path. What an earlier event costs depends on the emission:

* **Re-cut per event** (the event path with ``ON_WINDOW_UPDATE``, which must emit each event's
  changes; and aggregations that are not held, below): the event re-cuts, by the rule above,
  the key's open sessions from the one it falls into (earlier sessions cannot change: the cut
  is a left-to-right scan, and the scan up to that session's first event is the same), reading
  the later ones only while the new cut reaches them (:func:`cut_until_unchanged`: where a new
  session ends right before a stored session's first event, the cut from there on is the
  stored one). Cheaper cases: an event inside a session that reaches no further than the
  session's events do (no bound and no later cut moves), and an event before every open
  session that either does not reach the first one or becomes its first event while that
  session keeps all its events and reaches no further: one ``add`` for the built-ins whose
  ``add`` keeps (time, arrival) order itself (count, first, last, collect), the session folded
  again for the others.
* **Held keys** (``ON_WINDOW_CLOSE`` on every path, and ``ON_WINDOW_UPDATE`` inside one batch,
  :meth:`MaxDuration.process_many`, whose change log is "before the batch, and now"): the key's
  open sessions are not written at every event. The event holds its key (:class:`_Held`: the
  open sessions stored when it became held, and the events since, in memory); every later
  event of the key is held too. The key is written once (:meth:`MaxDuration._write_held`: its
  open events from the session the earliest held event falls into, sorted, cut by
  :func:`cut_until_unchanged`, diffed against the stored sessions) when that is needed: before
  the close cursor reaches a lower bound of its session ends (:meth:`MaxDuration.write_upto`,
  called by the engine's closing; the bound is the smallest own-window end over its open
  events, since every session starts at one of them and ends at or after that event's
  own-window end, or the "closed before" when it became held, + 1, if later, since no step
  creates a session closed on creation), before an event whose "closed before" reaches it, at
  the end of a batch with ``ON_WINDOW_UPDATE``, before ``commit()``, ``flush()`` and
  ``sessions(key)``, and when :data:`HELD_EVENTS_LIMIT` events are held; ``abort()`` drops
  them. Until the bound is reached none of the key's sessions could have closed, so the
  written cut is the one a re-cut per event gives. Only the built-in aggregations are held,
  and only while the numbers their sums, minima and maxima see are ints and floats whose int
  sums cannot leave int64 (:meth:`MaxDuration._magnitude`): a write then cannot fail, and an
  event that could make it fail takes the re-cut and fails at itself.

Either way the difference (removed sessions, new or changed ones) goes through the engine's
normal store writes and emission, so retractions (``ON_WINDOW_UPDATE``), the write cache,
closing (``ON_WINDOW_CLOSE``), expiry and commits work as for every session. Closed sessions are
final: they never join a re-cut.

**Cost.** A session's record holds its events (values included) besides the accumulator, until
retention expires it: memory and disk grow with the events per session, not only the sessions,
and writing a session costs O(its events) (a write-through cache re-encodes the whole record on
every change). A key's open sessions are kept in order beside the cache's view of the key
(:meth:`MaxDuration._open_bounds`), so an event finds its session by binary search. A held
event costs O(1); writing a held key costs a sort and a scan of its open events from the
session its earliest held event falls into. So any arrival order costs O(n log n) per key plus
the output with ``ON_WINDOW_CLOSE`` and on the batch paths, as long as a key is not written
again and again (each write happens because its bound was reached, a batch with
``ON_WINDOW_UPDATE`` ended or a commit came; a stream that alternates an event at the front of
a long open chain with one of those writes the chain each time). A re-cut per event, with a
fixed gap, finds each session's end by binary search (:func:`cut_pieces`): O(log n) steps per
session it writes, plus copying that session's events into its new record and folding its
accumulator; with a gap per event it scans the events it reads (:func:`cut_until_unchanged`).
What a re-cut per event cannot avoid is writing every session whose bounds or events change:
when a newest-first event moves the first event of every session of a chain (sessions cut by
the maximum duration, one after the other), each of them is written, retracted and emitted
again: O(n * sessions in the chain) on the event path with ``ON_WINDOW_UPDATE``, bound by its
output. :attr:`MaxDuration.recut_steps` and :attr:`MaxDuration.recut_events` count the work.

**Refused combinations.** Triggers (early/late panes over sessions whose events move between
them have no sound pane history) raise ``ValueError``.

**The batch path** (:meth:`MaxDuration.process_many`; the columnar fast path is off) gives
exactly the event path's answer: lateness, each event's "closed before" and arrival numbers are
computed for the whole batch, then each key's events are cut in one pass when they came in time
order after its last open event (:meth:`MaxDuration._in_order`), or out of order with an
aggregation that is not held (:meth:`MaxDuration._replay` follows the loop's re-cuts and
closes; those fold from the events); the other keys take the event step one by one, which
holds them. With ``ON_WINDOW_UPDATE`` every held key is written at the end of the batch. With a
write cache every event takes the event step (its evictions forward in the loop's order).

Wire form of a record: ``[acc, n_new, pane_index, phase, pt_target_ms, events, max_end]``; the
first five are those of :class:`~sessionstore.engine.record.SessionRecord`, so every reader of
accumulators works unchanged.
"""

from __future__ import annotations

import bisect
import heapq
import operator
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import keyschema
from ..aggregations import Aggregation, Combined, is_count
from ..gap_boundary import reaches
from ..timeutil import INT64_MAX
from ..types import Session
from .columnar import NUMERIC_KINDS, columnar_parts
from .cuts import Recut, cut, cut_pieces, cut_until_unchanged, scan_on
from .emit import Emit, make_emit
from .record import acc_of, check_encodable, events_of, record_with_events

if TYPE_CHECKING:
    from .host import EngineHost

_FIRST = operator.itemgetter(0)
_SEQ = operator.itemgetter(1)
_VALUE = operator.itemgetter(3)
_TIME_SEQ = operator.itemgetter(0, 1)


def _start_of(stored: tuple[tuple[int, int], Any]) -> int:
    return int(stored[0][0])


# how many keys' open-session orders MaxDuration keeps beyond the keys the cache holds
_ORDERS_SLACK = 1024
# how many events MaxDuration holds unwritten (over all keys) before it writes them all
HELD_EVENTS_LIMIT = 1 << 20

ChangeLog = dict[Session, list[Any]]
"""Per session touched in a batch: ``[accumulator delivered before the batch or None,
accumulator now or None]``."""


def own_window_end(t_ms: int, own_end_ms: int, max_duration_ms: int) -> int:
    """The end of the session an event at ``t_ms`` forms alone: ``t + min(gap, max_duration)``."""
    capped = t_ms + max_duration_ms
    return own_end_ms if own_end_ms < capped else capped


def _payload(raw: Any, key: Any, bounds: tuple[int, int]) -> tuple[list[Any], int]:
    """The events and largest own end a stored record keeps.

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


def _fold(agg: Aggregation, key: Any, events: list[Any]) -> Any:
    """The accumulator of ``events`` (in (time, arrival) order): ``initial()``, then each
    event's ``add`` (``add_run`` gives the same by its contract; count's ``add_run`` is the
    number of events, which needs no lists)."""
    if is_count(agg):
        return agg.initial() + len(events)
    return agg.add_run(key, list(map(_VALUE, events)), list(map(_FIRST, events)),
                       list(map(_SEQ, events)), agg.initial())


def _wire(acc: Any, events: list[Any], max_end: int) -> list[Any]:
    return record_with_events(acc, events, max_end)


class _Held:
    """A key whose open sessions are written lazily: the open sessions stored when it became
    lazy (``stored``: ``[(bounds, record)]`` in order; they stay as stored until the key is
    written), the events that came since (``events``, ``[t, seq, own_end, value]`` in arrival
    order), a lower bound of the end of every session the key's open events can form
    (``bound``: the smallest own-window end over them, or ``floor``, the "closed before" when
    it became lazy, + 1, if that is later: no step creates a session closed on creation, so
    every session of the key ends after it) and, with sums, the sum of the
    magnitudes of their int values (no partial sum of a fold can leave int64 while it is at
    most ``INT64_MAX``)."""

    __slots__ = ("stored", "events", "bound", "floor", "magnitude")

    def __init__(self, stored: list[tuple[tuple[int, int], Any]], bound: int, floor: int,
                 magnitude: int) -> None:
        self.stored = stored
        self.events: list[list[Any]] = []
        self.floor = floor
        self.bound = bound if bound > floor else floor
        self.magnitude = magnitude


class MaxDuration:
    """The event step of an engine whose windows have ``max_duration_ms``.

    Args:
        engine: the :class:`~sessionstore.engine.SessionAggregator` it serves (its store,
            cursors, aggregation and emission).
        max_duration_ms: the maximum session duration.

    Raises:
        ValueError: the engine has a trigger (not supported with a maximum duration).
    """

    def __init__(self, engine: EngineHost, max_duration_ms: int) -> None:
        if engine.trigger is not None:
            raise ValueError(
                "max_duration_ms does not combine with trigger=: events move between sessions "
                "when an out-of-order event re-cuts them, which no pane history follows; use "
                "emit=ON_WINDOW_UPDATE or ON_WINDOW_CLOSE"
            )
        self.engine = engine
        self.max_duration_ms = max_duration_ms
        # the built-ins extend a copy of the accumulator (merge into initial() copies it
        # exactly); any other aggregation is folded again from the events, so that only its
        # initializer and aggregator are used, on fresh accumulators
        self._incremental = columnar_parts(engine.aggregation) is not None
        self._fixed_gap = not engine.config.dynamic
        #: events of the sessions re-cuts wrote (each is copied into its record and folded)
        self.recut_events = 0
        #: the steps of re-cuts done one by one in Python: binary searches (or, with a gap
        #: per event, events scanned) and sessions written (operation counts: tests bound the
        #: work of disordered input with them, without timing)
        self.recut_steps = 0
        # key -> (the cache's view of it, the bounds of its open sessions in order), kept
        # while the cache holds that same view (see _open_bounds)
        self._orders: dict[Any, tuple[Any, list[tuple[int, int]]]] = {}
        # held keys (see "Held keys" in the module docstring): with ON_WINDOW_CLOSE on
        # every path, with ON_WINDOW_UPDATE inside a batch (process_many); only for built-in
        # accumulators: their adds cannot fail on ints and floats whose sums stay in int64,
        # and their accumulators of encodable values encode (the engine checks each value);
        # any other must fail at the event that breaks it
        parts = columnar_parts(engine.aggregation) or []
        self._lazy = not engine.updates
        self._lazy_ok = self._incremental
        # (is a sum, column, index in the accumulator) of the parts whose adds look at the
        # value's number
        combined = isinstance(engine.aggregation, Combined)
        self._numeric = [(kind == "sum", column, i if combined else None)
                         for i, (kind, column) in enumerate(parts) if kind in NUMERIC_KINDS]
        # the adds of the other built-ins (count, first, last, collect) give the fold in
        # (time, arrival) order whatever order they come in
        self._order_free_adds = not self._numeric
        self._pending: dict[Any, _Held] = {}
        self._due: list[tuple[int, int, Any, _Held]] = []  # (bound, tie, key, entry), a heap
        self._tie = 0
        self._held = 0  # events held in self._pending

    def _open_bounds(self, key: Any, view: Any, closed_before: int) -> list[tuple[int, int]]:
        """The bounds of ``key``'s open sessions (ending after ``closed_before``) in ``view``
        (what the cache's ``sessions_of`` returned), in order (disjoint: start order is end
        order), without sorting them again at every event.

        The order is kept with the view it was read from, and used only while the cache
        returns that same view: every change of a key's open sessions goes through this
        class, which updates the order (:meth:`_reindex`), or drops it (the batch plans); the
        cache itself only forgets sessions that closed, which are a prefix (ends increase), or
        starts a new view (an eviction, an abort, a reload)."""
        entry = self._orders.get(key)
        if entry is not None and entry[0] is view:
            order = entry[1]
            closed = 0
            while closed < len(order) and order[closed][1] <= closed_before:
                closed += 1
            if closed:
                del order[:closed]
            return order
        order = sorted(b for b in view if b[1] > closed_before)
        self.recut_steps += len(view)
        held = self.engine.cache.held_keys
        if held.get(key) is view:  # not when the cache writes through (a view per call)
            orders = self._orders
            if len(orders) >= len(held) + _ORDERS_SLACK:
                for gone in [k for k, e in orders.items() if held.get(k) is not e[0]]:
                    del orders[gone]  # views the cache no longer holds
            orders[key] = (view, order)
        return order

    @staticmethod
    def _reindex(order: list[tuple[int, int]], removed: list[tuple[tuple[int, int], Any]],
                 added: list[tuple[int, int, Any, list[Any], int, bool, Any]],
                 recut: tuple[int, int, list[tuple[int, int]]] | None) -> None:
        """Apply a step's changes to the order :meth:`_open_bounds` returned: a re-cut
        replaces ``order[low:high]`` by its sessions; otherwise the removed bounds leave and
        the new ones (``fresh``) are inserted."""
        if recut is not None:
            low, high, bounds = recut
            order[low:high] = bounds
            return
        for b, _ in removed:
            del order[bisect.bisect_left(order, b)]
        for start, end, _, _, _, fresh, _ in added:
            if fresh:
                bisect.insort(order, (start, end))

    def process(self, key: Any, value: Any, t: int, own_end: int, out: list[Emit],
                log: ChangeLog | None = None) -> None:
        """Add one validated event (the event path's step; the batch path loops over it).

        Args:
            key, value, t: the event.
            own_end: the end of its own window, ``t + gap(event)``.
            out: emits are appended here (closing, and ``ON_WINDOW_UPDATE`` without ``log``).
            log: with ``ON_WINDOW_UPDATE`` in a batch, the changes are recorded here instead of
                emitted (:meth:`emit_log` emits them at the end of the batch).
        """
        engine = self.engine
        engine.metrics.records_in += 1
        times = engine.times
        if times.is_late(own_window_end(t, own_end, self.max_duration_ms)):
            engine.drop(key, value, t)
            return
        closed_before = times.closed_before()
        self._step(key, value, t, own_end, closed_before, out, log, times.seq + 1,
                   self._lazy)
        times.seq += 1
        if times.observe(t):
            engine.on_watermark(out)

    def _step(self, key: Any, value: Any, t: int, own_end: int, closed_before: int,
              out: list[Emit], log: ChangeLog | None, seq: int, lazy: bool) -> None:
        """Re-cut the key's open sessions with the new event (arrival number ``seq``) and
        apply the difference (the caller advances the engine's arrival counter); with
        ``lazy``, hold the event instead (:meth:`_hold`) unless it comes after every open
        event of its key.

        No session this creates is closed on creation. The first re-cut session starts at an
        open session's first event (it keeps all that session's events, so it ends no earlier,
        after ``closed_before``) or at the new event (it ends at ``t + min(gap, max_duration)``
        or later, after ``closed_before`` since the event is not late). Every later one starts
        at an event at or past the end of the one before, so after ``closed_before`` too.
        """
        engine = self.engine
        cfg = engine.config
        md = self.max_duration_ms
        inclusive = cfg.inclusive_gap
        agg = engine.aggregation
        event = [t, seq, own_end, value]
        if self._pending and key in self._pending:
            held = self._pending[key]
            if lazy and held.bound > closed_before and self._hold(key, held, event, out, log):
                return
            self._write_held(key, out, log)  # the key may close: write it, then step
        view = engine.cache.sessions_of(key, closed_before)
        bounds = self._open_bounds(key, view, closed_before)
        j = bisect.bisect_right(bounds, t, key=_FIRST) - 1
        if lazy and self._lazy_ok and bounds and (
                j != len(bounds) - 1 or t < _payload(view[bounds[j]][0], key, bounds[j])[0][-1][0]
        ) and self._start_holding(key, view, bounds, event, closed_before, out, log):
            return  # held: before the last open event of its key
        removed: list[tuple[tuple[int, int], Any]] = []  # (bounds, old accumulator)
        # (start, end, acc, events, max_end, whether the bounds are new, the old accumulator of
        # a session changed in place)
        added: list[tuple[int, int, Any, list[Any], int, bool, Any]] = []
        last = len(bounds) - 1
        appended = True  # the cases that need no re-cut
        if j >= 0:
            b = bounds[j]
            raw = view[b][0]
            events, max_end = _payload(raw, key, b)
            start = b[0]
            if j == last and t >= events[-1][0]:
                # after every open event of the key: it extends the last session or starts one
                if t < start + md and reaches(max_end, t, inclusive):
                    new_max = own_end if own_end > max_end else max_end
                    end = new_max if new_max < start + md else start + md
                    acc, events = self._grow(key, value, t, seq, acc_of(raw), events, event,
                                             len(events))
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
                pos = bisect.bisect_right(events, t, key=_FIRST)  # after equal times
                acc, events = self._grow(key, value, t, seq, acc_of(raw), events, event, pos)
                added.append((start, b[1], acc, events, max_end, False, acc_of(raw)))
            else:
                appended = False
        elif bounds:
            # before every open session of the key; the scan from t meets the first one
            b = bounds[0]
            raw = view[b][0]
            events, max_end = _payload(raw, key, b)
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
                acc, events = self._grow(key, value, t, seq, acc_of(raw), events, event, 0)
                removed.append((b, acc_of(raw)))
                added.append((t, max_end if max_end < limit else limit, acc, events, max_end,
                              True, None))
            else:
                appended = False
        else:  # no open session
            added.append((t, own_window_end(t, own_end, md),
                          agg.add(key, value, t, seq, agg.initial()), [event], own_end, True,
                          None))
        recut: tuple[int, int, list[tuple[int, int]]] | None = None
        if not appended:
            # the event falls at or after the start of bounds[first] and before the next one
            first = j if j > 0 else 0
            stored = _payload(view[bounds[first]][0], key, bounds[first])[0]
            pos = bisect.bisect_right(stored, t, key=_FIRST)  # after equal times: arrival
            following = len(bounds) - first - 1

            def events_of(i: int) -> list[Any]:
                b = bounds[first + 1 + i]
                return _payload(view[b][0], key, b)[0]

            sessions: list[Recut]
            if self._fixed_gap:
                pieces = [part for part in (stored[:pos], [event], stored[pos:]) if part]
                sessions, used, searches = cut_pieces(pieces, 1 if pos else 0, following,
                                                      events_of, md, inclusive)
                self.recut_steps += searches
            else:  # a gap per event: whether events reach each other depends on the start
                gathered = [*stored[:pos], event, *stored[pos:]]
                cuts, used = cut_until_unchanged(gathered, following, events_of, md, inclusive)
                self.recut_steps += len(gathered)
                sessions = []
                low = 0
                for start, end, max_end, stop in cuts:
                    sessions.append((start, end, max_end, gathered[low:stop],
                                     low <= pos < stop))
                    low = stop
            removed, added = self._diff(key, sessions, {
                b: view[b][0] for b in bounds[first:first + 1 + used]})
            recut = (first, first + 1 + used, [(c[0], c[1]) for c in sessions])
        if engine.check_acc:
            for start, end, acc, *_ in added:
                check_encodable(acc, f"the accumulator of {Session(key, start, end)}")
        # apply: nothing below fails on the event's content (a store failure while the cache
        # writes leaves the key's order dropped: it is read again from the view)
        order = self._orders.pop(key, None)
        self._write(key, removed, added)
        self._reindex(bounds, removed, added, recut)
        if order is not None:
            self._orders[key] = order
        self._publish(key, removed, added, out, log)

    def _diff(self, key: Any, sessions: list[Recut], old: dict[tuple[int, int], Any]
              ) -> tuple[list[tuple[tuple[int, int], Any]],
                         list[tuple[int, int, Any, list[Any], int, bool, Any]]]:
        """The changes that replace the stored open sessions ``old`` (``{bounds: record}``,
        in order) by the sessions of a cut over their events and new ones: ``(removed,
        added)``, as :meth:`_step` applies them.

        A session of a cut holds exactly the open events in ``[start, end)``, so one with
        stored bounds and no new event is the stored one (unchanged); every other one gets its
        accumulator folded from its events (in (time, arrival) order)."""
        agg = self.engine.aggregation
        kept: set[tuple[int, int]] = set()
        added: list[tuple[int, int, Any, list[Any], int, bool, Any]] = []
        for start, end, max_end, members, holds_new in sessions:
            raw = old.get((start, end))
            if raw is not None:
                kept.add((start, end))  # unchanged, or changed in place: no removal
                if not holds_new:
                    continue
            self.recut_events += len(members)
            self.recut_steps += 1
            added.append((start, end, _fold(agg, key, members), members, max_end, raw is None,
                          None if raw is None else acc_of(raw)))
        return [(b, acc_of(raw)) for b, raw in old.items() if b not in kept], added

    def _write(self, key: Any, removed: list[tuple[tuple[int, int], Any]],
               added: list[tuple[int, int, Any, list[Any], int, bool, Any]]) -> None:
        """Write a key's changed open sessions to the store."""
        state = self.engine.cache
        for b, _ in removed:
            state.remove(Session(key, b[0], b[1]))
        for start, end, acc, events, max_end, *_ in added:
            state.put(Session(key, start, end), _wire(acc, events, max_end))

    def _publish(self, key: Any, removed: list[tuple[tuple[int, int], Any]],
                 added: list[tuple[int, int, Any, list[Any], int, bool, Any]],
                 out: list[Emit], log: ChangeLog | None) -> None:
        """Emit (``ON_WINDOW_UPDATE``), log (a batch's ``ON_WINDOW_UPDATE``) or index for
        closing (``ON_WINDOW_CLOSE``) the changes :meth:`_write` wrote."""
        engine = self.engine
        if engine.updates:
            if engine.write_cache:
                return  # the write cache delivers the changes on flush
            result = engine.aggregation.result
            if log is not None:
                for b, old_acc in removed:
                    session = Session(key, b[0], b[1])
                    entry = log.get(session)
                    if entry is None:
                        log[session] = [old_acc, None]
                    else:
                        entry[1] = None
                for start, end, acc, _, _, _, old_acc in added:
                    session = Session(key, start, end)
                    entry = log.get(session)
                    if entry is None:
                        log[session] = [old_acc, acc]
                    else:
                        entry[1] = acc
                return
            for b, old_acc in removed:
                out.append(make_emit(Session(key, b[0], b[1]), result(old_acc), retraction=True))
            for start, end, acc, *_ in added:
                out.append(make_emit(Session(key, start, end), result(acc)))
            engine.metrics.emitted += len(removed) + len(added)
            return
        heap = engine.close_heap
        for _, end, _, _, _, fresh, _ in added:
            if fresh:
                heapq.heappush(heap, end)
                if engine.record_close_times:
                    engine.new_close_times.append(end)

    # -- lazy writes ----------------------------------------------------------------------------

    def _magnitude(self, value: Any) -> int | None:
        """The sum of the magnitudes of ``value``'s int numbers that sums add; None when a
        number the aggregation looks at is not an int or a float (or is missing): the event
        then takes the exact step, whose add fails at that event if it must."""
        total = 0
        for is_sum, column, _ in self._numeric:
            try:
                number = value if column is None else value[column]
            except (KeyError, TypeError, IndexError):
                return None
            kind = type(number)
            if kind is int:
                if is_sum:
                    total += number if number >= 0 else -number
            elif kind is not float:
                return None
        return total

    def _start_holding(self, key: Any, view: Any, bounds: list[tuple[int, int]],
                     event: list[Any], closed_before: int, out: list[Emit],
                     log: ChangeLog | None) -> bool:
        """Start holding ``key``'s events, ``event`` first; False (nothing changed) when an
        open or the new value is one whose adds could fail (see :meth:`_magnitude`).

        The bound is the smallest own-window end over the key's open events: every session
        of any cut of them starts at one of them and ends at or after its own-window end
        (``[s, min(max_end, s + max_duration))`` with ``max_end >= s + gap``). With a fixed
        gap that is the first open event's; with a gap per event, every event is read."""
        md = self.max_duration_ms
        magnitude = self._magnitude(event[3])
        if magnitude is None:
            return False
        stored = [(b, view[b][0]) for b in bounds]
        self.recut_steps += len(stored)
        first = _payload(stored[0][1], key, bounds[0])[0][0]
        bound = min(own_window_end(first[0], first[2], md),
                    own_window_end(event[0], event[2], md))
        if self._numeric or not self._fixed_gap:
            for b, raw in stored:
                for e in _payload(raw, key, b)[0]:
                    if self._numeric:
                        more = self._magnitude(e[3])
                        if more is None:
                            return False
                        magnitude += more
                    if not self._fixed_gap:
                        end = own_window_end(e[0], e[2], md)
                        if end < bound:
                            bound = end
                self.recut_steps += len(_payload(raw, key, b)[0])
        if magnitude > INT64_MAX:
            return False
        held = _Held(stored, bound, closed_before + 1, magnitude)
        self._pending[key] = held
        self._push_due(key, held)
        return self._hold(key, held, event, out, log)

    def _push_due(self, key: Any, held: _Held) -> None:
        """Index a held key's (new, lower) bound for :meth:`write_upto`; a driver that wakes
        the engine on close times (``drain_close_times``) gets the bound as one: no session of
        the key closes before it, and the wake-up writes the key, whose ends then follow."""
        self._tie += 1
        heapq.heappush(self._due, (held.bound, self._tie, key, held))
        engine = self.engine
        if engine.record_close_times:
            engine.new_close_times.append(held.bound)

    def _hold(self, key: Any, held: _Held, event: list[Any], out: list[Emit],
              log: ChangeLog | None) -> bool:
        """Hold ``event`` (not late; its key's bound is after its "closed before") for
        ``key``; False (nothing changed) when its value is one whose adds could fail or its
        sums could leave int64."""
        magnitude = self._magnitude(event[3])
        if magnitude is None or held.magnitude + magnitude > INT64_MAX:
            return False
        held.magnitude += magnitude
        held.events.append(event)
        end = own_window_end(event[0], event[2], self.max_duration_ms)
        if end < held.floor:
            end = held.floor
        if end < held.bound:
            held.bound = end
            self._push_due(key, held)
        self._held += 1
        if self._held > HELD_EVENTS_LIMIT:
            self.write_all(out, log)
        return True

    def write_upto(self, upto: int, out: list[Emit]) -> None:
        """Write every held key whose bound is at or before ``upto`` (the engine calls this
        before it closes the sessions ending up to ``upto``)."""
        due = self._due
        pending = self._pending
        while due and due[0][0] <= upto:
            _, _, key, held = heapq.heappop(due)
            if pending.get(key) is held:
                self._write_held(key, out, None)

    def write_all(self, out: list[Emit], log: ChangeLog | None = None) -> None:
        """Write every held key (before a commit, a flush, at the end of a batch with
        ``ON_WINDOW_UPDATE``, or when too many events are held)."""
        for key in list(self._pending):
            self._write_held(key, out, log)
        self._due.clear()  # every entry is stale

    def write_key(self, key: Any) -> None:
        """Write ``key`` if it is held (before its sessions are read)."""
        if key in self._pending:
            self._write_held(key, [], None)

    def forget(self) -> None:
        """Drop every held event (an abort)."""
        self._pending.clear()
        self._due.clear()
        self._held = 0
        self._orders.clear()

    def _write_held(self, key: Any, out: list[Emit], log: ChangeLog | None) -> None:
        """Cut a held key's open events (its stored open sessions and its held events) by the
        rule and write the difference to the stored sessions, as one re-cut.

        The sessions before the one the earliest held event falls into cannot change (the
        cut is a left-to-right scan); from there on, every open event is cut again (in
        (time, arrival) order). A session of a cut holds exactly the open events in
        ``[start, end)``, so one with stored bounds and no held event is the stored one.
        Every other session gets its accumulator folded from its events in (time, arrival)
        order. If that fails, nothing is written and the key stays held."""
        held = self._pending[key]
        engine = self.engine
        md = self.max_duration_ms
        stored = held.stored
        news = sorted(held.events, key=_TIME_SEQ)
        first = max(bisect.bisect_right(stored, news[0][0], key=_start_of) - 1, 0)
        last = max(bisect.bisect_right(stored, news[-1][0], key=_start_of) - 1, first)
        gathered: list[Any] = []
        for b, raw in stored[first:last + 1]:
            gathered += _payload(raw, key, b)[0]
        gathered += news
        gathered.sort(key=_TIME_SEQ)  # two sorted runs: one merge

        def events_of(i: int) -> list[Any]:
            b, raw = stored[last + 1 + i]
            return _payload(raw, key, b)[0]

        cuts, used = cut_until_unchanged(gathered, len(stored) - last - 1, events_of, md,
                                         engine.config.inclusive_gap)
        self.recut_steps += len(gathered) + last + 1 + used - first
        new_times = list(map(_FIRST, news))
        sessions: list[Recut] = []
        low = 0
        for start, end, max_end, stop in cuts:
            at = bisect.bisect_left(new_times, start)  # a held event in [start, end)?
            sessions.append((start, end, max_end, gathered[low:stop],
                             at < len(new_times) and new_times[at] < end))
            low = stop
        removed, added = self._diff(key, sessions, dict(stored[first:last + 1 + used]))
        del self._pending[key]
        self._held -= len(held.events)
        self._orders.pop(key, None)  # read again from the view at the key's next step
        self._write(key, removed, added)
        self._publish(key, removed, added, out, log)

    def process_many(self, keys: list[Any], values: list[Any], times: np.ndarray,
                     ends: np.ndarray, codes: np.ndarray, out: list[Emit],
                     log: ChangeLog | None) -> None:
        """Add a batch of validated events (arrival order) as a loop of :meth:`process` would,
        without a write cache (whose evictions forward changes in loop order).

        Args:
            keys, values, times: the events; ``codes`` numbers their keys (equal keys, equal
                codes); ``ends`` is each event's own ``t + gap``.
            out: the emits of closing (and the caller emits ``log``).
            log: with ``ON_WINDOW_UPDATE``, the batch's changes (see :meth:`emit_log`).

        Lateness, each event's "closed before" and its arrival number are those the loop
        would see (the watermark before each event is a running maximum). A key whose
        accepted events come in time order, none before the last event of its open sessions,
        is cut in one pass (:meth:`_in_order`), as the loop's in-order step would, one event
        after the other; so is a disordered key of an aggregation that is not held
        (:meth:`_replay`); every other key's events take the event step, in arrival order,
        which holds them (:meth:`_hold`). With ``ON_WINDOW_UPDATE`` every held key is written
        at the end. Closing runs once, after every write, as in the columnar batch path.
        """
        engine = self.engine
        clock = engine.times
        md = self.max_duration_ms
        n = len(times)
        if n == 0:
            return
        own = times + np.minimum(ends - times, md)  # own_window_end, without overflow
        late, closed_before, accepted, _ = clock.arrive_batch(times, own)
        m = len(accepted)
        seq0 = clock.seq + 1
        acc_codes = codes[accepted]
        acc_times = times[accepted]
        # each key's accepted events in (time, arrival) order
        order = np.lexsort((np.arange(m), acc_times, acc_codes))
        sorted_codes = acc_codes[order]
        same_key = sorted_codes[1:] == sorted_codes[:-1]
        # keys whose events did not come in time order: their arrival indexes go down
        disordered = set(sorted_codes[1:][same_key & (np.diff(order) < 0)].tolist())
        starts = np.flatnonzero(np.concatenate(([True], ~same_key))).tolist() if m else []
        bounds_of = [*starts, m]
        rows = accepted[order].tolist()  # batch rows
        positions = order.tolist()  # their arrival index among the accepted
        time_list = times.tolist()
        end_list = ends.tolist()
        cb_list = closed_before.tolist()
        code_list = sorted_codes.tolist()
        fallback: list[int] = []  # arrival indexes among the accepted
        plans: list[tuple[Any, list[Any]]] = []
        # a disordered key is held (written once, lazily) by the step when built-in
        # accumulators allow it (always here: a batch holds keys with either emission);
        # otherwise replayed in one pass (the other aggregations fold from the events, so
        # their accumulators do not depend on the order of the adds)
        lazy = self._lazy or log is not None
        held_keys = lazy and self._lazy_ok
        pending = self._pending
        for g in range(len(starts)):
            a, b = bounds_of[g], bounds_of[g + 1]
            row = rows[a]
            mixed = code_list[a] in disordered
            if (mixed and held_keys) or (pending and keys[row] in pending):
                fallback.extend(positions[a:b])
                continue
            plan = self._in_order(keys[row], values, time_list, end_list, cb_list, rows[a:b],
                                  [seq0 + p for p in positions[a:b]], mixed)
            if plan is None:
                fallback.extend(positions[a:b])
            else:
                plans.append((keys[row], plan))
        # apply: the late events, the keys that need re-cutting, then the in-order keys
        metrics = engine.metrics
        metrics.records_in += n
        if m < n:
            for i in np.flatnonzero(late).tolist():
                engine.drop(keys[i], values[i], time_list[i])
        fallback.sort()
        step = self._step
        acc_rows = accepted.tolist()
        for p in fallback:
            i = acc_rows[p]
            step(keys[i], values[i], time_list[i], end_list[i], cb_list[i], out, log, seq0 + p,
                 lazy)
        clock.seq += m
        for key, plan in plans:
            self._apply_in_order(key, plan, log)
        if log is not None and self._pending:
            self.write_all(out, log)  # the log is "before the batch, and now"
        if m and clock.observe(int(acc_times.max())):
            engine.on_watermark(out)

    def _in_order(self, key: Any, values: list[Any], times: list[int], ends: list[int],
                  closed_before: list[int], rows: list[int], seqs: list[int],
                  disordered: bool) -> list[Any] | None:
        """Cut one key's events (``rows``, in (time, arrival) order, arrival numbers ``seqs``)
        onto its open sessions, changing nothing; None when the loop's answer could differ (the
        caller then re-cuts those events one by one, exactly).

        Each event joins the last session iff the loop's in-order step would join it: that
        session is still open at the event's "closed before", the event is gap-connected and
        before ``start + max_duration``; otherwise it starts a session. That is the loop's
        answer when no event comes before the last event of the key's open sessions (earlier
        sessions never change then), and

        * the events came in time order (``disordered`` false): each is the loop's in-order
          step, also when a session closes between two of them; or
        * they did not (``disordered``): :meth:`_replay` follows the loop's re-cuts and
          closes, for aggregations that are folded from their events (not held), whose
          accumulators do not depend on the order of the adds.

        Returns the changed sessions, ``[start, end, max_end, events, acc, old bounds or None,
        old acc, changed]``, and the ends to index for closing (in time order, each end a step
        gave a fresh session, as the loop indexes them; otherwise the final ones).
        """
        engine = self.engine
        agg = engine.aggregation
        md = self.max_duration_ms
        inclusive = engine.config.inclusive_gap
        incremental = self._incremental
        # the first arrival's "closed before" (it grows with arrival: the smallest)
        cb0 = min(closed_before[row] for row in rows) if disordered else closed_before[rows[0]]
        view = engine.cache.sessions_of(key, cb0)
        cur: list[Any] | None = None
        open_events: list[Any] = []
        if view:
            open_bounds = [bb for bb in view if bb[1] > cb0]
            if open_bounds:
                last = max(open_bounds)
                raw = view[last][0]
                open_events, max_end = _payload(raw, key, last)
                if times[rows[0]] < open_events[-1][0]:
                    return None
                cur = [last[0], last[1], max_end, open_events, acc_of(raw), last, acc_of(raw), False]
        done: list[list[Any]] = []
        fresh: list[int] = []
        if disordered:
            done, fresh = self._replay(key, values, times, ends, closed_before, rows, seqs,
                                       open_events, cur)
            rows = seqs = []  # replayed
        for row, seq in zip(rows, seqs, strict=True):
            t = times[row]
            own_end = ends[row]
            value = values[row]
            if cur is not None and cur[1] > closed_before[row] and t < cur[0] + md \
                    and reaches(cur[2], t, inclusive):
                if not cur[7]:  # first change: own copies, the stored record stays as it was
                    cur[3] = list(cur[3])
                    if incremental:
                        cur[4] = agg.merge(key, agg.initial(), cur[4])
                    cur[7] = True
                cur[3].append([t, seq, own_end, value])
                if own_end > cur[2]:
                    cur[2] = own_end
                    cap = cur[0] + md
                    end = own_end if own_end < cap else cap
                    if end != cur[1]:
                        cur[1] = end
                        fresh.append(end)
                if incremental:
                    cur[4] = agg.add(key, value, t, seq, cur[4])
                continue
            if cur is not None and cur[7]:
                done.append(cur)
            end = own_window_end(t, own_end, md)
            fresh.append(end)
            cur = [t, end, own_end, [[t, seq, own_end, value]],
                   agg.add(key, value, t, seq, agg.initial()) if incremental else None,
                   None, None, True]
        if cur is not None and cur[7]:
            done.append(cur)
        for session in done:
            if not incremental:
                session[4] = _fold(agg, key, session[3])
            if engine.check_acc:
                check_encodable(session[4],
                                f"the accumulator of {Session(key, session[0], session[1])}")
        return [done, fresh]

    def _replay(self, key: Any, values: list[Any], times: list[int], ends: list[int],
                closed_before: list[int], rows: list[int], seqs: list[int],
                open_events: list[Any], last: list[Any] | None
                ) -> tuple[list[list[Any]], list[int]]:
        """The loop's answer for a key whose batch events (``rows``, in (time, arrival)
        order) came out of order, all at or after every event of its last open session
        (``open_events``; ``last`` its :meth:`_in_order` entry, None without one).

        The loop keeps the key's open events cut by the offline rule (its re-cuts, from the
        session an event falls into, give that cut); at each arrival, the sessions of that cut
        ending at or before the arrival's "closed before" are final (a prefix: ends increase),
        and the new event joins the rest, which is cut again. So: per arrival, freeze that
        prefix, insert the event; at the end, cut what is still open. Accumulators are folded
        per final session, which is the loop's value for aggregations that do not depend on
        the order of the adds (the caller checks)."""
        agg = self.engine.aggregation
        md = self.max_duration_ms
        inclusive = self.engine.config.inclusive_gap
        incremental = self._incremental
        batch = [[times[row], seq, ends[row], values[row]]
                 for row, seq in zip(rows, seqs, strict=True)]
        by_arrival = sorted(range(len(rows)), key=seqs.__getitem__)
        pending = list(open_events)  # the open events, in (time, arrival) order
        final: list[tuple[int, int, int, list[Any]]] = []
        # the first session of the cut of pending, while known: [start, run, limit, stop]
        head: list[int] | None = None
        for i in by_arrival:
            cb = closed_before[rows[i]]
            while pending and pending[0][0] < cb:  # a session ending <= cb holds only t < cb
                if head is None:
                    first = pending[0]
                    head = [first[0], first[2], first[0] + md, 1]
                    scan_on(pending, head, inclusive)
                start, run, limit, stop = head
                end = run if run < limit else limit
                if end > cb:
                    break
                final.append((start, end, run, pending[:stop]))
                del pending[:stop]
                head = None
            event = batch[i]
            # after the equal times: it arrived last
            pos = bisect.bisect_right(pending, event[0], key=_FIRST)
            pending.insert(pos, event)
            if head is not None:
                if pos == 0:
                    head = None  # a new first event: scan again
                elif pos <= head[3]:
                    if pos < head[3]:  # between two of its events: it joins the session
                        head[3] += 1
                        if event[2] > head[1]:
                            head[1] = event[2]
                    scan_on(pending, head, inclusive)  # a longer run may take more
        low = 0
        for start, end, max_end, stop in cut(pending, md, inclusive):
            final.append((start, end, max_end, pending[low:stop]))
            low = stop
        done: list[list[Any]] = []
        fresh: list[int] = []
        n_open = len(open_events)
        for start, end, max_end, events in final:
            if last is not None and start == last[0] and events[0] is open_events[0]:
                # the session holding the open session's events (first, in their order)
                if (start, end) == last[5] and len(events) == n_open:
                    continue  # unchanged
                acc = (agg.merge(key, agg.initial(), last[4]) if incremental else None)
                added = events[n_open:]
                old, old_acc = last[5], last[6]
            else:
                acc = agg.initial() if incremental else None
                added = events
                old = old_acc = None
            if incremental:
                for event in added:
                    acc = agg.add(key, event[3], event[0], event[1], acc)
            if (start, end) != old:
                fresh.append(end)
            done.append([start, end, max_end, events, acc, old, old_acc, True])
        return done, fresh

    def _apply_in_order(self, key: Any, plan: list[Any], log: ChangeLog | None) -> None:
        """Write (and log or index for closing) what :meth:`_in_order` computed."""
        engine = self.engine
        state = engine.cache
        done, fresh = plan
        self._orders.pop(key, None)  # read again from the view at the key's next step
        for start, end, max_end, events, acc, old, old_acc, _ in done:
            if old is not None and old != (start, end):
                state.remove(Session(key, old[0], old[1]))
                if log is not None:
                    log[Session(key, old[0], old[1])] = [old_acc, None]
            state.put(Session(key, start, end), _wire(acc, events, max_end))
            if log is not None:
                log[Session(key, start, end)] = [old_acc if old == (start, end) else None, acc]
        if engine.updates:
            return
        heap = engine.close_heap
        for end in fresh:
            heapq.heappush(heap, end)
        if engine.record_close_times:
            engine.new_close_times.extend(fresh)

    def _grow(self, key: Any, value: Any, t: int, seq: int, acc: Any, events: list[Any],
              event: list[Any], pos: int) -> tuple[Any, list[Any]]:
        """A session's accumulator and events with ``event`` inserted at ``pos`` (its place in
        (time, arrival) order), changing nothing until the caller applies them.

        The accumulator is the fold of the events in (time, arrival) order: an add extends it
        at the end, or anywhere for the built-ins whose adds keep that order themselves;
        otherwise (sums, minima and maxima: a float sum rounds by order) it is folded again,
        unless they see only ints (:meth:`_ints_only`)."""
        agg = self.engine.aggregation
        if not self._incremental or (pos < len(events) and not self._order_free_adds
                                     and not self._ints_only(acc, value)):
            events = [*events[:pos], event, *events[pos:]]
            self.recut_events += len(events)
            return _fold(agg, key, events), events
        acc = agg.add(key, value, t, seq, agg.merge(key, agg.initial(), acc))
        if self.engine.check_acc:  # the accumulator check may still refuse: copy
            return acc, [*events[:pos], event, *events[pos:]]
        # in place (O(1) at the end): only the record this step replaces holds the list, and
        # nothing after this can fail on the event (the store copies what it writes)
        events.insert(pos, event)
        return acc, events

    def _ints_only(self, acc: Any, value: Any) -> bool:
        """Whether the sums, minima and maxima of ``acc`` and ``value`` are all ints, so that
        an ``add`` anywhere gives the fold in (time, arrival) order: int sums are exact, and
        the minimum of ints is the same whichever equal int is seen first (a sum stays an int
        only while every value added was one)."""
        for _, column, index in self._numeric:
            if type(acc if index is None else acc[index]) is not int:
                return False
            try:
                number = value if column is None else value[column]
            except (KeyError, TypeError, IndexError):
                return False
            if type(number) is not int:
                return False
        return True

    def emit_log(self, log: ChangeLog, out: list[Emit]) -> None:
        """Emit a batch's changes as the write cache would flush them: in (end, key, start)
        order, an update per session changed, a retraction per session delivered before the
        batch and removed by it."""
        encode = keyschema.encode_key
        result = self.engine.aggregation.result
        emitted = 0
        for session in sorted(log, key=lambda s: (s.end, encode(s.key), s.start)):
            before, now = log[session]
            if now is not None:
                out.append(make_emit(session, result(now)))
            elif before is not None:
                out.append(make_emit(session, result(before), retraction=True))
            else:
                continue
            emitted += 1
        self.engine.metrics.emitted += emitted

