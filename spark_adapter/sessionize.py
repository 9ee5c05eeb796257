"""``sessionize(df, ...)``: session windows on a static or streaming Spark DataFrame."""

from __future__ import annotations

import datetime as dt
import decimal
import logging
import re
from collections.abc import Mapping, Sequence
from functools import partial
from operator import itemgetter
from typing import Any, NamedTuple

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sessionstore import (
    AccumulationMode,
    AfterWatermark,
    InMemorySessionStore,
    SessionAggregator,
    aggregations,
    aggspec,
)
from sessionstore.aggregations import Aggregation
from sessionstore.timeutil import INT64_MAX, duration_fraction, duration_ms

from . import arrow, columns, static_columnar
from .config import (
    STATIC_MAX_GAP_US,
    STATIC_RETENTION_US,
    US_PER_MS,
    SessionizeConfig,
    duration_us,
    engine_arguments,
    null_keys_message,
)
from .provider import open_filesystem
from .state import canonical_settings, config_digest

log = logging.getLogger(__name__)

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
GAP_COLUMN = "sessionstore_gap_us"  # hidden: each row's gap in microseconds
END_SCRATCH = "sessionstore_gap_end"  # hidden, briefly: each row's window end
# what native casts to a gap; PySpark 3.5 has no Python type for a calendar interval (such a
# column cannot reach this check there), so the tuple is built from what the version has
GAP_TYPES: tuple[type[T.DataType], ...] = tuple(
    t for t in (T.StringType, getattr(T, "CalendarIntervalType", None), T.NullType)
    if t is not None)


class DynamicGap(NamedTuple):
    """A per-row gap: the input with the hidden gap column, and what is known of the gap."""

    frame: DataFrame  # the input with GAP_COLUMN
    description: str  # how the gap was given, for messages
    bound_us: int | None  # the largest gap a row can get, when the gap is a literal string


#: How far a day added in a time zone can stretch past 24 hours (or shrink): the widest spread
#: of UTC offsets, UTC-12 to UTC+14.
OFFSET_SPREAD_US = 26 * 3600 * 1_000_000
# Spark's text form of an interval: its months, days and microseconds, term by term
_INTERVAL_TERM = re.compile(r"(-?[0-9]+(?:\.[0-9]+)?) (years|months|days|hours|minutes|seconds)")
_INTERVAL_UNITS = {"years": (0, 12), "months": (0, 1), "days": (1, 1),
                   "hours": (2, 3_600_000_000), "minutes": (2, 60_000_000),
                   "seconds": (2, 1_000_000)}
# session time zones with one offset for ever ("UTC", "Z", "+05:00", "Etc/GMT-3", "UTC+8")
_FIXED_ZONE = re.compile(r"(?:Z|(?:(?:Etc/)?(?:UTC|GMT|UCT|UT))?(?:[+-]\d{1,2}(?::?\d{2}){0,2})?)")


def _days_are_exact(df: DataFrame, timestamp: str) -> bool:
    """Whether native adds a day to ``timestamp`` as exactly 24 hours: on a timestamp_ntz (no
    zone), or in a session time zone that never changes its offset."""
    if isinstance(df.schema[timestamp].dataType, T.TimestampNTZType):
        return True
    zone = df.sparkSession.conf.get("spark.sql.session.timeZone") or "UTC"
    return _FIXED_ZONE.fullmatch(zone) is not None


def _interval_fields(spark: SparkSession, text: str) -> tuple[int, int, int] | None:
    """(months, days, microseconds) of the interval native ``session_window`` reads from the
    gap string ``text`` (``CAST(text AS INTERVAL)``), asked of Spark itself; None when Spark
    reads no interval from it. Read from the interval's text form ("1 years 2 months 3 days
    4 hours 5.000006 seconds"): ``extract`` would fold whole days of hours into the days."""
    # a local relation (no SQL parameters, which Spark < 3.5 takes otherwise): no job runs
    shown = spark.createDataFrame([(text,)], "gap string").selectExpr(
        "CAST(TRY_CAST(gap AS INTERVAL) AS STRING) AS i").collect()[0].i
    if shown is None:
        return None
    fields = [0, 0, 0]
    for number, unit in _INTERVAL_TERM.findall(shown):
        field, scale = _INTERVAL_UNITS[unit]
        fields[field] += int(decimal.Decimal(number) * scale)
    return fields[0], fields[1], fields[2]


