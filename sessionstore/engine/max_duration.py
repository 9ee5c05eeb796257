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
(see the proof in :meth:`.EventStep.step`).

**Out of order.** An event earlier than a session's start (or inside it) can re-anchor a chain:
the cuts move and events move between sessions, which aggregates alone cannot follow. So while a
session is open, its record keeps its events, ``[t, seq, own_end, value]`` in (time, arrival)
order, and the largest ``t + gap`` over them. A session's accumulator is the fold of its events
in (time, arrival) order (``initial()``, then ``add`` each): a float sum is the left fold in
time order, whatever the arrival order and the path. An event that comes after every open event
of its key (the in-order case) only extends the last session or starts a new one, at the cost
of one ``add``, on every path. What an earlier event costs depends on the emission:

* **Re-cut per event** (the event path with ``ON_WINDOW_UPDATE``, which must emit each event's
  changes; and events that are not held, below): the event re-cuts, by the rule above,
  the key's open sessions from the one it falls into (earlier sessions cannot change: the cut
  is a left-to-right scan, and the scan up to that session's first event is the same), reading
  the later ones only while the new cut reaches them (:func:`.cut_until_unchanged`: where a new
  session ends right before a stored session's first event, the cut from there on is the
  stored one). Cheaper cases: an event inside a session that reaches no further than the
  session's events do (no bound and no later cut moves), and an event before every open
  session that either does not reach the first one or becomes its first event while that
  session keeps all its events and reaches no further: one ``add`` for the built-ins whose
  ``add`` keeps (time, arrival) order itself (count, first, last, collect), the session folded
  again for the others.
