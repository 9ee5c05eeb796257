"""The Arrow engine's columnar path: a partition's Arrow batches go to the engine whole, never
as Python rows: in streaming queries to the engine's ``process_table``, in static ones (all
rows there) to its bounded path, ``sessionstore.sessionize``, on the same prepared columns.

It serves the common case, every aggregation ``count`` or ``sum``/``min``/``max`` over an integer
or floating column, with the default emission (each session once, when it is complete). The
engine's built-in aggregations then keep their accumulators as columns (its *fast path*), so a
batch costs array operations; other configurations take the row path of
:func:`spark_adapter.arrow.static_partition` and :func:`spark_adapter.arrow.stream_partition`,
with the same results. A streaming query's stored sessions hold this path's accumulators, so
``sessionize`` pins the choice in the query's configuration digest: state written by one path is
never read by the other.

Spark's null rule for ``sum``, ``min`` and ``max`` (a null is no input; a session of nulls gives
null) is kept without a per-row branch: a null becomes the operation's identity (0, the largest
or the smallest value), and each such column also sums a 0/1 "present" column, so a session
whose sum of it is 0 outputs null. Key, time and output columns use the codecs of
:mod:`spark_adapter.columns` (times in microseconds, dates in days).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import types as T

from sessionstore import InMemorySessionStore, SessionAggregator, aggregations
from sessionstore.aggregations import Aggregation, SumOverflowError
from sessionstore.engine import Emit
from sessionstore.timeutil import INT64_MAX

from . import columns
from .config import (
    SESSION_END,
    SESSION_START,
    STATIC_RETENTION_US,
    SessionizeConfig,
    check_gap_bound,
    engine_arguments,
    null_keys_message,
)

#: ``SessionizeConfig.extra`` key under which ``sessionize`` leaves ``[(name, kind, column)]``.
PARTS_KEY = "static_parts"
_KINDS = ("count", "sum", "min", "max")
_NUMERIC = (*columns.INTEGRAL, *columns.FRACTIONAL)
# floating keys never get here: sessionize refuses them (columns.check_key_type)
_KEY_TYPES = (*columns.INTEGRAL, T.StringType, T.BinaryType, T.BooleanType, T.DateType,
              *columns.TIMES)
_PREFIX = "__sessionstore_"  # internal column names: the user's names never reach the engine
_KEY = _PREFIX + "key"
_TIME = _PREFIX + "time"
_GAP = _PREFIX + "gap"
_FIRST = _PREFIX + "first"  # a bucket's first and last event times
_LAST = _PREFIX + "last"
_BUCKET = _PREFIX + "bucket"
_HALF_BITS = 32  # an integer sum is split in a high and a low half (see bucketed_frame)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


@dataclass(frozen=True)
class _Part:
    name: str  # the output column
    kind: str
    column: str | None
    data_type: T.DataType | None


def columnar_parts(config: SessionizeConfig) -> list[_Part] | None:
    """The aggregations, if every one can take the columnar path; else None."""
    if config.trigger is not None or config.emit != "final" or config.json_outputs:
        return None
    if not all(isinstance(t, _KEY_TYPES) for t in config.key_types):
        return None
    described = config.extra.get(PARTS_KEY)
    if not isinstance(described, list) or len(described) != len(config.output_names):
        return None
    types = dict(zip(config.value_columns, config.value_types, strict=True))
    parts = []
    for name, kind, column in described:
        if kind not in _KINDS:
            return None
        data_type = None if column is None else types.get(column)
        if kind != "count" and not isinstance(data_type, _NUMERIC):
            return None
        parts.append(_Part(name, kind, column, data_type))
    return parts


def _identity(kind: str, floating: bool) -> float | int:
    if kind == "sum":
        return 0.0 if floating else 0
    if floating:
        return float("inf") if kind == "min" else float("-inf")
    info = np.iinfo(np.int64)
    return int(info.max) if kind == "min" else int(info.min)


def columnar_aggregation(parts: list[_Part]) -> Aggregation:
    """The engine's aggregation for ``parts``: per part its value column and, for ``sum``,
    ``min`` and ``max``, a count of the rows that were not null (see the module docstring)."""
    engine_parts: dict[str, Aggregation] = {}
    for i, part in enumerate(parts):
        if part.kind == "count":
            engine_parts[f"{_PREFIX}v{i}"] = aggregations.count()
            continue
        build = {"sum": aggregations.sum_of, "min": aggregations.min_of,
                 "max": aggregations.max_of}[part.kind]
        engine_parts[f"{_PREFIX}v{i}"] = build(column=f"{_PREFIX}v{i}")
        engine_parts[f"{_PREFIX}n{i}"] = aggregations.sum_of(column=f"{_PREFIX}n{i}")
    return aggregations.combine(engine_parts)


class ColumnarRunner:
    """Feeds one partition's input columns to an engine built with :func:`columnar_aggregation`
    and turns what it emits into output rows (see the module docstring)."""

    def __init__(self, config: SessionizeConfig, parts: list[_Part],
                 engine: SessionAggregator) -> None:
        self.config = config
        self.parts = parts
        self.engine = engine
        self.key_names = [f"{_KEY}{i}" for i in range(len(config.key_columns))]

    def feed(self, table: pa.Table) -> tuple[dict[str, int], int | None]:
        """One chunk of the partition's rows. Rows without an event time or a key are dropped
        and counted. Returns the counts (``null_times_dropped``, ``null_keys_dropped``) and the
        largest event time fed (us), or None for no row.

        Raises:
            ValueError: a row's gap exceeds ``max_gap`` (see :func:`check_gap_bound`); nothing
                has reached the engine then.
            RuntimeError: the engine emitted while taking rows, which it cannot with a
                watermark that only :meth:`SessionAggregator.advance_watermark` moves.
        """
        prepared, counts = self.engine_input(table)
        if prepared is None:
            return counts, None
        return counts, self.feed_prepared(prepared)

    def feed_prepared(self, prepared: pa.Table) -> int:
        """:meth:`feed` of what :meth:`engine_input` made (rows left); returns the largest
        event time fed (us)."""
        try:
            emitted = self.engine.process_table(prepared, key=self.key_names, time=_TIME,
                                                gap=None if self.config.gap_column is None
                                                else _GAP)
        except aggregations.SumOverflowError as exc:
            # name the user's output, not the engine column that carries it
            names = {f"{_PREFIX}v{i}": part.name for i, part in enumerate(self.parts)}
            if exc.aggregation not in names:
                raise
            raise exc.naming(names[exc.aggregation]) from None
        if emitted.num_rows:
            raise RuntimeError(f"sessionize: {emitted.num_rows} sessions emitted before the "
                               f"watermark moved")
        return int(pc.max(prepared.column(_TIME)).as_py())

    def engine_input(self, table: pa.Table) -> tuple[pa.Table | None, dict[str, int]]:
        """The engine's columns for ``table`` (None when no row is left) and the counts of the
        rows dropped for a null time or key: the keys in the engine's codecs as
        ``key_names``, the time in us, the gap in us when it is per row, and per part its
        value (a null as the operation's identity) and whether it was present (see the module
        docstring).

        Raises:
            ValueError: a row's gap exceeds ``max_gap`` (see :func:`check_gap_bound`).
        """
        cfg = self.config
        valid = pc.is_valid(table.column(cfg.time_column))
        null_times = table.num_rows - int(pc.sum(valid).as_py() or 0)
        for name in cfg.key_columns:
            valid = pc.and_(valid, pc.is_valid(table.column(name)))
        kept = int(pc.sum(valid).as_py() or 0)
        null_keys = table.num_rows - null_times - kept
        if kept != table.num_rows:
            table = table.filter(valid)
        counts = {"null_times_dropped": null_times, "null_keys_dropped": null_keys}
        if not kept:
            return None, counts
        arrays: dict[str, pa.ChunkedArray] = {}
        for name, column, data_type in zip(self.key_names, cfg.key_columns, cfg.key_types,
                                           strict=True):
            arrays[name] = _engine_key(table.column(column), data_type)
        arrays[_TIME] = table.column(cfg.time_column).cast(pa.int64())
        if cfg.gap_column is not None:  # a gap per row (us); over max_gap is refused, naming it
            check_gap_bound(cfg, table)
            arrays[_GAP] = table.column(cfg.gap_column)
        for i, part in enumerate(self.parts):
            if part.kind == "count":
                continue
            assert part.column is not None
            values = table.column(part.column)
            floating = isinstance(part.data_type, columns.FRACTIONAL)
            target = pa.float64() if floating else pa.int64()
            fill = pa.scalar(_identity(part.kind, floating), target)
            arrays[f"{_PREFIX}v{i}"] = pc.fill_null(values.cast(target), fill)
            arrays[f"{_PREFIX}n{i}"] = pc.is_valid(values).cast(pa.int64())
        return pa.table(arrays), counts

    def rows(self, emits: list[Emit]) -> pa.RecordBatch:
        """The output rows of ``emits`` (sessions the engine closed)."""
        cfg = self.config
        tz = cfg.timezone
        arrays: list[pa.Array] = []
        keys = [e.session.key for e in emits]
        for i, data_type in enumerate(cfg.key_types):
            column = keys if len(cfg.key_types) == 1 else [k[i] for k in keys]
            arrays.append(columns.key_from_engine(column, data_type, tz))
        arrays.append(columns.from_engine([e.session.start for e in emits], cfg.time_type, tz))
        arrays.append(columns.from_engine([e.session.end for e in emits], cfg.time_type, tz))
        for i, (part, out_field) in enumerate(zip(self.parts, cfg.output_fields, strict=True)):
            values = [e.value[f"{_PREFIX}v{i}"] for e in emits]
            if part.kind != "count":
                present = [e.value[f"{_PREFIX}n{i}"] for e in emits]
                values = [v if n else None for v, n in zip(values, present, strict=True)]
            arrays.append(columns.from_engine(values, out_field.dataType, tz))
        return pa.RecordBatch.from_arrays(arrays, schema=cfg.arrow_output_schema())


def _engine_key(array: pa.ChunkedArray, data_type: T.DataType) -> pa.ChunkedArray:
    """A key column in the engine's representation (see :mod:`spark_adapter.columns`)."""
    if isinstance(data_type, columns.TIMES):
        return array.cast(pa.int64())
    if isinstance(data_type, T.DateType):
        return array.cast(pa.int32())
    if isinstance(data_type, T.BooleanType):  # as columns.key_to_engine: the engine keys on ints
        return array.cast(pa.int8())
    return array


