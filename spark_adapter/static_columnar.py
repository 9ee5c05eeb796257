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
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import types as T

from sessionstore import InMemorySessionStore, SessionAggregator, aggregations
from sessionstore.aggregations import Aggregation
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
