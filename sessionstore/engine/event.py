"""The event path: one event at a time (:func:`process_event`, the engine's ``process``).

:func:`process_event` validates the event (key, time, value, the dynamic gap) before anything
changes, then takes the step: :func:`process_one` (a trigger or a maximum duration) or its lean
form :func:`process_lean` (no trigger, no maximum duration: a stored record is only its
accumulator). The fused form of the lean step, for the common case, is in :mod:`.fast_event`.
"""

from __future__ import annotations

import functools
import heapq
from typing import TYPE_CHECKING, Any

from .. import keyschema
from ..timeutil import INT64_MAX, INT64_MIN, duration_ms
from ..timeutil import timestamp_ms as to_timestamp_ms
from ..types import Session
from .emit import Emit, make_emit
from .merge import END_START, join_range, merge_event
from .record import SessionRecord, acc_of, check_encodable, plain_record

if TYPE_CHECKING:
    from .host import EngineHost

_new_session = functools.partial(tuple.__new__, Session)  # Session(k, s, e), without a call
_MSGPACK_INT_MIN = -(1 << 63)  # msgpack stores ints in [-2**63, 2**64 - 1]
_MSGPACK_INT_MAX = (1 << 64) - 1


def process_event(engine: EngineHost, key: Any, value: Any, timestamp_ms: Any,
                  gap_ms: Any = None) -> list[Emit]:
    """Add one event; return what it emits. See :meth:`SessionAggregator.process` for the
    contract (the checks, and what raises)."""
    if engine.fixed_lean and type(timestamp_ms) is int and gap_ms is None \
            and INT64_MIN <= timestamp_ms <= engine.max_timestamp_ms and engine.table is None:
        # the common case, checked as below: a fixed gap, an int time in range
        kind = type(key)
        if not ((kind is str or kind is int) and key in engine.held_keys):
            keyschema.encode_key(key)  # a key the cache holds passed this already
        vkind = type(value)
        if not (value is None or vkind is float or vkind is bool
                or (vkind is int and _MSGPACK_INT_MIN <= value <= _MSGPACK_INT_MAX)):
            check_encodable(value, "value")  # the scalars above always encode
        emits: list[Emit] = []
        process_lean(engine, key, value, timestamp_ms, emits, None)
        if engine.forwarded:
            emits.extend(engine.drain_forwarded())
        return emits
    cfg = engine.config
    t = timestamp_ms if type(timestamp_ms) is int else None
    gap: int | None = None  # the event's own gap; None with a fixed gap
    if not cfg.dynamic:
        if gap_ms is not None:
            raise ValueError(f"gap_ms={gap_ms!r} given, but the windows have a fixed gap "
                             f"({cfg.gap_ms} ms); pass gap_ms only with "
                             f"SessionWindows(None, max_gap_ms=...)")
        if t is None or not INT64_MIN <= t <= cfg.max_timestamp_ms:
            t = check_timestamp(engine, timestamp_ms)
    else:
        if t is None or not INT64_MIN <= t <= INT64_MAX:
            t = to_timestamp_ms(timestamp_ms, "timestamp_ms")
    keyschema.encode_key(key)
    check_encodable(value, "value")
    if cfg.dynamic:  # after the key and value checks: a gap callable sees valid events
        gap = event_gap(engine, key, value, t, gap_ms)
    if engine.table is not None:
        engine.leave_table()
    out: list[Emit] = []
    if gap is None and cfg.dynamic:  # an invalid gap: dropped, as Spark filters it
        # (dropped here, not as late: it does not call on_late nor move the watermark)
        engine.metrics.records_in += 1
        engine.metrics.dropped += 1
        engine.metrics.dropped_invalid_gap += 1
        return out
    process_one(engine, key, value, t, out, gap)
    if engine.forwarded:
        out.extend(engine.drain_forwarded())
    return out