def static_partition(config: SessionizeConfig,
                     batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch] | None:
    """The columnar ``mapInArrow`` function for a static partition, or None when the
    configuration needs the row path.

    The partition's rows are all there, so they take the engine's bounded path
    (``sessionstore.sessionize``: sort by key and time, one scan, array reductions), which is
    exact whatever the row order and gives the sessions the streaming engine gives once its
    watermark has passed every row, with no Python object per session. A failure (a sum
    leaving int64) takes the streaming engine on an in-memory store instead, which raises the
    error in the adapter's terms.

    Raises:
        ValueError: a key column holds a null (naming the key columns), as ``sessionize``
            refuses null keys in a static input.
    """
    parts = columnar_parts(config)
    if parts is None:
        return None
    return _run(config, parts, batches)


def _engine_runner(config: SessionizeConfig, parts: list[_Part]) -> ColumnarRunner:
    engine = SessionAggregator(
        InMemorySessionStore(**engine_arguments(retention_us=STATIC_RETENTION_US)),
        config.windows(),
        columnar_aggregation(parts), watermark="external", **config.engine_options(),
    )
    return ColumnarRunner(config, parts, engine)


def _run(config: SessionizeConfig, parts: list[_Part],
         batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    runner = _engine_runner(config, parts)
    prepared, counts = runner.engine_input(config.input_table(batches))
    if counts["null_keys_dropped"]:
        raise ValueError(null_keys_message(config.key_columns))
    if prepared is None:
        return
    try:
        out = _bounded_rows(config, parts, runner.key_names, prepared)
    except ValueError:  # the engine below raises it naming the user's output
        out = None
    if out is None:
        runner.feed_prepared(prepared)
        out = runner.rows(runner.engine.advance_watermark(INT64_MAX))
    if out.num_rows:
        yield out


def _bounded_rows(config: SessionizeConfig, parts: list[_Part], key_names: list[str],
                  prepared: pa.Table) -> pa.RecordBatch:
    """The output rows of ``prepared`` (:meth:`ColumnarRunner.engine_input`) by the bounded
    path, with the same engine columns and the same null rule as the streaming engine's.

    Raises:
        ValueError: the bounded path refuses the rows (a sum leaving int64).
    """
    from sessionstore.bounded import sessionize as bounded_sessionize

    specs: dict[str, Any] = {}
    for i, part in enumerate(parts):
        if part.kind == "count":
            specs[f"{_PREFIX}v{i}"] = "count"
        else:
            specs[f"{_PREFIX}v{i}"] = (part.kind, f"{_PREFIX}v{i}")
            specs[f"{_PREFIX}n{i}"] = ("sum", f"{_PREFIX}n{i}")
    # times and gaps are int64 microseconds: integer gaps share the time column's unit
    sessions = bounded_sessionize(
        prepared, key=key_names, time=_TIME,
        gap=config.gap_us if config.gap_column is None else _GAP,
        aggregations=specs, max_duration=config.max_duration_us,
        inclusive_gap=config.inclusive_gap)
    return _output_rows(config, parts, key_names, sessions)


def _output_rows(config: SessionizeConfig, parts: list[_Part], key_names: list[str],
                 sessions: pa.Table) -> pa.RecordBatch:
    """The output rows of the bounded path's ``sessions`` over the engine columns of
    :meth:`ColumnarRunner.engine_input` (per part its value and, but for ``count``, how many
    values were present). Raises ValueError (pyarrow's) when a value does not fit its output
    type."""
    schema = config.arrow_output_schema()
    arrays: list[pa.Array | pa.ChunkedArray] = [
        sessions.column(name) for name in [*key_names, SESSION_START, SESSION_END]]
    for i, part in enumerate(parts):
        values = sessions.column(f"{_PREFIX}v{i}")
        if part.kind != "count":  # a session of nulls only gives null, as Spark's
            present = pc.greater(sessions.column(f"{_PREFIX}n{i}"), 0)
            values = pc.if_else(present, values, pa.scalar(None, values.type))
        arrays.append(values)
    return pa.RecordBatch.from_arrays(
        [column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
         for column in (a.cast(f.type) for a, f in zip(arrays, schema, strict=True))],
        schema=schema)


def bucketed_parts(config: SessionizeConfig) -> list[_Part] | None:
    """The aggregations, if Spark may first reduce a static input to one row per key and
    gap-wide time bucket (:func:`bucketed_frame`); else None.

    That needs a fixed gap, no ``max_duration`` (it may split a bucket's events), a timestamp
    time column (a timestamp_ntz one keeps the row path's wall-clock arithmetic), and every
    aggregation a ``count`` or an integer ``sum``, ``min`` or ``max``, whose partial results
    combine exactly (a float sum's would round in another order than the row path's), and no
    key column named like the frame's own columns (``__sessionstore_*``).
    """
    parts = columnar_parts(config)
    if (parts is None or config.gap_column is not None or config.gap_us is None
            or config.max_duration_us is not None
            or not isinstance(config.time_type, T.TimestampType)
            # the bucketed frame's own columns sit beside the keys: a key named like one of
            # them keeps the row path, whose engine never sees the user's names
            or any(name.startswith(_PREFIX) for name in config.key_columns)):
        return None
    if not all(p.kind == "count" or isinstance(p.data_type, columns.INTEGRAL) for p in parts):
        return None
    return parts


def bucketed_frame(df: DataFrame, config: SessionizeConfig, parts: list[_Part]) -> DataFrame:
    """``df`` reduced by Spark to one row per key and time bucket holding an event, partitioned
    by key into ``config.n_partitions`` partitions, for :func:`bucketed_partition`.

    A bucket is ``[b, b + gap)`` with ``b`` a multiple of the gap in microseconds since the
    epoch. Two events of a key less than a gap apart are in one session under either gap rule,
    so all the events of a bucket are: a session is a union of whole buckets, and the
    sessions of the buckets, each taken as one event at its first time with its own gap
    (``last - first + gap``, so that it reaches as far as its last event's would), are the
    sessions of the events. A row is the keys (as ``__sessionstore_key0``, ...), the bucket,
    the first and last event times, and per part its partial result (``count``: the rows;
    ``min``/``max``: of the present values; ``sum``: the sums of the present values' high
    halves ``v >> 32`` and low halves ``v & (2**32 - 1)``, which fit int64 for any bucket of
    under 2**31 rows, where a sum of the values could leave it, and which
    :func:`bucketed_partition` joins back exactly) with, but for ``count``, how many values
    were present. The rows without a time share a bucket of their own, null, whose times are
    null: :func:`bucketed_partition` drops it, as every static path drops them. Spark reduces
    each input partition before the shuffle, so far fewer rows cross it and reach Python than
    events. Every column has a name of this module's (no dot, no backtick), so the frame goes
    to ``mapInArrow`` as it is; each expression is one SQL string, and the frame is built in as
    few steps as Spark allows, since each step costs the driver a round trip and an analysis
    of the plan before the job starts (native's plan takes two).
    """
    from pyspark.sql import functions as F

    # SQL expressions (one call each); pyspark < 3.5 also lacks some as Python functions
    time = columns.quote(config.time_column)
    micros = f"unix_micros({time})"
    assert config.gap_us is not None  # bucketed_parts
    groups = [F.expr(f"{columns.quote(name)} AS {_KEY}{i}")
              for i, name in enumerate(config.key_columns)]
    groups.append(F.expr(f"{micros} - pmod({micros}, {config.gap_us}) AS {_BUCKET}"))
    results = [f"min({time}) AS {_FIRST}", f"max({time}) AS {_LAST}"]
    for i, part in enumerate(parts):
        if part.kind == "count":
            results.append(f"count(1) AS {_PREFIX}v{i}")
            continue
        assert part.column is not None
        value = columns.quote(part.column)
        if part.kind == "sum":
            whole = f"cast({value} as bigint)"
            # try_sum: a half's sum leaving int64 (2**31 rows in a bucket) is null, not wrapped
            results += [f"try_sum(shiftright({whole}, {_HALF_BITS})) AS {_PREFIX}v{i}",
                        f"try_sum({whole} & {(1 << _HALF_BITS) - 1}) AS {_PREFIX}l{i}"]
        else:
            results.append(f"{part.kind}({value}) AS {_PREFIX}v{i}")
        results.append(f"count({value}) AS {_PREFIX}n{i}")
    return (df.groupBy(*groups).agg(*[F.expr(result) for result in results])
            .repartition(config.n_partitions, *[f"{_KEY}{i}"
                                                for i in range(len(config.key_columns))]))


def bucketed_partition(config: SessionizeConfig,
                       batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The ``mapInArrow`` function over :func:`bucketed_frame`'s rows, partitioned by key: the
    sessions of the buckets, by the engine's bounded path, as :func:`static_partition` gives
    them for the events.

    Raises:
        ValueError: a key column holds a null (naming the key columns), as
            :func:`static_partition`.
        SumOverflowError: a session's integer sum leaves int64 (naming the output), as the
            row path's engine raises it.
    """
    parts = bucketed_parts(config)
    if parts is None:
        raise RuntimeError("sessionize: bucketed_partition called for a configuration that "
                           "bucketed_parts refuses")
    received = list(batches)
    if not received:
        return
    table = pa.Table.from_batches(received)
    if table.column(_FIRST).null_count:  # the rows without a time (see bucketed_frame)
        table = table.filter(pc.is_valid(table.column(_FIRST)))
    if not table.num_rows:
        return
    key_names = [f"{_KEY}{i}" for i in range(len(config.key_columns))]
    for name in key_names:
        if table.column(name).null_count:
            raise ValueError(null_keys_message(config.key_columns))
    arrays: dict[str, pa.ChunkedArray | pa.Array] = {}
    dictionaries: dict[str, pa.Array] = {}
    for name, data_type in zip(key_names, config.key_types, strict=True):
        key = _engine_key(table.column(name), data_type)
        if isinstance(data_type, T.StringType | T.BinaryType):
            # the bounded path takes a small integer key as its own code, where it would sort
            # a dictionary of the strings; the sessions' keys are looked up in it below
            # (encoded chunk by chunk with one shared dictionary: no copy of the key bytes
            # into one array, whose 32-bit offsets a partition over 2 GiB of keys would pass)
            encoded = key.dictionary_encode()
            dictionaries[name] = encoded.chunk(encoded.num_chunks - 1).dictionary
            key = pa.chunked_array([chunk.indices for chunk in encoded.chunks],
                                   encoded.type.index_type)
        arrays[name] = key
    first = table.column(_FIRST).cast(pa.int64())
    arrays[_TIME] = first
    arrays[_GAP] = pc.add(pc.subtract(table.column(_LAST).cast(pa.int64()), first),
                          pa.scalar(config.gap_us, pa.int64()))
    specs: dict[str, Any] = {}
    for i, part in enumerate(parts):
        value, present = f"{_PREFIX}v{i}", f"{_PREFIX}n{i}"
        if part.kind == "count":
            arrays[value] = table.column(value).cast(pa.int64())
            specs[value] = ("sum", value)
            continue
        arrays[present] = table.column(present).cast(pa.int64())
        specs[present] = ("sum", present)
        if part.kind != "sum":
            arrays[value] = pc.fill_null(table.column(value).cast(pa.int64()),
                                         pa.scalar(_identity(part.kind, False), pa.int64()))
            specs[value] = (part.kind, value)
            continue
        low = f"{_PREFIX}l{i}"
        for half in (value, low):
            sums = table.column(half)
            if int(pc.sum(pc.and_(pc.is_null(sums), pc.greater(arrays[present], 0)))
                   .as_py() or 0):
                raise ValueError(f"sessionize: the sum {part.name!r} cannot be computed "
                                 f"exactly: a key's events in one gap of time hold 2**31 "
                                 f"values or more")
            arrays[half] = pc.fill_null(sums, 0)
            specs[half] = ("sum", half)
    from sessionstore.bounded import sessionize as bounded_sessionize

    sessions = bounded_sessionize(pa.table(arrays), key=key_names, time=_TIME, gap=_GAP,
                                  aggregations=specs, inclusive_gap=config.inclusive_gap)
    for name, dictionary in dictionaries.items():
        sessions = sessions.set_column(sessions.schema.get_field_index(name), name,
                                       dictionary.take(sessions.column(name)))
    for i, part in enumerate(parts):
        if part.kind == "sum":
            total = _join_halves(config, part, key_names, sessions, i)
            sessions = sessions.set_column(sessions.schema.get_field_index(f"{_PREFIX}v{i}"),
                                           f"{_PREFIX}v{i}", total)
    out = _output_rows(config, parts, key_names, sessions)
    if out.num_rows:
        yield out


def _join_halves(config: SessionizeConfig, part: _Part, key_names: list[str],
                 sessions: pa.Table, i: int) -> pa.Array:
    """Each session's sum of part ``i`` from the sums of its high and low halves (see
    :func:`bucketed_frame`): ``high * 2**32 + low``, exact, as int64.

    With ``low = carry * 2**32 + rest`` (``0 <= rest < 2**32``) the sum is
    ``(high + carry) * 2**32 + rest``, which fits int64 exactly when ``high + carry`` fits 32
    bits; a session where it does not is :class:`SumOverflowError`, as the row path raises.
    """
    high = sessions.column(f"{_PREFIX}v{i}").combine_chunks().cast(pa.int64())
    low = sessions.column(f"{_PREFIX}l{i}").combine_chunks().cast(pa.int64())
    upper = pc.add_checked(high, pc.shift_right(low, _HALF_BITS))
    rest = pc.bit_wise_and(low, (1 << _HALF_BITS) - 1)
    bound = 1 << (_HALF_BITS - 1)
    outside = pc.or_(pc.less(upper, -bound), pc.greater_equal(upper, bound))
    if pc.any(outside).as_py():
        assert config.gap_us is not None  # bucketed_parts
        row = int(pc.index(outside, True).as_py())
        keys = tuple(sessions.column(name)[row].as_py() for name in key_names)
        last_us = int(sessions.column(SESSION_END)[row].as_py()) - config.gap_us
        total = (int(upper[row].as_py()) << _HALF_BITS) + int(rest[row].as_py())
        # the engine's times are the adapter's microseconds, as the row path's error names them
        raise SumOverflowError(keys[0] if len(keys) == 1 else keys, total, last_us,
                               aggregation=part.name)
    return pc.add(pc.multiply(upper, 1 << _HALF_BITS), rest)  # fits: upper has 32 bits