def _dynamic_gap(df: DataFrame, gap: Any, timestamp: str) -> DynamicGap | None:
    """``None`` for a fixed gap, else the input with the hidden per-row gap column.

    A fixed gap is an int (ms), a ``timedelta`` or numpy ``timedelta64`` (exact: native refuses
    a day-time interval as a gap, so it has no calendar meaning) or a duration string that
    native reads as an exact length. Anything else that gives a duration string or an interval
    per row (a ``Column``, or a SQL expression string that is not a duration) is dynamic, with
    the meaning of native ``session_window(ts, gapExpr)`` (SPARK-36465): the row's window is
    ``[ts, ts + CAST(gap AS INTERVAL))``, added in the session time zone as Spark adds it
    (months and days are calendar units), and its gap is that window's length in
    microseconds: null when the expression is null or no interval, <= 0 when the interval is
    (native filters both out). So is a literal string whose interval has months, or days that
    the zone can make 23 or 25 hours long (``"1 day"`` across a daylight-saving change; as
    native's ``session_window(ts, "1 day")``); its bound is then known: ``bound_us``.

    Raises:
        ValueError: the expression does not resolve or has another type (naming it), a literal
            calendar gap that is never > 0.
        TypeError: ``gap`` is of no accepted type.
    """
    bound_us: int | None = None
    if isinstance(gap, Column):
        column, description = gap, f"{gap}"
    elif isinstance(gap, str):
        not_duration: ValueError | None = None
        try:
            duration_us(gap, "gap")
        except ValueError as exc:
            not_duration = exc
        # native casts a literal gap string to an interval: one with months, or with days that
        # the session zone can make 23 or 25 hours long, is a per-row gap there too
        fields = None if not_duration is None and _days_are_exact(df, timestamp) else \
            _interval_fields(df.sparkSession, gap)
        if fields is not None and fields[:2] != (0, 0):
            months, days, exact_us = fields
            if months <= 0 and days <= 0 and exact_us <= 0:
                raise ValueError(f"gap must be > 0, got {gap!r}")
            column, description = F.lit(gap), repr(gap)
            # a month is at most 31 days; a day 24 hours, give or take the widest offset change
            bound_us = max(1, max(months, 0) * 31 * 86_400_000_000
                           + max(days, 0) * 86_400_000_000 + exact_us + OFFSET_SPREAD_US)
        elif not_duration is None:
            return None  # what native reads from it, if anything, is an exact length
        else:
            try:
                column, description = F.expr(gap), repr(gap)
                df.select(column).schema  # noqa: B018 - resolves it: errors surface here
            except Exception as exc:  # a parse or analysis error of Spark's own
                raise ValueError(
                    f"gap {gap!r} is neither a duration ({not_duration}) nor a SQL expression "
                    f"of this DataFrame ({_first_line(exc)})") from None
    elif (isinstance(gap, dt.timedelta | int) and not isinstance(gap, bool)) \
            or duration_fraction(gap, "gap") is not None:  # a numpy timedelta64
        return None
    else:
        raise TypeError(f"gap must be milliseconds (int), a timedelta, a duration string, a "
                        f"Column or a SQL expression string, got {gap!r} ({type(gap).__name__})")
    try:
        gap_type = df.select(column.alias("gap")).schema.fields[0].dataType
    except Exception as exc:
        raise ValueError(f"gap {description} does not resolve against the DataFrame: "
                         f"{_first_line(exc)}") from None
    if not isinstance(gap_type, GAP_TYPES):
        raise ValueError(
            f"gap {description} has type {gap_type.simpleString()}; a per-row gap must be a "
            f"duration string ('5 seconds') or a calendar interval (INTERVAL '5' SECOND, "
            f"F.lit('1 month')), as for Spark's session_window")
    for hidden in (GAP_COLUMN, END_SCRATCH):
        if hidden in df.columns:
            raise ValueError(f"the DataFrame has a column named {hidden!r}, which sessionize "
                             f"uses for a dynamic gap; rename it")
    ts = F.col(columns.quote(timestamp))
    with_end = df.withColumn(END_SCRATCH, ts + column.cast("interval"))
    if isinstance(df.schema[timestamp].dataType, T.TimestampNTZType):
        # no time zone: the difference of the wall-clock micros, as native's
        micros = F.expr(f"timestampdiff(MICROSECOND, {columns.quote(timestamp)}, {END_SCRATCH})")
    else:
        micros = F.unix_micros(F.col(END_SCRATCH)) - F.unix_micros(ts)
    return DynamicGap(with_end.withColumn(GAP_COLUMN, micros).drop(END_SCRATCH), description,
                      bound_us)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _plan_aggregations(
    df: DataFrame, spec: Mapping[str, Any], key_columns: list[str], timestamp: str
) -> tuple[Aggregation, list[str], list[str], list[T.StructField], list[str]]:
    """Turn the user's ``aggregations`` mapping into one combined engine aggregation, parsed and
    built by the language the CLI shares (``sessionstore.aggspec``); output types are Spark's.

    Returns (aggregation, value columns, output names, output fields, JSON-encoded outputs).
    Built-in aggregations read only the columns they name; a ``sessionstore.aggregations`` object
    sees every column but the key and time columns, as a dict.
    """
    specs = aggspec.from_mapping(spec)
    schema = {f.name: f.dataType for f in df.schema.fields}
    value_columns: list[str] = []
    if any(s.kind == aggspec.CUSTOM for s in specs):
        value_columns = [c for c in schema if c not in key_columns and c != timestamp]
    for item in specs:
        if item.column is not None and item.column not in schema:
            raise ValueError(f"aggregation {item.name!r} names column {item.column!r}, which the "
                             f"DataFrame does not have (columns: {sorted(schema)})")
        if item.column is not None and item.column not in value_columns:
            value_columns.append(item.column)
    parts: dict[str, Aggregation] = {}
    fields: list[T.StructField] = []
    json_outputs: list[str] = []
    for item in specs:
        if item.kind == "count":
            parts[item.name] = aggregations.count()
            fields.append(T.StructField(item.name, T.LongType()))
        elif item.kind == aggspec.CUSTOM:
            assert item.custom is not None
            for col in value_columns:
                columns.check_custom_input(item.name, col, schema[col])
            parts[item.name] = aggspec.WholeRow(item.custom, value_columns)
            fields.append(T.StructField(item.name, T.StringType()))
            json_outputs.append(item.name)
        else:
            assert item.column is not None
            out_type = columns.output_type(item.name, item.kind, item.column, schema[item.column])
            parts[item.name] = aggspec.KINDS[item.kind].build(
                itemgetter(value_columns.index(item.column)))
            fields.append(T.StructField(item.name, out_type))
    return aggregations.combine(parts), value_columns, list(parts), fields, json_outputs