def check_timestamp(engine: EngineHost, value: Any) -> int:
    """``value`` as an event time in ms.

    Raises:
        TypeError / ValueError: not a time; ``t + gap + grace`` overflows int64.
    """
    t = to_timestamp_ms(value, "timestamp_ms")
    if t > engine.config.max_timestamp_ms:
        raise ValueError(f"timestamp_ms {t} + gap_ms + grace_ms overflows int64")
    return t


def event_gap(engine: EngineHost, key: Any, value: Any, t: int, gap_ms: Any) -> int | None:
    """The dynamic gap of one event (None: invalid, the event is dropped).

    Raises:
        ValueError / TypeError: naming the argument (a missing or unexpected ``gap_ms``, a
            gap that is not a duration, above ``max_gap_ms``, or overflowing int64).
    """
    fn = engine.windows.gap_fn
    if fn is not None:
        if gap_ms is not None:
            raise ValueError(f"gap_ms={gap_ms!r} given, but the windows compute each "
                             f"event's gap with their gap callable; pass one or the other")
        raw, name = fn(key, value, t), "the gap callable's result"
    else:
        if gap_ms is None:
            raise ValueError("gap_ms is required: the windows take each event's gap with "
                             "the event (SessionWindows(None, ...))")
        raw, name = gap_ms, "gap_ms"
    if raw is None:
        return None
    gap = raw if type(raw) is int else duration_ms(raw, name)
    if gap <= 0:
        return None
    cfg = engine.config
    if gap > cfg.max_gap_ms:
        raise ValueError(f"{name} = {gap} exceeds max_gap_ms = {cfg.max_gap_ms} "
                         f"(event at timestamp_ms {t})")
    if t > INT64_MAX - gap - cfg.grace_ms:
        raise ValueError(f"timestamp_ms {t} + {name} {gap} + grace_ms overflows int64")
    return gap


def drop(engine: EngineHost, key: Any, value: Any, t: int) -> None:
    """Count a late event as dropped and hand it to ``on_late``."""
    engine.metrics.dropped += 1
    if engine.on_late is not None:
        engine.on_late(key, value, t)


def process_one(engine: EngineHost, key: Any, value: Any, t: int, out: list[Emit],
                gap: int | None = None) -> None:
    """One validated event; ``gap`` is its own gap (None: the fixed gap)."""
    if engine.lean:
        process_lean(engine, key, value, t, out, gap)
        return
    if engine.max_duration is not None:  # issue 12: maximum session duration
        engine.max_duration.process(
            key, value, t, t + (engine.config.max_gap_ms if gap is None else gap), out)
        return
    engine.metrics.records_in += 1
    times = engine.times
    cfg = engine.config
    own_end = t + (cfg.max_gap_ms if gap is None else gap)  # max_gap_ms: the fixed gap
    if times.is_late(own_end):
        drop(engine, key, value, t)
        return
    closed_before = times.closed_before()
    view = engine.cache.sessions_of(key, closed_before)
    start, end, joined = merge_event(view.keys(), t, own_end, closed_before,
                                     cfg.inclusive_gap)
    new = Session(key, start, end)
    records = [SessionRecord.from_wire(view[b][0]) for b in joined]
    same = len(joined) == 1 and joined[0] == (start, end)
    agg = engine.aggregation
    seq = times.seq + 1
    runner = engine.runner
    if runner is not None and same:
        record = runner.on_element(records[0], agg.add(key, value, t, seq, records[0].acc))
    else:
        acc = agg.initial()
        for rec in records:
            acc = agg.merge(key, acc, rec.acc)
        acc = agg.add(key, value, t, seq, acc)
        record = (SessionRecord(acc) if runner is None
                  else runner.on_merge(records, acc, end))
    if engine.check_acc:
        check_encodable(record.acc, f"the accumulator of {new}")
    times.seq = seq
    state = engine.cache
    for b in joined:
        if b != (start, end):
            state.remove(Session(key, b[0], b[1]))
    state.put(new, record.to_wire())
    if engine.updates:
        if not engine.write_cache:
            result = agg.result
            for b, rec in zip(joined, records, strict=True):
                if b != (start, end):
                    out.append(make_emit(Session(key, b[0], b[1]), result(rec.acc),
                                         retraction=True))
            out.append(make_emit(new, result(record.acc)))
            engine.metrics.emitted += len(joined) + 1 - same
    else:
        if not same:
            heapq.heappush(engine.close_heap, end)
            if engine.record_close_times:
                engine.new_close_times.append(end)
        if runner is not None:
            runner.after_update(new, record,
                                records[0].pt_target_ms if same else None, same, out)
    if times.observe(t):
        engine.on_watermark(out)


