"""The Arrow engine: each Spark partition's rows reach the engine as Arrow record batches.

Streaming (``repartition(n, key).mapInArrow``): every micro-batch runs one task per partition,
rows or not, because the input is shuffled to a fixed ``n``. A task

1. opens its partition's store at exactly version ``batchId - 1`` (the provider), or takes back
   the store and engine its worker process kept open after committing ``batchId - 1`` when that
   commit is still the published one (:mod:`spark_adapter.kept`); when another idle worker
   process keeps them, the task sends it its rows and that process runs steps 2-5
   (:func:`run_partition`) and sends the output back;
2. decides the micro-batch's watermark ``W_b`` (below) and keeps the previous one, ``W_{b-1}``,
   which the store already holds, for lateness;
3. feeds its rows to the engine: a row whose own window ``[t, t + gap)`` ended at or before
   ``W_{b-1}`` is late, dropped and counted, which is native ``session_window``'s rule (its late
   rows are judged against the previous batch's watermark, its sessions closed with the current);
4. advances the engine to ``W_b``, emitting every session that ends at or before it;
5. when the iterator ends, commits version ``batchId`` with ``W_b``, the partition's largest event
   time and its counters, then records that event time in the watermark log.

**How the watermark reaches the task.** Spark computes ``W_b = max(W_{b-1}, max event time in
batches < b - delay)`` (0 at first) and never shows it to a ``mapInArrow`` task. The task
computes the same value from what the previous micro-batch committed: each partition records its
largest event time of batches ``<= b-1`` (over every row with a time, as Spark's watermark
node takes it: a row the engine drops for a null key too) as the *name* of an empty object under
``progress/<b-1>/`` beside the snapshots, so one listing per task reads every partition's value.
Spark starts batch ``b`` only after every task of ``b - 1`` succeeded, so the listing is
complete, and it never changes afterwards: a replayed batch (task retry, executor loss, driver
restart) decides exactly the same ``W_b``; a task that finds its own manifest of ``b`` already
published reuses the ``W_b`` recorded there.

**Why every micro-batch runs.** A query with no stateful operator runs no "no-data" batch, so
after the last input the watermark would never close the last sessions. ``sessionize`` therefore
unions the output with an always-empty streaming deduplication over the same (reused) shuffle:
its watermark makes Spark run a no-data batch exactly when native ``session_window`` would.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Generator, Iterator
from functools import partial
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
from pyspark import TaskContext
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sessionstore import InMemorySessionStore, SessionAggregator
from sessionstore.engine import Emit
from sessionstore.timeutil import INT64_MAX

from . import columns, kept, static_columnar
from .config import (
    STATIC_RETENTION_US,
    US_PER_MS,
    SessionizeConfig,
    emits_batch,
    engine_arguments,
    engine_rows,
    null_keys_message,
)
from .provider import SessionStoreProvider, SnapshotError, open_filesystem
from .state import StateLayout, pin_layout, query_state_location

log = logging.getLogger(__name__)
SPARK_INITIAL_WATERMARK_MS = 0  # Spark's watermark starts at 0 and never goes below it
COUNTERS = ("records_in", "dropped_records", "null_times_dropped", "null_keys_dropped",
            "invalid_gaps_dropped")
_MARKER = re.compile(r"^(\d{1,9})=(-?\d{1,19}|none)$")


def sessionize_rows(engine: SessionAggregator, config: SessionizeConfig,
                    table: pa.Table | pa.RecordBatch, sort: bool) -> tuple[pa.RecordBatch,
                                                                           dict[str, int],
                                                                           int | None]:
    """Feed one batch of input rows to the engine: the one place that calls its batch API.

    Returns the emitted rows, the counters (rows in, null times and null keys dropped) and the
    largest event time seen (us), or None for no row.
    """
    rows = engine_rows(config, table, sort=sort)
    if rows.gaps_us is None:
        emits = engine.process_batch(rows.keys, rows.values, rows.times_us)
    else:
        emits = engine.process_batch(rows.keys, rows.values, rows.times_us,
                                     **engine_arguments(gaps_us=rows.gaps_us))
    counts = {"null_times_dropped": rows.null_times, "null_keys_dropped": rows.null_keys}
    return emits_batch(config, emits), counts, rows.max_time_us


class WatermarkLog:
    """Per micro-batch, every partition's largest event time so far, as object names.

    Layout: ``<state>/<operator>/progress/<batch>/<partition>=<max event ms | none>``.
    """

    def __init__(self, state_location: str, operator: str, n_partitions: int) -> None:
        self.fs, base = open_filesystem(state_location)
        self.root = f"{base}/{operator}/progress"
        self.n_partitions = n_partitions

    def record(self, batch: int, partition: int, max_event_ms: int | None) -> None:
        directory = f"{self.root}/{batch}"
        self.fs.create_dir(directory, recursive=True)
        label = "none" if max_event_ms is None else str(max_event_ms)
        with self.fs.open_output_stream(f"{directory}/{partition}={label}"):
            pass

    def max_event_ms(self, batch: int) -> int | None:
        """The largest event time (ms) any partition saw up to ``batch``; None if none.

        Raises:
            SnapshotError: some partition's record of ``batch`` is missing.
        """
        selector = pafs.FileSelector(f"{self.root}/{batch}", allow_not_found=True)
        seen: dict[int, int | None] = {}
        for info in self.fs.get_file_info(selector):
            match = _MARKER.match(info.base_name)
            if not match:
                continue
            partition, label = int(match.group(1)), match.group(2)
            value = None if label == "none" else int(label)
            previous = seen.get(partition)
            # replays record the same value; if a source replayed differently, the larger
            # value is still an event that was seen
            seen[partition] = value if previous is None else max(previous, value or previous)
        missing = sorted(set(range(self.n_partitions)) - set(seen))
        if missing:
            raise SnapshotError(
                f"the watermark log of batch {batch} at {self.root}/{batch} lacks partitions "
                f"{missing[:10]} of {self.n_partitions}: the state location is incomplete, or "
                f"the partition count changed"
            )
        known = [v for v in seen.values() if v is not None]
        return max(known) if known else None

    def purge(self, before_batch: int) -> None:
        """Delete the records of batches older than ``before_batch``."""
        selector = pafs.FileSelector(self.root, allow_not_found=True)
        for info in self.fs.get_file_info(selector):
            if info.base_name.isdigit() and int(info.base_name) < before_batch:
                self.fs.delete_dir(info.path)


def running_totals(previous: dict[str, Any], metrics: dict[str, float],
                   counts: dict[str, int]) -> dict[str, int]:
    """The partition's counters after this micro-batch: committed with its state, so a retried
    or replayed batch counts nothing twice."""
    totals = {name: int(previous.get(name, 0)) for name in COUNTERS}
    totals["records_in"] += int(metrics["records-in"])
    totals["dropped_records"] += int(metrics["dropped-records"])
    # rows whose dynamic gap is null or <= 0 (also in dropped_records), as native filters them
    totals["invalid_gaps_dropped"] += int(metrics.get("dropped-invalid-gap-records", 0))
    for name, count in counts.items():
        totals[name] += count
    return totals


def next_watermark_ms(previous_ms: int, max_event_ms: int | None, delay_ms: int) -> int:
    """Spark's rule: the watermark is the largest event time minus the delay, never going back."""
    if max_event_ms is None:
        return previous_ms
    return max(previous_ms, max_event_ms - delay_ms)


