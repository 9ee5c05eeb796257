"""Spark's own per-micro-batch floor: what a streaming micro-batch costs before any sessions are
computed, against native ``session_window`` and ``sessionize`` on the same stream.

It runs, in one Spark session on ``spark_bench``'s clickstream (one Parquet file per
micro-batch, then the far-future flush file), these queries into the same ``foreachBatch`` sink
(a count and a hash of every output row):

* ``native`` and ``arrow``: ``spark_bench``'s native ``session_window`` and ``sessionize``;
* ``source+sink``: the input rows themselves, watermarked, no shuffle;
* ``shuffle``: the same, repartitioned by user (one exchange, as every keyed plan needs);
* ``shuffle+python``: and through ``mapInArrow`` with a function that returns its input
  (Spark's round trip to the Python workers and back, no work in them);
* ``shuffle+state``: a streaming deduplication within the watermark by user (a stateful operator
  on Spark's state store, which is what makes Spark run no-data micro-batches);
* ``skeleton``: ``sessionize``'s streaming plan with the engine replaced by the identity
  function: the hashed partition column, one shared shuffle, ``mapInArrow``, and the always-empty
  deduplication unioned with it (what a micro-batch costs if the engine took no time at all).

The floors emit every input row (their sink work is larger than the engines', which emit one row
per session), so they overstate what Spark's own work costs, never understate it. For each query
it reports rows/s over every micro-batch (no-data ones included), the median
``triggerExecution`` of the data micro-batches after the first, and the CPU of the JVM and the
Python workers; and for each floor, the ceiling it puts on any plan built on it:
``native's median micro-batch / the floor's``. Numbers only, nothing asserted::

    python -m benchmarks.spark_floors [--rows N] [--batches B] [--repeats R] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import tempfile
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow as pa

from . import spark_bench as bench

log = logging.getLogger("benchmarks.spark_floors")
PARTITION_KEY = "floor_partition_key"


def _identity(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    yield from batches


def _as_sessions(frame: Any) -> Any:
    """Input rows under the sink's session columns: each row its own zero-length session."""
    from pyspark.sql import functions as F

    return frame.select("user", F.col("ts").alias("session_start"),
                        F.col("ts").alias("session_end"), F.lit(1).alias("clicks"),
                        F.col("amount").alias("revenue"))


def _watermarked(frame: Any, delay: str | None) -> Any:
    return frame.withWatermark("ts", delay) if delay is not None else frame


def _source_sink(frame: Any, delay: str | None) -> Any:
    return _as_sessions(_watermarked(frame, delay))


def _shuffle(frame: Any, delay: str | None) -> Any:
    partitions = int(frame.sparkSession.conf.get("spark.sql.shuffle.partitions"))
    return _as_sessions(_watermarked(frame, delay).repartition(partitions, "user"))


def _shuffle_python(frame: Any, delay: str | None) -> Any:
    partitions = int(frame.sparkSession.conf.get("spark.sql.shuffle.partitions"))
    shuffled = _watermarked(frame, delay).repartition(partitions, "user")
    return _as_sessions(shuffled.mapInArrow(_identity, shuffled.schema))


def _shuffle_state(frame: Any, delay: str | None) -> Any:
    return _as_sessions(_watermarked(frame, delay).dropDuplicatesWithinWatermark(["user"]))


def _skeleton(frame: Any, delay: str | None) -> Any:
    """``sessionize``'s streaming plan shape (see ``spark_adapter.sessionize``) with an identity
    engine: an int hash column, one shuffle by it shared by both branches, the engine's
    ``mapInArrow`` and the always-empty deduplication keyed by the hash, unioned."""
    from pyspark.sql import functions as F

    partitions = int(frame.sparkSession.conf.get("spark.sql.shuffle.partitions"))
    keyed = _watermarked(frame, delay).withColumn(PARTITION_KEY, F.hash(F.col("user")))
    shuffled = keyed.repartition(partitions, PARTITION_KEY)
    sessions = _as_sessions(shuffled.drop(PARTITION_KEY).mapInArrow(
        _identity, shuffled.drop(PARTITION_KEY).schema))
    never = F.spark_partition_id() < F.lit(0)
    ticker = _as_sessions(shuffled.filter(never).dropDuplicatesWithinWatermark([PARTITION_KEY]))
    return ticker.unionByName(sessions)


