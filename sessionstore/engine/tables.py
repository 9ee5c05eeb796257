"""The table-shaped API of :class:`~sessionstore.engine.SessionAggregator`: events in as
Arrow columns, emits out as Arrow columns (:func:`process_table`, and the watermark and flush
in the same columns).

The built-in aggregations take the fast columnar step (:func:`.fast_batch.fast_batch`) and
build no Python object per session; everything else goes through :func:`.batch.process_batch`
and its emits are turned into columns.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from .. import batch as columns
from ..arrays import factorize
from .batch import process_batch
from .batch_gaps import count_invalid_gaps, event_gaps
from .closing import advance_watermark
from .columnar import (
    NUMERIC_KINDS,
    IntKeys,
    NotColumnar,
    SessionRows,
    columnar_parts,
    numeric_column,
)
from .emit import Emit
from .fast_batch import Block, collector_paused, fast_batch
from .record import first_unencodable

if TYPE_CHECKING:
    from .host import EngineHost

SESSION_START = "session_start_ms"
SESSION_END = "session_end_ms"
#: The update-mode flag column: the same name as in the CLI's output and Spark's (one concept,
#: one name); ``Emit.retraction`` is the same flag on the event path.
RETRACTION = "retracted"


def process_table(engine: EngineHost, table: Any, *, key: str | list[str], time: str,
                  value: str | None = None, gap: str | None = None) -> pa.Table:
    """Add a batch of events given as an Arrow table; return what it emits as an Arrow table,
    and remember its key names and output schema for :func:`table_shape`.

    See :meth:`SessionAggregator.process_table` for the contract.
    """
    if engine.runner is not None:
        raise TypeError("process_table does not emit panes: with trigger=, use "
                        "process_batch")
    out = _process_table(engine, table, key=key, time=time, value=value, gap=gap)
    engine.table_columns = ([key] if isinstance(key, str) else list(key), out.schema)
    return out


def advance_watermark_table(engine: EngineHost, to_ms: Any,
                            key: str | list[str] | None) -> pa.Table:
    """:func:`~.closing.advance_watermark` in :func:`process_table`'s columns (see
    :meth:`SessionAggregator.advance_watermark_table` for the contract)."""
    names, schema = table_shape(engine, key)
    return emits_as_table(engine, advance_watermark(engine, to_ms), names, schema)


def flush_table(engine: EngineHost, key: str | list[str] | None) -> pa.Table:
    """The write cache's flush in :func:`process_table`'s columns (see
    :meth:`SessionAggregator.flush_table` for the contract)."""
    names, schema = table_shape(engine, key)
    return emits_as_table(engine, engine.flush(), names, schema)


def table_shape(engine: EngineHost, key: str | list[str] | None
                ) -> tuple[list[str], pa.Schema | None]:
    """The key names and output schema of a table method: ``key``'s names (with the schema of
    the last :func:`process_table` call when it had the same names), or the last call's.

    Raises:
        TypeError: a trigger is configured; a ``key`` that is not a name or list of names.
        ValueError: no ``key`` and no earlier :func:`process_table` call.
    """
    if engine.runner is not None:
        raise TypeError("the table methods do not emit panes: with trigger=, use "
                        "advance_watermark and flush")
    known = engine.table_columns
    if key is None:
        if known is None:
            raise ValueError("key= is required before the first process_table call: the "
                             "table's key column names come from it")
        return known[0], known[1]
    names = [key] if isinstance(key, str) else list(key)
    if not names or not all(isinstance(n, str) for n in names):
        raise TypeError(f"key must be a column name or a non-empty list of names, "
                        f"got {key!r}")
    return names, known[1] if known is not None and known[0] == names else None


def _process_table(engine: EngineHost, table: Any, *, key: str | list[str], time: str,
                   value: str | None = None, gap: str | None = None) -> pa.Table:
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
    else:
        cfg.check_times_fit(times, time)
    codes, uniques, uniques_arrow = _table_keys(table, key_names)
    names = engine.result_names or [engine.aggregation.name]
    for name in names:
        if name in key_names or name in (SESSION_START, SESSION_END, RETRACTION):
            raise ValueError(f"the output column {name!r} of the aggregation collides with a "
                             f"key or session column; rename it in combine()")
    kinds = engine.columnar_kinds
    if kinds is not None and not (cfg.dynamic and gaps is None):  # a gap callable: per row
        part_values, types = _table_part_values(engine, table, value)
        if part_values is not None:
            if n == 0 or (gaps is not None and len(gaps.kept) == 0):
                count_invalid_gaps(engine, gaps)
                return _blocks_to_table(engine, [], key_names, table, types)
            with collector_paused():
                try:
                    late_values = (table.column(value).to_pylist()
                                   if value is not None and engine.on_late is not None
                                   else None)
                    if gaps is None or not gaps.dropped:
                        ends = times + (cfg.max_gap_ms if gaps is None else gaps.gaps)
                        blocks = fast_batch(engine, codes, uniques, uniques_arrow, part_values,
                                            times, late_values, ends)
                    else:
                        kept = gaps.kept
                        blocks = fast_batch(
                            engine, codes[kept], uniques, uniques_arrow,
                            [None if v is None else v[kept] for v in part_values],
                            times[kept], None if late_values is None
                            else [late_values[i] for i in kept.tolist()],
                            times[kept] + gaps.gaps[kept])
                except NotColumnar:
                    pass
                else:
                    count_invalid_gaps(engine, gaps)
                    return _blocks_to_table(engine, blocks, key_names, table, types)
    # the exact slower path: the event values are the ``value`` column, or each row as a dict
    values = table.column(value).to_pylist() if value is not None else table.to_pylist()
    distinct = list(uniques)
    keys_list = [distinct[c] for c in codes.tolist()]
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


def _table_keys(table: pa.Table, names: list[str]) -> tuple[np.ndarray, Sequence[Any], Any]:
    if len(names) == 1:
        column = table.column(names[0])
        if pa.types.is_int64(column.type) and column.null_count == 0:
            # what factorize_keys_arrow gives (Arrow's dictionary_encode), hashed in one
            # compiled pass over the values, 3x faster
            values = (column.combine_chunks() if isinstance(column, pa.ChunkedArray)
                      else column).to_numpy(zero_copy_only=False)
            codes, distinct_ints = factorize(np.ascontiguousarray(values, dtype=np.int64))
            return codes, IntKeys(distinct_ints), pa.array(distinct_ints, type=pa.int64())
        return columns.factorize_keys_arrow(column, names[0])
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
    assert engine.columnar_kinds is not None
    out: list[Any] = []
    types: list[Any] = []
    fast = True
    for kind, column in zip(engine.columnar_kinds, engine.columnar_columns, strict=True):
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


def _key_kind(data_type: Any) -> type | None:
    """The Python type an Arrow key column holds (``str``, ``bytes`` or ``int``), or None."""
    if pa.types.is_dictionary(data_type):
        data_type = data_type.value_type
    if pa.types.is_string(data_type) or pa.types.is_large_string(data_type):
        return str
    if (pa.types.is_binary(data_type) or pa.types.is_large_binary(data_type)
            or pa.types.is_fixed_size_binary(data_type)):
        return bytes
    if pa.types.is_integer(data_type):
        return int
    return None


def _block_key_arrays(block: SessionRows, names: list[str], table: pa.Table) -> list[pa.Array]:
    """The key columns of a block's rows, in the input table's types: Arrow keys of the same
    kind are cast (no Python object per row); other keys, or a cast Arrow refuses, go through
    Python. Arrow would also cast ints or bytes to strings: a key is never changed that way."""
    if len(names) == 1 and isinstance(block.keys, pa.Array):
        wanted = table.column(names[0]).type
        if block.keys.type == wanted:
            return [block.keys]
        if _key_kind(block.keys.type) is _key_kind(wanted):
            with contextlib.suppress(pa.ArrowInvalid, pa.ArrowNotImplementedError):
                return [block.keys.cast(wanted)]
    return _key_arrays(block.key_list(), names, table)


def _key_column(keys: Sequence[Any], name: str, data_type: Any) -> pa.Array:
    """One key column of emitted keys, in ``data_type``.

    Raises:
        TypeError: a key that is not of the column's kind (an engine fed keys of another type
            through ``process``/``process_batch``): Arrow would turn bytes into text and text
            into bytes, and the row would name another key.
    """
    kind = _key_kind(data_type)
    if kind is not None and set(map(type, keys)) - {kind}:  # (map and set: no Python loop)
        key = next(k for k in keys if type(k) is not kind)
        raise TypeError(
            f"key column {name!r} is {data_type}, but the engine emits a session of key "
            f"{key!r} ({type(key).__name__}); give process_table the key types the engine "
            f"holds, or use process_batch")
    return pa.array(list(keys), type=data_type)


def _key_arrays(keys: list[Any], names: list[str], table: pa.Table) -> list[pa.Array]:
    if len(names) == 1:
        return [_key_column(keys, names[0], table.column(names[0]).type)]
    split = list(zip(*keys, strict=True)) if keys else [() for _ in names]
    return [_key_column(part, name, table.column(name).type)
            for part, name in zip(split, names, strict=True)]


def _output_table(engine: EngineHost, key_arrays: list[pa.Array], names: list[str],
                  starts: Any, ends: Any, flags: Any, results: list[pa.Array]) -> pa.Table:
    arrays = [*key_arrays, pa.array(starts, type=pa.int64()), pa.array(ends, type=pa.int64())]
    fields = [*names, SESSION_START, SESSION_END]
    if engine.updates:
        arrays.append(pa.array(flags, type=pa.bool_()))
        fields.append(RETRACTION)
    arrays += results
    fields += engine.result_names or [engine.aggregation.name]
    return pa.Table.from_arrays(arrays, names=fields)


def _blocks_to_table(engine: EngineHost, blocks: list[Block], names: list[str],
                     table: pa.Table, types: list[Any]) -> pa.Table:
    assert engine.columnar_kinds is not None
    kinds = engine.columnar_kinds
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
    labels = engine.result_names
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
