"""Spark benchmark: native ``session_window``, the Arrow engine and the processor engine, in one
Spark session on the same data, streaming and static.

* Streaming: the same Parquet files, one per micro-batch, through each query, then one file
  whose single far-future event lets the watermark close every session. Rows/s divide the input
  rows (counted in the files) by the summed ``triggerExecution`` time of *every* micro-batch,
  no-data batches included (they are where sessions close). Spark's own ``numInputRows`` is
  kept as ``spark_reported_rows``: it counts a source once per scan in the plan.
* Static: the same files read as one DataFrame; rows/s divide the input rows by the wall time of
  one job that computes every output row.

Each run also counts its sessions and sums a hash of every session row (key, bounds,
aggregates), so equal counts and checksums mean equal results. It reports numbers and asserts
none; ratios against native are the figures to quote on a shared machine::

    python -m benchmarks.spark_bench [--rows N] [--batches B] [--no-write]
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from sessionstore.sample import generate

from .common import peak_rss_mb, write_results

log = logging.getLogger("benchmarks.spark")
GAP = "30 minutes"
DELAY = "10 minutes"
SCHEMA = "user string, ts timestamp, amount long"
NATIVE = "native session_window"
ARROW = "sessionize (arrow)"
PROCESSOR = "sessionize (processor)"
Builder = Callable[[Any, "str | None"], Any]  # (input frame, watermark delay) -> sessions
FLUSH_USER = "flush"  # the far-future event's user: its own session never closes


def spark_session(partitions: int) -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    root = str(Path(__file__).resolve().parents[1])
    os.environ["PYTHONPATH"] = os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])
    from pyspark.sql import SparkSession

    from spark_adapter.sessionize import ROCKSDB_PROVIDER

    spark = (
        SparkSession.builder.master("local[2]").appName("sessionstore-bench")
        .config("spark.sql.shuffle.partitions", str(partitions))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "4g")
        # every micro-batch's progress, not the default last 100
        .config("spark.sql.streaming.numRecentProgressUpdates", "100000")
        .config("spark.sql.streaming.stateStore.providerClass", ROCKSDB_PROVIDER)
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def write_batches(directory: Path, n_rows: int, n_batches: int) -> tuple[list[Path], Path, int]:
    """The sample clickstream as ``n_batches`` Parquet files in arrival order, and a flush file.

    Returns (data files, flush file, input rows in the data files).
    """
    stream = generate(n_rows, n_users=max(1, n_rows // 8), hours=6)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, part in enumerate(np.array_split(np.arange(len(stream.users)), n_batches)):
        path = directory / f"batch-{i:04d}.parquet"
        _write(path, [f"user{u}" for u in stream.users[part].tolist()], stream.times_ms[part],
               stream.amounts[part])
        paths.append(path)
    flush = directory / f"batch-{n_batches:04d}.parquet"
    far_ms = int(stream.times_ms.max()) + 86_400_000  # a day later: past every gap and delay
    _write(flush, [FLUSH_USER], np.array([far_ms]), np.array([0]))
    return paths, flush, len(stream.users)


def _write(path: Path, users: list[str], times_ms: np.ndarray, amounts: np.ndarray) -> None:
    pq.write_table(pa.table({
        "user": pa.array(users, pa.string()),
        "ts": pa.array(times_ms, type=pa.timestamp("ms", tz="UTC")),
        "amount": pa.array(amounts, type=pa.int64()),
    }), path)


def native(frame: Any, delay: str | None) -> Any:
    from pyspark.sql import functions as F

    if delay is not None:
        frame = frame.withWatermark("ts", delay)
    return (frame.groupBy("user", F.session_window("ts", GAP).alias("w"))
            .agg(F.count("*").alias("clicks"), F.sum("amount").alias("revenue"))
            .select("user", F.col("w.start").alias("session_start"),
                    F.col("w.end").alias("session_end"), "clicks", "revenue"))


def ours(engine: str, root: Path) -> Callable[[Any, str | None], Any]:
    from spark_adapter import sessionize

    def build(frame: Any, delay: str | None) -> Any:
        options: dict[str, Any] = {}
        if delay is not None:
            options = {"watermark_delay": delay, "state_location": str(root / "state"),
                       "local_dir": str(root / "local")}
        return sessionize(frame, key="user", timestamp="ts", gap=GAP, engine=engine,
                          aggregations={"clicks": "count", "revenue": ("sum", "amount")},
                          **options)

    return build


def digest(frame: Any) -> tuple[int, int]:
    """(session rows, sum of a 64-bit hash of each row): computes every output column."""
    from pyspark.sql import functions as F

    row = frame.agg(
        F.count("*").alias("n"),
        F.sum(F.xxhash64("user", "session_start", "session_end", "clicks", "revenue")
              .cast("decimal(38,0)")).alias("h"),
    ).collect()[0]
    return int(row["n"]), int(row["h"] or 0)


def run_streaming(spark: Any, files: list[Path], root: Path,
                  build: Callable[[Any, str | None], Any]) -> dict[str, Any]:
    """Every file, one per micro-batch, then as many no-data batches as Spark runs."""
    source = root / "source"
    source.mkdir(parents=True)
    for path in files:
        shutil.copy(path, source / path.name)
        # the file source orders by modification time: make it the file order
        os.utime(source / path.name, (1_700_000_000 + len(os.listdir(source)),) * 2)
    totals = {"sessions": 0, "checksum": 0}

    def sink(frame: Any, batch_id: int) -> None:
        sessions, checksum = digest(frame.filter(frame.user != FLUSH_USER))
        totals["sessions"] += sessions
        totals["checksum"] += checksum

    stream = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1) \
        .parquet(str(source))
    started = time.perf_counter()
    query = (build(stream, DELAY).writeStream.foreachBatch(sink).outputMode("append")
             .option("checkpointLocation", str(root / "checkpoint")).start())
    query.processAllAvailable()
    wall_s = time.perf_counter() - started
    progress = list(query.recentProgress)
    query.stop()
    # rows are counted from the files, never from Spark's numInputRows: Spark counts a source
    # once per scan in the plan, so a query that reads its input twice reports twice the rows
    file_rows = [pq.read_metadata(path).num_rows for path in files]
    batches = [{"spark_rows": p["numInputRows"], "ms": p["durationMs"]["triggerExecution"]}
               for p in progress]
    data = [b for b in batches if b["spark_rows"]]
    if len(data) != len(files):
        raise RuntimeError(f"{len(data)} micro-batches read rows, expected one per file "
                           f"({len(files)})")
    for batch, count in zip(data, file_rows, strict=True):
        batch["rows"] = count
    rows = sum(file_rows)
    seconds = sum(b["ms"] for b in batches) / 1000
    steady = data[1:] or data  # the first data batch pays for starting Python workers
    return {
        "rows": rows,
        "spark_reported_rows": sum(b["spark_rows"] for b in batches),
        "seconds": seconds,
        "wall_seconds": wall_s,
        "rows_per_s": rows / seconds,
        "steady_rows_per_s": sum(b["rows"] for b in steady) / (sum(b["ms"] for b in steady)
                                                               / 1000),
        "data_batches": len(data),
        "no_data_batches": len(batches) - len(data),
        "sessions": totals["sessions"],
        "checksum": str(totals["checksum"]),
        "batches": batches,
    }


def run_static(spark: Any, files: list[Path], build: Callable[[Any, str | None], Any],
               rows: int) -> dict[str, Any]:
    frame = spark.read.schema(SCHEMA).parquet(*[str(p) for p in files])
    started = time.perf_counter()
    sessions, checksum = digest(build(frame, None))
    seconds = time.perf_counter() - started
    return {"rows": rows, "seconds": seconds, "rows_per_s": rows / seconds,
            "sessions": sessions, "checksum": str(checksum)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000,
                        help="input rows (the sample clickstream); default 200,000")
    parser.add_argument("--batches", type=int, default=8, help="data micro-batches")
    parser.add_argument("--partitions", type=int, default=2, help="shuffle partitions")
    parser.add_argument("--no-write", action="store_true", help="do not write the JSON")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    log.setLevel(logging.INFO)  # ours only: py4j logs every command at INFO
    spark = spark_session(args.partitions)
    root = Path(tempfile.mkdtemp(prefix="spark-bench-"))
    results: dict[str, Any] = {"rows": 0, "gap": GAP, "watermark_delay": DELAY,
                               "batches": args.batches, "partitions": args.partitions,
                               "master": "local[2]", "spark": spark.version}
    try:
        files, flush, n_rows = write_batches(root / "files", args.rows, args.batches)
        results["rows"] = n_rows
        peers: list[tuple[str, Callable[[Path], Builder]]] = [
            (NATIVE, lambda _: native), (ARROW, partial(ours, "arrow")),
            (PROCESSOR, partial(ours, "processor"))]
        # warm up the JVM and the Python workers once, on one file, so no peer pays for it
        for name, make in peers:
            run_streaming(spark, files[:1], root / "warm" / name.replace(" ", "_"),
                          make(root / "warm" / name.replace(" ", "_")))
        streaming: dict[str, dict[str, Any]] = {}
        static: dict[str, dict[str, Any]] = {}
        for name, make in peers:
            run_root = root / "stream" / name.replace(" ", "_")
            streaming[name] = run_streaming(spark, [*files, flush], run_root, make(run_root))
            log.info("streaming %-24s %9.0f rows/s  %d sessions  (%d data + %d no-data "
                     "batches; Spark reported %d input rows of %d)", name,
                     streaming[name]["rows_per_s"], streaming[name]["sessions"],
                     streaming[name]["data_batches"], streaming[name]["no_data_batches"],
                     streaming[name]["spark_reported_rows"], streaming[name]["rows"])
        for name, make in peers:
            static[name] = run_static(spark, files, make(root / "static"), n_rows)
            log.info("static    %-24s %9.0f rows/s  %d sessions", name,
                     static[name]["rows_per_s"], static[name]["sessions"])
        results["streaming"] = streaming
        results["static"] = static
        results["ratios_vs_native"] = {
            mode: {name: runs[name]["rows_per_s"] / runs[NATIVE]["rows_per_s"] for name in runs}
            for mode, runs in (("streaming", streaming), ("static", static))
        }
        results["equal_results"] = {
            mode: len({(r["sessions"], r["checksum"]) for r in runs.values()}) == 1
            for mode, runs in (("streaming", streaming), ("static", static))
        }
        log.info("ratios vs native: %s; equal results: %s", results["ratios_vs_native"],
                 results["equal_results"])
        results["driver_peak_rss_mb"] = peak_rss_mb()
        results["load_average"] = os.getloadavg()
    finally:
        spark.stop()
        shutil.rmtree(root, ignore_errors=True)
    if not args.no_write:
        log.info("wrote %s", write_results("spark", results))


if __name__ == "__main__":
    start = time.time()
    main()
    log.info("took %.0f s", time.time() - start)