def sessionize(
    df: DataFrame,
    *,
    key: str | Sequence[str],
    timestamp: str,
    gap: str | dt.timedelta | int | Column,
    aggregations: Mapping[str, Any],
    emit: str = "final",
    watermark_delay: str | dt.timedelta | None = None,
    inclusive_gap: bool = True,
    state_location: str | None = None,
    n_buckets: int | None = None,
    local_dir: str | None = None,
    trigger: AfterWatermark | None = None,
    accumulation: AccumulationMode | None = None,
    engine: str = "arrow",
    max_gap: str | dt.timedelta | int | None = None,
    max_duration: str | dt.timedelta | int | None = None,
    state_version: str | None = None,
) -> DataFrame:
    """Session windows over ``df``, static or streaming, with the sessionstore engine.

    Args:
        key: the key column, or a list of them.
        timestamp: the event-time column (a timestamp or timestamp_ntz; on a static DataFrame
            also a date, taken as native takes it: midnight in the session time zone, with
            timestamp session bounds). Rows whose time is null are dropped (as Spark's
            ``session_window`` does) and counted.
        gap: the inactivity gap: ``"10 minutes"``, ``"250 microseconds"``, a ``timedelta``
            (a pandas ``Timedelta`` or numpy ``timedelta64`` too; exact: one that is not a
            whole number of microseconds is refused) or an int of milliseconds. A string
            means what native ``session_window(ts, gap)`` makes of it: days and months
            (``"1 day"``, ``"1 month"``) are calendar units added in the session time zone, so
            a day is 23 or 25 hours across a daylight-saving change (exactly 24 on a
            timestamp_ntz or in a fixed-offset zone), and each row gets its own window length,
            bounded without ``max_gap``. Or a per-row gap, as native
            ``session_window(ts, gapExpr)`` takes it: a ``Column`` or a SQL expression string
            (one that is not a duration) giving a duration string or a calendar interval, e.g.
            ``F.col("duration")`` or ``F.when(F.col("kind") == "a", "5 seconds")
            .otherwise("20 seconds")``. A row's window is then ``[t, t + gap(row))``, a session
            ends at the largest ``t + gap`` of its rows, and a row is late when its own window
            end is at or before the watermark. Rows whose gap is null or <= 0 are dropped and
            counted (``invalid_gaps_dropped``, also in ``dropped_records``), as native filters
            them. A dynamic gap on a stream needs ``max_gap``.
        aggregations: output name -> ``"count"``, ``(kind, column)`` with kind one of sum, min,
            max, first, last, collect, or a ``sessionstore.aggregations`` object (called with each
            row as a dict of the columns the other aggregations use; its result is a JSON string).
        emit: ``"final"`` (each session once, when Spark's watermark passes its end; use
            ``outputMode("append")``) or ``"update"`` (every change plus retractions, with a
            ``retracted`` column; use ``outputMode("update")``).
        watermark_delay: required for streaming input: how far Spark's watermark trails the
            largest event time (whole milliseconds, as Spark's own watermark).
        inclusive_gap: events exactly ``gap`` apart share a session (as Spark's session_window).
        state_location: the base under which versioned snapshots go (a path or a
            ``pyarrow.fs`` URI such as ``s3://bucket/prefix``), visible to every executor.
            Defaults to ``<spark.sql.streaming.checkpointLocation>/sessionstore`` when that is
            set. Each streaming query keeps its state in its own ``query-<query id>`` under it
            (the id Spark keeps in the query's checkpoint), so two queries never share state
            and a restart from the same checkpoint finds its own. The first run pins
            ``n_buckets``, the partition count and a digest of the configuration there; a
            restart with other values fails (``StateLayoutMismatchError``, naming both values).
        n_buckets: ``engine="processor"`` only: how many groups rows are spread over (default:
            4 x shuffle partitions). The Arrow engine uses one engine per shuffle partition.
        local_dir: where executors keep working copies (default: a temp directory).
        trigger: a Beam ``AfterWatermark(early=..., late=...)``; replaces ``emit`` and adds
            ``pane_timing``, ``pane_index``, ``pane_is_first`` and ``pane_is_last`` columns.
            Processing-time sub-triggers are evaluated at micro-batch boundaries.
        accumulation: the trigger's ``AccumulationMode`` (DISCARDING by default).
        engine: ``"arrow"`` (default: ``mapInArrow`` over the key-partitioned input, state in
            this project's versioned store; Spark >= 3.5, static input 3.3) or ``"processor"``
            (``transformWithStateInPandas`` with Spark-managed timers; Spark >= 4). Both give
            the same rows on the same input.
        max_gap: with a per-row gap on a streaming DataFrame, required: the largest gap a row
            may have (a duration, as ``gap``). State is kept long enough for it; a row whose gap
            exceeds it fails the task (or the query) with a ``ValueError`` naming the gap
            expression, the row and both values. Optional on a static DataFrame, which retains
            nothing (as native, no bound is needed then). Refused with a gap that is no
            ``Column`` or expression (its bound is known).
        max_duration: a session never spans more than this (a duration, as ``gap``): per key,
            in event-time order, a row joins the current session only if it is gap-connected to
            it *and* earlier than the session's start + ``max_duration``; otherwise it starts a
            new session. The end is ``min(largest t + gap, start + max_duration)``. Whatever the
            arrival order, the sessions equal this offline rule over the rows that are not late.
        state_version: what the stored state of an aggregation object means, when sessionize
            cannot tell (an object built on a Python function: ``sum_of(lambda r: ...)``,
            ``aggregate(...)``, ``reduce(...)``, a subclass). Required then for a streaming
            DataFrame, and pinned like the rest of the configuration: change it whenever such a
            function changes what it stores, and a restart from the old checkpoint is refused
            (``StateLayoutMismatchError``, naming the old and the new version) instead of
            misreading the state. Built-in aggregations (``"count"``, ``(kind, column)``,
            ``count()`` and ``sum_of(column=...)`` style objects) are pinned by what they are.

    Returns:
        The key column(s), ``session_start`` and ``session_end`` (of the time column's type;
        the end is exclusive, last event + gap), then one column per aggregation, typed as
        Spark's own aggregate functions type them.

    Raises:
        ValueError: a missing column, a non-timestamp time column, a bad gap or aggregation, a
            column type an aggregation cannot use (naming the column and its type), a streaming
            input without ``watermark_delay``, null keys in a static input (the Arrow engine's
            tasks raise it when the job runs, naming the key columns, so that no extra pass
            reads the input; ``engine="processor"`` checks in the call), a per-row gap on a
            stream without ``max_gap`` or of a type that is no duration (naming it), a gap,
            ``max_gap``, ``max_duration`` or ``watermark_delay`` so large that the state's
            retention would not fit int64 (naming them), an input column named like one of
            the hidden columns sessionize adds (naming it).
    """
    if not isinstance(df, DataFrame):
        raise TypeError(f"df must be a pyspark DataFrame, got {type(df).__name__}")
    if not isinstance(key, str | list | tuple):
        raise TypeError(f"key must be a column name or a list of them, got {key!r}")
    key_columns = [key] if isinstance(key, str) else list(key)
    if not key_columns or not all(isinstance(k, str) for k in key_columns):
        raise ValueError(f"key must be a column name or a list of them, got {key!r}")
    if engine not in ("arrow", "processor"):
        raise ValueError(f"engine must be 'arrow' or 'processor', got {engine!r}")
    schema = {f.name: f.dataType for f in df.schema.fields}
    for column in [*key_columns, timestamp]:
        if column not in schema:
            raise ValueError(f"column {column!r} is not in the DataFrame (columns: "
                             f"{sorted(schema)})")
    source = df  # what aggregations read: a date time column stays a date there, as native's
    # a static date time column: cast as native casts it, into a hidden column beside it
    df, time_column = columns.event_time_column(df, timestamp)
    schema[time_column] = df.schema[time_column].dataType
    for column in key_columns:
        columns.check_key_type(column, schema[column])
    if not isinstance(schema[time_column], columns.TIMES):
        raise ValueError(f"timestamp column {timestamp!r} must be a timestamp, got "
                         f"{schema[time_column].simpleString()}")
    dynamic = _dynamic_gap(df, gap, time_column)
    gap_us: int | None = None
    literal = dynamic is None or dynamic.bound_us is not None  # a gap the user wrote out
    if literal and max_gap is not None:
        raise ValueError(f"max_gap bounds a per-row gap; gap={gap!r} is fixed, leave "
                         f"max_gap out")
    if dynamic is None:
        gap_us = duration_us(gap, "gap")
        if gap_us <= 0:
            raise ValueError(f"gap must be > 0, got {gap_us} us")
        max_gap_us = gap_us
    elif dynamic.bound_us is not None:  # calendar units: their longest is known
        max_gap_us = dynamic.bound_us
    elif max_gap is None:
        if df.isStreaming:
            raise ValueError(f"gap {dynamic[1]} is per row: give max_gap=, the largest gap a row "
                             f"may have (state is kept for it, and larger gaps are refused)")
        max_gap_us = STATIC_MAX_GAP_US  # a static query retains nothing: no bound is needed
    else:
        max_gap_us = duration_us(max_gap, "max_gap")
        if max_gap_us <= 0:
            raise ValueError(f"max_gap must be > 0, got {max_gap_us} us")
    max_duration_us = None if max_duration is None else duration_us(max_duration,
                                                                     "max_duration")
    if max_duration_us is not None and max_duration_us <= 0:
        raise ValueError(f"max_duration must be > 0, got {max_duration_us} us")
    if emit not in ("final", "update"):
        raise ValueError(f"emit must be 'final' or 'update', got {emit!r}")
    if trigger is not None and not isinstance(trigger, AfterWatermark):
        raise TypeError(f"trigger must be AfterWatermark(...), got {type(trigger).__name__}")
    if accumulation is not None and trigger is None:
        raise ValueError("accumulation needs a trigger")
    if trigger is not None and emit != "final":
        raise ValueError("a trigger replaces emit: leave emit at 'final'")
    # the arguments the state's retention is made of, as the user gave them (for messages)
    retention_terms: dict[str, Any] = {"gap" if literal else "max_gap":
                                       gap if literal else max_gap,
                                       "max_duration": max_duration}
    agg, value_columns, output_names, agg_fields, json_outputs = _plan_aggregations(
        source, aggregations, key_columns, timestamp
    )
    spark = df.sparkSession
    partitions = int(spark.conf.get("spark.sql.shuffle.partitions") or "200")
    if n_buckets is None:
        n_buckets = 4 * partitions
    if isinstance(n_buckets, bool) or not isinstance(n_buckets, int) or n_buckets < 1:
        raise ValueError(f"n_buckets must be an int >= 1, got {n_buckets!r}")
    config = SessionizeConfig(
        key_columns=key_columns, key_types=[schema[k] for k in key_columns],
        time_column=time_column, time_type=schema[time_column],
        value_columns=value_columns, value_types=[schema[c] for c in value_columns],
        gap_us=gap_us, inclusive_gap=bool(inclusive_gap), emit=emit, aggregation=agg,
        output_names=output_names, output_fields=agg_fields, json_outputs=json_outputs,
        timezone=spark.conf.get("spark.sql.session.timeZone") or "UTC",
        n_partitions=partitions, local_dir=local_dir, trigger=trigger,
        accumulation=accumulation, max_gap_us=max_gap_us, max_duration_us=max_duration_us,
        gap_column=None if dynamic is None else GAP_COLUMN,
        gap_description="" if dynamic is None else dynamic[1],
    )
    if not df.isStreaming:
        _check_engine(config, STATIC_RETENTION_US, retention_terms)
    config.extra[static_columnar.PARTS_KEY] = [
        (s.name, s.kind, s.column) for s in aggspec.from_mapping(aggregations)]
    parts = static_columnar.bucketed_parts(config)
    if not df.isStreaming and engine == "arrow" and parts is not None:
        # Spark reduces the rows to one per key and gap bucket first; the Arrow engine's tasks
        # refuse a null key themselves (checking here would read the whole input once more,
        # which native does not)
        return static_columnar.bucketed_frame(df, config, parts).mapInArrow(
            partial(arrow.task_entry, partial(static_columnar.bucketed_partition, config)),
            config.output_schema())
    carried = [c for c in value_columns if c not in key_columns and c != time_column]
    # each column once (a key may be the time column too), each name quoted for Spark
    selected_names = [columns.quote(c) for c in dict.fromkeys([*key_columns, time_column,
                                                                *carried])]
    if dynamic is None:
        selected = df.select(*selected_names)
    else:  # the gap is computed on the input, whose columns the expression may read
        selected = dynamic[0].select(*selected_names, GAP_COLUMN)
    key_refs = [F.col(columns.quote(k)) for k in key_columns]
    if not df.isStreaming:
        if engine == "processor":
            _refuse_null_keys(df, key_columns)
            from .processor import static_frames
            bucketed = selected.withColumn(BUCKET_COLUMN, _bucket(key_columns, n_buckets))
            return arrow.positional(bucketed, (BUCKET_COLUMN,)).groupBy(BUCKET_COLUMN) \
                .applyInPandas(static_frames(config, bucketed.columns), config.output_schema())
        # the Arrow engine's tasks refuse a null key themselves (arrow.static_partition)
        return arrow.map_in_arrow(selected.repartition(partitions, *key_refs),
                                  partial(arrow.static_partition, config),
                                  config.output_schema())

    if watermark_delay is None:
        raise ValueError("watermark_delay is required for a streaming DataFrame: sessions are "
                         "final when Spark's watermark passes their end")
    delay_ms = duration_ms(watermark_delay, "watermark_delay")
    if delay_ms < 0:
        raise ValueError(f"watermark_delay must be >= 0, got {delay_ms} ms")
    config.delay_ms = delay_ms
    retention_terms["watermark_delay"] = watermark_delay
    # a stream's store keeps each session for config.retention_us: it must fit int64
    _check_engine(config, INT64_MAX, retention_terms)
    config.state_location = _state_location(spark, state_location)
    open_filesystem(config.state_location)  # fail on the driver for a bad URI
    config.keep_versions = int(spark.conf.get("spark.sql.streaming.minBatchesToRetain") or "100")
    # the Arrow engine keeps one engine per shuffle partition: a bucket is a partition
    config.n_buckets = n_buckets if engine == "processor" else partitions
    meaning = {name: _meaning(item) for name, item in aggregations.items()
               if isinstance(item, Aggregation)}
    opaque = sorted(name for name, (_, exact) in meaning.items() if not exact)
    if state_version is not None and (not isinstance(state_version, str) or not state_version):
        raise ValueError(f"state_version must be a non-empty str, got {state_version!r}")
    if opaque and state_version is None:
        raise ValueError(
            f"aggregations {opaque} are built on Python functions, so a restart cannot tell "
            f"whether they still mean what the stored state means: give state_version= (any "
            f"string, e.g. '1'), and change it whenever such a function changes")
    pinned: dict[str, Any] = {
        "engine": engine, "key": [[k, schema[k].simpleString()] for k in key_columns],
        "timestamp": [timestamp, schema[timestamp].simpleString()],
        "values": [[c, schema[c].simpleString()] for c in value_columns],
        "gap_us": gap_us, "inclusive_gap": bool(inclusive_gap), "emit": emit,
        "aggregations": {name: _describe(item) for name, item in aggregations.items()},
        "trigger": repr(trigger), "accumulation": repr(accumulation),
    }
    # only when used, so that the digest of a query without them is what it always was
    if dynamic is not None:
        pinned["gap"], pinned["max_gap_us"] = dynamic[1], max_gap_us
    if max_duration_us is not None:
        pinned["max_duration_us"] = max_duration_us
    if meaning:  # only when used, as above: what each object's stored state holds
        pinned["aggregation_state"] = {name: description
                                       for name, (description, _) in meaning.items()}
    if state_version is not None:
        pinned["state_version"] = state_version
    if engine == "arrow" and static_columnar.columnar_parts(config) is not None:
        # the stored accumulators are the columnar path's (see static_columnar)
        pinned["state_layout"] = "columnar"
    if engine == "arrow":
        # which keys each partition's store holds: PARTITION_COLUMN's hash of the key (earlier
        # versions hashed the key columns themselves, so their state is refused, never misread)
        pinned["partitioning"] = "hash-of-key-hash"
    config.layout_digest = config_digest(pinned)
    config.layout_settings = canonical_settings(pinned)
    if engine == "processor":
        return _processor_stream(spark, selected, config, n_buckets)
    # Spark's own watermark is declared on the event time, as for native session_window: it
    # reports it in the query progress and drives the no-data batches (see spark_adapter.arrow)
    if PARTITION_COLUMN in selected.columns:
        raise ValueError(f"the DataFrame has a column named {PARTITION_COLUMN!r}, which "
                         f"sessionize uses to partition a stream; rename it")
    watermarked = selected.withWatermark(columns.quote(timestamp), f"{delay_ms} milliseconds")
    # partitioned by a hash of the key in one int column, which the ticker also keys on
    keyed = watermarked.withColumn(PARTITION_COLUMN, F.hash(*[F.col(columns.quote(k))
                                                             for k in key_columns]))
    shuffled = keyed.repartition(partitions, PARTITION_COLUMN)
    # each task also reports its counters, observed into query.lastProgress (see arrow.py)
    sessions = arrow.map_in_arrow(shuffled.drop(PARTITION_COLUMN),
                                  partial(arrow.observed_stream_partition, config),
                                  arrow.observed_schema(config))
    # the ticker first: the first copy of a shared exchange keeps the watermark node (_ticker)
    ticker = _ticker(keyed, shuffled, config)
    return arrow.observe_counters(ticker.unionByName(sessions))


