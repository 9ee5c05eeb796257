"""The event path's common step, fused into one function: the engine's ``process`` for the
lean engine (a fixed gap, no trigger, no maximum duration, no write cache).

:func:`~sessionstore.engine.event.process_event` is a chain of calls (the checks,
``process_lean``, the cache's ``sessions_of`` and ``put_merged``, the close index). A
plain-Python sessionizer does the same work in one loop body; a call, or an attribute read of
an object, costs about as much as a dict operation, and each event made a dozen of them. Here
the whole step is one closure over the objects it touches (the engine's state, its clock and
counters, the cache's methods), built once per engine and rebuilt when the engine replaces
any of them (:func:`~sessionstore.engine.lifecycle.abort`).

It only takes the common case, and takes it exactly as the chain would: an ``int`` or ``str``
key, an ``int`` time in range, no ``gap_ms``, no columnar table, a key whose view the cache
answers from memory (:meth:`~sessionstore.store.caching.CachingSessionStore.held_view`) and an
event that joins at most one session. Everything else (and every case the chain would handle
differently) is handed, before anything changes, to the chain itself: ``process_event`` or
``process_lean``. The write goes through the cache's own rule for a one-session merge,
:meth:`~sessionstore.store.caching.CachingSessionStore.put_joined` (which ``put_merged`` and
``put`` call too), so the cache's bookkeeping exists once. ``tests/engine/test_fast_event.py``
runs this step against the chain, step by step, with every cache size, segment size and
watermark mode; the property tests in ``tests/engine`` run both against an independent oracle.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..aggregations import is_count
from ..timeutil import INT64_MIN
from ..types import Session
from .emit import Emit, make_emit
from .event import process_event
from .merge import join_range
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
    inclusive = cfg.inclusive_gap
    event_time = cfg.watermark == "event_time"
    ooo = cfg.max_out_of_orderness_ms
    updates = engine.updates
    closes_in_cache = engine.closes_in_cache
    check_acc = engine.check_acc
    agg = engine.aggregation
    count = is_count(agg)
    result = agg.result
    held_keys = state.held_keys
    held_view = state.held_view
    put_joined = state.put_joined
    encode_key = state.encode_key
    # count's records, shared: a tuple of scalars made once instead of per event (fewer
    # allocations the collector tracks until its next pass)
    count_records = [plain_record(n) for n in range(_SHARED_COUNTS)]

    def process(key: Any, value: Any, timestamp_ms: Any, gap_ms: Any = None) -> list[Emit]:
        kind = type(key)
        t = timestamp_ms
        if (kind is not int and kind is not str) or type(t) is not int or gap_ms is not None \
                or t > max_t or t < INT64_MIN or engine.table is not None:
            return slow(engine, key, value, timestamp_ms, gap_ms)
        if key not in held_keys:
            encode_key(key)  # a key the cache holds passed this already
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
        closed_before = times.closed_before()
        view = held_view(key, closed_before)
        if view is None:
            out: list[Emit] = []
            lean(key, value, t, out, None)
            return out
        joined: Any = None
        if view:
            floor, latest_start = join_range(t, own_end, closed_before, inclusive)
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
        record = count_records[acc] if count and type(acc) is int and 0 <= acc < _SHARED_COUNTS \
            else plain_record(acc)
        same = entry is not None and joined[0] == start and joined[1] == end
        put_joined(key, view, joined, start, end, record)
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
