"""``sessionize(df, ...)``: session windows on a static or streaming Spark DataFrame."""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sessionstore import AccumulationMode, AfterWatermark, aggregations
from sessionstore.aggregations import Aggregation
from sessionstore.timeutil import duration_ms

from .processor import (
    BUCKET_COLUMN,
    END_MS,
    START_MS,
    TIME_MS,
    SessionizeConfig,
    SessionizeProcessor,
    static_bucket,
)
from .provider import check_name, open_filesystem

log = logging.getLogger(__name__)

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
_BUILTIN = ("sum", "min", "max", "first", "last", "collect")
_NUMERIC = (T.ByteType, T.ShortType, T.IntegerType, T.LongType, T.FloatType, T.DoubleType,
            T.DecimalType)


def _column(index: int) -> Any:
    def pick(row: Any) -> Any:
        return row[index]

    return pick


def _plan_aggregations(
    df: DataFrame, spec: Mapping[str, Any], key_columns: list[str], timestamp: str
) -> tuple[Aggregation, list[str], list[str], list[T.StructField], list[str]]:
    """Turn the user's ``aggregations`` mapping into one combined engine aggregation.

    Returns (aggregation, value columns, output names, output fields, JSON-encoded outputs).
    Built-in aggregations read only the columns they name; a ``sessionstore.aggregations`` object
    sees every column but the key and time columns, as a dict.
    """
    if not isinstance(spec, Mapping) or not spec:
        raise ValueError("aggregations must be a non-empty dict of output name -> aggregation")
    schema = {f.name: f.dataType for f in df.schema.fields}
    value_columns: list[str] = []
    if any(isinstance(item, Aggregation) for item in spec.values()):
        value_columns = [c for c in schema if c not in key_columns and c != timestamp]
    parts: dict[str, Aggregation] = {}
    fields: list[T.StructField] = []
    json_outputs: list[str] = []

    def index_of(col: Any, name: str) -> int:
        if not isinstance(col, str) or col not in schema:
            raise ValueError(f"aggregation {name!r} names column {col!r}, which the DataFrame "
                             f"does not have (columns: {sorted(schema)})")
        if col not in value_columns:
            value_columns.append(col)
        return value_columns.index(col)

    for name, item in spec.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"aggregation names must be non-empty strings, got {name!r}")
        if item == "count":
            parts[name] = aggregations.count()
            fields.append(T.StructField(name, T.LongType()))
        elif isinstance(item, tuple) and len(item) == 2 and item[0] in _BUILTIN:
            kind, col = item
            pick = _column(index_of(col, name))
            data_type = schema[col]
            if kind == "sum":
                if not isinstance(data_type, _NUMERIC):
                    raise ValueError(f"aggregation {name!r}: sum needs a numeric column, "
                                     f"{col!r} is {data_type.simpleString()}")
                out_type: T.DataType = (T.DoubleType() if isinstance(
                    data_type, T.FloatType | T.DoubleType | T.DecimalType) else T.LongType())
                parts[name] = aggregations.sum_of(pick)
            elif kind == "collect":
                out_type = T.ArrayType(data_type)
                parts[name] = aggregations.collect(pick)
            else:
                out_type = data_type
                parts[name] = {"min": aggregations.min_of, "max": aggregations.max_of,
                               "first": aggregations.first_of,
                               "last": aggregations.last_of}[kind](pick)
            fields.append(T.StructField(name, out_type))
        elif isinstance(item, Aggregation):
            parts[name] = _WholeRow(item, value_columns)
            fields.append(T.StructField(name, T.StringType()))
            json_outputs.append(name)
        else:
            raise ValueError(
                f"aggregation {name!r} must be 'count', ('sum'|'min'|'max'|'first'|'last'|"
                f"'collect', column) or a sessionstore.aggregations object, got {item!r}"
            )
    return aggregations.combine(parts), value_columns, list(parts), fields, json_outputs


class _WholeRow(Aggregation):
    """Wraps a user aggregation so that it sees each row as a dict of the value columns."""

    def __init__(self, inner: Aggregation, columns: list[str]) -> None:
        self.inner = inner
        self.columns = columns
        self.name = getattr(inner, "name", "aggregation")

    def _row(self, value: Any) -> Any:
        return dict(zip(self.columns, value, strict=True))

    def initial(self) -> Any:
        return self.inner.initial()

    def add(self, key: Any, value: Any, timestamp_ms: int, seq: int, acc: Any) -> Any:
        return self.inner.add(key, self._row(value), timestamp_ms, seq, acc)

    def merge(self, key: Any, acc1: Any, acc2: Any) -> Any:
        return self.inner.merge(key, acc1, acc2)

    def result(self, acc: Any) -> Any:
        return self.inner.result(acc)


