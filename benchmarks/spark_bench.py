"""Spark benchmark: sessionize against Spark's native session_window and a hand-written
applyInPandasWithState sessionizer, on the same generated clickstream, in one run.

Two workloads, both streaming from Parquet files, one file per micro-batch, in ``local[2]``:

* throughput: rows/s per micro-batch for each peer;
* state growth: batch latency while retained state grows past a million sessions (nothing is
  evicted: the watermark delay is a day), for sessionize and native session_window.

It reports numbers and asserts none::

    python -m benchmarks.spark_bench
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from sessionstore.sample import generate

from .common import peak_rss_mb, write_results

log = logging.getLogger("benchmarks.spark")
GAP = "30 minutes"
GAP_MS = 30 * 60_000


def spark_session(partitions: int) -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    root = str(Path(__file__).resolve().parents[1])
    os.environ["PYTHONPATH"] = os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]").appName("sessionstore-bench")
        .config("spark.sql.shuffle.partitions", str(partitions))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "6g")
        .config("spark.sql.streaming.stateStore.providerClass",
                "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def write_batches(directory: Path, users: np.ndarray, times_ms: np.ndarray,
                  amounts: np.ndarray, n_batches: int) -> list[Path]:
    """Split the stream into ``n_batches`` Parquet files in arrival order."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, part in enumerate(np.array_split(np.arange(len(users)), n_batches)):
        table = pa.table({
            "user": pa.array([f"user{u}" for u in users[part].tolist()]),
            "ts": pa.array(times_ms[part], type=pa.timestamp("ms")),
            "amount": pa.array(amounts[part], type=pa.int64()),
        })
        path = directory / f"batch-{i:04d}.parquet"
        pq.write_table(table, path)
        paths.append(path)
    return paths


def stream_batches(spark: Any, files: list[Path], root: Path,
                   build: Callable[[Any], Any], output_mode: str) -> list[dict[str, Any]]:
    """Feed one file per micro-batch; return per-batch input rows and durations."""
    source = root / "source"
    source.mkdir(parents=True)
    schema = "user string, ts timestamp, amount long"
    stream = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1) \
        .parquet(str(source))
    query = (build(stream).writeStream.format("noop").outputMode(output_mode)
             .option("checkpointLocation", str(root / "checkpoint")).start())
    for path in files:
        shutil.copy(path, source / (path.name + ".tmp"))
        os.rename(source / (path.name + ".tmp"), source / path.name)
        query.processAllAvailable()
    progress = [p for p in query.recentProgress if p["numInputRows"] > 0]
    query.stop()
    return [
        {"rows": p["numInputRows"], "ms": p["durationMs"]["triggerExecution"],
         "state_rows": sum(op.get("numRowsTotal", 0) for op in p.get("stateOperators") or [])}
        for p in progress
    ]


def sessionize_query(root: Path, delay: str) -> Callable[[Any], Any]:
    from spark_adapter import sessionize

    def build(stream: Any) -> Any:
        return sessionize(stream, key="user", timestamp="ts", gap=GAP,
                          aggregations={"clicks": "count", "revenue": ("sum", "amount")},
                          watermark_delay=delay, state_location=str(root / "state"),
                          local_dir=str(root / "local"))

    return build


def native_query(delay: str) -> Callable[[Any], Any]:
    from pyspark.sql import functions as F

    def build(stream: Any) -> Any:
        return (stream.withWatermark("ts", delay)
                .groupBy("user", F.session_window("ts", GAP))
                .agg(F.count("*").alias("clicks"), F.sum("amount").alias("revenue")))

    return build


