"""Closing: the watermark's consequences.

When the watermark W moves, every session ending at or before ``W - grace`` closes: with
ON_WINDOW_CLOSE it is emitted (from the columnar table, the cache's end index, or the store),
with a trigger its closing pane fires; then the close cursor and the expiry cap move
(:func:`on_watermark`). With a trigger, sessions whose end W passed fire their ON_TIME pane
(:func:`fire_on_time`).
"""

from __future__ import annotations

import functools
import heapq
from typing import TYPE_CHECKING, Any

from ..gap_boundary import first_open_end
from ..store.caching import ClosedRow
from ..timeutil import check_int64
from ..triggers import PaneTiming
from ..types import Session
from .emit import Emit, make_emit
from .lifecycle import advance_table, cap_expiry
from .record import Phase, SessionRecord, acc_of, as_stored
from .time import close_time_ms, final_latency_ms

if TYPE_CHECKING:
    from .host import EngineHost

_new_session = functools.partial(tuple.__new__, Session)  # Session(k, s, e), without a call
_new_emit = functools.partial(tuple.__new__, Emit)


def advance_watermark(engine: EngineHost, to_ms: Any) -> list[Emit]:
    """Move W forward to ``to_ms`` (never back) and return what that completes or closes.

    Raises:
        ValueError / TypeError: ``to_ms`` is not an int64 time.
    """
    to = check_int64(to_ms, "to_ms")
    out: list[Emit] = []
    if engine.max_duration is not None and to > engine.times.watermark:
        engine.max_duration.before_watermark(to, out)  # a write that may fail: before the move
    if engine.times.advance_to(to):
        on_watermark(engine, out)
    if engine.forwarded:
        out.extend(engine.drain_forwarded())
    return out


def on_watermark(engine: EngineHost, out: list[Emit]) -> None:
    """W moved: close (and emit) what ends at or before ``W - grace``, move the close cursor
    and the expiry cap, and fire the ON_TIME panes that are due."""
    times = engine.times
    w = times.watermark
    close_upto = w - engine.config.grace_ms
    if close_upto > times.last_close:
        if engine.max_duration is not None:  # sessions written lazily that may close
            engine.max_duration.write_upto(close_upto, out)
        if engine.table is not None:
            closed = advance_table(engine)
            if closed is not None:
                out.extend(closed.emits(engine.result_names))
        elif not engine.tracks_close:
            times.last_close = close_upto
        # is_final(first end, close_upto), inline: this runs at every watermark advance
        elif (engine.close_heap and engine.close_heap[0] <= close_upto) \
                or not engine.close_heap_complete or engine.cache.has_ends_upto(close_upto):
            close_up_to(engine, close_upto, out)
        else:
            times.last_close = close_upto
        if not engine.close_heap_complete and times.last_close >= engine.unindexed_until:
            engine.close_heap_complete = True  # every session from before the restart closed
        cap_expiry(engine)
    if engine.runner is not None:
        fire_on_time(engine, w, out)


def close_up_to(engine: EngineHost, upto: int, out: list[Emit]) -> None:
    """Emit every session with ``last_close < end <= upto`` as closed, in end order."""
    heap = engine.close_heap
    while heap and heap[0] <= upto:  # is_final(end, upto), inline: per closed session
        heapq.heappop(heap)
    times = engine.times
    grace = engine.config.grace_ms
    result = engine.aggregation.result
    metrics = engine.metrics
    runner = engine.runner
    if engine.closes_in_cache:
        taken = engine.cache.take_closed_rows(first_open_end(times.last_close), upto)
        if taken is not None:
            emit_taken(engine, taken, out)
            times.last_close = upto
            return
    rows = list(engine.cache.find_sessions(first_open_end(times.last_close), upto))
    if runner is None:
        # the records are decoded (and checked) one by one, the metrics counted once
        w = times.watermark
        latencies = []
        for session, raw in rows:
            out.append(make_emit(session, result(SessionRecord.from_wire(raw).acc)))
            latencies.append(final_latency_ms(w, session.end, grace))
        metrics.emitted += len(rows)
        metrics.record_finals(latencies)
    else:
        for session, raw in rows:
            runner.fire_closing(session, SessionRecord.from_wire(raw), out)
    times.last_close = upto


def emit_taken(engine: EngineHost, taken: list[ClosedRow], out: list[Emit]) -> None:
    """Emit the closed sessions the cache handed from memory (its rows ``(end, key bytes,
    start, key, value, changed)``), with the values a read from the store
    would give (:func:`~sessionstore.engine.record.as_stored`)."""
    if not taken:
        return
    result = engine.aggregation.result
    append = out.append
    new_emit = _new_emit
    new_session = _new_session
    count = engine.is_count
    for row in taken:
        acc = acc_of(row[4])
        if count and type(acc) is int:  # count's result is its accumulator
            append(new_emit((new_session((row[3], row[2], row[0])), acc, None, False,
                             row[0] - 1)))
        else:
            if type(acc) is not int:
                acc = as_stored(acc)
            append(new_emit((new_session((row[3], row[2], row[0])), result(acc), None, False,
                             row[0] - 1)))
    # final_latency_ms of each row, summed inline (this runs at each close of the event path;
    # pinned by tests/engine/test_final_latency.py): the rows are in end order, and when the
    # last has closed (always, closing up to W - grace) each latency is W - (end + grace)
    n = len(taken)
    w = engine.times.watermark
    grace = engine.config.grace_ms
    ends = [row[0] for row in taken]
    if close_time_ms(ends[-1], grace) <= w:
        total = n * w - sum(ends) - n * grace
        top = w - close_time_ms(ends[0], grace)
    else:
        latencies = [final_latency_ms(w, end, grace) for end in ends]
        total = sum(latencies)
        top = max(latencies)
    metrics = engine.metrics
    metrics.emitted += n
    metrics.record_final_sum(n, total, top, ends, w, grace)


def fire_on_time(engine: EngineHost, w: int, out: list[Emit]) -> None:
    """With a trigger: fire the ON_TIME pane of each session still EARLY whose end W passed."""
    times = engine.times
    runner = engine.runner
    assert runner is not None
    low = max(times.last_on_time, times.last_close) + 1
    if w < low:
        return
    if runner.on_time_due(w):
        for session, raw in list(engine.cache.find_sessions(low, w)):
            record = SessionRecord.from_wire(raw)
            if record.phase is Phase.EARLY:
                runner.fire(session, record, PaneTiming.ON_TIME, False, out)
    times.last_on_time = w
