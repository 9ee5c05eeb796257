"""The ``transformWithStateInPandas`` engine (``engine="processor"``, Spark >= 4).

Rows arrive grouped by a *bucket* (``pmod(hash(key), n_buckets)``), never one call per user: each
bucket's rows go through the engine's batch path. All buckets of a Spark partition share that
partition's versioned session store (:mod:`spark_adapter.provider`), and the same row codecs as
the Arrow engine (:mod:`spark_adapter.config`), so both engines give the same rows.

Watermark (kept equal to the Arrow engine's, hence to native ``session_window``'s):

* ``sessionize`` declares Spark's watermark on the event's window end ``t + gap`` with the delay
  grown by ``gap``, so its value is native's and Spark itself drops native's late rows (with a
  per-row gap, on ``t + max_gap``: Spark drops the rows late for any gap, and the engine, which
  judges each row by its own ``t + gap``, the others);
* rows are processed at the watermark the engine already holds (the previous batch's), and the
  engine advances to the current one only in ``handleExpiredTimer``, which Spark calls after
  every input row of the partition: each bucket keeps one *heartbeat* timer just past the
  current watermark, so it fires in every micro-batch that moves the watermark, rows or not;
* every bucket arms its heartbeat in the first batch (``sessionize`` gives each bucket one row
  of initial state), so a partition's engine holds the previous batch's watermark even when
  its first rows come late in the query; and a bucket's rows leave its due timer alone (the
  timer, not the rows, advances the engine to this batch's watermark).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import pandas as pd
import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql import types as T
from pyspark.sql.streaming.stateful_processor import (
    ExpiredTimerInfo,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)

from sessionstore import InMemorySessionStore, SessionAggregator
from sessionstore.engine import Emit
from sessionstore.timeutil import INT64_MAX

from . import arrow, columns, kept
from .config import (
    STATIC_RETENTION_US,
    US_PER_MS,
    SessionizeConfig,
    emits_batch,
    engine_arguments,
)
from .provider import SessionStoreProvider

log = logging.getLogger(__name__)
WINDOW_END_COLUMN = "sessionstore_window_end"


def frame_table(config: SessionizeConfig, frame: pd.DataFrame,
                names: list[str] | None = None) -> pa.Table:
    """A pandas batch from Spark as the Arrow table the Arrow engine would have received.

    Spark hands timestamps to pandas as naive wall-clock times of the session time zone.
    ``names``: the columns' own names, in order, when they crossed under positional ones
    (see :func:`spark_adapter.arrow.positional`).
    """
    if names is not None:
        frame = frame.set_axis(names, axis=1)
    data = {}
    gap: list[tuple[str, T.DataType]] = [] if config.gap_column is None else [
        (config.gap_column, T.LongType())]  # nullable: pandas may hold it as float with NaN
    for name, data_type in [*zip(config.key_columns, config.key_types, strict=True),
                            (config.time_column, config.time_type),
                            *zip(config.value_columns, config.value_types, strict=True), *gap]:
        if name in data:
            continue
        series = frame[name]
        target = columns.arrow_type(data_type, config.timezone)
        if isinstance(data_type, columns.TIMES):
            series = pd.to_datetime(series)
            if isinstance(data_type, T.TimestampType):
                if series.dt.tz is None:
                    series = series.dt.tz_localize(config.timezone)
                series = series.dt.tz_convert("UTC")
                data[name] = pa.array(series, pa.timestamp("ns", tz="UTC")).cast(target)
            else:
                data[name] = pa.array(series, pa.timestamp("ns")).cast(target)
        else:
            data[name] = pa.array(series, target, from_pandas=True)
    return pa.table(data)


def batch_frame(batch: pa.RecordBatch) -> pd.DataFrame:
    return batch.to_pandas(date_as_object=True)


class SessionizeProcessor(StatefulProcessor):
    """transformWithStateInPandas processor: one engine per partition and micro-batch."""

    def __init__(self, config: SessionizeConfig, names: list[str] | None = None) -> None:
        self.config = config
        self.names = names  # the input's own column names (see frame_table)
        self.provider: SessionStoreProvider | None = None
        self.engine: SessionAggregator | None = None
        self.batch = -1
        self.counts: dict[str, int] = {}

    def __reduce__(self) -> tuple[Callable[..., SessionizeProcessor],
                                  tuple[SessionizeConfig, list[str] | None]]:
        """Each task unpickles its own processor, before it reads a row: see
        :func:`task_processor`. Nothing but the arguments crosses (the rest is per task)."""
        return task_processor, (self.config, self.names)

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        context = TaskContext.get()
        if context is None:  # the extra driver-side init: no state there
            self.provider = None
            return
        batch = context.getLocalProperty("streaming.sql.batchId")
        if batch is None:
            raise RuntimeError("sessionize: no streaming batch id; is this a streaming query?")
        self.batch = int(batch)
        cfg = self.config
        self.provider = SessionStoreProvider(
            arrow.query_location(cfg), cfg.operator, context.partitionId(),
            local_root=cfg.local_dir, **engine_arguments(retention_us=cfg.retention_us),
            keep_versions=cfg.keep_versions,
            # closed after every commit, so a background compaction would be discarded by the
            # next load: RocksDB compacts on its own, and commits upload what it wrote
            compact_level0_files=0,
        )
        store = self.provider.load(self.batch - 1)
        self.engine = SessionAggregator(
            store, cfg.windows(), cfg.aggregation, watermark="external", **cfg.engine_options(),
        )
        self.counts = {"null_times_dropped": 0, "null_keys_dropped": 0}

    def _heartbeat(self, watermark_ms: int) -> None:
        """One timer just past the current watermark: it fires in the next micro-batch that
        moves the watermark, so that this partition closes its sessions then, rows or not.

        A timer at or before the current watermark is left alone: it is due in this micro-batch
        (Spark fires it after the partition's rows, and deletes it after the call), and it is
        what advances the engine to this batch's watermark."""
        target = max(watermark_ms, 0) + 1
        armed = False
        for moment in list(self.handle.listTimers()):
            if moment == target:
                armed = True
            elif moment > watermark_ms:
                self.handle.deleteTimer(moment)
        if not armed:
            self.handle.registerTimer(target)

    def handleInitialState(self, key: Any, initialState: pd.DataFrame,
                           timerValues: TimerValues) -> None:
        """The first batch: every bucket (``sessionize`` gives each one row) arms its heartbeat,
        whether rows ever reach it or not."""
        self._heartbeat(timerValues.getCurrentWatermarkInMs())

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame],
                        timerValues: TimerValues) -> Iterator[pd.DataFrame]:
        assert self.engine is not None, "handleInputRows before init"
        out: list[pa.RecordBatch] = []
        for frame in rows:
            table = frame_table(self.config, frame, self.names)
            batch, counts, _ = arrow.sessionize_rows(
                self.engine, self.config, table, self.config.order_sensitive)
            for name, count in counts.items():
                self.counts[name] += count
            if batch.num_rows:
                out.append(batch)
        self._heartbeat(timerValues.getCurrentWatermarkInMs())
        for batch in out:
            yield batch_frame(batch)

    def handleExpiredTimer(self, key: Any, timerValues: TimerValues,
                           expiredTimerInfo: ExpiredTimerInfo) -> Iterator[pd.DataFrame]:
        assert self.engine is not None, "handleExpiredTimer before init"
        watermark_ms = timerValues.getCurrentWatermarkInMs()
        out: list[Emit] = self.engine.advance_watermark(
            **engine_arguments(to_us=max(watermark_ms, 0) * US_PER_MS))
        if self.config.trigger is not None:
            out.extend(self.engine.poll())  # processing-time triggers, at batch boundaries
        self._heartbeat(watermark_ms)
        if out:
            yield batch_frame(emits_batch(self.config, out))

    def close(self) -> None:
        if self.provider is None or self.engine is None:
            return
        engine = self.engine
        try:
            previous = arrow.previous_metadata(engine.committed_metadata)
            totals = arrow.running_totals(previous, engine.metrics, self.counts)
            self.provider.commit(engine.commit, self.batch, totals)
        finally:
            self.provider.close()
            self.engine = None


