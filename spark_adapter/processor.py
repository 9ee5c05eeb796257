"""The code that runs inside Spark's Python workers: the stateful processor and the static path.

Rows arrive grouped by a *bucket* (``pmod(hash(key), n_buckets)``), never one call per user: each
bucket's rows go through the engine's batch path. All buckets of a Spark partition share that
partition's versioned session store (:mod:`spark_adapter.provider`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from pyspark import TaskContext
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.streaming.stateful_processor import ExpiredTimerInfo, TimerValues

from sessionstore import (
    AccumulationMode,
    AfterWatermark,
    EmitStrategy,
    InMemorySessionStore,
    SessionAggregator,
    SessionWindows,
)
from sessionstore.aggregations import Aggregation
from sessionstore.engine import Emit
from sessionstore.timeutil import INT64_MAX

from .provider import SessionStoreProvider

log = logging.getLogger(__name__)
BUCKET_COLUMN = "sessionstore_bucket"
TIME_MS = "sessionstore_time_ms"
START_MS = "sessionstore_start_ms"
END_MS = "sessionstore_end_ms"
TIMER_STEPS_PER_GAP = 4  # timers round session close times up to a quarter of the gap


@dataclass
class SessionizeConfig:
    """Everything a worker needs; pickled by Spark with the processor."""

    key_columns: list[str]
    time_column: str
    value_columns: list[str]
    gap_ms: int
    inclusive_gap: bool
    emit: str  # "final" or "update"
    aggregation: Aggregation
    output_names: list[str]
    json_outputs: list[str]
    state_location: str | None = None
    operator: str = "sessionize"
    retention_ms: int = 0
    keep_versions: int = 100
    local_dir: str | None = None
    trigger: AfterWatermark | None = None
    accumulation: AccumulationMode | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def windows(self) -> SessionWindows:
        return SessionWindows(self.gap_ms, 0, self.inclusive_gap,
                              retention_ms=max(self.retention_ms, self.gap_ms))

    def emit_strategy(self) -> EmitStrategy | None:
        if self.trigger is not None:
            return None
        return (EmitStrategy.ON_WINDOW_CLOSE if self.emit == "final"
                else EmitStrategy.ON_WINDOW_UPDATE)

    def engine_options(self) -> dict[str, Any]:
        """Emission keyword arguments of SessionAggregator."""
        if self.trigger is not None:
            return {"trigger": self.trigger, "accumulation": self.accumulation}
        return {"emit": self.emit_strategy()}


def frame_columns(config: SessionizeConfig, frame: pd.DataFrame) -> tuple[list[Any], list[Any],
                                                                          np.ndarray]:
    """Engine keys, values and int64 millisecond times of one pandas batch."""
    keys_frame = frame[config.key_columns]
    if keys_frame.isna().to_numpy().any():
        bad = next(c for c in config.key_columns if frame[c].isna().any())
        raise ValueError(f"key column {bad!r} holds a null; sessionize needs every key set")
    if len(config.key_columns) == 1:
        keys = keys_frame.iloc[:, 0].tolist()
    else:
        keys = list(keys_frame.itertuples(index=False, name=None))
    times = frame[TIME_MS]
    if times.isna().any():
        raise ValueError(f"time column {config.time_column!r} holds a null")
    millis = times.to_numpy(dtype=np.int64)
    if config.value_columns:
        values = list(frame[config.value_columns].itertuples(index=False, name=None))
    else:
        values = [None] * len(frame)
    return keys, values, millis


def emits_frame(config: SessionizeConfig, emits: list[Emit]) -> pd.DataFrame:
    """The output rows: key columns, session bounds, one column per aggregation."""
    data: dict[str, list[Any]] = {}
    keys = [e.session.key for e in emits]
    if len(config.key_columns) == 1:
        data[config.key_columns[0]] = keys
    else:
        for i, name in enumerate(config.key_columns):
            data[name] = [k[i] for k in keys]
    data[START_MS] = [e.session.start for e in emits]
    data[END_MS] = [e.session.end for e in emits]
    for name in config.output_names:
        column = [e.value[name] for e in emits]
        if name in config.json_outputs:
            column = [json.dumps(v) for v in column]
        data[name] = column
    if config.emit == "update":
        data["retracted"] = [e.retraction for e in emits]
    if config.trigger is not None:
        panes = [e.pane for e in emits]
        data["pane_timing"] = [p.timing.value if p else None for p in panes]
        data["pane_index"] = [p.index if p else None for p in panes]
        data["pane_is_first"] = [p.is_first if p else None for p in panes]
        data["pane_is_last"] = [p.is_last if p else None for p in panes]
    return pd.DataFrame(data)


class SessionizeProcessor(StatefulProcessor):
    """transformWithStateInPandas processor: one engine per partition and micro-batch."""

    def __init__(self, config: SessionizeConfig) -> None:
        self.config = config
        self.provider: SessionStoreProvider | None = None
        self.engine: SessionAggregator | None = None
        self.batch = -1

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
        assert cfg.state_location is not None
        self.provider = SessionStoreProvider(
            cfg.state_location, cfg.operator, context.partitionId(),
            local_root=cfg.local_dir, retention_ms=max(cfg.retention_ms, cfg.gap_ms),
            keep_versions=cfg.keep_versions,
        )
        store = self.provider.load(self.batch - 1)
        self.engine = SessionAggregator(
            store, cfg.windows(), cfg.aggregation, watermark="external", **cfg.engine_options(),
        )
        self.engine.drain_close_times()  # from now on the engine records close times for timers

    def _advance(self, timer_values: TimerValues, out: list[Emit]) -> None:
        assert self.engine is not None
        watermark = timer_values.getCurrentWatermarkInMs()
        if watermark > 0:
            out.extend(self.engine.advance_watermark(watermark))
        if self.config.trigger is not None:
            out.extend(self.engine.poll())  # processing-time triggers, at batch boundaries

    def _arm_timers(self) -> None:
        """Register timers at or after the close time of every session changed in this call,
        rounded up to a granularity so that a bucket holds few timers. A timer fires once
        Spark's watermark passes it, even if this partition gets no more rows, and the engine
        then closes everything the watermark has passed, in every bucket of the partition."""
        assert self.engine is not None
        times = self.engine.drain_close_times()
        if not times or (self.config.emit != "final" and self.config.trigger is None):
            return
        step = max(1, self.config.gap_ms // TIMER_STEPS_PER_GAP)
        for moment in sorted({-(-t // step) * step for t in times}):
            self.handle.registerTimer(moment)

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame],
                        timerValues: TimerValues) -> Iterator[pd.DataFrame]:
        assert self.engine is not None, "handleInputRows before init"
        out: list[Emit] = []
        self._advance(timerValues, out)
        for frame in rows:
            keys, values, millis = frame_columns(self.config, frame)
            out.extend(self.engine.process_batch(keys, values, millis))
        self._arm_timers()
        if out:
            yield emits_frame(self.config, out)

    def handleExpiredTimer(self, key: Any, timerValues: TimerValues,
                           expiredTimerInfo: ExpiredTimerInfo) -> Iterator[pd.DataFrame]:
        assert self.engine is not None, "handleExpiredTimer before init"
        out: list[Emit] = []
        self._advance(timerValues, out)
        self._arm_timers()
        if out:
            yield emits_frame(self.config, out)

    def close(self) -> None:
        if self.provider is None or self.engine is None:
            return
        engine = self.engine
        try:
            metrics = engine.metrics
            previous = self.provider.store.committed_metadata if self.provider.store else None
            totals = _running_totals(previous, metrics)
            self.provider.commit(engine.commit, self.batch, totals)
        finally:
            self.provider.close()
            self.engine = None


def _running_totals(previous: Any, metrics: dict[str, float]) -> dict[str, int]:
    """Dropped and input counts, accumulated across batches in the committed metadata."""
    base = {"dropped_records": 0, "records_in": 0}
    if isinstance(previous, dict):
        spark = (previous.get("user") or {}).get("spark") or {}
        for name in base:
            base[name] = int(spark.get(name, 0))
    base["dropped_records"] += int(metrics["dropped-records"])
    base["records_in"] += int(metrics["records-in"])
    return base


def static_bucket(config: SessionizeConfig, frame: pd.DataFrame) -> pd.DataFrame:
    """The static path: one bucket's rows, all at once, on an in-memory engine."""
    windows = SessionWindows(config.gap_ms, 0, config.inclusive_gap)
    engine = SessionAggregator(
        InMemorySessionStore(retention_ms=INT64_MAX // 4), windows, config.aggregation,
        watermark="external", **config.engine_options(),
    )
    keys, values, millis = frame_columns(config, frame)
    order = np.argsort(millis, kind="stable")
    out = engine.process_batch([keys[i] for i in order], [values[i] for i in order], millis[order])
    out += engine.advance_watermark(INT64_MAX)
    return emits_frame(config, out)
