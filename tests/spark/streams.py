"""Helpers that feed files to a streaming query, batch by batch, and collect its output."""

from __future__ import annotations

import datetime as dt
import json
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyspark.sql import types as T

SCHEMA = T.StructType([
    T.StructField("user", T.StringType()),
    T.StructField("ts", T.TimestampType()),
    T.StructField("amount", T.LongType()),
])
EPOCH = dt.datetime(2024, 1, 1)
SPAN_S = 60  # event time covered by one file


def make_files(n_files: int, rows_per_file: int, seed: int = 5) -> list[list[tuple[str, int, int]]]:
    """Rows (user, seconds since EPOCH, amount); file i covers [i*SPAN_S, (i+1)*SPAN_S)."""
    rng = random.Random(seed)
    files = []
    for i in range(n_files):
        rows = []
        for _ in range(rows_per_file):
            second = i * SPAN_S + rng.randrange(SPAN_S)
            rows.append((f"u{rng.randrange(6)}", second, rng.randrange(100)))
        # events exactly one gap (10 s) apart, which must share a session
        rows.append(("edge", i * SPAN_S, 1))
        rows.append(("edge", i * SPAN_S + 10, 2))
        files.append(rows)
    return files


def write_file(directory: Path, index: int, rows: list[tuple[str, int, int]]) -> None:
    tmp = directory / f".f{index:04d}.tmp"
    with open(tmp, "w") as handle:
        for user, second, amount in rows:
            ts = (EPOCH + dt.timedelta(seconds=second)).isoformat()
            handle.write(json.dumps({"user": user, "ts": ts, "amount": amount}) + "\n")
    tmp.rename(directory / f"f{index:04d}.json")


class StreamRun:
    """A streaming sessionize query over a directory of JSON files, with a foreachBatch sink
    that keeps each batch's rows by batch id (a retried batch replaces its rows)."""

    def __init__(self, spark: Any, root: Path, build: Callable[[Any], Any]) -> None:
        self.spark = spark
        self.source = root / "source"
        self.checkpoint = root / "checkpoint"
        self.source.mkdir(parents=True, exist_ok=True)
        self.build = build
        self.batches: dict[int, list[tuple]] = {}
        self.query: Any = None

    def start(self) -> None:
        stream = self.spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1) \
            .json(str(self.source))
        batches = self.batches

        def sink(frame: Any, batch_id: int) -> None:
            batches[batch_id] = [tuple(r) for r in frame.collect()]

        self.query = (self.build(stream).writeStream.foreachBatch(sink)
                      .option("checkpointLocation", str(self.checkpoint))
                      .outputMode("append").start())

    def feed(self, index: int, rows: list[tuple[str, int, int]],
             between: Callable[[], None] | None = None) -> None:
        write_file(self.source, index, rows)
        self.query.processAllAvailable()
        if between is not None:
            between()

    def stop(self) -> None:
        self.progress = list(self.query.recentProgress)
        self.query.stop()

    def state_location(self, base: Path) -> str:
        """Where sessionize kept this query's state under ``base``."""
        from spark_adapter import query_state_location

        return query_state_location(str(base), str(self.query.id))

    def dropped_by_watermark(self) -> int:
        """Spark's own count of input rows it dropped as older than the watermark."""
        return sum(
            op.get("numRowsDroppedByWatermark", 0)
            for progress in self.progress
            for op in (progress.get("stateOperators") or [])
        )

    def rows(self) -> list[tuple]:
        return [row for batch in sorted(self.batches) for row in self.batches[batch]]


def wipe(path: Path) -> Callable[[], None]:
    def run() -> None:
        shutil.rmtree(path, ignore_errors=True)

    return run