def previous_metadata(committed: Any) -> dict[str, Any]:
    if isinstance(committed, dict) and isinstance(committed.get("spark"), dict):
        return dict(committed["spark"])
    return {}


def query_location(config: SessionizeConfig) -> str:
    """This query's own state location, checked against the layout it was first run with.

    Called in every task of both streaming engines, before anything is read or written: the
    query id is visible only there (see :func:`spark_adapter.state.current_query_id`).

    Raises:
        StateLayoutMismatchError: the query was started with another n_buckets, partition count
            or configuration (the message names both values); nothing has been changed.
    """
    assert config.state_location is not None
    location = query_state_location(config.state_location)
    pin_layout(location, StateLayout(n_buckets=config.n_buckets,
                                     num_partitions=config.n_partitions,
                                     config_digest=config.layout_digest,
                                     settings=config.layout_settings))
    return location


def _task_batch() -> int:
    context = TaskContext.get()
    if context is None:
        raise RuntimeError("sessionize: not inside a Spark task")
    batch = context.getLocalProperty("streaming.sql.batchId")
    if batch is None:
        raise RuntimeError("sessionize: no streaming batch id; is this a streaming query?")
    return int(batch)


def task_partition(config: SessionizeConfig) -> int:
    """This task's shuffle partition, ``0 .. n_partitions - 1``.

    ``sessionize`` unions its output after the no-data ticker (see ``sessionize._ticker``), and
    a task's ``partitionId`` counts the partitions of the union: the ticker's ``n_partitions``
    come first. With one shuffle partition both sides report the same output partitioning
    (``SinglePartition``), and Spark (4.3 at least) unions them partition by partition: the
    union then has one partition, id 0. (With more, each side's partitioning is unknown once
    the hidden column is dropped, and the union is the concatenation.)

    Raises:
        RuntimeError: the index falls outside the range, e.g. the output was unioned after
            another input in the same stage, or ``spark.sql.shuffle.partitions`` changed
            between the ``sessionize`` call and the query's start (the ticker then takes the
            new count); nothing has been read or written.
    """
    context = TaskContext.get()
    assert context is not None
    index = context.partitionId()
    partition = 0 if index == 0 and config.n_partitions == 1 else index - config.n_partitions
    if not 0 <= partition < config.n_partitions:
        raise RuntimeError(
            f"sessionize: task partition {context.partitionId()} is not one of the "
            f"{config.n_partitions} after the ticker's; was the sessionize output unioned with "
            f"another input before a shuffle (union it after a repartition instead), or did "
            f"spark.sql.shuffle.partitions change after sessionize was called (it was "
            f"{config.n_partitions} then: call sessionize under the setting the query starts "
            f"with)?"
        )
    return partition