def process_lean(engine: EngineHost, key: Any, value: Any, t: int, out: list[Emit],
                 gap: int | None) -> None:
    """:func:`process_one` without a trigger or maximum duration: the same steps, with
    the accumulator stored as the plain record ``[acc, 0, 0, 0, None]`` and the one-session
    merge (most events) inlined. The outcome is that of :func:`merge_event` and
    ``initial / merge / add`` in the same order, so any aggregation may take it."""
    engine.metrics.records_in += 1
    times = engine.times
    own_end = t + (engine.max_gap_ms if gap is None else gap)  # max_gap_ms: the fixed gap
    w = times.watermark
    grace = engine.grace_ms
    if w >= own_end + grace:  # TimeKeeper.is_late, inlined (the hot path)
        drop(engine, key, value, t)
        return
    closed_before = times.closed_before()
    state = engine.cache
    view = state.sessions_of(key, closed_before)
    if view:
        floor, latest_start = join_range(t, own_end, closed_before, engine.inclusive_gap)
        joined: Any = []  # a loop: a comprehension is a call, and views hold 1-2 sessions
        for b in view:
            if b[1] >= floor and b[0] <= latest_start:
                joined.append(b)
    else:
        joined = ()
    seq = times.seq + 1
    start, end = t, own_end
    accs: Any = ()
    if not joined:
        if engine.is_count:
            acc: Any = 1
        else:
            agg = engine.aggregation
            acc = agg.add(key, value, t, seq, agg.initial())
    else:
        if len(joined) > 1:
            joined.sort(key=END_START)
        accs = []
        for b in joined:
            s, e = b
            if s < start:
                start = s
            if e > end:
                end = e
            accs.append(acc_of(view[b][0]))
        if engine.is_count:
            acc = sum(accs) + 1
        else:
            agg = engine.aggregation
            acc = agg.initial()
            for old in accs:
                acc = agg.merge(key, acc, old)
            acc = agg.add(key, value, t, seq, acc)
    if engine.check_acc:
        check_encodable(acc, f"the accumulator of {Session(key, start, end)}")
    times.seq = seq
    same = len(joined) == 1 and joined[0] == (start, end)
    # plain tuples: msgpack stores the record tuple as the record list, and the garbage
    # collector stops tracking both (a list, or a Session, would stay tracked while cached)
    state.put_merged(key, view, joined, (key, start, end), plain_record(acc))
    if engine.updates:
        if not engine.write_cache:
            new = _new_session((key, start, end))
            result = engine.aggregation.result
            for b, old in zip(joined, accs, strict=True):
                if b != (start, end):
                    out.append(make_emit(Session(key, b[0], b[1]), result(old),
                                         retraction=True))
            out.append(make_emit(new, result(acc)))
            engine.metrics.emitted += len(joined) + 1 - same
    elif not same:
        if not engine.closes_in_cache:
            heapq.heappush(engine.close_heap, end)
        if engine.record_close_times:
            engine.new_close_times.append(end)
    if engine.event_time:  # TimeKeeper.observe, inlined
        met = times.max_event_time
        if met is None or t > met:
            times.max_event_time = t
        ooo = engine.max_out_of_orderness_ms
        if t - ooo > times.watermark:
            times.watermark = t - ooo
            engine.on_watermark(out)