BUCKET_COLUMN = "sessionstore_bucket"
PARTITION_COLUMN = "sessionstore_partition_key"  # hidden: what the stream is partitioned by


def _refuse_null_keys(df: DataFrame, key_columns: list[str]) -> None:
    """Raises ValueError (naming the key columns) when a static input holds a null key."""
    keys = [F.col(columns.quote(k)) for k in key_columns]
    nulls = df.filter(F.greatest(*[k.isNull() for k in keys]) if len(keys) > 1
                      else keys[0].isNull()).limit(1).count()
    if nulls:
        raise ValueError(null_keys_message(key_columns))


def _check_engine(config: SessionizeConfig, store_retention_us: int,
                  retention_terms: Mapping[str, Any]) -> None:
    """Build the engine once on the driver, on a store of the retention its tasks give theirs,
    so that a combination it refuses (say, a trigger with ``max_duration``) fails here, with the
    engine's message, before any task runs.

    Raises:
        ValueError: the state's retention (the engine's rule, ``config.retention_us``: the
            largest gap + ``max_duration`` + ``watermark_delay``) exceeds ``store_retention_us``,
            naming the arguments it is made of and their values; or the engine refuses the
            settings.
    """
    try:
        needed: int | str = config.retention_us
    except ValueError:  # the engine's windows refuse a gap + max_duration beyond int64
        needed = "more than int64"
    if not isinstance(needed, int) or needed > store_retention_us:
        named = [name for name, value in retention_terms.items() if value is not None]
        given = ", ".join(f"{name}={retention_terms[name]!r}" for name in named)
        raise ValueError(
            f"sessionize: {given} need state kept {needed} us after a session ends (the largest "
            f"gap + max_duration + watermark_delay), beyond the {store_retention_us} us a store "
            f"can keep; make {' or '.join(named)} smaller")
    try:
        store = InMemorySessionStore(**engine_arguments(retention_us=store_retention_us))
        SessionAggregator(store, config.windows(), config.aggregation, watermark="external",
                          **config.engine_options())
    except (TypeError, ValueError) as exc:
        raise ValueError(f"sessionize: the engine refuses these settings: {exc}") from exc


