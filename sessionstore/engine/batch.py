"""The columnar batch path of :class:`~sessionstore.engine.SessionAggregator`.

:func:`process_batch` takes a batch of events as columns and works on all of them at once:

1. validate the whole batch (keys, times, values that msgpack can store) before any change;
2. compute each event's watermark on arrival, so lateness and "closed before" are exactly what
   an event loop would see;
3. load the open sessions of the batch's keys and hand everything to the merge plan
   (:func:`~sessionstore.engine.planner.plan`), which returns the resulting sessions and
   what each event and each open session went into;
4. aggregate each resulting session (open accumulators merged, events folded in (time, arrival)
   order), and check every new accumulator can be stored — still before any change;
5. write: remove the replaced sessions, put the new ones (the cache writes them in bulk);
6. emit: with ON_WINDOW_UPDATE, what the event path with its write cache flushed at the end
   of the batch emits; with ON_WINDOW_CLOSE, advance the watermark and close, exactly as the
   loop would (the close cursor caps expiry, so the writes of step 5 cannot expire anything
   that is not emitted yet).

With a trigger, events go one at a time through the event path (the exact slower path), after
the same validation.

The built-in aggregations (:func:`~sessionstore.engine.columnar.columnar_parts`) without a
trigger or write cache take the fast path instead (:func:`.fast_batch.fast_batch`): the
engine's open sessions live in a columnar :class:`~sessionstore.engine.columnar.SessionRows`,
and a batch costs array operations, one ``remove_many`` and one ``put_many``. Steps 1-6 are the
same; only how they are computed differs. A batch the fast path cannot take exactly (mixed value types, NaN, an integer
sum beyond int64) takes the path above.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from .. import batch as columns
from .. import keyschema
from ..gap_boundary import is_final
from ..types import Session
from . import planner
from .batch_gaps import count_invalid_gaps, event_gaps
from .columnar import NotColumnar
from .emit import Emit, make_emit
from .fast_batch import collector_paused, fast_batch, part_values_of_list
from .max_duration_state import ChangeLog
from .record import SessionRecord, check_encodable, first_unencodable

if TYPE_CHECKING:
    from .host import EngineHost


def process_batch(engine: EngineHost, keys: Any, values: Any,
                  timestamps_ms: Any, gaps_ms: Any = None) -> list[Emit]:
    """Add a batch of events in arrival order.

    Args:
        keys, values, timestamps_ms: lists, numpy arrays, pandas Series or Arrow arrays of the
            same length; times are int64 milliseconds (or datetimes).
        gaps_ms: each event's gap, with windows whose gap comes with each event
            (``SessionWindows(None, max_gap_ms=...)``): a column like the others of durations
            (ints in engine units, or ``timedelta`` / duration strings in a list) or nulls.
            Required then; refused with a fixed gap or a gap callable (which is called per
            event instead). A null or ``<= 0`` gap drops its event (counted in
            ``dropped-records`` and ``dropped-invalid-gap-records``).

    Returns:
        With ON_WINDOW_CLOSE or a trigger: exactly what a loop of ``process`` emits. With
        ON_WINDOW_UPDATE: what the event path emits with ``write_cache=True`` and a
        :meth:`flush` at the end of the batch (one update per changed session, a retraction per
        delivered session merged away).

    Raises:
        TypeError / ValueError: a bad key, time, gap or value, naming the argument and the
            row (``values[3] cannot be stored ...``, ``gaps_ms[2] = 900 exceeds max_gap_ms =
            600``). A batch is atomic: nothing changes then.
    """
    # Integer key columns and numeric value columns stay arrays: they are factorised and
    # aggregated as they are (every number can be stored), and turned into Python lists only
    # for the paths that take events one by one.
    key_column = columns.as_column(keys, "keys")
    key_array = key_column if _is_flat(key_column, "iu") else None
    key_list = None if key_array is not None else (
        key_column.tolist() if isinstance(key_column, np.ndarray) else list(key_column))
    n = len(key_column) if key_list is None else len(key_list)
    times = columns.timestamps(timestamps_ms, n)
    value_column = columns.as_column(values, "values")
    value_array = value_column if _is_flat(value_column, "iufb") else None
    value_list = None if value_array is not None else (
        value_column.tolist() if isinstance(value_column, np.ndarray) else list(value_column))
    if len(value_column) != n:
        raise ValueError(f"values has {len(value_column)} rows, keys has {n}")
    cfg = engine.config
    cfg.check_times_fit(times, "timestamps_ms")
    codes, uniques, uniques_arrow = columns.factorize_keys_arrow(
        key_list if key_array is None else pa.array(key_array))
    if value_list is not None:
        first_unencodable(value_list, "values")
    gaps = None
    if cfg.dynamic:
        if engine.windows.gap_fn is not None:
            fn_keys = key_column.tolist() if key_list is None else key_list
            fn_values = value_column.tolist() if value_list is None else value_list
            if gaps_ms is not None:
                raise ValueError("gaps_ms given, but the windows compute each event's gap with "
                                 "their gap callable; pass one or the other")
            fn = engine.windows.gap_fn
            raw = [fn(k, v, t) for k, v, t in zip(fn_keys, fn_values, times.tolist(),
                                                  strict=True)]
            gaps = event_gaps(engine, raw, times, "the gap callable's results")
        else:
            if gaps_ms is None:
                raise ValueError("gaps_ms is required: the windows take each event's gap with "
                                 "the event (SessionWindows(None, ...))")
            gaps = event_gaps(engine, gaps_ms, times, "gaps_ms")
    elif gaps_ms is not None:
        raise ValueError(f"gaps_ms given, but the windows have a fixed gap ({cfg.gap_ms} ms); "
                         f"pass gaps_ms only with SessionWindows(None, max_gap_ms=...)")
    out: list[Emit] = []
    if n == 0:
        return out
    kept = None if gaps is None or not gaps.dropped else gaps.kept  # None: every event
    if kept is not None and len(kept) == 0:  # every event has an invalid gap
        count_invalid_gaps(engine, gaps)
        return out
    ends = times + cfg.max_gap_ms if gaps is None else times + gaps.gaps  # max_gap: fixed gap
    if engine.columnar_kinds is not None:
        with collector_paused():
            try:
                part_values = part_values_of_list(
                    engine, value_list if value_array is None else value_array)
                late_values = None  # only the on_late callback reads them
                if engine.on_late is not None:
                    late_values = value_list if value_array is None else value_array.tolist()
                if kept is None:
                    blocks = fast_batch(engine, codes, uniques, uniques_arrow, part_values, times,
                                        late_values, ends)
                else:
                    blocks = fast_batch(engine, codes[kept], uniques, uniques_arrow,
                                        [None if v is None else v[kept] for v in part_values],
                                        times[kept], None if late_values is None
                                        else [late_values[i] for i in kept.tolist()],
                                        ends[kept])
            except NotColumnar:
                pass
            else:
                names = engine.result_names
                for block, flags in blocks:
                    out.extend(block.emits(names, flags))
                count_invalid_gaps(engine, gaps)
                return out
    engine.leave_table()
    if key_list is None:
        key_list = key_column.tolist()
    if value_list is None:
        value_list = value_column.tolist()
    if engine.max_duration is not None:  # issue 12: the event-by-event plan, exactly
        _max_duration_batch(engine, key_list, value_list, times, ends, kept, out, codes)
        count_invalid_gaps(engine, gaps)
        return out
    if engine.runner is not None:
        _precheck_accumulators(engine, key_list, value_list, times)
        step = engine.process_one
        if gaps is None:
            for key, value, t in zip(key_list, value_list, times.tolist(), strict=True):
                step(key, value, t, out)
        else:
            count_invalid_gaps(engine, gaps)
            gap_list = gaps.gaps.tolist()
            for i in gaps.kept.tolist():
                step(key_list[i], value_list[i], int(times[i]), out, gap_list[i])
        return out
    if kept is None:
        _columnar(engine, codes, uniques, value_list, times, out, ends)
    else:
        _columnar(engine, codes[kept], uniques, [value_list[i] for i in kept.tolist()],
                  times[kept], out, ends[kept])
        count_invalid_gaps(engine, gaps)
    if engine.forwarded:
        out.extend(engine.drain_forwarded())
    return out


def _is_flat(column: Any, kinds: str) -> bool:
    """Whether ``column`` is a one-dimensional numpy array of one of the dtype ``kinds``."""
    return isinstance(column, np.ndarray) and column.ndim == 1 and column.dtype.kind in kinds



def _precheck_accumulators(engine: EngineHost, keys: list[Any], values: list[Any],
                           times: np.ndarray) -> None:
    """For the event-by-event path: refuse values whose own accumulator cannot be stored."""
    agg = engine.aggregation
    if agg.acc_always_encodable:
        return
    for row, (key, value, t) in enumerate(zip(keys, values, times.tolist(), strict=True)):
        check_encodable(agg.add(key, value, t, 0, agg.initial()),
                        f"the accumulator of values[{row}]")


def _max_duration_batch(engine: EngineHost, keys: list[Any], values: list[Any],
                        times: np.ndarray, ends: np.ndarray, kept: np.ndarray | None,
                        out: list[Emit], codes: np.ndarray) -> None:
    """A batch with ``max_duration_ms`` (each kept row, with ``kept``; ``ends`` is each row's
    own ``t + gap``, ``codes`` numbers the keys): what the event loop gives, exactly (see
    :mod:`sessionstore.engine.max_duration`). With ON_WINDOW_UPDATE, the changes are emitted
    once at the end, as the write cache flushes them.

    Without a write cache, :meth:`MaxDuration.process_many` cuts each key whose events come
    in order in one pass and re-cuts only the others event by event; with a write cache
    (whose evictions forward changes in the loop's order) it takes every event one by one.
    Either way a failing step undoes the earlier ones: the batch changes nothing.
    """
    planner = engine.max_duration
    assert planner is not None
    _precheck_accumulators(engine, keys, values, times)  # names the row as given
    if kept is not None:
        rows = kept.tolist()
        keys = [keys[i] for i in rows]
        values = [values[i] for i in rows]
        times = times[kept]
        ends = ends[kept]
        codes = codes[kept]
    log: ChangeLog | None = {} if engine.updates and not engine.write_cache else None
    with collector_paused():
        planner.process_many(keys, values, times, ends, codes, out, log)
    if log is not None:
        planner.emit_log(log, out)
    if engine.write_cache:
        engine.cache.flush()
    if engine.forwarded:
        out.extend(engine.drain_forwarded())


def _columnar(engine: EngineHost, codes: np.ndarray, uniques: list[Any],
              values: list[Any], times: np.ndarray, out: list[Emit], ends: np.ndarray) -> None:
    """The exact batch path; ``ends`` is each event's own window end (``t + gap``)."""
    cfg = engine.config
    clock = engine.times
    metrics = engine.metrics
    n = len(times)
    late, closed_before, accepted, seqs = clock.arrive_batch(times, ends)
    m = len(accepted)
    acc_codes = codes[accepted]
    acc_times = times[accepted]
    acc_closed = closed_before[accepted]

    # the open sessions of the batch's keys, as columns
    state = engine.cache
    floor = int(acc_closed[0]) if m else 0
    open_codes: list[int] = []
    open_starts: list[int] = []
    open_ends: list[int] = []
    open_raw: list[Any] = []
    for code in np.unique(acc_codes).tolist():
        for (s, e), cached in state.sessions_of(uniques[code], floor).items():
            open_codes.append(code)
            open_starts.append(s)
            open_ends.append(e)
            open_raw.append(cached[0])
    final = is_final(np.array(open_ends, dtype=np.int64), floor)
    if final.any():  # the view may hold sessions that closed before the batch: drop them
        live = np.flatnonzero(~final).tolist()
        open_codes = [open_codes[j] for j in live]
        open_starts = [open_starts[j] for j in live]
        open_ends = [open_ends[j] for j in live]
        open_raw = [open_raw[j] for j in live]
    planned = planner.plan(
        acc_codes, acc_times, ends[accepted], acc_closed, np.array(open_codes, dtype=np.int64),
        np.array(open_starts, dtype=np.int64), np.array(open_ends, dtype=np.int64),
        cfg.inclusive_gap, keys=len(uniques), by_time=False).plan

    # aggregate every resulting session; nothing has changed yet
    agg = engine.aggregation
    s_codes = planned.session_codes.tolist()
    s_starts = planned.session_starts_ms.tolist()
    s_ends = planned.session_ends_ms.tolist()
    n_sessions = len(s_codes)
    open_into = planned.open_session.tolist()
    members: list[list[int]] = [[] for _ in range(n_sessions)]
    for j in sorted(range(len(open_into)), key=lambda j: (open_ends[j], open_starts[j])):
        if open_into[j] >= 0:
            members[open_into[j]].append(j)
    order = np.lexsort((seqs, acc_times, planned.event_session))
    sorted_sessions = planned.event_session[order]
    cuts = np.flatnonzero(np.diff(sorted_sessions)) + 1
    run_bounds = np.concatenate(([0], cuts, [m])).tolist()
    run_session = sorted_sessions[np.concatenate(([0], cuts))].tolist() if m else []
    rows = accepted[order].tolist()
    row_times = acc_times[order].tolist()
    row_seqs = seqs[order].tolist()
    records: list[SessionRecord | None] = [None] * n_sessions
    for r, k in enumerate(run_session):
        key = uniques[s_codes[k]]
        acc = agg.initial()
        for j in members[k]:
            acc = agg.merge(key, acc, SessionRecord.from_wire(open_raw[j]).acc)
        a, b = run_bounds[r], run_bounds[r + 1]
        run_acc = agg.add_run(key, [values[i] for i in rows[a:b]], row_times[a:b],
                              row_seqs[a:b], agg.initial())
        acc = agg.merge(key, acc, run_acc)
        if engine.check_acc:
            check_encodable(acc, f"the accumulator of session {Session(key, s_starts[k], s_ends[k])}")
        records[k] = SessionRecord(acc)

    # apply: from here on nothing can fail on the batch's content
    metrics.records_in += n
    if m < n:
        for i in np.flatnonzero(late).tolist():
            engine.drop(uniques[codes[i]], values[i], int(times[i]))
    clock.seq += m
    changes: list[tuple[Session, Any, bool]] = []  # (session, value, retraction)
    result = agg.result
    updates = engine.updates and not engine.write_cache
    for j, k in enumerate(open_into):
        if k >= 0 and (open_starts[j], open_ends[j]) != (s_starts[k], s_ends[k]):
            session = Session(uniques[open_codes[j]], open_starts[j], open_ends[j])
            state.remove(session)
            if updates:
                changes.append((session, SessionRecord.from_wire(open_raw[j]).acc, True))
    for k in range(n_sessions):
        record = records[k]
        assert record is not None
        session = Session(uniques[s_codes[k]], s_starts[k], s_ends[k])
        state.put(session, record.to_wire())
        if updates:
            changes.append((session, record.acc, False))
    if engine.updates:
        if engine.write_cache:
            state.flush()
        else:
            session_order = keyschema.session_order
            changes.sort(key=lambda c: session_order(c[0]))
            out.extend(make_emit(s, result(acc), retraction=retraction)
                       for s, acc, retraction in changes)
            metrics.emitted += len(changes)
    else:
        import heapq

        heap = engine.close_heap
        for end in s_ends:
            heapq.heappush(heap, end)
        if engine.record_close_times:
            engine.new_close_times.extend(s_ends)
    if m and clock.observe(int(acc_times.max())):
        engine.on_watermark(out)


# the accumulator kinds whose records pack_session_records can pack (numeric columns)
