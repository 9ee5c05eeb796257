"""The event path's common step, fused into one function: the engine's ``process`` for the
lean engine (a fixed gap, no trigger, no maximum duration, no write cache).

:func:`~sessionstore.engine.event.process_event` is a chain of calls (the checks,
``process_lean``, the cache's ``sessions_of`` and ``put_merged``, the close index). A
plain-Python sessionizer does the same work in one loop body; a call, or an attribute read of
an object, costs about as much as a dict operation, and each event made a dozen of them. Here
the whole step is one closure over the objects it touches (the engine's state, its clock and
counters, the cache's containers), built once per engine and rebuilt when the engine replaces
any of them (:func:`~sessionstore.engine.lifecycle.abort`).

It only takes the common case, and takes it exactly as the chain would: an ``int`` or ``str``
key, an ``int`` time in range, no ``gap_ms``, no columnar table, a key whose view the cache
holds (or a key it knows the store has nothing for) and an event that joins at most one
session. Everything else (and every case the chain would handle differently) is handed, before
anything changes, to the chain itself: ``process_event`` or ``process_lean``. The property
tests in ``tests/engine`` run both against each other and against an independent oracle with
every cache size, segment size and watermark mode.

The fused step changes the write cache's views in place, through the cache's public
:attr:`~sessionstore.store.caching.CachingSessionStore.event_layout` and as its
:class:`~sessionstore.store.caching.EventLayout` says: a change stays in its view entry,
``(record, NEW | CHANGED)``, with its key in ``changed_keys``; a session whose end only moves
later gets no new end-index entry. The cache's own methods do the rest: a new key's view
(``cached_view``), counting and indexing a new session (``added``), the removal of a session the
store may hold (``drop_stored``) and tracking for ranged flushes (``track_change``). It is
:meth:`~sessionstore.store.caching.CachingSessionStore.sessions_of` and
:meth:`~sessionstore.store.caching.CachingSessionStore.put_merged` for the one-session merge,
without a call in the common step.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..aggregations import is_count
from ..gap_boundary import merge_bounds
from ..store.caching import CHANGED, CLEAN, NEW
from ..timeutil import INT64_MIN
from ..types import Session
from .emit import Emit, make_emit
from .event import process_event
from .record import acc_of, check_encodable, plain_record

if TYPE_CHECKING:
    from .host import EngineHost

_MSGPACK_INT_MIN = -(1 << 63)  # msgpack stores ints in [-2**63, 2**64 - 1]
_MSGPACK_INT_MAX = (1 << 64) - 1

_SHARED_COUNTS = 256

EventStep = Callable[..., list[Emit]]


def bind_event_step(engine: EngineHost) -> EventStep | None:
    """The fused ``process(key, value, timestamp_ms, gap_ms=None)`` of ``engine``, or None when
    the engine is not one it applies to (then ``engine.process`` does everything)."""
    if not engine.fixed_lean or engine.write_cache:
        return None
    state = engine.cache
    if state.max_sessions == 0:
        return None  # write-through: no view is kept, every event reads the store
    slow = process_event
    lean = engine.process_lean
    drop = engine.drop
    on_watermark = engine.on_watermark
    times = engine.times
    metrics = engine.metrics
    close_heap = engine.close_heap
    heappush = heapq.heappush
    cfg = engine.config
    max_t = cfg.max_timestamp_ms
    gap = cfg.max_gap_ms  # the fixed gap
    grace = cfg.grace_ms
    # merge_bounds(t, own_end) is (t + earliest_offset, own_end + latest_offset)
    earliest_offset, latest_offset = merge_bounds(0, 0, cfg.inclusive_gap)
    event_time = cfg.watermark == "event_time"
    ooo = cfg.max_out_of_orderness_ms
    updates = engine.updates
    closes_in_cache = engine.closes_in_cache
    check_acc = engine.check_acc
    agg = engine.aggregation
    count = is_count(agg)
    result = agg.result
    layout = state.event_layout
    views_get = layout.views.get
    changed_keys_add = layout.changed_keys.add
    tracking = layout.tracking
    cached_view = state.cached_view
    key_bytes = state.key_bytes  # keyschema.encode_key, remembered by the cache
    added = state.added
    drop_stored = state.drop_stored
    track_change = state.track_change
    # count's records and new view entries, shared: a tuple of scalars made once instead of
    # per event (fewer allocations the collector tracks until its next pass)
    count_new = [(plain_record(n), NEW) for n in range(_SHARED_COUNTS)]
    count_changed = [(entry[0], CHANGED) for entry in count_new]

    def process(key: Any, value: Any, timestamp_ms: Any, gap_ms: Any = None) -> list[Emit]:
        kind = type(key)
        t = timestamp_ms
        if (kind is not int and kind is not str) or type(t) is not int or gap_ms is not None \
                or t > max_t or t < INT64_MIN or engine.table is not None:
            return slow(engine, key, value, timestamp_ms, gap_ms)
        view = views_get(key)
        if view is None:
            key_bytes(key)  # a key the cache holds passed this already
        vkind = type(value)
        if not ((vkind is int and _MSGPACK_INT_MIN <= value <= _MSGPACK_INT_MAX)
                or value is None or vkind is float or vkind is bool):
            check_encodable(value, "value")  # the scalars above always encode
        own_end = t + gap
        w = times.watermark
        if w >= own_end + grace:  # TimeKeeper.is_late, inlined (the hot path)
            metrics.records_in += 1
            drop(key, value, t)
            return []
        # TimeKeeper.closed_before, inlined: W - grace, never below the close cursor
        closed_before = w - grace
        if closed_before < times.last_close:
            closed_before = times.last_close
        # CachingSessionStore.sessions_of without a store read; the held view inline
        if view is None:
            view = cached_view(key, closed_before)
        else:
            held_floor = view.floor
            if closed_before != held_floor and (closed_before < held_floor or len(view) > 2):
                view = cached_view(key, closed_before)  # forgets, or None: a reload
        if view is None:
            out: list[Emit] = []
            lean(key, value, t, out, None)
            return out
        joined: Any = None
        if view:
            # join_range, inlined: merge_bounds moved to the event, the close-cursor floor
            floor = t + earliest_offset
            if floor <= closed_before:
                floor = closed_before + 1
            latest_start = own_end + latest_offset
            for b in view:
                if b[1] >= floor and b[0] <= latest_start:
                    if joined is not None:  # a merge of several sessions: the full step
                        out = []
                        lean(key, value, t, out, None)
                        return out
                    joined = b
        metrics.records_in += 1
        seq = times.seq + 1
        if joined is None:
            start, end = t, own_end
            acc: Any = 1 if count else agg.add(key, value, t, seq, agg.initial())
            entry: Any = None
        else:
            start, end = joined
            if t < start:
                start = t
            if own_end > end:
                end = own_end
            entry = view[joined]
            old = acc_of(entry[0])
            if not count:
                acc = agg.add(key, value, t, seq, agg.merge(key, agg.initial(), old))
            elif type(old) is int:
                acc = old + 1  # sum((old,)) + 1, as the full step adds
            else:
                acc = sum((old,)) + 1
        if check_acc:
            check_encodable(acc, f"the accumulator of {Session(key, start, end)}")
        times.seq = seq
        shared = count and type(acc) is int and 0 <= acc < _SHARED_COUNTS
        # CachingSessionStore.put_merged of one joined session, by the cache's EventLayout:
        # the view holds the change (NEW or CHANGED)
        if entry is not None and joined[0] == start and joined[1] == end:  # the same session
            same = True
            was = entry[1]
            if shared:
                view[joined] = (count_new if was == NEW else count_changed)[acc]
            else:
                view[joined] = (plain_record(acc), NEW if was == NEW else CHANGED)
            if was == CLEAN:
                changed_keys_add(key)
                if tracking:
                    track_change(key, start, end)
        else:
            same = False
            if entry is not None:
                del view[joined]
                if entry[1] != NEW:  # NEW: never written, nothing to undo downstream
                    drop_stored(key, joined[0], joined[1])
            # the view holds no other session with these bounds: one ending after
            # closed_before would overlap the event's window (it ends at or after own_end and
            # starts at or before t) and have joined it; the others end before own_end. No
            # removal of these bounds is pending either: the session that replaced it would
            # hold the event's window, and have joined it, or have closed (the event is late)
            view[(start, end)] = count_new[acc] if shared else (plain_record(acc), NEW)
            if entry is None or entry[1] == CLEAN:  # else its key is among them already
                changed_keys_add(key)
            if tracking:
                track_change(key, start, end)
            if entry is None:
                added(key, start, end)  # counted, indexed; may write everything
            # else: the new bounds hold the joined session's, which ended after the close
            # cursor: it counts as that one, whose end-index entry lies within them
        out = []
        if updates:
            if entry is not None and not same:
                out.append(make_emit(Session(key, joined[0], joined[1]), result(old),
                                     retraction=True))
                metrics.emitted += 2
            else:
                metrics.emitted += 1
            out.append(make_emit(Session(key, start, end), result(acc)))
        elif not same:
            if not closes_in_cache:
                heappush(close_heap, end)
            if engine.record_close_times:
                engine.new_close_times.append(end)
        if event_time:  # TimeKeeper.observe, inlined
            met = times.max_event_time
            if met is None or t > met:
                times.max_event_time = t
            if t - ooo > times.watermark:
                times.watermark = t - ooo
                on_watermark(out)
        return out

    return process