def _bucket(key_columns: list[str], n_buckets: int) -> Any:
    return F.pmod(F.hash(*[F.col(columns.quote(k)) for k in key_columns]), F.lit(n_buckets))


def _ticker(watermarked: DataFrame, shuffled: DataFrame, config: SessionizeConfig) -> DataFrame:
    """An always-empty streaming deduplication that shares the Arrow engine's shuffle, with the
    engine's output columns (all null) and the counters column.

    It is the plan's one stateful operator, so Spark runs a no-data micro-batch whenever the
    watermark advances, as it does for native session_window (a deduplication within the
    watermark asks for one on the same condition as an aggregation in append mode). Spark's
    rules shape it:

    * It deduplicates on the column the input is partitioned by (``PARTITION_COLUMN``, a hash
      of the key), so the shuffle already gives it the distribution it needs: no exchange and
      no stage of its own (an aggregation keyed by a window would need both). Its state key is
      that int whatever the key columns, so a restart with other key columns reaches
      ``sessionize``'s layout check (which names them) instead of failing Spark's state schema
      check first.
    * Spark's watermark is the minimum over every watermark node it executes, and a node that
      never sees a row holds it at 0 (on Spark 3.5 the two branches' copies of one
      ``withWatermark`` count as two nodes). So the filter that keeps no row sits above the
      watermark node: it is non-deterministic, so never pushed below it, and not one the
      optimizer can prove false (``rand() < -1`` is folded to false and pushed to the scan).
    * A stateful operator's eviction watermark comes from the watermark node in its own branch,
      and when Spark reuses an exchange, only the first copy (in plan order) keeps its subtree:
      so ``sessionize`` puts the ticker first in the union, and the Arrow engine reads the
      reused shuffle (its tasks come after the ticker's ``n_partitions``; see
      :func:`spark_adapter.arrow.task_partition`).
    * Spark runs the shuffle once only if both branches read the same columns, so the ticker's
      counters column reads every column, under a condition that never holds and that the
      optimizer cannot fold away (column pruning would otherwise shuffle two column sets).

    With exchange reuse disabled (``spark.sql.exchange.reuse=false``) the ticker reads its own
    copy of the input instead, filtered before its own shuffle (Spark then reports the input
    rows twice).
    """
    spark = shuffled.sparkSession
    reuse = (spark.conf.get("spark.sql.exchange.reuse", "true") or "true").lower() != "false"
    never = F.spark_partition_id() < F.lit(0)
    deduplicated = (shuffled if reuse else watermarked).filter(never) \
        .dropDuplicatesWithinWatermark([PARTITION_COLUMN])
    every_column = F.xxhash64(*[F.col(columns.quote(c)) for c in shuffled.columns])
    counters = F.when(never, F.struct(*[every_column.alias(name)
                                        for name in arrow.OBSERVED_COUNTERS]))
    return deduplicated.select(*[F.lit(None).cast(f.dataType).alias(f.name)
                                 for f in config.output_schema().fields],
                               counters.cast(arrow.counters_type()).alias(arrow.COUNTERS_COLUMN))