def max_event_us(config: SessionizeConfig, table: pa.Table) -> int | None:
    """The largest event time (us) of a task's input rows, None for none: every row with a
    time counts, one with a null key too, as Spark's watermark node counts it (the engine drops
    such a row, but ``W_b`` must stay Spark's)."""
    largest = pc.max(table.column(config.time_column).cast(pa.int64())).as_py()
    return None if largest is None else int(largest)


def stream_partition(config: SessionizeConfig, batches: Iterator[pa.RecordBatch],
                     observed: dict[str, int] | None = None) -> Iterator[pa.RecordBatch]:
    """The ``mapInArrow`` function of the streaming Arrow engine (see the module docstring).

    A partition kept open by another idle worker process on this host runs there instead
    (:func:`spark_adapter.kept.relay`): this task sends it the rows and passes its output on.

    ``observed``, when given, receives this micro-batch's counters (:data:`OBSERVED_COUNTERS`)
    once the version is committed."""
    batch_id = _task_batch()
    location = query_location(config)
    partition = task_partition(config)
    parts = static_columnar.columnar_parts(config)
    key = kept.key_of(config, location, partition)
    opened = kept.take(key, batch_id - 1)
    try:
        table = config.input_table(batches)
    except BaseException:
        if opened is not None:  # as a failure after it: the next task loads afresh
            opened.close()
        raise
    if opened is None:
        provider = _provider(config, location, partition)
        relayed = None if parts is None else kept.relay(
            provider.local, key, config, kept.Assignment(location, partition, batch_id), table)
        if relayed is not None:
            yield from _relayed_output(relayed, observed)
            return
        opened = _open_partition(config, provider, batch_id - 1, parts)
    with kept.running():
        yield from run_partition(config, opened, key, kept.Assignment(location, partition,
                                                                      batch_id), table, observed)


