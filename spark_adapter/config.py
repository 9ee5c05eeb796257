"""What a Spark task needs to run the engine, shared by both engines, and its row codecs.

The engine counts time in integer units; the Spark adapter feeds it **microseconds**, Spark's own
timestamp unit, so gaps, session bounds and ordering keep their full precision. Inside
``spark_adapter`` a microsecond quantity is named ``*_us`` and a millisecond one ``*_ms``; every
microsecond quantity reaches the engine's arguments through :func:`engine_arguments`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import types as T

from sessionstore import AccumulationMode, AfterWatermark, EmitStrategy, SessionWindows
from sessionstore.aggregations import Aggregation
from sessionstore.engine import Emit
from sessionstore.engine.config import required_retention_ms
from sessionstore.timeutil import INT64_MAX, check_int64, duration_fraction, duration_ms

from . import columns

SESSION_START = "session_start"
SESSION_END = "session_end"
PANE_FIELDS = [T.StructField("pane_timing", T.StringType()),
               T.StructField("pane_index", T.LongType()),
               T.StructField("pane_is_first", T.BooleanType()),
               T.StructField("pane_is_last", T.BooleanType())]
#: The retention of the in-memory store a static task runs on: nothing expires before the final
#: watermark, and the store's sums of times and retention stay far from int64's end.
STATIC_RETENTION_US = INT64_MAX // 4
#: The bound of a per-row gap on a static DataFrame given without ``max_gap`` (about 14,600
#: years): nothing is retained between tasks, so only the static store's retention limits it.
STATIC_MAX_GAP_US = STATIC_RETENTION_US // 2
#: Microseconds per millisecond: Spark's watermarks and delays (ms) in the adapter's unit.
US_PER_MS = 1000
_MICROS = re.compile(r"^\s*(\d+)\s*(us|micro|micros|microsecond|microseconds)\s*$")


def duration_us(value: Any, name: str) -> int:
    """A duration in microseconds: a ``timedelta``, a pandas ``Timedelta`` or a numpy
    ``timedelta64`` (exactly: see :func:`~sessionstore.timeutil.duration_fraction`),
    ``"250 microseconds"``, a Spark-style string such as ``"10 minutes"``, or an int of
    milliseconds.

    Raises:
        TypeError / ValueError: naming ``name``: also a value outside int64, and a duration
            that is not a whole number of microseconds (Spark's unit), never truncated.
    """
    exact = duration_fraction(value, name)  # before the int: a timedelta64 is a numpy integer
    if exact is not None:
        amount, per_second = exact
        micros, rest = divmod(amount * 1_000_000, per_second)
        if rest:
            raise ValueError(f"{name} is not a whole number of microseconds, the finest time "
                             f"Spark keeps: {value!r}")
        return check_int64(micros, name)
    if isinstance(value, str):
        match = _MICROS.match(value)
        if match:
            return check_int64(int(match.group(1)), name)
    return check_int64(duration_ms(value, name) * US_PER_MS, name)


def engine_arguments(**quantities_us: Any) -> dict[str, Any]:
    """The engine's keyword arguments for microsecond quantities: ``<name>_us=v`` is handed over
    as ``<name>_ms=v``. The one place where the adapter's times meet the engine's arguments.

    The engine (``SessionWindows``, ``SessionAggregator``, the stores, and the
    :class:`~spark_adapter.provider.SessionStoreProvider` that wraps a store) is unit-agnostic: it
    counts time in integer *engine units*, whatever unit its caller uses, and names its arguments
    ``*_ms`` after the unit of its own front ends (the embedded API and the CLI). The Spark
    adapter runs it in **microseconds**, so a value passes unchanged and only its name says what
    it is on each side: ``SessionWindows(**engine_arguments(gap_us=gap_us))`` gives the engine a
    gap of ``gap_us`` engine units.

    Args:
        quantities_us: each an engine argument's name with ``_us`` in place of ``_ms``.

    Returns:
        The same values under the engine's names.

    Raises:
        TypeError: a name that does not end in ``_us`` (naming it), so that a millisecond value
            is never handed over as if it were one of the engine's units.
    """
    arguments: dict[str, Any] = {}
    for name, value in quantities_us.items():
        if not name.endswith("_us"):
            raise TypeError(f"engine_arguments takes microsecond quantities named *_us, got "
                            f"{name}={value!r}")
        arguments[name[:-len("_us")] + "_ms"] = value
    return arguments


@dataclass
class SessionizeConfig:
    """Everything a worker needs; pickled by Spark with the task function. Times are in us."""

    key_columns: list[str]
    key_types: list[T.DataType]
    time_column: str
    time_type: T.DataType
    value_columns: list[str]
    value_types: list[T.DataType]
    gap_us: int | None  # None: the gap is per row, in the ``gap_column`` of the input
    inclusive_gap: bool
    emit: str  # "final" or "update"
    aggregation: Aggregation
    output_names: list[str]
    output_fields: list[T.StructField]
    json_outputs: list[str]
    timezone: str = "UTC"
    delay_ms: int = 0
    n_partitions: int = 1
    state_location: str | None = None  # the base; each query's own lies under it
    operator: str = "sessionize"
    n_buckets: int = 1
    layout_digest: str = ""  # of every setting the state depends on (pinned on first run)
    layout_settings: str = ""  # those settings, named in a refused restart's message
    keep_versions: int = 100
    local_dir: str | None = None
    trigger: AfterWatermark | None = None
    accumulation: AccumulationMode | None = None
    gap_column: str | None = None  # the hidden int64 column of per-row gaps (us), if dynamic
    gap_description: str = ""  # how the user gave a dynamic gap, for error messages
    max_gap_us: int = 0  # the bound of a dynamic gap (the gap itself when it is fixed)
    max_duration_us: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.gap_us is not None and not self.max_gap_us:
            self.max_gap_us = self.gap_us

    @property
    def dynamic(self) -> bool:
        return self.gap_us is None

    @property
    def retention_us(self) -> int:
        """How long the store keeps a session after its end: until Spark's watermark, which
        trails the newest event by the delay, has passed it for certain: the largest gap an
        event may have, the longest a session may last (with ``max_duration``), the delay."""
        return required_retention_ms(
            self._windows(None), watermark="event_time",
            **engine_arguments(max_out_of_orderness_us=self.delay_ms * US_PER_MS + 1))

    def _windows(self, retention_us: int | None) -> SessionWindows:
        return SessionWindows(inclusive_gap=self.inclusive_gap, **engine_arguments(
            gap_us=self.gap_us, grace_us=0, retention_us=retention_us,
            max_gap_us=self.max_gap_us if self.dynamic else None,
            max_duration_us=self.max_duration_us))

    def windows(self) -> SessionWindows:
        return self._windows(self.retention_us)

    def engine_options(self) -> dict[str, Any]:
        """Emission keyword arguments of SessionAggregator."""
        if self.trigger is not None:
            return {"trigger": self.trigger, "accumulation": self.accumulation}
        return {"emit": EmitStrategy.ON_WINDOW_CLOSE if self.emit == "final"
                else EmitStrategy.ON_WINDOW_UPDATE}

    @property
    def order_sensitive(self) -> bool:
        """Whether the output depends on the order of rows with equal times (then each
        partition's rows are sorted before the engine sees them, so a replay repeats it)."""
        return self.emit == "update" or self.trigger is not None or bool(self.json_outputs) \
            or any(getattr(part, "name", "") in ("first", "last", "collect")
                   for part in getattr(self.aggregation, "parts", []))

    def output_schema(self) -> T.StructType:
        fields = [*[T.StructField(k, t) for k, t in zip(self.key_columns, self.key_types,
                                                         strict=True)],
                  T.StructField(SESSION_START, self.time_type),
                  T.StructField(SESSION_END, self.time_type), *self.output_fields]
        if self.emit == "update":
            fields.append(T.StructField("retracted", T.BooleanType()))
        if self.trigger is not None:
            fields += PANE_FIELDS
        return T.StructType(fields)

    def arrow_output_schema(self) -> pa.Schema:
        return pa.schema([pa.field(f.name, columns.arrow_type(f.dataType, self.timezone))
                          for f in self.output_schema().fields])

    def arrow_input_schema(self) -> pa.Schema:
        """The rows a task receives: keys, the event time, the other value columns, then the
        per-row gap (int64 microseconds) when the gap is dynamic."""
        named = dict(zip(self.key_columns, self.key_types, strict=True))
        named[self.time_column] = self.time_type
        for name, data_type in zip(self.value_columns, self.value_types, strict=True):
            named.setdefault(name, data_type)
        if self.gap_column is not None:
            named[self.gap_column] = T.LongType()
        return pa.schema([pa.field(n, columns.arrow_type(t, self.timezone))
                          for n, t in named.items()])

    def input_table(self, batches: Iterable[pa.RecordBatch]) -> pa.Table:
        """The rows a task received, as one table of :meth:`arrow_input_schema`.

        Spark sends a column that cannot be null (a literal, ``coalesce``, a Parquet REQUIRED
        field) as a non-nullable Arrow field, so batches may differ from the input schema, and
        from each other, in nullability alone: each is brought to the schema here, the one edge
        where the adapter receives rows.
        """
        schema = self.arrow_input_schema()
        return pa.Table.from_batches([conform(batch, schema) for batch in batches], schema)

    def ceil_gap_ms(self) -> int:
        """The largest gap an event can have, rounded up to whole milliseconds."""
        return math.ceil(self.max_gap_us / US_PER_MS)


def conform(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """``batch`` with ``schema``, which names the same columns in the same order and may differ
    in nullability (of a column or of a nested element) only."""
    if batch.schema.equals(schema):
        return batch
    arrays = [column if column.type.equals(target.type) else column.cast(target.type)
              for column, target in zip(batch.columns, schema, strict=True)]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


@dataclass
class Rows:
    """One batch of rows in engine form, and what was dropped on the way (counted)."""

    keys: list[Any]
    values: list[Any]
    times_us: Any
    max_time_us: int | None
    null_times: int
    null_keys: int
    gaps_us: list[int | None] | None = None  # per row, when the gap is dynamic


def engine_rows(config: SessionizeConfig, table: pa.Table | pa.RecordBatch,
                sort: bool = False) -> Rows:
    """Keys, values and int64 microsecond times of one Arrow batch of input rows.

    Rows with a null event time or a null key are dropped and counted (Spark's
    ``session_window`` also drops null times). With ``sort``, rows are put in one canonical order
    (time, then keys and values) so that a replay of the same rows repeats the same output.
    With a dynamic gap, the rows' gaps come along (null and non-positive ones too: the engine
    drops and counts those, as native ``session_window`` filters them).

    Raises:
        ValueError: a row's gap exceeds ``max_gap`` (naming the gap, the row and both values);
            nothing has reached the engine then.
    """
    time_array = table.column(config.time_column)
    valid = pc.is_valid(time_array)
    null_times = len(time_array) - int(pc.sum(valid).as_py() or 0)
    for name in config.key_columns:
        valid = pc.and_(valid, pc.is_valid(table.column(name)))
    kept_count = int(pc.sum(valid).as_py() or 0)
    null_keys = len(time_array) - null_times - kept_count
    if kept_count != len(time_array):
        table = table.filter(valid)
    if sort and table.num_rows > 1:
        sortable = [config.time_column, *config.key_columns,
                    *[c for c, t in zip(config.value_columns, config.value_types, strict=True)
                      if columns.is_simple(t) and c not in config.key_columns]]
        if config.gap_column is not None:
            sortable.append(config.gap_column)
        table = table.take(pc.sort_indices(table, sort_keys=[(c, "ascending")
                                                             for c in dict.fromkeys(sortable)]))
    gaps = None if config.gap_column is None else checked_gaps(config, table)
    times = table.column(config.time_column).cast(pa.int64()).to_numpy()
    key_lists = [columns.key_to_engine(table.column(k), t)
                 for k, t in zip(config.key_columns, config.key_types, strict=True)]
    keys = key_lists[0] if len(key_lists) == 1 else list(zip(*key_lists, strict=True))
    if config.value_columns:
        value_lists = [columns.to_engine(table.column(c), t)
                       for c, t in zip(config.value_columns, config.value_types, strict=True)]
        values: list[Any] = list(zip(*value_lists, strict=True))
    else:
        values = [None] * table.num_rows
    max_time = int(times.max()) if len(times) else None
    return Rows(keys, values, times, max_time, null_times, null_keys, gaps)


def checked_gaps(config: SessionizeConfig, table: pa.Table | pa.RecordBatch) -> list[int | None]:
    """The per-row gaps (us) of ``table``, none of them over ``max_gap``.

    Raises:
        ValueError: see :func:`check_gap_bound`.
    """
    assert config.gap_column is not None
    check_gap_bound(config, table)
    return list(table.column(config.gap_column).to_pylist())


def null_keys_message(key_columns: list[str]) -> str:
    """The refusal of a static input with a null key (every front end of it says this)."""
    return f"key column(s) {key_columns} hold nulls; sessionize needs every key set"


def check_gap_bound(config: SessionizeConfig, table: pa.Table | pa.RecordBatch) -> None:
    """Refuse a per-row gap over ``max_gap`` before any row of ``table`` reaches the engine.

    Raises:
        ValueError: naming the gap expression, the first offending row (key and time) and both
            values.
    """
    assert config.gap_column is not None
    gaps = table.column(config.gap_column)
    over = pc.fill_null(pc.greater(gaps, config.max_gap_us), False)
    if pc.any(over).as_py():
        row = int(pc.index(over, True).as_py())
        key = [table.column(k)[row].as_py() for k in config.key_columns]
        raise ValueError(
            f"gap {config.gap_description} is {gaps[row].as_py()} us for the row with key "
            f"{key[0] if len(key) == 1 else tuple(key)!r} at "
            f"{config.time_column}={table.column(config.time_column)[row].as_py()}, over "
            f"max_gap={config.max_gap_us} us; raise max_gap or bound the gap expression"
        )


def emits_batch(config: SessionizeConfig, emits: list[Emit]) -> pa.RecordBatch:
    """The output rows, typed as :meth:`SessionizeConfig.output_schema` says."""
    tz = config.timezone
    arrays: list[pa.Array] = []
    keys = [e.session.key for e in emits]
    for i, (name, data_type) in enumerate(zip(config.key_columns, config.key_types,
                                               strict=True)):
        del name
        column = keys if len(config.key_columns) == 1 else [k[i] for k in keys]
        arrays.append(columns.key_from_engine(column, data_type, tz))
    arrays.append(columns.from_engine([e.session.start for e in emits], config.time_type, tz))
    arrays.append(columns.from_engine([e.session.end for e in emits], config.time_type, tz))
    for name, out_field in zip(config.output_names, config.output_fields, strict=True):
        values = [e.value[name] for e in emits]
        if name in config.json_outputs:
            values = [json.dumps(v) for v in values]
        arrays.append(columns.from_engine(values, out_field.dataType, tz))
    if config.emit == "update":
        arrays.append(pa.array([e.retraction for e in emits], pa.bool_()))
    if config.trigger is not None:
        panes = [e.pane for e in emits]
        arrays.append(pa.array([p.timing.value if p else None for p in panes], pa.string()))
        arrays.append(pa.array([p.index if p else None for p in panes], pa.int64()))
        arrays.append(pa.array([p.is_first if p else None for p in panes], pa.bool_()))
        arrays.append(pa.array([p.is_last if p else None for p in panes], pa.bool_()))
    return pa.RecordBatch.from_arrays(arrays, schema=config.arrow_output_schema())