def _hand_written(key: tuple[Any, ...], frames: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
    """What a user writes today: the user's sessions as JSON in GroupState."""
    sessions = json.loads(state.get[0]) if state.exists else []
    watermark = state.getCurrentWatermarkMs()
    for frame in frames:
        for t, amount in zip(frame["ts"].astype("int64") // 1_000_000, frame["amount"],
                             strict=True):
            start, end, clicks, revenue = t, t + GAP_MS, 1, int(amount)
            keep = []
            for s in sessions:
                if s[1] >= t and s[0] <= t + GAP_MS:
                    start, end = min(start, s[0]), max(end, s[1])
                    clicks, revenue = clicks + s[2], revenue + s[3]
                else:
                    keep.append(s)
            sessions = [*keep, [start, end, clicks, revenue]]
    closed = [s for s in sessions if s[1] <= watermark]
    sessions = [s for s in sessions if s[1] > watermark]
    if sessions:
        state.update((json.dumps(sessions),))
        state.setTimeoutTimestamp(max(s[1] for s in sessions))
    else:
        state.remove()
    if closed:
        yield pd.DataFrame({"user": [key[0]] * len(closed), "start": [s[0] for s in closed],
                            "end": [s[1] for s in closed], "clicks": [s[2] for s in closed],
                            "revenue": [s[3] for s in closed]})


def pandas_state_query(delay: str) -> Callable[[Any], Any]:
    from pyspark.sql.streaming.state import GroupStateTimeout

    def build(stream: Any) -> Any:
        return stream.withWatermark("ts", delay).groupBy("user").applyInPandasWithState(
            _hand_written, "user string, start long, end long, clicks long, revenue long",
            "sessions string", "append", GroupStateTimeout.EventTimeTimeout)

    return build


def summarise(batches: list[dict[str, Any]]) -> dict[str, Any]:
    rows = sum(b["rows"] for b in batches)
    ms = sum(b["ms"] for b in batches)
    steady = batches[1:] or batches  # the first batch pays for Python worker start-up
    return {
        "rows": rows,
        "seconds": ms / 1000,
        "rows_per_s": rows / (ms / 1000),
        "steady_rows_per_s": sum(b["rows"] for b in steady) / (sum(b["ms"] for b in steady) / 1000),
        "batches": batches,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=400_000)
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--pandas-state-events", type=int, default=60_000)
    parser.add_argument("--growth-batches", type=int, default=12)
    parser.add_argument("--growth-sessions-per-batch", type=int, default=90_000)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    spark = spark_session(partitions=2)
    root = Path(tempfile.mkdtemp(prefix="spark-bench-"))
    results: dict[str, Any] = {"events": args.events, "gap": GAP}
    try:
        stream = generate(args.events, n_users=50_000, hours=6)
        files = write_batches(root / "files", stream.users, stream.times_ms, stream.amounts,
                              args.batches)
        peers = [
            ("sessionize", sessionize_query(root / "q-ours", "10 minutes"), "append", files),
            ("native session_window", native_query("10 minutes"), "append", files),
        ]
        small = generate(args.pandas_state_events, n_users=5_000, hours=6, seed=7)
        small_files = write_batches(root / "small", small.users, small.times_ms, small.amounts,
                                    args.batches)
        peers += [
            ("applyInPandasWithState (hand-written)", pandas_state_query("10 minutes"), "append",
             small_files),
            ("sessionize, same small stream", sessionize_query(root / "q-ours-small",
                                                               "10 minutes"),
             "append", small_files),
        ]
        throughput = {}
        for name, build, mode, inputs in peers:
            summary = summarise(stream_batches(spark, inputs, root / name.replace(" ", "_"),
                                               build, mode))
            throughput[name] = summary
            log.info("%-42s %10.0f rows/s (steady %10.0f)", name, summary["rows_per_s"],
                     summary["steady_rows_per_s"])
        results["throughput"] = throughput

        # state growth: each batch brings new users' sessions; a day of watermark delay keeps
        # every session in state
        per_batch = args.growth_sessions_per_batch
        users, times, amounts = [], [], []
        for b in range(args.growth_batches):
            ids = np.arange(b * per_batch, (b + 1) * per_batch, dtype=np.int64)
            base = 1_700_000_000_000 + b * 60_000
            users += [ids, ids]
            times += [np.full(per_batch, base), np.full(per_batch, base + 1000)]
            amounts += [np.zeros(per_batch, dtype=np.int64)] * 2
        all_users = np.concatenate(users)
        all_times = np.concatenate(times)
        all_amounts = np.concatenate(amounts)
        growth_files = write_batches(root / "growth", all_users, all_times, all_amounts,
                                     args.growth_batches)
        growth = {}
        for name, build in [("sessionize", sessionize_query(root / "g-ours", "1 day")),
                            ("native session_window", native_query("1 day"))]:
            batches = stream_batches(spark, growth_files, root / f"g-{name.replace(' ', '_')}",
                                     build, "append")
            growth[name] = batches
            log.info("%-42s batch ms: %s", name, [b["ms"] for b in batches])
        results["state_growth"] = {"sessions_per_batch": per_batch, "runs": growth}
        results["driver_peak_rss_mb"] = peak_rss_mb()
    finally:
        spark.stop()
        shutil.rmtree(root, ignore_errors=True)
    if not args.no_write:
        log.info("wrote %s", write_results("spark", results))


if __name__ == "__main__":
    start = time.time()
    main()
    log.info("took %.0f s", time.time() - start)