def _relayed_output(relayed: Iterator[pa.RecordBatch | dict[str, int]],
                    observed: dict[str, int] | None) -> Iterator[pa.RecordBatch]:
    for item in relayed:
        if isinstance(item, dict):
            if observed is not None:
                observed.update(item)
        else:
            yield item


def run_partition(config: SessionizeConfig, opened: kept.OpenPartition, key: kept.Key,
                  task: kept.Assignment, table: pa.Table,
                  observed: dict[str, int] | None = None
                  ) -> Generator[pa.RecordBatch, None, None]:
    """One micro-batch of one partition on its open provider and engine (``opened``, at
    exactly version ``task.batch_id - 1``): feed ``table``, close what the watermark passed,
    commit ``task.batch_id``; then keep ``opened`` for the partition's next task in this
    process (:func:`spark_adapter.kept.keep`), or close it if the commit was not reached.

    It needs no Spark task around it, so the worker process that keeps the partition can run
    it for a task of another worker (:func:`spark_adapter.kept.relay`).
    """
    location, partition, batch_id = task.location, task.partition, task.batch_id
    parts = static_columnar.columnar_parts(config)
    watermarks = WatermarkLog(location, config.operator, config.n_partitions)
    provider, engine = opened.provider, opened.engine
    committed = False
    try:
        # the columnar path when every aggregation is a built-in the engine keeps as columns;
        # sessionize pins that choice in the configuration digest (see static_columnar)
        runner = None if parts is None else static_columnar.ColumnarRunner(config, parts, engine)
        to_rows: Callable[[list[Emit]], pa.RecordBatch] = (
            partial(emits_batch, config) if runner is None else runner.rows)
        # a kept engine's metrics count every task it ran: this task's are the difference
        before = engine.metrics
        previous = previous_metadata(engine.committed_metadata)
        previous_w_ms = int(previous.get("watermark_ms", SPARK_INITIAL_WATERMARK_MS))
        # a fresh store starts at 0
        opening = engine.advance_watermark(**engine_arguments(to_us=previous_w_ms * US_PER_MS))
        watermark_ms = _decide_watermark(provider, watermarks, config, batch_id, previous_w_ms)
        if runner is None:
            out, counts, _ = sessionize_rows(engine, config, table, config.order_sensitive)
        else:
            counts, _ = runner.feed(table)
            out = None
        max_us = max_event_us(config, table)
        if opening:
            yield to_rows(opening)
        if out is not None and out.num_rows:
            yield out
        closing: list[Emit] = engine.advance_watermark(
            **engine_arguments(to_us=watermark_ms * US_PER_MS))
        if config.trigger is not None:
            closing += engine.poll()  # processing-time triggers fire at micro-batch boundaries
        if closing:
            yield to_rows(closing)
        max_event_ms = previous.get("max_event_ms")
        if max_us is not None:
            batch_max = columns.micros_to_millis_java(max_us)
            max_event_ms = batch_max if max_event_ms is None else max(max_event_ms, batch_max)
        metrics = {name: value - before.get(name, 0) for name, value in engine.metrics.items()}
        totals = running_totals(previous, metrics, counts)
        provider.commit(engine.commit, batch_id, {
            **totals, "watermark_ms": watermark_ms, "max_event_ms": max_event_ms,
        })
        watermarks.record(batch_id, partition, max_event_ms)
        if partition == 0 and batch_id % 10 == 0:
            watermarks.purge(batch_id - config.keep_versions)
        if observed is not None:
            observed.update(batch_counters(metrics, counts))
        committed = True
    finally:
        if committed:  # for this partition's next task in this worker (see spark_adapter.kept)
            kept.keep(key, opened)
        else:  # uncommitted writes are discarded; the next task loads afresh
            opened.close()


kept.serve_with(run_partition)  # a keeper runs other workers' micro-batches with it


