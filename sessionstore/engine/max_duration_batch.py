"""The batch step of the maximum-duration engine (:meth:`BatchStep.process_many`; see "The batch
path" in :mod:`sessionstore.engine.max_duration`): a key whose events came in time order after
its open events is cut in one pass (:meth:`BatchStep._in_order`), so is a disordered key of an
aggregation with user functions (:meth:`BatchStep._replay`, whatever the emission); every other
key's events take the event step, in arrival order, as one change (undone if one fails:
:mod:`.max_duration_undo`)."""

from __future__ import annotations

import heapq
import operator
from typing import Any

import numpy as np
from sortedcontainers import SortedKeyList

from ..gap_boundary import reaches, within_max_duration
from ..types import Session
from .cuts import cut, scan_on
from .emit import Emit
from .max_duration_held import HeldKeys
from .max_duration_order import OpenOrders
from .max_duration_state import (
    ChangeLog,
    DurationState,
    fold_events,
    own_window_end,
    own_window_ends,
    stored_events,
)
from .max_duration_step import EventStep
from .max_duration_undo import BatchUndo
from .record import acc_of, check_encodable, record_with_events

_TIME_ARRIVAL = operator.itemgetter(0, 1)
"""An event's (time, arrival number): its place among a key's events."""


class BatchStep:
    """The batch step (with a write cache, whose evictions forward changes in the loop's
    order, every event takes the event step).

    Args:
        state: the shared state of the maximum-duration step.
        orders: the open-session orders (a key the batch writes is read again at its next
            step).
        held: the held keys: a key held before the batch takes the event step.
        event: the event step, for the keys that are not cut in one pass.
    """

    __slots__ = ("_state", "_engine", "_md", "_lazy", "_incremental", "_orders", "_held_keys",
                 "_event")

    def __init__(self, state: DurationState, orders: OpenOrders, held: HeldKeys,
                 event: EventStep) -> None:
        self._state = state
        self._engine = state.engine
        self._md = state.max_duration_ms
        self._lazy = state.lazy
        self._incremental = state.incremental
        self._orders = orders
        self._held_keys = held
        self._event = event

    def process_many(self, keys: list[Any], values: list[Any], times: np.ndarray,
                     ends: np.ndarray, codes: np.ndarray, out: list[Emit],
                     log: ChangeLog | None, horizon: int | None) -> None:
        """Add a batch of validated events (arrival order) as a loop of
        :meth:`.MaxDuration.process` would.

        Args:
            keys, values, times: the events; ``codes`` numbers their keys (equal keys, equal
                codes); ``ends`` is each event's own ``t + gap``.
            out: the emits of closing (and the caller emits ``log``).
            log: with ``ON_WINDOW_UPDATE``, the batch's changes (see
                :func:`~sessionstore.engine.max_duration_write.emit_log`).
            horizon: with an aggregation whose held writes can fail, the close cursor the
                batch moves to (the caller wrote what it reaches first): no key is held with a
                bound at or before it (:meth:`.HeldKeys.hold`); None otherwise.

        Lateness, each event's "closed before" and its arrival number are those the loop
        would see (the watermark before each event is a running maximum). A key whose
        accepted events come in time order, none before the last event of its open sessions,
        is cut in one pass (:meth:`_in_order`), as the loop's in-order step would, one event
        after the other; so is a disordered key of an aggregation with user functions
        (:meth:`_replay`); every other key's events take the event step, in arrival order,
        which holds them (:meth:`.HeldKeys.hold`), as one change (:meth:`_step_all`: a
        failing step undoes the earlier ones, so the batch changes nothing). With a write
        cache every event takes the event step, in arrival order (its evictions forward
        changes in the loop's order), also as one change. With ``ON_WINDOW_UPDATE`` every
        held key is written at the end. Closing runs once, after every write, as in the
        columnar batch path.
        """
        engine = self._engine
        clock = engine.times
        md = self._md
        n = len(times)
        if n == 0:
            return
        own = own_window_ends(times, ends, md)
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
        # a disordered key is held (written once, lazily) by the step when its accumulator is
        # a built-in one (a batch holds keys with either emission); a user function's is
        # replayed in one pass (it folds from the events, so its accumulators do not depend on
        # the order of the adds), which folds before the batch changes anything: with
        # ON_WINDOW_UPDATE a failing held write at the batch's end would follow its changes,
        # and with ON_WINDOW_CLOSE the step holds no event whose key's bound the batch's own
        # close reaches, so a long session's events would each be re-cut (issue 25)
        lazy = self._lazy or log is not None
        held_keys = lazy and self._incremental
        pending = self._held_keys.by_key
        # with a write cache every event takes the event step, in arrival order: the cache
        # then reads, evicts and forwards as under a loop of process
        for g in range(0 if engine.write_cache else len(starts)):
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
        if engine.write_cache:
            fallback = list(range(m))
        # apply: the keys that need re-cutting, one event at a time (a failing step undoes
        # them all: the batch changes nothing), then the late events and the in-order keys
        if fallback:
            self._step_all(keys, values, time_list, end_list, cb_list, accepted.tolist(),
                           sorted(fallback), seq0, lazy, out, log, horizon)
        metrics = engine.metrics
        metrics.records_in += n
        if m < n:
            for i in np.flatnonzero(late).tolist():
                engine.drop(keys[i], values[i], time_list[i])
        clock.seq += m
        for key, plan in plans:
            self._apply_in_order(key, plan, log)
        if log is not None and pending:
            self._held_keys.write_all(out, log)  # the log is "before the batch, and now"
        if m and clock.observe(int(acc_times.max())):
            engine.on_watermark(out)

    def _step_all(self, keys: list[Any], values: list[Any], times: list[int], ends: list[int],
                  closed_before: list[int], rows: list[int], fallback: list[int], seq0: int,
                  lazy: bool, out: list[Emit], log: ChangeLog | None, horizon: int | None
                  ) -> None:
        """Take the event step for each of ``fallback`` (arrival indexes among the accepted
        events, ascending; ``rows`` maps them to batch rows), as one change: when a step
        raises (a value check of the aggregation, an accumulator the store cannot encode, the
        store), :class:`.BatchUndo` puts back what the earlier ones changed before the error
        goes on, so the batch changes nothing (its watermark, arrival counter and counters
        move only after this returns; with a write cache, what it forwards is delivered only
        after this returns)."""
        undo = BatchUndo(self._state, self._orders, self._held_keys, self._event,
                         min(closed_before))
        held = self._held_keys
        step = self._event.step
        touch = undo.touch
        # with a write cache, a key is first read with its first event's "closed before", as
        # the loop's step reads it: a lower floor would load more sessions, and the cache
        # would evict (and forward) at other points
        own_floor = self._engine.write_cache
        try:
            if held.full(len(fallback)):
                undo.touch_held()  # a step may write every held key
            for p in fallback:
                i = rows[p]
                key = keys[i]
                cb = closed_before[i]
                touch(key, cb if own_floor else None)
                step(key, values[i], times[i], ends[i], cb, cb if horizon is None else horizon,
                     out, log, seq0 + p, lazy)
        except BaseException:
            undo.undo()
            raise
        undo.done()

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
          closes, for aggregations that are folded from their events (user functions), whose
          accumulators do not depend on the order of the adds.

        Returns the changed sessions, ``[start, end, max_end, events, acc, old bounds or None,
        old acc, changed]``, and the ends to index for closing (in time order, each end a step
        gave a fresh session, as the loop indexes them; otherwise the final ones).
        """
        engine = self._engine
        agg = engine.aggregation
        md = self._md
        inclusive = engine.config.inclusive_gap
        incremental = self._incremental
        # the first arrival's "closed before" (it grows with arrival: the smallest)
        cb0 = min(closed_before[row] for row in rows) if disordered else closed_before[rows[0]]
        view = engine.cache.sessions_of(key, cb0)
        cur: list[Any] | None = None
        open_events: list[Any] = []
        if view:
            # not is_final(end, cb0), inline: per session (max-duration tests)
            open_bounds = [bb for bb in view if bb[1] > cb0]
            if open_bounds:
                last = max(open_bounds)
                raw = view[last][0]
                open_events, max_end = stored_events(raw, key, last)
                if times[rows[0]] < open_events[-1][0]:
                    return None
                cur = [last[0], last[1], max_end, open_events, acc_of(raw), last, acc_of(raw),
                       False]
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
            # not is_final(cur end, closed_before[row]), inline: per event (max-duration tests)
            if cur is not None and cur[1] > closed_before[row] \
                    and within_max_duration(t, cur[0], md) and reaches(cur[2], t, inclusive):
                if not cur[7]:  # first change: own copies, the stored record stays as it was
                    cur[3] = list(cur[3])
                    if incremental:
                        cur[4] = agg.merge(key, agg.initial(), cur[4])
                    cur[7] = True
                cur[3].append([t, seq, own_end, value])
                if own_end > cur[2]:
                    cur[2] = own_end
                    cap = cur[0] + md  # own_window_end(cur[0], own_end, md), inline: per event
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
                session[4] = fold_events(agg, key, session[3])
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
        the order of the adds (the caller checks).

        The open events are a sorted list of blocks (``SortedKeyList`` on (time, arrival)): an
        insertion or a position costs O(log n), not the O(n) list moves of inserting into one
        list (a newest-first key inserts every event at the front), so the replay is
        O(n log n) in the key's events."""
        agg = self._engine.aggregation
        md = self._md
        inclusive = self._engine.config.inclusive_gap
        incremental = self._incremental
        batch = [[times[row], seq, ends[row], values[row]]
                 for row, seq in zip(rows, seqs, strict=True)]
        by_arrival = sorted(range(len(rows)), key=seqs.__getitem__)
        # the open events, in (time, arrival) order (arrival numbers are unique)
        pending = SortedKeyList(open_events, key=_TIME_ARRIVAL)
        final: list[tuple[int, int, int, list[Any]]] = []
        # the first session of the cut of pending, while known: [start, run, limit, stop]
        head: list[int] | None = None
        for i in by_arrival:
            cb = closed_before[rows[i]]
            while pending and pending[0][0] < cb:  # a session ending <= cb holds only t < cb
                if head is None:
                    first = pending[0]
                    head = [first[0], first[2], first[0] + md, 1]
                    scan_on(pending, head, md, inclusive)
                start, run, limit, stop = head
                end = run if run < limit else limit
                if end > cb:  # not is_final(end, cb), inline: per arrival (max-duration tests)
                    break
                final.append((start, end, run, pending[:stop]))
                del pending[:stop]
                head = None
            event = batch[i]
            pending.add(event)  # after the equal times: it arrived last
            if head is not None:
                pos = pending.bisect_key_left(_TIME_ARRIVAL(event))
                if pos == 0:
                    head = None  # a new first event: scan again
                elif pos <= head[3]:
                    if pos < head[3]:  # between two of its events: it joins the session
                        head[3] += 1
                        if event[2] > head[1]:
                            head[1] = event[2]
                    scan_on(pending, head, md, inclusive)  # a longer run may take more
        low = 0
        rest = list(pending)
        for start, end, max_end, stop in cut(rest, md, inclusive):
            final.append((start, end, max_end, rest[low:stop]))
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
        # the work, as a re-cut counts it: each event placed once, each session written
        state = self._state
        state.recut_steps += len(batch) + len(done)
        state.recut_events += sum(len(session[3]) for session in done)
        return done, fresh

    def _apply_in_order(self, key: Any, plan: list[Any], log: ChangeLog | None) -> None:
        """Write (and log or index for closing) what :meth:`_in_order` computed."""
        engine = self._engine
        state = engine.cache
        done, fresh = plan
        self._orders.forget(key)  # read again from the view at the key's next step
        for start, end, max_end, events, acc, old, old_acc, _ in done:
            if old is not None and old != (start, end):
                state.remove(Session(key, old[0], old[1]))
                if log is not None:
                    log[Session(key, old[0], old[1])] = [old_acc, None]
            state.put(Session(key, start, end), record_with_events(acc, events, max_end))
            if log is not None:
                log[Session(key, start, end)] = [old_acc if old == (start, end) else None, acc]
        if engine.updates:
            return
        heap = engine.close_heap
        for end in fresh:
            heapq.heappush(heap, end)
        if engine.record_close_times:
            engine.new_close_times.extend(fresh)