def _processor_stream(spark: SparkSession, selected: DataFrame, config: SessionizeConfig,
                      n_buckets: int) -> DataFrame:
    """The ``transformWithStateInPandas`` engine (Spark >= 4)."""
    try:
        from .processor import WINDOW_END_COLUMN, SessionizeProcessor
    except ImportError as exc:
        raise ValueError(f"engine='processor' needs transformWithStateInPandas (Spark >= 4): "
                         f"{exc}") from None
    provider = spark.conf.get("spark.sql.streaming.stateStore.providerClass", None)
    if provider != ROCKSDB_PROVIDER:
        raise ValueError(
            "engine='processor' (transformWithStateInPandas) needs "
            f"spark.sql.streaming.stateStore.providerClass={ROCKSDB_PROVIDER}; set it on the "
            "SparkSession before starting the query"
        )
    # Spark drops rows whose *declared* column is at or behind the previous batch's watermark.
    # Declared on the event's own window end, t + gap (rounded up to whole ms) with the delay
    # grown by the same amount, the watermark value equals native's and the rows Spark drops
    # are exactly native's late rows. With a per-row gap it is declared on t + max_gap: the
    # value is still native's, Spark drops only rows late by any gap, and the engine, which
    # processes rows at the previous watermark (see spark_adapter.processor), drops the others
    # whose own t + gap is late.
    ceil_gap_ms = config.ceil_gap_ms()
    time = F.col(columns.quote(config.time_column))
    end = F.timestamp_micros(F.unix_micros(time.cast("timestamp")) + F.lit(ceil_gap_ms * US_PER_MS))
    watermarked = selected.withColumn(WINDOW_END_COLUMN, end).withWatermark(
        WINDOW_END_COLUMN, f"{config.delay_ms + ceil_gap_ms} milliseconds")
    bucketed = watermarked.withColumn(BUCKET_COLUMN, _bucket(config.key_columns, n_buckets))
    # every bucket, as the first batch's initial state: each arms its heartbeat there, rows or
    # not, so that every partition's engine holds the previous batch's watermark when rows come
    every_bucket = spark.range(n_buckets).select(
        F.col("id").cast(bucketed.schema[BUCKET_COLUMN].dataType).alias(BUCKET_COLUMN))
    ours = (BUCKET_COLUMN, WINDOW_END_COLUMN)
    return arrow.positional(bucketed, ours).groupBy(BUCKET_COLUMN).transformWithStateInPandas(
        SessionizeProcessor(config, bucketed.columns), config.output_schema(),
        "append" if config.emit == "final" else "update", "EventTime",
        initialState=every_bucket.groupBy(BUCKET_COLUMN),
    )