def _provider(config: SessionizeConfig, location: str, partition: int) -> SessionStoreProvider:
    """The partition's provider, nothing loaded yet (its ``local`` names the working copy)."""
    return SessionStoreProvider(
        location, config.operator, partition, local_root=config.local_dir,
        keep_versions=config.keep_versions, **engine_arguments(retention_us=config.retention_us),
    )


def _open_partition(config: SessionizeConfig, provider: SessionStoreProvider, version: int,
                    parts: list[Any] | None) -> kept.OpenPartition:
    """``provider`` with its store loaded at exactly ``version``, and an engine on it."""
    store = provider.load(version)
    try:
        engine = SessionAggregator(
            store, config.windows(),
            config.aggregation if parts is None else static_columnar.columnar_aggregation(parts),
            watermark="external", **config.engine_options())
    except BaseException:
        provider.close()
        raise
    return kept.OpenPartition(provider, engine, config if parts is not None else None)


# -- the counters in the query's progress (``df.observe``) ----------------------------------------
#
# A mapInArrow task cannot reach the driver's progress reporting itself, and an accumulator does
# not appear in ``query.lastProgress``. So each task appends one *counter row* to its output: every
# output column null, and the struct column COUNTERS_COLUMN set to its micro-batch's counters (the
# session rows carry null there). ``observe_counters`` sums them with ``df.observe`` (so they show
# in ``lastProgress["observedMetrics"]["sessionstore"]``, per micro-batch) and then filters the
# counter rows out; a failed task attempt's rows, counter row included, are not counted.

OBSERVATION = "sessionstore"
COUNTERS_COLUMN = "sessionstore_counters"
#: What each micro-batch reports, besides ``sessions_emitted`` (the output rows).
OBSERVED_COUNTERS = ("late_rows_dropped", "invalid_gap_rows_dropped", "null_time_rows_dropped",
                     "null_key_rows_dropped", "rows_in")


def batch_counters(metrics: dict[str, float], counts: dict[str, int]) -> dict[str, int]:
    """One task's counters: the engine's (its metrics count this task only) and the rows the
    adapter dropped before the engine."""
    invalid = int(metrics.get("dropped-invalid-gap-records", 0))
    return {"late_rows_dropped": int(metrics["dropped-records"]) - invalid,
            "invalid_gap_rows_dropped": invalid,
            "null_time_rows_dropped": int(counts.get("null_times_dropped", 0)),
            "null_key_rows_dropped": int(counts.get("null_keys_dropped", 0)),
            "rows_in": int(metrics["records-in"]) + sum(int(v) for v in counts.values())}


def counters_type() -> T.StructType:
    return T.StructType([T.StructField(name, T.LongType()) for name in OBSERVED_COUNTERS])


def observed_schema(config: SessionizeConfig) -> T.StructType:
    """The output schema plus the counters column."""
    return T.StructType([*config.output_schema().fields,
                         T.StructField(COUNTERS_COLUMN, counters_type())])


def _arrow_counters_type() -> pa.DataType:
    return pa.struct([pa.field(name, pa.int64()) for name in OBSERVED_COUNTERS])


def observed_stream_partition(config: SessionizeConfig, batches: Iterator[pa.RecordBatch]
                              ) -> Iterator[pa.RecordBatch]:
    """:func:`stream_partition`, each output batch with a null counters column, then the
    task's counter row (after the commit: a task that fails reports nothing)."""
    observed: dict[str, int] = {}
    kind = _arrow_counters_type()
    for out in stream_partition(config, batches, observed):
        yield pa.RecordBatch.from_arrays([*out.columns, pa.nulls(out.num_rows, kind)],
                                         names=[*out.schema.names, COUNTERS_COLUMN])
    schema = config.arrow_output_schema()
    yield pa.RecordBatch.from_arrays(
        [*(pa.nulls(1, f.type) for f in schema), pa.array([observed], kind)],
        names=[*schema.names, COUNTERS_COLUMN])