FLOORS: dict[str, bench.Builder] = {
    "source+sink": _source_sink, "shuffle": _shuffle, "shuffle+python": _shuffle_python,
    "shuffle+state": _shuffle_state, "skeleton": _skeleton}


def run(rows: int, batches: int, repeats: int, partitions: int) -> dict[str, Any]:
    """Every query warmed up on one file, then ``repeats`` runs each in alternating order."""
    spark = bench.spark_session(partitions)
    root = Path(tempfile.mkdtemp(prefix="spark-floors-"))
    files, flush, n_rows = bench.write_batches(root / "files", rows, batches)
    queries: list[tuple[str, Callable[[Path], bench.Builder]]] = [
        ("native", lambda _: bench.native), ("arrow", partial(bench.ours, "arrow")),
        *[(name, (lambda b: lambda _: b)(builder)) for name, builder in FLOORS.items()]]
    for name, make in queries:
        warm = root / "warm" / name
        bench.run_streaming(spark, files[:1], warm, make(warm))
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in queries}
    for repeat in range(repeats):
        for name, make in queries if repeat % 2 == 0 else queries[::-1]:
            run_root = root / f"run-{repeat}" / name
            result = bench.run_streaming(spark, [*files, flush], run_root, make(run_root))
            data_ms = [b["ms"] for b in result["batches"] if b["spark_rows"]][1:]
            runs[name].append({"rows_per_s": result["rows_per_s"],
                               "median_batch_ms": statistics.median(data_ms),
                               "jvm_cpu_s": result["jvm_cpu_s"],
                               "python_cpu_s": result["python_cpu_s"],
                               "load_average": os.getloadavg()[0]})
            log.info("%-15s %8.0f rows/s  median micro-batch %4.0f ms  CPU JVM %.1f s, Python "
                     "%.1f s  load %.1f", name, *runs[name][-1].values())
    spark.stop()
    summary = {name: {"median_rows_per_s": statistics.median(r["rows_per_s"] for r in each),
                      "median_batch_ms": statistics.median(r["median_batch_ms"] for r in each),
                      "runs": each}
               for name, each in runs.items()}
    native_ms = summary["native"]["median_batch_ms"]
    for figures in summary.values():
        figures["ceiling_vs_native"] = native_ms / figures["median_batch_ms"]
    return {"rows": n_rows, "batches": batches, "partitions": partitions, "repeats": repeats,
            "spark": spark.version, "queries": summary}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.spark_floors",
        description="Spark's per-micro-batch floor against native session_window and "
                    "sessionize (see the module docstring).")
    parser.add_argument("--rows", type=int, default=400_000, help="input rows (default 400000)")
    parser.add_argument("--batches", type=int, default=16,
                        help="micro-batches the input is split into (default 16)")
    parser.add_argument("--repeats", type=int, default=2,
                        help="timed runs of each query, alternating order (default 2)")
    parser.add_argument("--partitions", type=int, default=2,
                        help="spark.sql.shuffle.partitions (default 2)")
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    args = parser.parse_args(argv)
    if args.rows < args.batches or args.batches < 1 or args.repeats < 1 or args.partitions < 1:
        parser.error(f"--rows >= --batches >= 1, --repeats >= 1 and --partitions >= 1, got "
                     f"{args.rows}, {args.batches}, {args.repeats} and {args.partitions}")
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    log.setLevel(logging.INFO)
    results = run(args.rows, args.batches, args.repeats, args.partitions)
    for name, figures in results["queries"].items():
        log.info("%-15s median %8.0f rows/s, micro-batch %4.0f ms; native / this: %.2fx", name,
                 figures["median_rows_per_s"], figures["median_batch_ms"],
                 figures["ceiling_vs_native"])
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
