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
trigger or write cache take the fast path instead (:func:`_fast`): the engine's open sessions
live in a columnar :class:`~sessionstore.engine.columnar.SessionRows`, and a batch costs array
operations, one ``remove_many`` and one ``put_many``. Steps 1-6 are the same; only how they are
computed differs. A batch the fast path cannot take exactly (mixed value types, NaN, an integer
sum beyond int64) takes the path above.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import operator
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from .. import batch as columns
from .. import keyschema
from ..packing import PackedValues, pack_session_records
from ..serde import MsgpackSerde
from ..store.base import SegmentedSessionStore
from ..timeutil import INT64_MAX, INT64_MIN, duration_ms
from ..types import Session
from . import planner
from .columnar import (
    NUMERIC_KINDS,
    NotColumnar,
    SessionRows,
    aggregate_plan,
    columnar_parts,
    needs_time_order,
    normal_key_array,
    numeric_column,
    object_array,
)
from .emit import Emit, make_emit
from .max_duration import ChangeLog
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
    if not cfg.dynamic and n and int(times.max()) > cfg.max_timestamp_ms:
        row = int(np.argmax(times > cfg.max_timestamp_ms))
        raise ValueError(
            f"timestamps_ms[{row}] = {int(times[row])}: + gap_ms + grace_ms overflows int64"
        )
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
        _count_invalid_gaps(engine, gaps)
        return out
    ends = times + cfg.max_gap_ms if gaps is None else times + gaps.gaps  # max_gap: fixed gap
    if engine._columnar_kinds is not None:
        with _collector_paused():
            try:
                part_values = _part_values_of_list(
                    engine, value_list if value_array is None else value_array)
                late_values = None  # only the on_late callback reads them
                if engine.on_late is not None:
                    late_values = value_list if value_array is None else value_array.tolist()
                if kept is None:
                    blocks = _fast(engine, codes, uniques, uniques_arrow, part_values, times,
                                   late_values, ends)
                else:
                    blocks = _fast(engine, codes[kept], uniques, uniques_arrow,
                                   [None if v is None else v[kept] for v in part_values],
                                   times[kept], None if late_values is None
                                   else [late_values[i] for i in kept.tolist()], ends[kept])
            except NotColumnar:
                pass
            else:
                names = engine._result_names
                for block, flags in blocks:
                    out.extend(block.emits(names, flags))
                _count_invalid_gaps(engine, gaps)
                return out
    engine._leave_table()
    if key_list is None:
        key_list = key_column.tolist()
    if value_list is None:
        value_list = value_column.tolist()
    if engine._max_duration is not None:  # issue 12: the event-by-event plan, exactly
        _max_duration_batch(engine, key_list, value_list, times, ends, kept, out, codes)
        _count_invalid_gaps(engine, gaps)
        return out
    if engine._runner is not None:
        _precheck_accumulators(engine, key_list, value_list, times)
        step = engine._process_one
        if gaps is None:
            for key, value, t in zip(key_list, value_list, times.tolist(), strict=True):
                step(key, value, t, out)
        else:
            _count_invalid_gaps(engine, gaps)
            gap_list = gaps.gaps.tolist()
            for i in gaps.kept.tolist():
                step(key_list[i], value_list[i], int(times[i]), out, gap_list[i])
        return out
    if kept is None:
        _columnar(engine, codes, uniques, value_list, times, out, ends)
    else:
        _columnar(engine, codes[kept], uniques, [value_list[i] for i in kept.tolist()],
                  times[kept], out, ends[kept])
        _count_invalid_gaps(engine, gaps)
    if engine._forwarded:
        out.extend(engine._drain_forwarded())
    return out


def _is_flat(column: Any, kinds: str) -> bool:
    """Whether ``column`` is a one-dimensional numpy array of one of the dtype ``kinds``."""
    return isinstance(column, np.ndarray) and column.ndim == 1 and column.dtype.kind in kinds


class EventGaps:
    """The validated dynamic gaps of a batch: ``gaps`` (int64, 0 where invalid) and ``kept``
    (the rows whose gap is valid, ascending); the other rows are dropped."""

    __slots__ = ("gaps", "kept", "dropped")

    def __init__(self, gaps: np.ndarray, kept: np.ndarray, n: int) -> None:
        self.gaps = gaps
        self.kept = kept
        self.dropped = n - len(kept)