def sessionize(
    df: DataFrame,
    *,
    key: str | Sequence[str],
    timestamp: str,
    gap: str | dt.timedelta | int,
    aggregations: Mapping[str, Any],
    emit: str = "final",
    watermark_delay: str | dt.timedelta | None = None,
    inclusive_gap: bool = True,
    state_location: str | None = None,
    n_buckets: int | None = None,
    local_dir: str | None = None,
    trigger: AfterWatermark | None = None,
    accumulation: AccumulationMode | None = None,
) -> DataFrame:
    """Session windows over ``df``, static or streaming, with the sessionstore engine.

    Args:
        key: the key column, or a list of them.
        timestamp: the event-time column (a timestamp).
        gap: the inactivity gap: ``"10 minutes"``, a ``timedelta`` or milliseconds.
        aggregations: output name -> ``"count"``, ``(kind, column)`` with kind one of sum, min,
            max, first, last, collect, or a ``sessionstore.aggregations`` object (called with each
            row as a dict of the columns the other aggregations use; its result is a JSON string).
        emit: ``"final"`` (each session once, when Spark's watermark passes its end; use
            ``outputMode("append")``) or ``"update"`` (every change plus retractions, with a
            ``retracted`` column; use ``outputMode("update")``).
        watermark_delay: required for streaming input: how far Spark's watermark trails the
            largest event time.
        inclusive_gap: events exactly ``gap`` apart share a session (as Spark's session_window).
        state_location: where versioned snapshots go (a path or a ``pyarrow.fs`` URI such as
            ``s3://bucket/prefix``), visible to every executor. Defaults to
            ``<spark.sql.streaming.checkpointLocation>/sessionstore`` when that is set.
        n_buckets: how many groups rows are spread over (default: 4 x shuffle partitions).
        local_dir: where executors keep working copies (default: a temp directory).
        trigger: a Beam ``AfterWatermark(early=..., late=...)``; replaces ``emit`` and adds
            ``pane_timing``, ``pane_index``, ``pane_is_first`` and ``pane_is_last`` columns.
            Processing-time sub-triggers are evaluated at micro-batch boundaries.
        accumulation: the trigger's ``AccumulationMode`` (DISCARDING by default).

    Returns:
        The key column(s), ``session_start`` and ``session_end`` (timestamps; the end is
        exclusive, last event + gap), then one column per aggregation.

    Raises:
        ValueError: a missing column, a non-timestamp time column, a bad gap or aggregation,
            a streaming input without ``watermark_delay``, or null keys in a static input.
    """
    if not isinstance(df, DataFrame):
        raise TypeError(f"df must be a pyspark DataFrame, got {type(df).__name__}")
    if not isinstance(key, str | list | tuple):
        raise TypeError(f"key must be a column name or a list of them, got {key!r}")
    key_columns = [key] if isinstance(key, str) else list(key)
    if not key_columns or not all(isinstance(k, str) for k in key_columns):
        raise ValueError(f"key must be a column name or a list of them, got {key!r}")
    schema = {f.name: f.dataType for f in df.schema.fields}
    for column in [*key_columns, timestamp]:
        if column not in schema:
            raise ValueError(f"column {column!r} is not in the DataFrame (columns: "
                             f"{sorted(schema)})")
    if not isinstance(schema[timestamp], T.TimestampType | T.TimestampNTZType):
        raise ValueError(f"timestamp column {timestamp!r} must be a timestamp, got "
                         f"{schema[timestamp].simpleString()}")
    gap_ms = duration_ms(gap, "gap")
    if gap_ms <= 0:
        raise ValueError(f"gap must be > 0, got {gap_ms} ms")
    if emit not in ("final", "update"):
        raise ValueError(f"emit must be 'final' or 'update', got {emit!r}")
    if trigger is not None and not isinstance(trigger, AfterWatermark):
        raise TypeError(f"trigger must be AfterWatermark(...), got {type(trigger).__name__}")
    if accumulation is not None and trigger is None:
        raise ValueError("accumulation needs a trigger")
    if trigger is not None and emit != "final":
        raise ValueError("a trigger replaces emit: leave emit at 'final'")
    agg, value_columns, output_names, agg_fields, json_outputs = _plan_aggregations(
        df, aggregations, key_columns, timestamp
    )
    spark = df.sparkSession
    if n_buckets is None:
        n_buckets = 4 * int(spark.conf.get("spark.sql.shuffle.partitions") or "200")
    if isinstance(n_buckets, bool) or not isinstance(n_buckets, int) or n_buckets < 1:
        raise ValueError(f"n_buckets must be an int >= 1, got {n_buckets!r}")

    key_fields = [T.StructField(k, schema[k]) for k in key_columns]
    out_fields = [*key_fields, T.StructField(START_MS, T.LongType()),
                  T.StructField(END_MS, T.LongType()), *agg_fields]
    if emit == "update":
        out_fields.append(T.StructField("retracted", T.BooleanType()))
    pane_fields = [T.StructField("pane_timing", T.StringType()),
                   T.StructField("pane_index", T.LongType()),
                   T.StructField("pane_is_first", T.BooleanType()),
                   T.StructField("pane_is_last", T.BooleanType())] if trigger is not None else []
    out_fields += pane_fields
    out_schema = T.StructType(out_fields)
    final_columns = [
        *[F.col(k) for k in key_columns],
        F.timestamp_millis(F.col(START_MS)).alias("session_start"),
        F.timestamp_millis(F.col(END_MS)).alias("session_end"),
        *[F.col(f.name) for f in agg_fields],
        *([F.col("retracted")] if emit == "update" else []),
        *[F.col(f.name) for f in pane_fields],
    ]
    config = SessionizeConfig(
        key_columns=key_columns, time_column=timestamp, value_columns=value_columns,
        gap_ms=gap_ms, inclusive_gap=bool(inclusive_gap), emit=emit, aggregation=agg,
        output_names=output_names, json_outputs=json_outputs, local_dir=local_dir,
        trigger=trigger, accumulation=accumulation,
    )
    carried = [c for c in value_columns if c not in key_columns and c != timestamp]
    selected = df.select(
        *key_columns, timestamp, *carried,
        F.unix_millis(F.col(timestamp).cast("timestamp")).alias(TIME_MS),
    )
    bucketed = selected.withColumn(
        BUCKET_COLUMN, F.pmod(F.hash(*[F.col(k) for k in key_columns]), F.lit(n_buckets))
    )

    if not df.isStreaming:
        nulls = df.filter(F.greatest(*[F.col(k).isNull() for k in key_columns])).limit(1).count() \
            if len(key_columns) > 1 else df.filter(F.col(key_columns[0]).isNull()).limit(1).count()
        if nulls:
            raise ValueError(f"key column(s) {key_columns} hold nulls; sessionize needs every "
                             f"key set")

        def run_bucket(frame: Any) -> Any:
            return static_bucket(config, frame)

        return bucketed.groupBy(BUCKET_COLUMN).applyInPandas(run_bucket, out_schema) \
            .select(*final_columns)

    if watermark_delay is None:
        raise ValueError("watermark_delay is required for a streaming DataFrame: sessions are "
                         "final when Spark's watermark passes their end")
    delay_ms = duration_ms(watermark_delay, "watermark_delay")
    if delay_ms < 0:
        raise ValueError(f"watermark_delay must be >= 0, got {delay_ms} ms")
    config.state_location = _state_location(spark, state_location)
    open_filesystem(config.state_location)  # fail on the driver for a bad URI
    config.retention_ms = gap_ms + delay_ms + 1
    config.keep_versions = int(spark.conf.get("spark.sql.streaming.minBatchesToRetain") or "100")
    digest = hashlib.sha1(
        repr((key_columns, timestamp, gap_ms, inclusive_gap, emit, output_names,
              repr(trigger), repr(accumulation))).encode()
    ).hexdigest()[:10]
    config.operator = check_name(f"sessionize-{digest}", "operator")
    provider = spark.conf.get("spark.sql.streaming.stateStore.providerClass", None)
    if provider != ROCKSDB_PROVIDER:
        raise ValueError(
            "transformWithStateInPandas needs spark.sql.streaming.stateStore.providerClass="
            f"{ROCKSDB_PROVIDER}; set it on the SparkSession before starting the query"
        )
    watermarked = bucketed.withWatermark(timestamp, f"{delay_ms} milliseconds")
    return watermarked.groupBy(BUCKET_COLUMN).transformWithStateInPandas(
        SessionizeProcessor(config), out_schema,
        "append" if emit == "final" else "update", "EventTime",
    ).select(*final_columns)


def _state_location(spark: SparkSession, state_location: str | None) -> str:
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