def observe_counters(frame: DataFrame) -> DataFrame:
    """Observe the counter rows of :func:`observed_stream_partition`'s output (and the session
    rows, as ``sessions_emitted``), then drop them and the counters column."""
    marker = F.col(COUNTERS_COLUMN)
    metrics = [F.count(F.when(marker.isNull(), F.lit(1))).alias("sessions_emitted"),
               *[F.coalesce(F.sum(marker.getField(name)), F.lit(0)).alias(name)
                 for name in OBSERVED_COUNTERS]]
    return frame.observe(OBSERVATION, *metrics).filter(marker.isNull()).drop(COUNTERS_COLUMN)


def _decide_watermark(provider: SessionStoreProvider, watermarks: WatermarkLog,
                      config: SessionizeConfig, batch_id: int, previous_ms: int) -> int:
    """``W_b``: the one a first attempt already committed, else Spark's rule over the log."""
    try:
        published = provider.read_manifest(batch_id)
    except SnapshotError:
        published = None
    if published is not None:
        decided = previous_metadata({"spark": published.get("spark")}).get("watermark_ms")
        if isinstance(decided, int):
            return decided
    seen = watermarks.max_event_ms(batch_id - 1) if batch_id > 0 else None
    return next_watermark_ms(previous_ms, seen, config.delay_ms)


def static_partition(config: SessionizeConfig,
                     batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The ``mapInArrow`` function of the static Arrow engine: a partition's rows, all at once,
    on an in-memory engine, then every session closed. The common aggregations take the
    columnar path of :mod:`spark_adapter.static_columnar`.

    Raises:
        ValueError: a key column holds a null (:func:`null_keys_message`): a static input needs
            every key set. The task checks it, so that ``sessionize`` need not read the input
            an extra time; the job fails with it when it runs.
    """
    columnar = static_columnar.static_partition(config, batches)
    if columnar is not None:
        yield from columnar
        return
    engine = SessionAggregator(
        InMemorySessionStore(**engine_arguments(retention_us=STATIC_RETENTION_US)),
        config.windows(),
        config.aggregation, watermark="external", **config.engine_options(),
    )
    for batch in batches:
        out, counts, _ = sessionize_rows(engine, config, batch, sort=False)
        if counts["null_keys_dropped"]:
            raise ValueError(null_keys_message(config.key_columns))
        if out.num_rows:
            yield out
    closing = engine.advance_watermark(INT64_MAX)
    if closing:
        yield emits_batch(config, closing)


def map_in_arrow(frame: DataFrame,
                 function: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]],
                 schema: T.StructType) -> DataFrame:
    """``frame.mapInArrow(function, schema)`` for any column names.

    The rows cross under positional names (see :func:`positional`), and ``function``
    receives each batch under ``frame``'s own names, in ``frame``'s order.
    """
    return positional(frame).mapInArrow(partial(_renamed, function, frame.columns), schema)


def positional(frame: DataFrame, keep: tuple[str, ...] = ()) -> DataFrame:
    """``frame`` with each column but those named in ``keep`` renamed by its position (``_0``,
    ``_1``, ...): PySpark's ``mapInArrow``, ``applyInPandas`` and
    ``transformWithStateInPandas`` look each input column up by its unquoted name, which a dot
    or a backtick in a user's column name breaks. Their functions name the columns back."""
    return frame.toDF(*[name if name in keep else f"_{i}"
                        for i, name in enumerate(frame.columns)])


def task_entry(function: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]],
               batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``function(batches)``: what every ``mapInArrow`` task of ``sessionize`` runs, static or
    streaming (through :func:`map_in_arrow`, or directly for the static buckets). It first
    freezes what the worker already holds (:func:`spark_adapter.kept.freeze_heap`), so that
    PySpark's garbage collection after the task visits only the task's own objects."""
    kept.freeze_heap()
    return function(batches)


def _renamed(function: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]],
             names: list[str], batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``function`` over ``batches`` under ``names``, as a task (:func:`task_entry`)."""
    return task_entry(function, (batch.rename_columns(names) for batch in batches))