def event_gaps(engine: EngineHost, values: Any, times: np.ndarray,
               name: str) -> EventGaps:
    """Validate a batch's per-event gaps (vectorised for integer columns).

    A null or ``<= 0`` gap marks its row dropped. Raises (naming ``name``, the row and both
    values) for a gap above ``max_gap_ms``, and for ``t + gap + grace`` beyond int64.

    Raises:
        TypeError: a column that is not integer durations (floats included), naming the row.
        ValueError: as above; a length mismatch.
    """
    n = len(times)
    gaps, valid = _gap_column(values, n, name)
    cfg = engine.config
    valid &= gaps > 0
    over = valid & (gaps > cfg.max_gap_ms)
    if over.any():
        row = int(np.argmax(over))
        raise ValueError(f"{name}[{row}] = {int(gaps[row])} exceeds max_gap_ms = "
                         f"{cfg.max_gap_ms} (event at {int(times[row])})")
    gaps = np.where(valid, gaps, 0)
    # t + gap + grace must fit int64; gap <= max_gap_ms, so INT64_MAX - gap - grace cannot wrap
    overflow = valid & (times > (INT64_MAX - cfg.grace_ms) - gaps)
    if overflow.any():
        row = int(np.argmax(overflow))
        raise ValueError(f"timestamps_ms[{row}] = {int(times[row])}: + {name}[{row}] "
                         f"({int(gaps[row])}) + grace_ms overflows int64")
    kept = np.flatnonzero(valid).astype(np.int64)
    return EventGaps(gaps.astype(np.int64), kept, n)


def _gap_column(values: Any, n: int, name: str) -> tuple[np.ndarray, np.ndarray]:
    """``(gaps, valid)``: int64 gaps (0 where null) and where they are not null."""
    arrow = values
    if isinstance(values, list) or (hasattr(values, "to_numpy")  # lists, pandas Series
                                    and not isinstance(values, np.ndarray | pa.Array
                                                       | pa.ChunkedArray)):
        with contextlib.suppress(pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError,
                                 ValueError):
            arrow = pa.array(values)
    if isinstance(arrow, pa.ChunkedArray):
        arrow = arrow.combine_chunks()
    if isinstance(arrow, pa.Array) and (pa.types.is_integer(arrow.type)
                                        or pa.types.is_null(arrow.type)):
        if len(arrow) != n:
            raise ValueError(f"{name} has {len(arrow)} rows, timestamps_ms has {n}")
        valid = arrow.is_valid().to_numpy(zero_copy_only=False).astype(np.bool_)
        if pa.types.is_null(arrow.type):
            return np.zeros(n, dtype=np.int64), valid
        raw = arrow.fill_null(0).to_numpy(zero_copy_only=False)
        if raw.dtype == np.uint64 and len(raw) and raw.max() > np.iinfo(np.int64).max:
            row = int(np.argmax(raw > np.iinfo(np.int64).max))
            raise ValueError(f"{name}[{row}] = {raw[row]} does not fit in int64")
        return raw.astype(np.int64), valid
    column = columns.as_column(values, name)
    if len(column) != n:
        raise ValueError(f"{name} has {len(column)} rows, timestamps_ms has {n}")
    if isinstance(column, np.ndarray) and column.dtype.kind in "iu" \
            and column.dtype != np.uint64:
        return column.astype(np.int64), np.ones(n, dtype=np.bool_)
    items = column.tolist() if isinstance(column, np.ndarray) else list(column)
    gaps = np.zeros(n, dtype=np.int64)
    valid = np.ones(n, dtype=np.bool_)
    for row, item in enumerate(items):  # durations one by one: the error names the row
        if item is None or _is_missing(item):
            valid[row] = False
        else:
            gaps[row] = duration_ms(item, f"{name}[{row}]")
    return gaps, valid


def _is_missing(item: Any) -> bool:
    """pandas' NA and NaT (a null in a pandas column), without importing pandas. A float NaN
    is not missing: floats are refused, as in the time column."""
    return type(item).__name__ in ("NAType", "NaTType")