def _describe(item: Any) -> Any:
    """An aggregation as the layout digest sees it: stable across processes (no addresses)."""
    if isinstance(item, Aggregation):
        return f"{type(item).__module__}.{type(item).__qualname__}:{getattr(item, 'name', '')}"
    return list(item) if isinstance(item, tuple) else item


def _meaning(item: Aggregation) -> tuple[Any, bool]:
    """What an aggregation object's stored accumulator holds, for the layout digest, and whether
    that description is exact.

    A built-in of ``sessionstore.aggregations`` that reads a named column (``sum_of(column=
    "amount")``) or nothing (``count()``) is described exactly, and so is a ``combine`` of such
    parts. Anything built on a Python function (``sum_of(lambda r: ...)``, ``aggregate``,
    ``reduce``, a subclass) is described by its class and name only, and is not exact: the
    caller then needs a ``state_version``.
    """
    if isinstance(item, aggregations.Combined):
        parts = {name: _meaning(part) for name, part in zip(item.names, item.parts, strict=True)}
        return ({"combine": {name: d for name, (d, _) in parts.items()}},
                all(exact for _, exact in parts.values()))
    kind = type(item)
    name = getattr(item, "name", "")
    if kind.__module__ == aggregations.__name__:
        column = getattr(item, "column", None)
        if isinstance(column, str):
            return {name: column}, True
        if name == "count" and not hasattr(item, "fn"):
            return name, True
        return {name: "a Python function"}, False
    return f"{kind.__module__}.{kind.__qualname__}:{name}", False


def _state_location(spark: SparkSession, state_location: str | None) -> str:
    """The base location; every query keeps its state in its own ``query-<id>`` under it."""
    if state_location is not None:
        return state_location
    checkpoint = spark.conf.get("spark.sql.streaming.checkpointLocation", None)
    if checkpoint:
        return checkpoint.rstrip("/") + "/sessionstore"
    raise ValueError(
        "state_location is required for a streaming DataFrame (or set "
        "spark.sql.streaming.checkpointLocation): executors must all see it, so pass a shared "
        "path or URI explicitly"
    )
