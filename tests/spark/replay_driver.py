"""A streaming driver process for the replay test: ``python -m tests.spark.replay_driver``.

It streams the JSON files under ``<root>/source`` (one per micro-batch) through ``sessionize`` (or
native ``session_window`` with ``--native``) into a foreachBatch sink that writes each batch's rows
to ``<root>/out/<batch>.<pid>.json``. With ``--kill-at N`` the sink SIGKILLs its own driver right
after writing batch N: after the sink committed, before Spark writes ``commits/N``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.spark.streams import jvm_temp_option


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("--engine", default="arrow")
    parser.add_argument("--native", action="store_true")
    parser.add_argument("--kill-at", type=int, default=-1)
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from spark_adapter import sessionize
    from spark_adapter.sessionize import ROCKSDB_PROVIDER

    root = Path(args.root)
    spark = (SparkSession.builder.master("local[2]").appName("sessionstore-replay")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.ui.enabled", "false")
             .config("spark.sql.streaming.stateStore.providerClass", ROCKSDB_PROVIDER)
             .config("spark.python.worker.faulthandler.enabled", "true")
             .config("spark.driver.extraJavaOptions", jvm_temp_option())
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    stream = spark.readStream.schema("user string, ts timestamp, amount long") \
        .option("maxFilesPerTrigger", 1).json(str(root / "source"))
    if args.native:
        sessions = (stream.withWatermark("ts", "5 seconds")
                    .groupBy("user", F.session_window("ts", "10 seconds").alias("w"))
                    .agg(F.count("*").alias("n"), F.sum("amount").alias("total"))
                    .select("user", "w.start", "w.end", "n", "total"))
    else:
        sessions = sessionize(stream, key="user", timestamp="ts", gap="10 seconds",
                              aggregations={"n": "count", "total": ("sum", "amount")},
                              watermark_delay="5 seconds", engine=args.engine,
                              state_location=str(root / "state"),
                              local_dir=str(root / "local"))
    run_to_end(spark, sessions, root, args.kill_at)
    return 0


def run_to_end(spark: Any, sessions: Any, root: Path, kill_driver_at: int,
               before_batch: Callable[[int], None] | None = None) -> None:
    """Run ``sessions`` until the source is drained, into a foreachBatch sink that writes each
    batch's rows to ``<root>/out/<batch>.<pid>.json`` and SIGKILLs this driver right after
    writing batch ``kill_driver_at`` (after the sink's commit, before Spark's commits/N)."""
    out = root / "out"
    out.mkdir(exist_ok=True)

    def sink(frame: Any, batch_id: int) -> None:
        if before_batch is not None:
            before_batch(batch_id)
        rows = sorted([r[0], r[1].isoformat(), r[2].isoformat(), r[3], r[4]]
                      for r in frame.collect())
        target = out / f"{batch_id}.{os.getpid()}.json"
        target.with_suffix(".tmp").write_text(json.dumps(rows))
        target.with_suffix(".tmp").rename(target)
        if batch_id == kill_driver_at:
            os.kill(os.getpid(), signal.SIGKILL)

    query = (sessions.writeStream.foreachBatch(sink).outputMode("append")
             .option("checkpointLocation", str(root / "checkpoint")).start())
    query.processAllAvailable()
    query.stop()
    spark.stop()

if __name__ == "__main__":
    sys.exit(main())