* **Held keys** (``ON_WINDOW_CLOSE`` on every path, and ``ON_WINDOW_UPDATE`` inside one batch,
  :meth:`MaxDuration.process_many`, whose change log is "before the batch, and now"): the key's
  open sessions are not written at every event. An event before the last open event of its
  key holds its key, unless it falls inside a session, reaches no further than it does and
  its add keeps the time-ordered fold and needs no accumulator check (ints, and strs for
  minima and maxima; an int sum's needs none: :meth:`.DurationState.in_place_add`; the
  in-place update of the re-cut below is one add, where holding keeps the event in memory
  and writes the session later). The event holds its key (:class:`.Held`: the open sessions
  stored when it became held, and the events since, in memory); every later event of the
  key is held too. The key is written once (:meth:`.HeldKeys.write`: its
  open events from the session the earliest held event falls into, sorted, cut by
  :func:`.cut_until_unchanged`, diffed against the stored sessions) when that is needed: before
  the close cursor reaches a lower bound of its session ends (:meth:`MaxDuration.write_upto`,
  called by the engine's closing; the bound is the end of the first session as far as the
  held events tell: the first stored open session's end, raised by the held events its run
  reaches (:meth:`.Held.extend`, a heap of the held events it does not reach yet, so a long
  session taking slightly disordered events is written once, when it closes); or the
  smallest own-window end of a held event before it if earlier, since the sessions of a cut
  end in increasing order and the first one keeps the first stored session's events or
  starts at such a held event (:class:`.Held`); or the "closed before" when it became held,
  + 1, if later, since no step creates a session closed on creation), before an event whose
  "closed before" reaches it, at
  the end of a batch with ``ON_WINDOW_UPDATE``, before ``commit()``, ``flush()`` and
  ``sessions(key)``, and when :data:`.HELD_EVENTS_LIMIT` events are held; ``abort()`` drops
  them. Until the bound is reached none of the key's sessions could have closed, so the
  written cut is the one a re-cut per event gives. A stored session the close cursor passes
  while the bound is later is stale (no session of the key's cut ends before the bound, so
  the write removes it): it is removed from the store before the closing meets it
  (:meth:`.HeldKeys.write_upto`, its record kept for the write; an abort restores it with the
  rest). The built-in aggregations are held only while the numbers their sums see are ints
  and floats whose int sums cannot leave int64, and their minima and maxima see numbers
  only, strs only, bytes only or lists of numbers only (:meth:`.DurationState.magnitude`): a
  write then cannot fail, and an event that could make it fail takes the re-cut and fails at
  itself. Aggregations
  with user functions are held with ``ON_WINDOW_CLOSE`` only (a batch replays their keys
  instead: below), and their writes can fail: a failing write
  raises :class:`.HeldWriteError` (naming the aggregation, key and session), writes nothing
  and keeps the key held; it is done before the call that needs it changes anything
  (:meth:`MaxDuration.process` and :meth:`MaxDuration.process_many` first write what their
  watermark move reaches, :meth:`MaxDuration.before_watermark` runs before an explicit move,
  and no event is held with a bound the call's own close reaches), so that call changes
  nothing; ``abort()`` drops the held events.

Either way the difference (removed sessions, new or changed ones) goes through the engine's
normal store writes and emission, so retractions (``ON_WINDOW_UPDATE``), the write cache,
closing (``ON_WINDOW_CLOSE``), expiry and commits work as for every session. Closed sessions are
final: they never join a re-cut.

**Cost.** A session's record holds its events (values included) besides the accumulator, until
retention expires it: memory and disk grow with the events per session, not only the sessions,
and writing a session costs O(its events) (a write-through cache re-encodes the whole record on
every change). A key's open sessions are kept in order beside the cache's view of the key
(:meth:`.OpenOrders.bounds`), so an event finds its session by binary search. A held
event costs O(log n) at most (O(1) but for the heap of :meth:`.Held.extend`); writing a
held key costs a sort and a scan of its open events from the
session its earliest held event falls into. So any arrival order costs O(n log n) per key plus
the output with ``ON_WINDOW_CLOSE`` and on the batch paths, as long as a key is not written
again and again (each write happens because its bound was reached, a batch with
``ON_WINDOW_UPDATE`` ended or a commit came; a stream that alternates an event at the front of
a long open chain with one of those writes the chain each time). A re-cut per event, with a
fixed gap, finds each session's end by binary search (:func:`.cut_pieces`): O(log n) steps per
session it writes, plus copying that session's events into its new record and folding its
accumulator; with a gap per event it scans the events it reads (:func:`.cut_until_unchanged`).
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
order after its last open event (:meth:`.BatchStep._in_order`), or out of order with an
aggregation with user functions (:meth:`.BatchStep._replay` follows the loop's re-cuts and
closes, in O(n log n); those fold from the events, before the batch changes anything, so a
failing function raises at that batch and changes nothing: with ``ON_WINDOW_UPDATE`` a held
write at the batch's end would follow its changes, and with ``ON_WINDOW_CLOSE`` no event is
held whose key's bound the batch's own close reaches); the other keys take the event step one
by one, which holds them. Those steps are one change: when one raises (a value check of a
built-in, an int64 sum or a minimum over values that do not compare, an accumulator the store
cannot encode, the store), :class:`.BatchUndo` puts back what the earlier ones changed (the
keys' open sessions and held state), and the batch's counters, arrival counter and watermark
move only after them, so a failing batch changes nothing, as without a maximum duration. With
``ON_WINDOW_UPDATE`` every held key is written at the end of the batch. With a write cache every
event takes the event step, as one change too (the cache's evictions forward in the loop's
order; what it forwards is held back until the batch ends: :mod:`.max_duration_undo`).

Wire form of a record: ``[acc, n_new, pane_index, phase, pt_target_ms, events, max_end]``; the
first five are those of :class:`~sessionstore.engine.record.SessionRecord`, so every reader of
accumulators works unchanged.

**Modules.** :class:`MaxDuration` is the façade the engine calls; each part is a module of
its own, and each imports only those above it:

* :mod:`.max_duration_state`: the options and what they imply, the work counters, the capped
  window end (:func:`.own_window_end`), a record's events and their fold;
* :mod:`.max_duration_order`: the order of each key's open sessions beside the cache's view;
* :mod:`.max_duration_write`: the difference of a cut from the stored sessions, its writes,
  emits, change log and close index;
* :mod:`.max_duration_held`: the held keys and the heap of their bounds;
* :mod:`.max_duration_step`: the event step;
* :mod:`.max_duration_undo`: the undo of a batch whose event steps failed;
* :mod:`.max_duration_batch`: the batch step.

The rule's cuts are :mod:`.cuts`; the late rule and the close cursor,
:class:`~sessionstore.engine.time.TimeKeeper`; the gap convention,
:func:`~sessionstore.gap_boundary.reaches`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .emit import Emit
from .max_duration_batch import BatchStep
from .max_duration_held import HeldKeys
from .max_duration_order import OpenOrders
from .max_duration_state import ChangeLog, DurationState, own_window_end
from .max_duration_step import EventStep
from .max_duration_write import emit_log

if TYPE_CHECKING:
    from .host import EngineHost


class MaxDuration:
    """The step of an engine whose windows have ``max_duration_ms``: events, batches, held
    keys and the engine's hooks (closing, commit, flush, abort, reads).

    Args:
        engine: the :class:`~sessionstore.engine.SessionAggregator`'s core it serves (its
            store, cursors, aggregation and emission).
        max_duration_ms: the maximum session duration.

    Attributes:
        held: the held keys (read only outside the step).

    Raises:
        ValueError: the engine has a trigger (not supported with a maximum duration).
    """

    __slots__ = ("max_duration_ms", "held", "_engine", "_lazy", "_fallible", "_state",
                 "_orders", "_event", "_batch")

    def __init__(self, engine: EngineHost, max_duration_ms: int) -> None:
        if engine.trigger is not None:
            raise ValueError(
                "max_duration_ms does not combine with trigger=: events move between sessions "
                "when an out-of-order event re-cuts them, which no pane history follows; use "
                "emit=ON_WINDOW_UPDATE or ON_WINDOW_CLOSE"
            )
        self.max_duration_ms = max_duration_ms
        self._engine = engine
        state = DurationState(engine, max_duration_ms)
        self._lazy = state.lazy
        # held keys whose writes can fail: user functions, held with ON_WINDOW_CLOSE
        self._fallible = state.lazy and not state.incremental
        self._state = state
        self._orders = OpenOrders(state)
        self.held = HeldKeys(state, self._orders)
        self._event = EventStep(state, self._orders, self.held)
        self._batch = BatchStep(state, self._orders, self.held, self._event)

    @property
    def recut_events(self) -> int:
        """The events of the sessions re-cuts wrote (each is copied into its record and
        folded)."""
        return self._state.recut_events

    @recut_events.setter
    def recut_events(self, count: int) -> None:
        self._state.recut_events = count

    @property
    def recut_steps(self) -> int:
        """The steps of re-cuts done one by one in Python: binary searches (or, with a gap per
        event, events scanned) and sessions written (operation counts: tests bound the work of
        disordered input with them, without timing)."""
        return self._state.recut_steps

    @recut_steps.setter
    def recut_steps(self, count: int) -> None:
        self._state.recut_steps = count

    def process(self, key: Any, value: Any, t: int, own_end: int, out: list[Emit],
                log: ChangeLog | None = None) -> None:
        """Add one validated event (the event path's step; a batch with a write cache loops
        over it): the late rule, then :meth:`.EventStep.step`.

        Args:
            key, value, t: the event.
            own_end: the end of its own window, ``t + gap(event)``.
            out: emits are appended here (closing, and ``ON_WINDOW_UPDATE`` without ``log``).
            log: with ``ON_WINDOW_UPDATE`` in a batch, the changes are recorded here instead of
                emitted (:meth:`emit_log` emits them at the end of the batch).
        """
        engine = self._engine
        times = engine.times
        closed_before = times.closed_before()
        horizon = closed_before
        if self._fallible:  # first the writes this event may need (they may fail)
            horizon = self.close_cursor_after(t)
            self.held.write_upto(horizon, out, closing=False)  # what its move closes
            if self.held.full(1):
                self.held.write_all(out)  # the held-events limit
        engine.metrics.records_in += 1
        if times.is_late(own_window_end(t, own_end, self.max_duration_ms)):
            engine.drop(key, value, t)
            return
        self._event.step(key, value, t, own_end, closed_before, horizon, out, log,
                         times.seq + 1, self._lazy)
        times.seq += 1
        if times.observe(t):
            engine.on_watermark(out)

    def close_cursor_after(self, t: int) -> int:
        """Where the close cursor moves when an event at ``t`` is accepted (what
        :func:`~sessionstore.engine.closing.on_watermark` closes up to; at most the current
        one when the watermark does not move)."""
        times = self._engine.times
        config = self._engine.config
        watermark = times.watermark
        if config.watermark == "event_time":
            moved = t - config.max_out_of_orderness_ms
            if moved > watermark:
                watermark = moved
        return watermark - config.grace_ms

    def before_watermark(self, to_ms: int, out: list[Emit]) -> None:
        """Write, before the watermark moves to ``to_ms``, the held keys that move would
        write, when their writes can fail (so that a failure changes nothing; the engine's
        ``advance_watermark`` calls this first)."""
        if self._fallible:
            self.held.write_upto(to_ms - self._engine.config.grace_ms, out, closing=False)

    def process_many(self, keys: list[Any], values: list[Any], times: np.ndarray,
                     ends: np.ndarray, codes: np.ndarray, out: list[Emit],
                     log: ChangeLog | None) -> None:
        """Add a batch of validated events (arrival order) as a loop of :meth:`process` would:
        :meth:`.BatchStep.process_many` (same arguments)."""
        horizon = None
        if self._fallible and len(times):  # first the writes the batch may need
            horizon = self.close_cursor_after(int(times.max()))
            self.held.write_upto(horizon, out, closing=False)  # what its close reaches
            if self.held.full(len(times)):
                self.held.write_all(out)  # the held-events limit (a longer batch than the
                # limit may still write every key between two of its events)
        self._batch.process_many(keys, values, times, ends, codes, out, log, horizon)

    def emit_log(self, log: ChangeLog, out: list[Emit]) -> None:
        """Emit a batch's changes as the write cache would flush them
        (:func:`.max_duration_write.emit_log`)."""
        emit_log(self._engine, log, out)

    def write_upto(self, upto: int, out: list[Emit]) -> None:
        """Write every held key whose bound is at or before ``upto`` (the engine calls this
        before it closes the sessions ending up to ``upto``); emits go to ``out``."""
        self.held.write_upto(upto, out)

    def write_all(self, out: list[Emit], log: ChangeLog | None = None) -> None:
        """Write every held key (before a commit, a flush, at the end of a batch with
        ``ON_WINDOW_UPDATE``); emits go to ``out``, or changes to ``log``."""
        self.held.write_all(out, log)

    def write_key(self, key: Any) -> None:
        """Write ``key`` if it is held (before its sessions are read)."""
        self.held.write_key(key)

    def forget(self) -> None:
        """Drop every held event and every kept order (an abort)."""
        self.held.forget()
        self._orders.clear()
