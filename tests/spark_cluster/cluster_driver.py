"""A streaming driver on ``local-cluster[2,1,1024]`` (two executor JVMs) for the cluster test:
``python -m tests.spark_cluster.cluster_driver ROOT [options]``.

It streams the JSON files under ``<ROOT>/source`` (one per micro-batch) through ``sessionize``
with its state at ``--state`` (an S3 URI), or through native ``session_window`` (``--native``),
into a foreachBatch sink that writes each batch's rows to ``<ROOT>/out/<batch>.<pid>.json``.

* ``--kill-executor-at N``: while batch N's tasks run, SIGKILL one executor JVM of this
  application (recorded in ``<ROOT>/killed-executors.json``); Spark reruns its tasks elsewhere.
* ``--kill-driver-at N``: SIGKILL this driver right after the sink wrote batch N, after the
  sink's commit and before Spark writes ``commits/N``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
GAP, DELAY = "10 seconds", "5 seconds"


def executor_pids(app_id: str) -> list[int]:
    """Executor JVMs of this application only (other Spark applications may share the host)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"org.apache.spark.executor.CoarseGrainedExecutorBackend" in argv \
                and app_id.encode() in argv:
            found.append(int(entry.name))
    return sorted(found)


def kill_executor_when_tasks_run(spark: Any, log: Path, timeout_s: float = 120.0) -> None:
    """Wait until a stage of this application has running tasks, then SIGKILL one executor."""
    context = spark.sparkContext
    tracker = context.statusTracker()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for stage in tracker.getActiveStageIds():
            info = tracker.getStageInfo(stage)
            if info is not None and info.numActiveTasks > 0:
                pids = executor_pids(context.applicationId)
                if pids:
                    os.kill(pids[0], signal.SIGKILL)
                    record = json.loads(log.read_text()) if log.exists() else []
                    record.append({"pid": pids[0], "stage": stage,
                                   "active_tasks": info.numActiveTasks})
                    log.write_text(json.dumps(record))
                    return
        time.sleep(0.05)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("--state", default=None, help="sessionize's state location (a URI)")
    parser.add_argument("--native", action="store_true")
    parser.add_argument("--kill-executor-at", type=int, default=-1)
    parser.add_argument("--kill-driver-at", type=int, default=-1)
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from spark_adapter import sessionize
    from tests.spark.replay_driver import run_to_end

    root = Path(args.root)
    pythonpath = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    spark = (SparkSession.builder.master("local-cluster[2,1,1024]")
             .appName("sessionstore-cluster")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.executor.memory", "768m")
             .config("spark.executorEnv.PYTHONPATH", pythonpath)
             .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
             .config("spark.pyspark.python", sys.executable)
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    stream = spark.readStream.schema("user string, ts timestamp, amount long") \
        .option("maxFilesPerTrigger", 1).json(str(root / "source"))
    if args.native:
        sessions = (stream.withWatermark("ts", DELAY)
                    .groupBy("user", F.session_window("ts", GAP).alias("w"))
                    .agg(F.count("*").alias("n"), F.sum("amount").alias("total"))
                    .select("user", "w.start", "w.end", "n", "total"))
    else:
        sessions = sessionize(stream, key="user", timestamp="ts", gap=GAP,
                              aggregations={"n": "count", "total": ("sum", "amount")},
                              watermark_delay=DELAY, state_location=args.state,
                              local_dir=str(root / "local"))
    def before_batch(batch_id: int) -> None:
        if batch_id == args.kill_executor_at:
            threading.Thread(target=kill_executor_when_tasks_run,
                             args=(spark, root / "killed-executors.json"), daemon=True).start()

    run_to_end(spark, sessions, root, args.kill_driver_at, before_batch)
    return 0

if __name__ == "__main__":
    sys.exit(main())
