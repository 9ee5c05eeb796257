"""``sessionstore.sessionize``: sessions of data that is all there, in one call."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from .. import aggspec
from .core import ROW_COLUMN, Part, sessionize_table
from .frame import FrameBuilder, arrow_of, as_numpy, first_null
from .options import (
    SESSION_COLUMNS,
    Options,
    duration_ticks,
    is_duration_text,
    key_list,
    memory_limit_bytes,
    parse_aggregations,
    time_kind,
)
from .order import check_key_type, sortable
from .spill import Spill

log = logging.getLogger(__name__)

#: Working memory of the in-memory path per input row, beyond twice the input's own bytes
#: (codes, times, window ends, the sort permutation and its packed keys, session bounds).
BYTES_PER_ROW = 72
#: How deep a partition that is still too large is split again before it is sessionized as is
#: (one key's events cannot be split).
MAX_SPLITS = 3
#: At most this many spill partitions (open files) per split: a partition still too large is
#: split again, so a tiny memory limit costs passes over the data, not file handles (the
#: soft limit is 256 or 1024 on many systems).
MAX_PARTITIONS = 128
#: A partition whose working set is under this is sessionized as it is, not split again:
#: splitting it saves less memory than the passes and files cost (with a tiny limit, one
#: split per key; measured: 20k rows of 3000 keys took 22 s at ``memory_limit=1000``).
MIN_SPLIT_BYTES = 1 << 20


@dataclass
class Stats:
    """What a run did, beyond its sessions.

    Attributes:
        events_in: input rows read.
        invalid_gap_dropped: rows dropped because their own gap was null or <= 0 (as Spark
            filters them; only with a gap column).
        sessions_out: rows of the result.
        partitions: how many spill partitions were sessionized (0: all in memory).
        spilled_bytes: Arrow bytes written to spill files.
    """

    events_in: int = 0
    invalid_gap_dropped: int = 0
    sessions_out: int = 0
    partitions: int = 0
    spilled_bytes: int = 0


def working_bytes(nbytes: int, rows: int) -> int:
    """The memory the in-memory path needs for ``rows`` input rows of ``nbytes``."""
    return 2 * nbytes + BYTES_PER_ROW * rows


Batches = Callable[[list[str]], Iterator[pa.RecordBatch]]


def _source(data: Any, keys: Sequence[str]
            ) -> tuple[pa.Table | None, Batches | None, pa.Schema]:
    """``data`` as a table in memory, or as a stream of batches of the columns asked for:
    ``(table, batches, schema)``, views and dictionary value columns decoded (see
    :func:`_without_views`)."""
    module = type(data).__module__.split(".")[0]
    if isinstance(data, pa.RecordBatch):
        data = pa.Table.from_batches([data])
    if module == "pandas":
        # a named index is a column (it may be the key), unless a column has its name
        named = [n for n in data.index.names if n is not None]
        keep = bool(named) and not any(n in data.columns for n in named)
        data = pa.Table.from_pandas(data, preserve_index=keep)
    elif module == "polars":
        if not hasattr(data, "to_arrow"):
            raise TypeError(f"data is a polars {type(data).__name__}: pass a DataFrame "
                            f"(collect a LazyFrame first)")
        data = data.to_arrow()
    if isinstance(data, pa.Table):
        plain = _without_views(data.schema, keys)
        return (data if plain is None else data.cast(plain)), None, plain or data.schema
    if isinstance(data, pa.RecordBatchReader):
        reader = data
        plain = _without_views(reader.schema, keys)
        return None, lambda columns: (_plain(b.select(columns), plain) for b in reader), \
            plain or reader.schema
    if module == "pyarrow" and hasattr(data, "to_batches") and hasattr(data, "count_rows"):
        dataset = data
        plain = _without_views(dataset.schema, keys)
        return None, lambda columns: (_plain(b, plain) for b in dataset.to_batches(
            columns=columns)), plain or dataset.schema
    raise TypeError(f"data must be a pyarrow Table, RecordBatchReader or Dataset, or a pandas "
                    f"or polars DataFrame, got {type(data).__module__}.{type(data).__name__}")


def _without_views(schema: pa.Schema, keys: Sequence[str]) -> pa.Schema | None:
    """``schema`` with string and binary views as large strings and binaries (which Arrow's
    sort and take kernels handle; a key's dictionary of views too), and dictionary columns
    other than ``keys`` (pandas' categoricals) as their values, which the aggregations take;
    None when nothing changes."""
    views = {"string_view": pa.large_string(), "binary_view": pa.large_binary()}

    def plain(field: pa.Field) -> pa.DataType:
        data_type = field.type
        if pa.types.is_dictionary(data_type):
            if field.name not in keys:
                return plain(field.with_type(data_type.value_type))
            values = views.get(str(data_type.value_type))
            return data_type if values is None else pa.dictionary(data_type.index_type, values)
        return views.get(str(data_type), data_type)

    if all(plain(f) == f.type for f in schema):
        return None
    return pa.schema([f.with_type(plain(f)) for f in schema])


def _plain(batch: pa.RecordBatch, plain: pa.Schema | None) -> pa.RecordBatch:
    if plain is None:
        return batch
    return pa.RecordBatch.from_arrays(
        [c.cast(plain.field(n).type) for c, n in zip(batch.columns, batch.schema.names,
                                                     strict=True)], names=batch.schema.names)


def _options(schema: pa.Schema, *, key: Any, time: Any, gap: Any, aggregations: Any,
             max_gap: Any, max_duration: Any, inclusive_gap: Any, time_unit: Any,
             memory_limit: Any) -> Options:
    keys = key_list(key)
    if not isinstance(time, str) or not time:
        raise TypeError(f"time must be a column name, got {time!r}")
    names = schema.names
    for what, name in [*(("key", k) for k in keys), ("time", time)]:
        if name not in names:
            raise ValueError(f"{what} column {name!r} is not in the input (columns: {names})")
    if time in keys:
        raise ValueError(f"time column {time!r} is also a key column")
    named = [k for k in keys if k in SESSION_COLUMNS]
    if named:
        raise ValueError(f"key column {named[0]!r} has the name of an output column "
                         f"({', '.join(SESSION_COLUMNS)}); rename it")
    for k in keys:  # before any row is read or spilled (a column of nulls: named by its row)
        if not pa.types.is_null(schema.field(k).type):
            check_key_type(schema.field(k).type, k)
    kind = time_kind(schema.field(time).type, time, time_unit)
    if not isinstance(inclusive_gap, bool):
        raise TypeError(f"inclusive_gap must be True or False, got {inclusive_gap!r}")
    gap_column: str | None = None
    gap_ticks: int | None = None
    if isinstance(gap, str) and not is_duration_text(gap):
        if gap not in names:
            raise ValueError(f"gap {gap!r} is neither a duration (such as '30m' or '10 "
                             f"minutes') nor a column of the input (columns: {names})")
        if gap in keys or gap == time:
            raise ValueError(f"gap column {gap!r} is also the key or time column")
        if kind.dates and pa.types.is_integer(schema.field(gap).type):
            raise ValueError(f"gap column {gap!r} holds integers, but the time column {time!r} "
                             f"holds dates, which are read as {kind.unit}, not days: give the "
                             f"gaps as Arrow durations")
        gap_column = gap
    else:
        gap_ticks = duration_ticks(gap, "gap", kind, time)
        if max_gap is not None:
            raise ValueError("max_gap applies to a gap column only (a fixed gap is its own "
                             "maximum)")
    max_gap_ticks = None if max_gap is None else duration_ticks(max_gap, "max_gap", kind, time)
    max_duration_ticks = None if max_duration is None else duration_ticks(
        max_duration, "max_duration", kind, time)
    specs = parse_aggregations(aggregations)
    clash = [s.name for s in specs if s.name in keys or s.name in SESSION_COLUMNS]
    if clash:
        raise ValueError(f"aggregations: output name {clash[0]!r} is also a key or session "
                         f"column; rename it")
    # a dictionary key stays one as a key; aggregated, it is its values (see Sorted.column)
    values = pa.schema([f.with_type(f.type.value_type) if pa.types.is_dictionary(f.type) else f
                        for f in schema])
    planned = aggspec.plan(specs, values, exclude=[*keys, time])
    return Options(keys, time, kind, gap_ticks, gap_column, max_gap_ticks, max_duration_ticks,
                   inclusive_gap, specs, planned, memory_limit_bytes(memory_limit))


def _sort_output(parts: list[pa.Table], keys: list[str]) -> pa.Table:
    table = pa.concat_tables(parts)
    if len(parts) < 2:
        return table
    # sorted on the keys' values: Arrow cannot sort a dictionary column itself
    order = [*keys, "session_start"]
    by = pa.table([sortable(table.column(c)) for c in order], names=order)
    import pyarrow.compute as pc

    return table.take(pc.sort_indices(by, sort_keys=[(c, "ascending") for c in order]))


def _partitioned(spill: Spill, options: Options, stats: Stats, depth: int,
                 spill_dir: str | Path | None, row_column: str) -> Iterator[pa.Table]:
    """The sessions of each partition of ``spill``; a partition still over the memory limit is
    split again (a new hash salt), up to :data:`MAX_SPLITS` deep. ``row_column`` holds each
    row's input row number."""
    for _, table in spill.read():
        rows = as_numpy(table.column(row_column))
        working = working_bytes(table.nbytes, table.num_rows)
        if depth < MAX_SPLITS and table.num_rows > 1 and \
                working > max(options.memory_limit, MIN_SPLIT_BYTES):
            parts = min(MAX_PARTITIONS, max(2, math.ceil(2 * working / options.memory_limit)))
            with Spill(table.schema, options.keys, parts, depth + 1, spill_dir) as inner:
                for batch in table.to_batches(max_chunksize=1 << 16):
                    inner.write(batch)
                del table
                stats.spilled_bytes += inner.bytes_written
                yield from _partitioned(inner, options, stats, depth + 1, spill_dir,
                                        row_column)
            continue
        stats.partitions += 1
        builder = FrameBuilder(table.schema, options.columns)
        for batch in table.to_batches():
            builder.add(batch)
        del table  # the frame copies the columns out as the table goes
        batch = None
        part = sessionize_table(builder.finish(), options, rows)
        stats.invalid_gap_dropped += part.invalid_gap_dropped
        yield part.table


def run(data: Any, *, key: str | Sequence[str], time: str, gap: Any, aggregations: Any,
        max_gap: Any = None, max_duration: Any = None, inclusive_gap: bool = True,
        time_unit: str | None = None, memory_limit: int | str | None = None,
        spill_dir: str | Path | None = None,
        progress: Callable[[int], None] | None = None) -> tuple[pa.Table, Stats]:
    """:func:`sessionize`, also returning its :class:`Stats` (for front ends such as the CLI).

    ``progress``, when given, is called with the number of input rows read so far, after
    each batch.
    """
    table, make_batches, schema = _source(data, key_list(key))
    options = _options(schema, key=key, time=time, gap=gap, aggregations=aggregations,
                       max_gap=max_gap, max_duration=max_duration,
                       inclusive_gap=inclusive_gap, time_unit=time_unit,
                       memory_limit=memory_limit)
    if spill_dir is not None and not Path(spill_dir).is_dir():
        raise ValueError(f"spill_dir {str(spill_dir)!r} is not a directory")
    columns = options.columns
    stats = Stats()
    if table is not None:
        table = table.select(columns)
        batches = None
        if working_bytes(table.nbytes, table.num_rows) <= options.memory_limit:
            stats.events_in = table.num_rows
            if progress is not None:
                progress(table.num_rows)
            return _finish(sessionize_table(table, options), stats)
        batches = iter(table.to_batches(max_chunksize=1 << 16))
    else:
        assert make_batches is not None
        batches = make_batches(columns)
    held = FrameBuilder(schema, columns)
    for batch in batches:
        _check_nulls(batch, options, stats.events_in)
        held.add(batch)
        stats.events_in += batch.num_rows
        if progress is not None:
            progress(stats.events_in)
        if working_bytes(held.nbytes, held.rows) > options.memory_limit:
            return _spilled(held, batches, options, stats, spill_dir, progress)
    return _finish(sessionize_table(held.finish(), options), stats)


def _check_nulls(batch: pa.RecordBatch, options: Options, first_row: int) -> None:
    """Refuse a null key or time in a batch of a stream, naming its input row (once spilled,
    a partition's rows no longer say where they came from)."""
    for what, name in [*(("key", k) for k in options.keys), ("time", options.time)]:
        row = first_null(batch.column(name))
        if row is not None:
            raise ValueError(f"{what} column {name!r} is null at row {first_row + row}: every "
                             f"event needs a {what}")


def _finish(part: Part, stats: Stats) -> tuple[pa.Table, Stats]:
    stats.invalid_gap_dropped += part.invalid_gap_dropped
    stats.sessions_out = part.table.num_rows
    if stats.invalid_gap_dropped:
        log.warning("%d events had a null or non-positive gap and were dropped, as Spark "
                    "drops them", stats.invalid_gap_dropped)
    return part.table, stats


def _spilled(held: FrameBuilder, rest: Iterator[pa.RecordBatch], options: Options,
             stats: Stats, spill_dir: str | Path | None,
             progress: Callable[[int], None] | None) -> tuple[pa.Table, Stats]:
    """Spill what is held and the rest of the stream to hash partitions, then sessionize them
    one by one."""
    # The stream may go on for long: enough partitions for 16 times what was read so far (a
    # partition that is still too large is split again, at the cost of reading it twice).
    partitions = min(MAX_PARTITIONS, max(8, math.ceil(
        16 * working_bytes(held.nbytes, held.rows) / options.memory_limit)))
    first = held.batches()
    row_column = ROW_COLUMN
    while row_column in held.names:  # an input column may have that name
        row_column = "_" + row_column
    schema = pa.schema([pa.field(n, held.types[n]) for n in held.names]).append(
        pa.field(row_column, pa.int64()))
    seen = 0
    with Spill(schema, options.keys, partitions, 0, spill_dir) as spill:
        def write(batch: pa.RecordBatch) -> None:
            nonlocal seen
            numbered = batch.append_column(row_column, arrow_of(
                np.arange(seen, seen + batch.num_rows, dtype=np.int64), pa.int64()))
            spill.write(numbered)
            seen += batch.num_rows

        while first:
            write(first.pop(0))
        for batch in rest:
            _check_nulls(batch, options, stats.events_in)
            write(batch)
            stats.events_in += batch.num_rows
            if progress is not None:
                progress(stats.events_in)
        stats.spilled_bytes += spill.bytes_written
        tables = list(_partitioned(spill, options, stats, 0, spill_dir, row_column))
    if not tables:
        raise AssertionError("spilled input produced no partition")  # pragma: no cover
    table = _sort_output(tables, options.keys)
    return _finish(Part(table, 0), stats)


def sessionize(data: Any, *, key: str | Sequence[str], time: str, gap: Any,
               aggregations: Any, max_gap: Any = None, max_duration: Any = None,
               inclusive_gap: bool = True, time_unit: str | None = None,
               memory_limit: int | str | None = None,
               spill_dir: str | Path | None = None) -> pa.Table:
    """Sessionize data that is all there: one row per session, exact whatever the row order.

    The answer is the streaming engine's once every event is in and the watermark has passed
    them all: per key, events sorted by time (ties by input order) form a session while each is
    within the gap of the session so far (``inclusive_gap``: at most ``gap`` after it; without:
    strictly less) and, with ``max_duration``, before ``start + max_duration``. A session is
    ``[first time, min(max(t + gap), start + max_duration))``. Nothing is late; there is no
    store, watermark or lateness. Inputs whose working set exceeds ``memory_limit`` are
    hash-partitioned by key into Arrow IPC spill files and sessionized partition by partition.

    Args:
        data: a ``pyarrow.Table``, ``RecordBatchReader`` or ``pyarrow.dataset.Dataset`` (read
            in batches, only the columns needed), or a pandas or polars DataFrame.
        key: the key column, or a list of them.
        time: the event-time column: timestamps (any unit, with or without a time zone, kept
            at full precision), dates (durations then say their unit: an int gap is
            refused), or integers (counts of ``time_unit``, or with
            ``time_unit`` None of the column's own unit, which an integer ``gap`` shares).
        gap: a duration: an int in the time column's units, a ``timedelta`` (or a pandas
            ``Timedelta`` or numpy ``timedelta64``), or a string such as ``"30m"`` or
            ``"10 minutes"``; or the name of a column with each event's own gap
            (integers in the time column's units, or Arrow durations), used when the string is
            not a duration. A null or non-positive own gap drops the event (counted in
            :class:`Stats` and logged), as Spark drops such rows.
        aggregations: the CLI's ``"NAME=KIND:COLUMN"`` strings (one or a list) or the Spark
            adapter's ``{NAME: "count" | (KIND, COLUMN) | Aggregation}``; kinds are count,
            sum, min, max, first, last and collect; a custom ``Aggregation`` sees each row as a
            dict of the other columns and is output as JSON text.
        max_gap: with a gap column, the largest gap allowed (optional here: nothing is kept);
            a larger one is an error.
        max_duration: the longest a session may span, a duration as ``gap``.
        inclusive_gap: whether events exactly ``gap`` apart share a session (True, Spark's
            rule) or not (False, Beam's).
        time_unit: "s", "ms", "us" or "ns": the unit of an integer time column (needed when
            a duration is a string or a ``timedelta``).
        memory_limit: bytes (an int, or a string such as ``"1GB"``) the working set may use
            before spilling; default a quarter of physical memory, at most 2 GiB.
        spill_dir: an existing directory for the spill files (default: the system's temporary
            directory); they are removed when the call returns or fails.

    Returns:
        A ``pyarrow.Table``: the key columns (their input types), ``session_start`` and
        ``session_end`` (exclusive; the time column's timestamp type, ``timestamp[s]`` for
        date32 and ``timestamp[ms]`` for date64 input, int64 for integer times), then one
        column per aggregation, typed as the CLI outputs them. Rows are ordered by key, then
        ``session_start``.

    Raises:
        ValueError: a missing column, a null key or time (naming the column and row), a bad
            duration, a gap above ``max_gap``, an integer sum beyond int64 (naming the
            aggregation, key and session), a ``spill_dir`` that is not a directory; each names
            the argument.
        TypeError: an unsupported ``data``, time column type or argument type.
    """
    table, _ = run(data, key=key, time=time, gap=gap, aggregations=aggregations,
                   max_gap=max_gap, max_duration=max_duration, inclusive_gap=inclusive_gap,
                   time_unit=time_unit, memory_limit=memory_limit, spill_dir=spill_dir)
    return table