def _count_invalid_gaps(engine: EngineHost, gaps: EventGaps | None) -> None:
    """Count the batch's events dropped for an invalid gap (after the batch succeeded)."""
    if gaps is None or not gaps.dropped:
        return
    metrics = engine._metrics
    metrics.records_in += gaps.dropped
    metrics.dropped += gaps.dropped
    metrics.dropped_invalid_gap += gaps.dropped


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
    (whose evictions forward changes in the loop's order) the events go one by one.
    """
    planner = engine._max_duration
    assert planner is not None
    _precheck_accumulators(engine, keys, values, times)  # names the row as given
    if kept is not None:
        rows = kept.tolist()
        keys = [keys[i] for i in rows]
        values = [values[i] for i in rows]
        times = times[kept]
        ends = ends[kept]
        codes = codes[kept]
    log: ChangeLog | None = {} if engine._updates and not engine.write_cache else None
    with _collector_paused():
        if not engine.write_cache:
            planner.process_many(keys, values, times, ends, codes, out, log)
        else:
            step = planner.process
            for key, value, t, end in zip(keys, values, times.tolist(), ends.tolist(),
                                          strict=True):
                step(key, value, t, end, out, log)
    if log is not None:
        planner.emit_log(log, out)
    if engine.write_cache:
        engine._state.flush()
    if engine._forwarded:
        out.extend(engine._drain_forwarded())


def _columnar(engine: EngineHost, codes: np.ndarray, uniques: list[Any],
              values: list[Any], times: np.ndarray, out: list[Emit], ends: np.ndarray) -> None:
    """The exact batch path; ``ends`` is each event's own window end (``t + gap``)."""
    cfg = engine.config
    clock = engine._times
    metrics = engine._metrics
    n = len(times)
    before = clock.watermarks_before(times)
    late = clock.late_in_batch(before, ends)
    closed_before = clock.closed_before_in_batch(before)
    accepted = np.flatnonzero(~late)
    m = len(accepted)
    acc_codes = codes[accepted]
    acc_times = times[accepted]
    acc_closed = closed_before[accepted]
    seqs = clock.seq + 1 + np.arange(m, dtype=np.int64)

    # the open sessions of the batch's keys, as columns
    state = engine._state
    floor = int(acc_closed[0]) if m else 0
    open_codes: list[int] = []
    open_starts: list[int] = []
    open_ends: list[int] = []
    open_raw: list[Any] = []
    for code in np.unique(acc_codes).tolist():
        for (s, e), cached in state.sessions_of(uniques[code], floor).items():
            if e > floor:
                open_codes.append(code)
                open_starts.append(s)
                open_ends.append(e)
                open_raw.append(cached[0])
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
        if engine._check_acc:
            check_encodable(acc, f"the accumulator of session {Session(key, s_starts[k], s_ends[k])}")
        records[k] = SessionRecord(acc)

    # apply: from here on nothing can fail on the batch's content
    metrics.records_in += n
    if m < n:
        for i in np.flatnonzero(late).tolist():
            engine._drop(uniques[codes[i]], values[i], int(times[i]))
    clock.seq += m
    changes: list[tuple[Session, Any, bool]] = []  # (session, value, retraction)
    result = agg.result
    updates = engine._updates and not engine.write_cache
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
    if engine._updates:
        if engine.write_cache:
            state.flush()
        else:
            encode = keyschema.encode_key
            changes.sort(key=lambda c: (c[0].end, encode(c[0].key), c[0].start))
            out.extend(make_emit(s, result(acc), retraction=retraction)
                       for s, acc, retraction in changes)
            metrics.emitted += len(changes)
    else:
        import heapq

        heap = engine._close_heap
        for end in s_ends:
            heapq.heappush(heap, end)
        if engine._record_close_times:
            engine._new_close_times.extend(s_ends)
    if m and clock.observe(int(acc_times.max())):
        engine._on_watermark(out)


# the accumulator kinds whose records pack_session_records can pack (numeric columns)
PACKABLE_KINDS = ("count", *NUMERIC_KINDS)

# -- the fast path ---------------------------------------------------------------------------


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while a batch builds its many small lists and
    tuples (none of them cyclic): each allocation burst otherwise triggers collections that
    traverse the whole heap, which measured as the largest cost of building a batch's emits
    and records. The previous setting is restored, also on error."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()

Block = tuple[SessionRows, "np.ndarray | None"]
"""Rows to emit, in emission order, with their retraction flags (None: none is one)."""


def _part_values_of_list(engine: EngineHost, values: Any) -> list[Any]:
    """Per aggregation part, the batch's values (a list, or a flat numeric numpy array) as an
    array (None for count).

    Raises:
        NotColumnar: a column the fast path cannot take exactly.
        TypeError: a value that is not a mapping holding a part's column, naming the row.
    """
    out: list[Any] = []
    assert engine._columnar_kinds is not None
    for kind, column in zip(engine._columnar_kinds, engine._columnar_columns, strict=True):
        if kind == "count":
            out.append(None)
            continue
        if isinstance(values, np.ndarray) and (column is not None or kind not in NUMERIC_KINDS):
            values = values.tolist()  # Python values, as the event path would hold them
        items = values if column is None else _items(values, column)
        out.append(numeric_column(items, "values") if kind in NUMERIC_KINDS
                   else object_array(items))
    return out


def _items(values: list[Any], column: str) -> list[Any]:
    try:
        return list(map(operator.itemgetter(column), values))
    except (KeyError, TypeError, IndexError):
        for row, value in enumerate(values):
            try:
                value[column]
            except (KeyError, TypeError, IndexError):
                raise TypeError(
                    f"values[{row}] has no item {column!r} (the aggregation reads that column)"
                ) from None
        raise


def _fast(engine: EngineHost, codes: np.ndarray, uniques: list[Any], uniques_arrow: Any,
          part_values: list[Any], times: np.ndarray, late_values: list[Any] | None,
          ends: np.ndarray) -> list[Block]:
    """The columnar batch step. Everything that can fail on the batch's content fails before
    the first change (raising :class:`NotColumnar` sends the batch to the exact path).
    ``ends`` is each event's own window end (``t + gap``)."""
    cfg = engine.config
    clock = engine._times
    kinds = engine._columnar_kinds
    assert kinds is not None
    n = len(times)
    before = clock.watermarks_before(times)
    late = clock.late_in_batch(before, ends)
    closed_before = clock.closed_before_in_batch(before)
    accepted = np.flatnonzero(~late)
    m = len(accepted)
    acc_codes = codes[accepted]
    acc_times = times[accepted]
    seqs = clock.seq + 1 + np.arange(m, dtype=np.int64)
    table = engine._open_table()
    acc_values = [None if v is None else v[accepted] for v in part_values]
    table.check(acc_values)
    batch_keys = None if uniques_arrow is None else normal_key_array(uniques_arrow)
    # an int key column's values as they are: the key index takes them without conversion
    key_ints = (batch_keys.to_numpy(zero_copy_only=False)
                if isinstance(batch_keys, pa.Array) and pa.types.is_int64(batch_keys.type)
                and batch_keys.null_count == 0 else None)
    # the open sessions of the batch's keys: a probe of the table's key index and lists
    kids = table.index.lookup(uniques, key_ints)
    cand, cand_codes = table.probe(kids)
    cand_starts = table.starts_ms[cand]
    cand_ends = table.ends_ms[cand]
    # the plan, each session's events and its absorbed open sessions, in one compiled pass
    dense = planner.plan(acc_codes, acc_times, ends[accepted], closed_before[accepted],
                         cand_codes, cand_starts, cand_ends, cfg.inclusive_gap,
                         keys=len(uniques), by_time=needs_time_order(kinds, acc_values))
    plan = dense.plan
    open_parts = [part.gather(cand) for part in table.parts]
    new_parts = aggregate_plan(kinds, plan, open_parts, cand_starts, acc_values, acc_times, seqs,
                               dense.events, dense.absorbed)
    new_keys = (batch_keys.take(pa.array(plan.session_codes)) if batch_keys is not None
                else object_array(uniques)[plan.session_codes])
    new = SessionRows(new_keys, plan.session_starts_ms, plan.session_ends_ms, new_parts)
    touched = plan.open_session >= 0
    absorbed = cand[touched]
    into = plan.open_session[touched]
    moved = ((cand_starts[touched] != plan.session_starts_ms[into])
             | (cand_ends[touched] != plan.session_ends_ms[into]))
    moved_codes = cand_codes[touched][moved]
    removed = (table.rows(absorbed[moved], batch_keys.take(pa.array(moved_codes))
                          if batch_keys is not None else object_array(uniques)[moved_codes])
               if engine._updates else None)
    removed_starts = cand_starts[touched][moved]
    removed_ends = cand_ends[touched][moved]
    combined = engine._result_names is not None
    packed = (pack_session_records([part.value for part in new.parts], combined=combined)
              if _store_takes_packed(engine, kinds) else None)
    records: list[Any] = new.wire_records(combined=combined) if packed is None else packed

    # apply: from here on nothing can fail on the batch's content
    metrics = engine._metrics
    metrics.records_in += n
    if m < n:
        metrics.dropped += n - m
        if engine.on_late is not None:
            for i in np.flatnonzero(late).tolist():
                engine.on_late(uniques[codes[i]], None if late_values is None
                               else late_values[i], int(times[i]))
    clock.seq += m
    table.remove(absorbed)
    table.insert(uniques, plan.session_codes, kids, new, key_ints)
    blocks: list[Block] = []
    if engine._updates:
        assert removed is not None
        changes = removed.concat(new)
        flags = np.concatenate((np.ones(len(removed), dtype=np.bool_),
                                np.zeros(len(new), dtype=np.bool_)))
        order = changes.store_order()
        blocks.append((changes.take(order), flags[order]))
        metrics.emitted += len(changes)
    elif engine._record_close_times:
        engine._new_close_times.extend(new.ends_ms.tolist())
    # close first (from the table), then write, then let expiry run: the write below is what
    # expires segments, with the cap the close just moved, as the event loop's later puts would
    if m and clock.observe(int(acc_times.max())):
        closed = engine._advance_table()
        if closed is not None and len(closed):
            blocks.append((closed, None))
    state = engine._state
    if len(moved_codes):
        # the batch's keys with an index: each distinct key is encoded once, not per session
        state.remove_many(uniques, removed_starts, removed_ends, key_index=moved_codes)
    if len(new):
        # sessions that closed inside the batch and lie below the expiry boundary were emitted
        # above; the loop would have written them and expired them by now, so they are not
        # written (a put would only count them as dropped)
        boundary = state.expiry_boundary_ms(int(new.ends_ms.max()))
        live = new.ends_ms >= (INT64_MIN if boundary is None else boundary)
        if not live.all():
            picked = list(itertools.compress(records, live.tolist()))
            records = PackedValues(picked) if type(records) is PackedValues else picked
        state.put_many(uniques, new.starts_ms[live], new.ends_ms[live], records,
                       key_index=plan.session_codes[live])
    return blocks


def _store_takes_packed(engine: EngineHost, kinds: list[str]) -> bool:
    """Whether the batch's records can go to the store packed already (see
    :mod:`sessionstore.packing`): numeric accumulators, and a store of this package whose serde
    is msgpack's (its ``put_many`` takes :class:`PackedValues` as they are)."""
    store = engine.store
    return (all(kind in PACKABLE_KINDS for kind in kinds)
            and isinstance(store, SegmentedSessionStore)
            and type(store.value_serde) is MsgpackSerde)



# -- the columnar in/out API -----------------------------------------------------------------

SESSION_START = "session_start_ms"
SESSION_END = "session_end_ms"
#: The update-mode flag column: the same name as in the CLI's output and Spark's (one concept,
#: one name); ``Emit.retraction`` is the same flag on the event path.
RETRACTION = "retracted"


def process_table(engine: EngineHost, table: Any, *, key: str | list[str], time: str,
                  value: str | None = None, gap: str | None = None) -> pa.Table:
    """Add a batch of events given as an Arrow table; return what it emits as an Arrow table.

    See :meth:`SessionAggregator.process_table` for the contract.
    """
    if isinstance(table, pa.RecordBatch):
        table = pa.Table.from_batches([table])
    if not isinstance(table, pa.Table):
        raise TypeError(f"table must be a pyarrow Table or RecordBatch, "
                        f"got {type(table).__name__}")
    key_names = [key] if isinstance(key, str) else key
    if not isinstance(key_names, list) or not key_names \
            or not all(isinstance(k, str) for k in key_names):
        raise TypeError(f"key must be a column name or a non-empty list of names, got {key!r}")
    for name, what in [(k, "key") for k in key_names] + [(time, "time")] + (
            [] if value is None else [(value, "value")]) + (
            [] if gap is None else [(gap, "gap")]):
        if not isinstance(name, str) or name not in table.column_names:
            raise ValueError(f"{what}={name!r} is not a column of the table "
                             f"(columns: {table.column_names})")
    parts = columnar_parts(engine.aggregation) or []
    columns = [column for _, column in parts if column is not None]
    for column in columns:
        if column not in table.column_names:
            raise ValueError(f"the aggregation reads column {column!r}, which the table lacks "
                             f"(columns: {table.column_names})")
    n = table.num_rows
    times = _time_column(table.column(time).combine_chunks(), time)
    cfg = engine.config
    gaps = None
    if cfg.dynamic and engine.windows.gap_fn is None:
        if gap is None:
            raise ValueError("gap=<column> is required: the windows take each event's gap with "
                             "the event (SessionWindows(None, ...))")
        column = table.column(gap)
        if not (pa.types.is_integer(column.type) or pa.types.is_null(column.type)):
            raise TypeError(f"gap column {gap!r} must hold integers in engine units (like the "
                            f"time column), got {column.type}; cast it first")
        gaps = event_gaps(engine, column, times, gap)
    elif gap is not None:
        raise ValueError(f"gap={gap!r} given, but the windows have "
                         + ("a gap callable" if cfg.dynamic else f"a fixed gap ({cfg.gap_ms})")
                         + "; pass gap= only with SessionWindows(None, max_gap_ms=...)")
    elif not cfg.dynamic and n and int(times.max()) > cfg.max_timestamp_ms:
        row = int(np.argmax(times > cfg.max_timestamp_ms))
        raise ValueError(
            f"{time}[{row}] = {int(times[row])}: + gap_ms + grace_ms overflows int64")
    codes, uniques, uniques_arrow = _table_keys(table, key_names)
    names = engine._result_names or [engine.aggregation.name]
    for name in names:
        if name in key_names or name in (SESSION_START, SESSION_END, RETRACTION):
            raise ValueError(f"the output column {name!r} of the aggregation collides with a "
                             f"key or session column; rename it in combine()")
    kinds = engine._columnar_kinds
    if kinds is not None and not (cfg.dynamic and gaps is None):  # a gap callable: per row
        part_values, types = _table_part_values(engine, table, value)
        if part_values is not None:
            if n == 0 or (gaps is not None and len(gaps.kept) == 0):
                _count_invalid_gaps(engine, gaps)
                return _blocks_to_table(engine, [], key_names, table, types)
            with _collector_paused():
                try:
                    late_values = (table.column(value).to_pylist()
                                   if value is not None and engine.on_late is not None
                                   else None)
                    if gaps is None or not gaps.dropped:
                        ends = times + (cfg.max_gap_ms if gaps is None else gaps.gaps)
                        blocks = _fast(engine, codes, uniques, uniques_arrow, part_values,
                                       times, late_values, ends)
                    else:
                        kept = gaps.kept
                        blocks = _fast(
                            engine, codes[kept], uniques, uniques_arrow,
                            [None if v is None else v[kept] for v in part_values],
                            times[kept], None if late_values is None
                            else [late_values[i] for i in kept.tolist()],
                            times[kept] + gaps.gaps[kept])
                except NotColumnar:
                    pass
                else:
                    _count_invalid_gaps(engine, gaps)
                    return _blocks_to_table(engine, blocks, key_names, table, types)
    # the exact slower path: the event values are the ``value`` column, or each row as a dict
    values = table.column(value).to_pylist() if value is not None else table.to_pylist()
    keys_list = [uniques[c] for c in codes.tolist()]
    emits = process_batch(engine, keys_list, values, times,
                          None if gap is None else table.column(gap))
    return _emits_to_table(engine, emits, key_names, table,
                           _output_types(engine, table, value))


def _time_column(column: Any, name: str) -> np.ndarray:
    if not pa.types.is_integer(column.type):
        raise TypeError(f"time column {name!r} must hold integers in engine units (int64 ms), "
                        f"got {column.type}; cast it first")
    if column.null_count:
        row = int(np.argmax(column.is_null().to_numpy(zero_copy_only=False)))
        raise ValueError(f"{name}[{row}] is null: every event needs a time")
    array = column.to_numpy(zero_copy_only=False)
    if array.dtype == np.uint64 and len(array) and array.max() > np.iinfo(np.int64).max:
        row = int(np.argmax(array > np.iinfo(np.int64).max))
        raise ValueError(f"{name}[{row}] = {array[row]} does not fit in int64")
    out: np.ndarray = array.astype(np.int64)
    return out


def _table_keys(table: pa.Table, names: list[str]) -> tuple[np.ndarray, list[Any], Any]:
    if len(names) == 1:
        return columns.factorize_keys_arrow(table.column(names[0]), names[0])
    per_column = [columns.factorize_keys_arrow(table.column(name), name) for name in names]
    stacked = np.stack([codes for codes, _, _ in per_column], axis=1)
    if len(stacked) == 0:
        return np.zeros(0, dtype=np.int64), [], None
    distinct, inverse = np.unique(stacked, axis=0, return_inverse=True)
    lists = [uniques for _, uniques, _ in per_column]
    uniques = [tuple(lists[c][code] for c, code in enumerate(row))
               for row in distinct.tolist()]
    return inverse.reshape(-1).astype(np.int64), uniques, None


def _table_part_values(engine: EngineHost, table: pa.Table, value: str | None
                       ) -> tuple[list[Any] | None, list[Any]]:
    """Per part, its column as an array, and the Arrow type of its output; (None, types) when
    a column cannot take the fast path.

    Raises:
        ValueError: a part reads values but neither it nor ``value=`` names a column; a null.
        TypeError: a value msgpack cannot store, naming the column and the row.
    """
    assert engine._columnar_kinds is not None
    out: list[Any] = []
    types: list[Any] = []
    fast = True
    for kind, column in zip(engine._columnar_kinds, engine._columnar_columns, strict=True):
        if kind == "count":
            out.append(None)
            types.append(pa.int64())
            continue
        name = column if column is not None else value
        if name is None:
            raise ValueError(f"the aggregation {kind!r} reads values: pass value=<column> or "
                             f"build it with column=<name>")
        data = table.column(name).combine_chunks()
        if data.null_count:
            row = int(np.argmax(data.is_null().to_numpy(zero_copy_only=False)))
            raise ValueError(f"{name}[{row}] is null; the aggregation {kind!r} needs a value")
        types.append(_part_output_type(kind, data.type))
        if kind in NUMERIC_KINDS:
            if not (pa.types.is_integer(data.type) or pa.types.is_floating(data.type)):
                fast = False
                out.append(None)
                continue
            try:
                array = numeric_column(data.to_numpy(zero_copy_only=False), name)
            except NotColumnar:
                fast = False
                array = None
            out.append(array)
        else:
            items = data.to_numpy(zero_copy_only=False)
            if items.dtype == object:
                first_unencodable(items.tolist(), name)
            else:
                items = items.astype(object)
            out.append(items)
    return (out if fast else None), types


def _part_output_type(kind: str, data_type: Any) -> Any:
    """The Arrow type of a built-in's output over a column of ``data_type``."""
    if kind == "count":
        return pa.int64()
    if kind in NUMERIC_KINDS and (pa.types.is_integer(data_type)
                                  or pa.types.is_floating(data_type)):
        return pa.float64() if pa.types.is_floating(data_type) else pa.int64()
    return pa.list_(data_type) if kind == "collect" else data_type


def _output_types(engine: EngineHost, table: pa.Table, value: str | None
                  ) -> list[Any] | None:
    """The output types of built-in aggregations over ``table`` (None for custom ones, or a
    part that names no column): what an empty exact-path result is typed as, so that it has
    the fast path's columns."""
    parts = columnar_parts(engine.aggregation)
    if parts is None:
        return None
    types = []
    for kind, column in parts:
        name = column if column is not None else value
        if kind != "count" and (name is None or name not in table.column_names):
            return None
        types.append(_part_output_type(kind, None if kind == "count"
                                       else table.column(name).type))
    return types


def _block_key_arrays(block: SessionRows, names: list[str], table: pa.Table) -> list[pa.Array]:
    """The key columns of a block's rows, in the input table's types: Arrow keys are cast
    (no Python object per row); other keys, or a cast Arrow refuses, go through Python."""
    if len(names) == 1 and isinstance(block.keys, pa.Array):
        wanted = table.column(names[0]).type
        if block.keys.type == wanted:
            return [block.keys]
        with contextlib.suppress(pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return [block.keys.cast(wanted)]
    return _key_arrays(block.key_list(), names, table)


def _key_arrays(keys: list[Any], names: list[str], table: pa.Table) -> list[pa.Array]:
    if len(names) == 1:
        return [pa.array(keys, type=table.column(names[0]).type)]
    split = list(zip(*keys, strict=True)) if keys else [() for _ in names]
    return [pa.array(list(part), type=table.column(name).type)
            for part, name in zip(split, names, strict=True)]


def _output_table(engine: EngineHost, key_arrays: list[pa.Array], names: list[str],
                  starts: Any, ends: Any, flags: Any, results: list[pa.Array]) -> pa.Table:
    arrays = [*key_arrays, pa.array(starts, type=pa.int64()), pa.array(ends, type=pa.int64())]
    fields = [*names, SESSION_START, SESSION_END]
    if engine._updates:
        arrays.append(pa.array(flags, type=pa.bool_()))
        fields.append(RETRACTION)
    arrays += results
    fields += engine._result_names or [engine.aggregation.name]
    return pa.Table.from_arrays(arrays, names=fields)


def _blocks_to_table(engine: EngineHost, blocks: list[Block], names: list[str],
                     table: pa.Table, types: list[Any]) -> pa.Table:
    assert engine._columnar_kinds is not None
    kinds = engine._columnar_kinds
    if not blocks:
        empty = SessionRows.empty(kinds)
        blocks = [(empty, None)]
    pieces = []
    for block, flags in blocks:
        results = []
        for kind, part, arrow_type in zip(kinds, block.parts, types, strict=True):
            if kind == "collect":
                assert part.offsets is not None
                results.append(pa.ListArray.from_arrays(
                    pa.array(part.offsets, type=pa.int32()),
                    pa.array(part.value, type=arrow_type.value_type)))
            else:
                results.append(pa.array(part.value, type=arrow_type))
        pieces.append(_output_table(
            engine, _block_key_arrays(block, names, table), names, block.starts_ms,
            block.ends_ms, np.zeros(len(block), dtype=np.bool_) if flags is None else flags,
            results))
    return pa.concat_tables(pieces)


def emits_as_table(engine: EngineHost, emits: list[Emit], names: list[str],
                   schema: pa.Schema | None) -> pa.Table:
    """``emits`` in :func:`process_table`'s columns: the key column(s) ``names``, the session
    bounds, the update flag (``ON_WINDOW_UPDATE``) and the aggregation outputs. With ``schema``
    (what ``process_table`` returned before, for the same key names) the columns take its
    types, so every table of one run concatenates; without it, they are inferred.

    Raises:
        ValueError: an emitted key that does not fit ``names`` (a tuple of another length).
    """
    if schema is not None:
        return _emits_to_table(engine, emits, names, schema.empty_table()).cast(schema)
    keys = [e.session.key for e in emits]
    if len(names) == 1:
        template = pa.table({names[0]: pa.array(keys)})
    else:
        if any(not isinstance(k, tuple) or len(k) != len(names) for k in keys):
            raise ValueError(f"key={names!r} names {len(names)} columns, but the engine holds "
                             f"keys that are not tuples of {len(names)}")
        split = list(zip(*keys, strict=True)) if keys else [() for _ in names]
        template = pa.table({name: pa.array(list(part))
                             for name, part in zip(names, split, strict=True)})
    return _emits_to_table(engine, emits, names, template)


def _emits_to_table(engine: EngineHost, emits: list[Emit], names: list[str],
                    table: pa.Table, types: list[Any] | None = None) -> pa.Table:
    keys = [e.session.key for e in emits]
    labels = engine._result_names
    if labels is None:
        results = [pa.array([e.value for e in emits])]
    else:
        results = [pa.array([e.value[label] for e in emits]) for label in labels]
    if types is not None:  # an output of nothing but nulls (no rows) takes the built-in's type
        results = [r.cast(t) if pa.types.is_null(r.type) else r
                   for r, t in zip(results, types, strict=True)]
    return _output_table(engine, _key_arrays(keys, names, table), names,
                         [e.session.start for e in emits], [e.session.end for e in emits],
                         [e.retraction for e in emits], results)
