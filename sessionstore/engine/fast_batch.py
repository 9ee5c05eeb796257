"""The fast columnar batch step (:func:`fast_batch`): the batch path of the built-in
aggregations without a trigger or write cache.

The engine's open sessions live in a columnar
:class:`~sessionstore.engine.table.OpenSessions` (:meth:`EngineHost.open_table`), and a batch
costs array operations, one ``remove_many`` and one ``put_many``. Its steps are those of the
exact batch path (see :mod:`.batch`); only how they are computed differs. A batch it cannot take
exactly (mixed value types, NaN, an integer sum beyond int64) raises
:class:`~sessionstore.engine.columnar.NotColumnar` before any change, and takes the exact path.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import operator
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from ..packing import PackedValues, pack_session_records
from ..serde import MsgpackSerde
from ..store.base import SegmentedSessionStore
from ..store.keycodec import encode_int_keys
from ..timeutil import INT64_MIN
from . import planner
from .columnar import (
    NUMERIC_KINDS,
    IntKeys,
    NotColumnar,
    SessionRows,
    aggregate_plan,
    needs_time_order,
    normal_key_array,
    numeric_column,
    object_array,
)
from .key_index import KeyIndex

if TYPE_CHECKING:
    from .host import EngineHost

# the accumulator kinds whose records pack_session_records can pack (numeric columns)
PACKABLE_KINDS = ("count", *NUMERIC_KINDS)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
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


def part_values_of_list(engine: EngineHost, values: Any) -> list[Any]:
    """Per aggregation part, the batch's values (a list, or a flat numeric numpy array) as an
    array (None for count).

    Raises:
        NotColumnar: a column the fast path cannot take exactly.
        TypeError: a value that is not a mapping holding a part's column, naming the row.
    """
    out: list[Any] = []
    assert engine.columnar_kinds is not None
    for kind, column in zip(engine.columnar_kinds, engine.columnar_columns, strict=True):
        if kind == "count":
            out.append(None)
            continue
        if isinstance(values, np.ndarray) and (column is not None or kind not in NUMERIC_KINDS):
            values = values.tolist()  # Python values, as the event path would hold them
        items = values if column is None else _items(values, column)
        if kind in NUMERIC_KINDS:
            out.append(numeric_column(items, "values"))
            continue
        if any(map(operator.is_, items, itertools.repeat(None))):
            # a null may be no input at all (Spark's rule, aggspec.SkipNullColumn): only the
            # exact path asks the aggregation what it does with it
            raise NotColumnar(f"a null in the values of the {kind!r} aggregation")
        out.append(object_array(items))
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


def fast_batch(engine: EngineHost, codes: np.ndarray, uniques: Sequence[Any], uniques_arrow: Any,
               part_values: list[Any], times: np.ndarray, late_values: list[Any] | None,
               ends: np.ndarray) -> list[Block]:
    """The columnar batch step. Everything that can fail on the batch's content fails before
    the first change (raising :class:`NotColumnar` sends the batch to the exact path).
    ``uniques`` are the distinct keys the codes index (a list, or :class:`IntKeys` with
    ``uniques_arrow`` their int64 column); ``ends`` is each event's own window end
    (``t + gap``)."""
    cfg = engine.config
    clock = engine.times
    kinds = engine.columnar_kinds
    assert kinds is not None
    n = len(times)
    late, closed_before, accepted, seqs = clock.arrive_batch(times, ends)
    m = len(accepted)
    if m == n:  # no late event (the usual case): the batch's columns as they are
        acc_codes, acc_times, acc_ends, acc_closed = codes, times, ends, closed_before
        acc_values = list(part_values)
    else:
        acc_codes, acc_times = codes[accepted], times[accepted]
        acc_ends, acc_closed = ends[accepted], closed_before[accepted]
        acc_values = [None if v is None else v[accepted] for v in part_values]
    table = engine.open_table()
    table.check(acc_values)
    batch_keys = None if uniques_arrow is None else normal_key_array(uniques_arrow)
    # an int key column's values as they are: the key index takes them without conversion
    key_ints = (batch_keys.to_numpy(zero_copy_only=False)
                if isinstance(batch_keys, pa.Array) and pa.types.is_int64(batch_keys.type)
                and batch_keys.null_count == 0 else None)
    index = table.index
    if isinstance(uniques, IntKeys) and not (isinstance(index, KeyIndex)
                                             and index.ints is not None):
        uniques = uniques.as_list()  # only an int key index takes the ints alone
    # the open sessions of the batch's keys: a probe of the table's key index and lists
    kids = index.lookup(uniques, key_ints)
    cand, cand_codes = table.probe(kids)
    cand_starts = table.starts_ms[cand]
    cand_ends = table.ends_ms[cand]
    # the plan, each session's events and its absorbed open sessions, in one compiled pass
    dense = planner.plan(acc_codes, acc_times, acc_ends, acc_closed, cand_codes, cand_starts,
                         cand_ends, cfg.inclusive_gap, keys=len(uniques),
                         by_time=needs_time_order(kinds, acc_values))
    plan = dense.plan
    open_parts = [part.gather(cand) for part in table.parts]
    new_parts = aggregate_plan(kinds, plan, open_parts, cand_starts, acc_values, acc_times, seqs,
                               dense.events, dense.absorbed)
    new_keys = (pa.array(key_ints[plan.session_codes]) if key_ints is not None  # no copy
                else batch_keys.take(pa.array(plan.session_codes)) if batch_keys is not None
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
               if engine.updates else None)
    removed_starts = cand_starts[touched][moved]
    removed_ends = cand_ends[touched][moved]
    combined = engine.result_names is not None
    packed = (pack_session_records([part.value for part in new.parts], combined=combined)
              if _store_takes_packed(engine, kinds) else None)
    records: Sequence[Any] = new.wire_records(combined=combined) if packed is None else packed

    # apply: from here on nothing can fail on the batch's content
    metrics = engine.metrics
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
    if engine.updates:
        assert removed is not None
        changes = removed.concat(new)
        flags = np.concatenate((np.ones(len(removed), dtype=np.bool_),
                                np.zeros(len(new), dtype=np.bool_)))
        order = changes.store_order()
        blocks.append((changes.take(order), flags[order]))
        metrics.emitted += len(changes)
    elif engine.record_close_times:
        engine.new_close_times.extend(new.ends_ms.tolist())
    # close first (from the table), then write, then let expiry run: the write below is what
    # expires segments, with the cap the close just moved, as the event loop's later puts would
    if m and clock.observe(int(acc_times.max())):
        closed = engine.advance_table()
        if closed is not None and len(closed):
            blocks.append((closed, None))
    state = engine.cache
    store_keys = _store_keys(engine, uniques, key_ints) if len(moved_codes) or len(new) else None
    if len(moved_codes):
        # the batch's keys with an index: each distinct key is encoded once, not per session
        state.remove_many(store_keys, removed_starts, removed_ends, key_index=moved_codes)
    if len(new):
        # sessions that closed inside the batch and lie below the expiry boundary were emitted
        # above; the loop would have written them and expired them by now, so they are not
        # written (a put would only count them as dropped)
        boundary = state.expiry_boundary_ms(int(new.ends_ms.max()))
        live = new.ends_ms >= (INT64_MIN if boundary is None else boundary)
        starts, ends, codes_of_new = new.starts_ms, new.ends_ms, plan.session_codes
        if not live.all():  # (else the columns as they are: the store copies what it keeps)
            records = (records.take(np.flatnonzero(live)) if type(records) is PackedValues
                       else list(itertools.compress(records, live.tolist())))
            starts, ends, codes_of_new = starts[live], ends[live], codes_of_new[live]
        state.put_many(store_keys, starts, ends, records, key_index=codes_of_new)
    return blocks


def _store_keys(engine: EngineHost, uniques: Sequence[Any], key_ints: np.ndarray | None
                ) -> Any:
    """The batch's distinct keys for its two bulk store calls: an int key column's values
    encoded once for both (:class:`~sessionstore.store.keycodec.KeyEncodings`) when the store
    is one of this package's (they take them as they are), else the keys themselves."""
    if key_ints is None or not isinstance(engine.store, SegmentedSessionStore):
        return uniques.as_list() if isinstance(uniques, IntKeys) else uniques
    return encode_int_keys(key_ints, distinct=True)  # the batch's distinct keys


def _store_takes_packed(engine: EngineHost, kinds: list[str]) -> bool:
    """Whether the batch's records can go to the store packed already (see
    :mod:`sessionstore.packing`): numeric accumulators, and a store of this package whose serde
    is msgpack's (its ``put_many`` takes :class:`PackedValues` as they are)."""
    store = engine.store
    return (all(kind in PACKABLE_KINDS for kind in kinds)
            and isinstance(store, SegmentedSessionStore)
            and type(store.value_serde) is MsgpackSerde)
