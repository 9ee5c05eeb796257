"""A streaming driver on ``local-cluster[2,1,1024]`` (two executor JVMs) for the cluster test:
``python -m tests.spark_cluster.cluster_driver PLAN.json``.

One driver process starts the cluster once and runs, one after another in the same
SparkSession, the streaming queries the plan lists (a JSON list of runs). Each run streams the
JSON files under ``<root>/source`` (one per micro-batch) through ``sessionize`` with its state at
``state`` (an S3 URI), or through native ``session_window`` (``"native": true``), into a
foreachBatch sink that writes each batch's rows to ``<root>/out/<batch>.<pid>.json``, and stops
when the source is drained. A run may also

* ``"kill_executor_at": N``: while batch N's tasks run, SIGKILL one executor JVM of this
  application (recorded in ``<root>/killed-executors.json``); Spark reruns its tasks elsewhere
  and the cluster starts a new executor;
* ``"kill_driver_at": N``: SIGKILL this driver right after the sink wrote batch N, after the
  sink's commit and before Spark writes ``commits/N``: the process ends there, so this is the
  plan's last run. A later plan restarts it (the same run without the kill) from its
  checkpoint.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tests.spark.streams import jvm_temp_option

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


def build(spark: Any, run: dict[str, Any]) -> Any:
    """The run's sessions: native session_window or sessionize, over its source directory."""
    from pyspark.sql import functions as F

    from spark_adapter import sessionize

    root = Path(run["root"])
    stream = spark.readStream.schema("user string, ts timestamp, amount long") \
        .option("maxFilesPerTrigger", 1).json(str(root / "source"))
    if run.get("native"):
        return (stream.withWatermark("ts", DELAY)
                .groupBy("user", F.session_window("ts", GAP).alias("w"))
                .agg(F.count("*").alias("n"), F.sum("amount").alias("total"))
                .select("user", "w.start", "w.end", "n", "total"))
    return sessionize(stream, key="user", timestamp="ts", gap=GAP,
                      aggregations={"n": "count", "total": ("sum", "amount")},
                      watermark_delay=DELAY, state_location=run["state"],
                      local_dir=str(root / "local"), engine=run.get("engine", "arrow"))


def run_to_end(spark: Any, run: dict[str, Any]) -> None:
    """Run one query until its source is drained (or this driver is killed in its sink)."""
    root = Path(run["root"])
    out = root / "out"
    out.mkdir(exist_ok=True)
    kill_executor_at = int(run.get("kill_executor_at", -1))
    kill_driver_at = int(run.get("kill_driver_at", -1))

    def sink(frame: Any, batch_id: int) -> None:
        if batch_id == kill_executor_at:
            threading.Thread(target=kill_executor_when_tasks_run,
                             args=(spark, root / "killed-executors.json"), daemon=True).start()
        rows = sorted([r[0], r[1].isoformat(), r[2].isoformat(), r[3], r[4]]
                      for r in frame.collect())
        target = out / f"{batch_id}.{os.getpid()}.json"
        target.with_suffix(".tmp").write_text(json.dumps(rows))
        target.with_suffix(".tmp").rename(target)
        if batch_id == kill_driver_at:
            os.kill(os.getpid(), signal.SIGKILL)

    query = (build(spark, run).writeStream.foreachBatch(sink).outputMode("append")
             .option("checkpointLocation", str(root / "checkpoint")).start())
    query.processAllAvailable()
    query.stop()


def main() -> int:
    plan = json.loads(Path(sys.argv[1]).read_text())
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

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
             .config("spark.driver.extraJavaOptions", jvm_temp_option())
             .config("spark.executor.extraJavaOptions", jvm_temp_option())
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    for run in plan:
        started = time.monotonic()
        run_to_end(spark, run)
        Path(run["root"], "run-seconds").write_text(f"{time.monotonic() - started:.1f}")
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