def task_processor(config: SessionizeConfig,
                   names: list[str] | None = None) -> SessionizeProcessor:
    """The processor a task of the processor engine unpickles, the task's first step of ours.

    PySpark reuses its Python workers, and collects garbage after every task over all they
    hold, so in a task this first freezes what the worker already holds, as every
    ``mapInArrow`` task of ``sessionize`` does (:func:`spark_adapter.kept.freeze_heap`, through
    ``arrow.task_entry``). Not in :meth:`SessionizeProcessor.init`, which runs once per task
    too: by then PySpark has read the task's first rows, as named tuples of a class it makes
    for each Arrow batch, and a class is a reference cycle, which frozen would outlive its batch
    (about 30 objects a task, never collected). Elsewhere (the driver, its schema-only init)
    there is no task: nothing is frozen.
    """
    if TaskContext.get() is not None:
        kept.freeze_heap()
    return SessionizeProcessor(config, names)


def static_frames(config: SessionizeConfig,
                  names: list[str] | None = None) -> Callable[[pd.DataFrame], pd.DataFrame]:
    """The function `applyInPandas` runs for the static path, bound to `config`.

    A plain function with pandas type hints, so that PySpark infers its kind instead of warning
    that it cannot read the hints of a `functools.partial`.
    """
    def frame_fn(frame: pd.DataFrame) -> pd.DataFrame:
        return static_frame(config, frame, names)
    return frame_fn


def static_frame(config: SessionizeConfig, frame: pd.DataFrame,
                 names: list[str] | None = None) -> pd.DataFrame:
    """The static path: one bucket's rows, all at once, on an in-memory engine."""
    engine = SessionAggregator(
        InMemorySessionStore(**engine_arguments(retention_us=STATIC_RETENTION_US)),
        config.windows(),
        config.aggregation, watermark="external", **config.engine_options(),
    )
    batch, _, _ = arrow.sessionize_rows(engine, config, frame_table(config, frame, names),
                                       sort=False)
    closing = emits_batch(config, engine.advance_watermark(INT64_MAX))
    return pa.Table.from_batches([batch, closing]).to_pandas(date_as_object=True)
