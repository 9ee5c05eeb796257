"""Spark benchmark: native ``session_window``, the Arrow engine and the processor engine, in one
Spark session on the same data, streaming and static.

* Streaming: the same Parquet files, one per micro-batch, through each query, then one file
  whose single far-future event lets the watermark close every session. Rows/s divide the input
  rows (counted in the files) by the summed ``triggerExecution`` time of *every* micro-batch,
  no-data batches included (they are where sessions close). Spark's own ``numInputRows`` is
  kept as ``spark_reported_rows``: it counts a source once per scan in the plan.
* Static: the same files read as one DataFrame; rows/s divide the input rows by the wall time of
  one job that computes every output row. A static job takes well under a second once warm, and
  the JVM's JIT keeps speeding native's up for its first ten or so runs, so static has its own
  warm-up (``--static-warmups`` runs of every engine, each one logged, not counted) and its own
  count of timed rounds (``--static-repeats``), the engines in alternating order in each. Each
  engine's figures are the medians with the spread (lowest and highest); the ratio is reported
  both of the medians and as the median of each round's ratio, which a load that drifts during
  the run moves less.
* CPU: each run reports the CPU seconds used by the JVM and by the Python workers (every process
  this driver started, read from ``/proc``), besides the wall time.
* Streaming: every engine is warmed up first (one streaming file each, not counted), then the
  engines run ``--repeats`` times, in alternating order (forward, then reversed), so neither
  always goes first. Each figure is the median over the repeats; every run is kept in the JSON.
* ``--modes``: ``streaming``, ``static`` or both (the default).
* ``--breakdown``: where a streaming micro-batch's time goes. Each micro-batch keeps every part of
  Spark's ``durationMs`` and its stateful operators' commit times (from the progress), and the
  stages of its jobs with their tasks (from the driver's UI REST API, which the option turns
  on): each stage's wall time, each task's duration, run and deserialization time. Each run
  then logs the medians over its data micro-batches after the first: the widest stage (the
  stateful one), the rest of ``triggerExecution`` outside it, and task durations by index.

Each run also counts its sessions and sums a hash of every session row (key, bounds,
aggregates), so equal counts and checksums mean equal results. It reports numbers and asserts
none; ratios against native are the figures to quote on a shared machine::

    python -m benchmarks.spark_bench [--rows N] [--batches B] [--repeats R]
        [--modes streaming,static] [--static-warmups W] [--static-repeats S]
        [--engines native,arrow,processor] [--conf NAME=VALUE] [--breakdown] [--no-write]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
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
PROVIDER_CONF = "spark.sql.streaming.stateStore.providerClass"


def spark_session(partitions: int, confs: dict[str, str] | None = None, ui: bool = False) -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    root = str(Path(__file__).resolve().parents[1])
    os.environ["PYTHONPATH"] = os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])
    from pyspark.sql import SparkSession

    from spark_adapter.sessionize import ROCKSDB_PROVIDER

    builder = SparkSession.builder
    for name, value in (confs or {}).items():  # first: the benchmark's own settings win
        builder = builder.config(name, value)
    spark = (
        builder.master("local[2]").appName("sessionstore-bench")
        .config("spark.sql.shuffle.partitions", str(partitions))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.enabled", str(ui).lower())  # --breakdown reads its REST API
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "4g")
        .config("spark.python.worker.faulthandler.enabled", "true")  # a crash shows its stack
        # every micro-batch's progress, not the default last 100
        .config("spark.sql.streaming.numRecentProgressUpdates", "100000")
        # Spark's RocksDB state store (the processor engine needs it) unless --conf names
        # another: the Arrow engine and native run on Spark's default one too
        .config(PROVIDER_CONF, (confs or {}).get(PROVIDER_CONF, ROCKSDB_PROVIDER))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _process_cpu_s(pid: int) -> tuple[str, float] | None:
    """(command name, CPU seconds of the process and its reaped children), or None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    name = stat[stat.index("(") + 1:stat.rindex(")")]
    fields = stat[stat.rindex(")") + 2:].split()
    # utime, stime, cutime, cstime: fields 14-17 of proc(5), counted after the name
    ticks = sum(int(f) for f in fields[11:15])
    return name, ticks / os.sysconf("SC_CLK_TCK")


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parent = int(stat[stat.rindex(")") + 2:].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


@contextmanager
def cpu_used() -> Iterator[dict[str, float]]:
    """Yields a dict that holds, on exit, the CPU seconds the JVM and the Python workers used
    inside the block (``jvm_cpu_s``, ``python_cpu_s``, ``cpu_s``). A worker that exited and was
    reaped counts in its parent's total; one that exited unreaped in the block is lost."""
    before = {pid: _process_cpu_s(pid) for pid in _descendants(os.getpid())}
    used: dict[str, float] = {}
    yield used
    totals = {"jvm": 0.0, "python": 0.0}
    for pid in _descendants(os.getpid()):
        now, then = _process_cpu_s(pid), before.get(pid)
        if now is None:
            continue
        kind = "jvm" if now[0] == "java" else "python"
        totals[kind] += now[1] - (then[1] if then is not None and then[0] == now[0] else 0.0)
    used.update(jvm_cpu_s=totals["jvm"], python_cpu_s=totals["python"],
                cpu_s=totals["jvm"] + totals["python"])


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


class StageTimes:
    """The stages and tasks of a streaming query's jobs, by micro-batch, from the driver's UI
    REST API (``spark.ui.enabled``): what ``--breakdown`` reports."""

    DURATIONS = ("triggerExecution", "addBatch", "getBatch", "latestOffset", "queryPlanning",
                 "walCommit", "commitOffsets")

    def __init__(self, spark: Any) -> None:
        context = spark.sparkContext
        if not context.uiWebUrl:
            raise RuntimeError("--breakdown needs the Spark UI (spark.ui.enabled=true)")
        self.base = f"{context.uiWebUrl}/api/v1/applications/{context.applicationId}"
        self.seen = {job["jobId"] for job in self._get("jobs")}

    def _get(self, path: str) -> Any:
        with urllib.request.urlopen(f"{self.base}/{path}", timeout=30) as response:
            return json.load(response)

    def by_batch(self, run_id: str) -> dict[int, list[dict[str, Any]]]:
        """The completed stages of the query run ``run_id``'s jobs since this was made, by
        micro-batch (Spark names the batch in each job's description)."""
        stages: dict[int, list[dict[str, Any]]] = {}
        for job in self._get("jobs"):
            if job["jobId"] in self.seen or job.get("jobGroup") != run_id:
                continue
            found = re.search(r"batch = (\d+)", job.get("description") or "")
            if found is None:
                continue
            for stage_id in job["stageIds"]:
                for stage in self._get(f"stages/{stage_id}?details=true"):
                    if stage["status"] == "COMPLETE":
                        stages.setdefault(int(found.group(1)), []).append(_stage_times(stage))
        return stages


def _rest_time(value: str) -> float:
    return datetime.strptime(value.removesuffix("GMT"), "%Y-%m-%dT%H:%M:%S.%f").timestamp()


def _stage_times(stage: dict[str, Any]) -> dict[str, Any]:
    tasks = sorted(stage.get("tasks", {}).values(), key=lambda task: task["index"])
    return {
        "stage": stage["stageId"], "tasks": stage["numTasks"],
        "ms": round(1000 * (_rest_time(stage["completionTime"])
                            - _rest_time(stage["submissionTime"]))),
        "run_ms": stage["executorRunTime"], "deserialize_ms": stage["executorDeserializeTime"],
        "jvm_cpu_ms": round(stage["executorCpuTime"] / 1e6),
        "task_ms": [task["duration"] for task in tasks],
        "task_run_ms": [task["taskMetrics"]["executorRunTime"] for task in tasks],
        "task_deserialize_ms": [task["taskMetrics"]["executorDeserializeTime"]
                                for task in tasks],
    }


def breakdown_summary(batches: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the data micro-batches after the first (which starts the Python workers):
    each ``durationMs`` part, the widest stage (the stateful one: the shuffle's partitions,
    and for ``sessionize`` the ticker's too), the rest of ``triggerExecution`` outside it, the
    stateful operators' commit time, and task durations by task index in the widest stage."""
    data = [b for b in batches if b["spark_rows"] and b.get("stages")][1:]
    if not data:
        return {}
    widest = [max(b["stages"], key=lambda stage: stage["tasks"]) for b in data]
    summary: dict[str, Any] = {
        f"{name}_ms": statistics.median(b["durations"].get(name, 0) for b in data)
        for name in StageTimes.DURATIONS}
    summary["stateful_stage_ms"] = statistics.median(stage["ms"] for stage in widest)
    summary["outside_stateful_stage_ms"] = statistics.median(
        b["ms"] - stage["ms"] for b, stage in zip(data, widest, strict=True))
    summary["state_commit_ms"] = statistics.median(b["state_commit_ms"] for b in data)
    summary["stages"] = statistics.median(len(b["stages"]) for b in data)
    width = min(len(stage["task_ms"]) for stage in widest)
    summary["task_ms_by_index"] = [statistics.median(stage["task_ms"][i] for stage in widest)
                                   for i in range(width)]
    return summary


def run_streaming(spark: Any, files: list[Path], root: Path,
                  build: Callable[[Any, str | None], Any],
                  breakdown: bool = False) -> dict[str, Any]:
    """Every file, one per micro-batch, then as many no-data batches as Spark runs; with
    ``breakdown``, every micro-batch's stages and tasks too (:class:`StageTimes`)."""
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
    stage_times = StageTimes(spark) if breakdown else None
    with cpu_used() as cpu:
        started = time.perf_counter()
        query = (build(stream, DELAY).writeStream.foreachBatch(sink).outputMode("append")
                 .option("checkpointLocation", str(root / "checkpoint")).start())
        query.processAllAvailable()
        wall_s = time.perf_counter() - started
    progress = list(query.recentProgress)
    run_id = str(query.runId)
    query.stop()
    stages = stage_times.by_batch(run_id) if stage_times is not None else {}
    # rows are counted from the files, never from Spark's numInputRows: Spark counts a source
    # once per scan in the plan, so a query that reads its input twice reports twice the rows
    file_rows = [pq.read_metadata(path).num_rows for path in files]
    batches = [{"spark_rows": p["numInputRows"], "ms": p["durationMs"]["triggerExecution"],
                "add_batch_ms": p["durationMs"].get("addBatch", 0),
                "durations": dict(p["durationMs"]),
                "state_commit_ms": sum(op.get("commitTimeMs", 0)
                                       for op in p.get("stateOperators") or []),
                **({"stages": stages.get(p["batchId"], [])} if breakdown else {})}
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
        **cpu,
        "python_cpu_s_per_batch": cpu["python_cpu_s"] / len(batches),
        "sessions": totals["sessions"],
        "checksum": str(totals["checksum"]),
        "batches": batches,
        **({"breakdown": breakdown_summary(batches)} if breakdown else {}),
    }


def run_static(spark: Any, files: list[Path], build: Callable[[Any, str | None], Any],
               rows: int) -> dict[str, Any]:
    frame = spark.read.schema(SCHEMA).parquet(*[str(p) for p in files])
    with cpu_used() as cpu:
        started = time.perf_counter()
        sessions, checksum = digest(build(frame, None))
        seconds = time.perf_counter() - started
    return {"rows": rows, "seconds": seconds, "rows_per_s": rows / seconds, **cpu,
            "sessions": sessions, "checksum": str(checksum)}


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run of median rows/s (the lower middle of an even count), with every run's rows/s,
    wall and CPU, and the load average after each, beside it."""
    ranked = sorted(runs, key=lambda r: r["rows_per_s"])
    chosen = dict(ranked[(len(ranked) - 1) // 2])
    chosen["median_rows_per_s"] = statistics.median(r["rows_per_s"] for r in runs)
    chosen["runs"] = [{k: r[k] for k in ("rows_per_s", "seconds", "cpu_s", "jvm_cpu_s",
                                          "python_cpu_s", "load_average", "breakdown")
                       if k in r}
                      for r in runs]
    return chosen


def static_summary(runs: dict[str, list[dict[str, Any]]], base: str) -> dict[str, Any]:
    """Per engine, over its timed static runs (rounds in order, one run per engine a round): the
    medians of rows/s, wall seconds and CPU seconds (JVM, Python workers), the spread (lowest
    and highest) of rows/s and wall, the load averages seen, and against ``base``: the ratio
    of the median rows/s, of the median CPU seconds (``base``'s over the engine's), and each
    round's ratio (``base``'s wall over the engine's), with their median and spread.

    Raises:
        ValueError: an engine has a different number of runs than ``base`` (a round lacks
            one), or none.
    """
    summary: dict[str, Any] = {}
    for name, engine_runs in runs.items():
        rates = [r["rows_per_s"] for r in engine_runs]
        walls = [r["seconds"] for r in engine_runs]
        round_ratios = [b["seconds"] / r["seconds"]
                        for b, r in zip(runs[base], engine_runs, strict=True)]
        summary[name] = {
            "median_rows_per_s": statistics.median(rates),
            "rows_per_s_range": [min(rates), max(rates)],
            "median_seconds": statistics.median(walls),
            "seconds_range": [min(walls), max(walls)],
            "median_jvm_cpu_s": statistics.median(r["jvm_cpu_s"] for r in engine_runs),
            "median_python_cpu_s": statistics.median(r["python_cpu_s"] for r in engine_runs),
            "median_cpu_s": statistics.median(r["cpu_s"] for r in engine_runs),
            "load_range": [min(r["load_average"] for r in engine_runs),
                           max(r["load_average"] for r in engine_runs)],
            "ratio_of_medians": statistics.median(rates)
            / statistics.median(r["rows_per_s"] for r in runs[base]),
            # CPU seconds are what a load moves least (it moves wall time most)
            "cpu_ratio_of_medians": statistics.median(r["cpu_s"] for r in runs[base])
            / statistics.median(r["cpu_s"] for r in engine_runs),
            "median_round_ratio": statistics.median(round_ratios),
            "round_ratio_range": [min(round_ratios), max(round_ratios)],
            "runs": [{k: r[k] for k in ("rows_per_s", "seconds", "cpu_s", "jvm_cpu_s",
                                         "python_cpu_s", "load_average")}
                     for r in engine_runs],
        }
    return summary


def _log_static(label: str, name: str, run: dict[str, Any]) -> None:
    log.info("%-9s %-24s %9.0f rows/s  %5.2f s wall  CPU %.2f s (JVM %.2f, Python %.2f)  %d "
             "sessions  load %.1f", label, name, run["rows_per_s"], run["seconds"],
             run["cpu_s"], run["jvm_cpu_s"], run["python_cpu_s"], run["sessions"],
             run["load_average"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000,
                        help="input rows (the sample clickstream); default 200,000")
    parser.add_argument("--batches", type=int, default=8, help="data micro-batches")
    parser.add_argument("--partitions", type=int, default=2, help="shuffle partitions")
    parser.add_argument("--repeats", type=int, default=2,
                        help="timed runs of each engine, in alternating order; default 2")
    parser.add_argument("--modes", default="streaming,static",
                        help="which of streaming and static to run (comma-separated)")
    parser.add_argument("--static-warmups", type=int, default=12,
                        help="untimed static runs of each engine before the timed ones, in "
                             "alternating order (native's JIT needs about ten); default 12")
    parser.add_argument("--static-repeats", type=int, default=7,
                        help="timed static rounds (one run of each engine, in alternating "
                             "order); default 7")
    parser.add_argument("--engines", default="native,arrow,processor",
                        help="which of native, arrow and processor to run (comma-separated)")
    parser.add_argument("--conf", action="append", default=[], metavar="NAME=VALUE",
                        help="a Spark setting for every engine (repeatable)")
    parser.add_argument("--breakdown", action="store_true",
                        help="record each streaming micro-batch's stages and tasks (turns the "
                             "Spark UI on; see the module docstring)")
    parser.add_argument("--no-write", action="store_true", help="do not write the JSON")
    args = parser.parse_args(argv)
    chosen = args.engines.split(",")
    if not chosen or set(chosen) - {"native", "arrow", "processor"} or args.repeats < 1:
        parser.error(f"--engines must name native, arrow or processor, got {args.engines!r}; "
                     f"--repeats must be >= 1, got {args.repeats}")
    modes = args.modes.split(",")
    if not modes or set(modes) - {"streaming", "static"}:
        parser.error(f"--modes must name streaming or static, got {args.modes!r}")
    if args.static_warmups < 0 or args.static_repeats < 1:
        parser.error(f"--static-warmups must be >= 0 and --static-repeats >= 1, got "
                     f"{args.static_warmups} and {args.static_repeats}")
    confs = dict(item.split("=", 1) for item in args.conf if "=" in item)
    if len(confs) != len(args.conf):
        parser.error(f"--conf takes NAME=VALUE, got {args.conf!r}")
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    log.setLevel(logging.INFO)  # ours only: py4j logs every command at INFO
    spark = spark_session(args.partitions, confs, ui=args.breakdown)
    root = Path(tempfile.mkdtemp(prefix="spark-bench-"))
    results: dict[str, Any] = {"rows": 0, "gap": GAP, "watermark_delay": DELAY,
                               "batches": args.batches, "partitions": args.partitions,
                               "repeats": args.repeats, "modes": modes,
                               "static_warmups": args.static_warmups,
                               "static_repeats": args.static_repeats, "master": "local[2]",
                               "spark": spark.version, "confs": confs}
    try:
        files, flush, n_rows = write_batches(root / "files", args.rows, args.batches)
        results["rows"] = n_rows
        every: list[tuple[str, str, Callable[[Path], Builder]]] = [
            ("native", NATIVE, lambda _: native), ("arrow", ARROW, partial(ours, "arrow")),
            ("processor", PROCESSOR, partial(ours, "processor"))]
        peers = [(name, make) for short, name, make in every if short in chosen]
        streaming_runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in peers}
        static_runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in peers}
        base = NATIVE if NATIVE in dict(peers) else peers[0][0]
        if "streaming" in modes:
            # warm up the JVM and the Python workers so no peer pays for it
            for name, make in peers:
                warm = root / "warm" / name.replace(" ", "_")
                run_streaming(spark, files[:1], warm, make(warm))
        for repeat in range(args.repeats if "streaming" in modes else 0):
            order = peers if repeat % 2 == 0 else peers[::-1]
            for name, make in order:
                run_root = root / f"stream-{repeat}" / name.replace(" ", "_")
                run = run_streaming(spark, [*files, flush], run_root, make(run_root),
                                    args.breakdown)
                run["load_average"] = os.getloadavg()[0]
                streaming_runs[name].append(run)
                log.info("streaming %-24s %9.0f rows/s  %5.1f s wall  CPU %.1f s (JVM %.1f, "
                         "Python %.1f)  %d sessions  (%d data + %d no-data batches)  load %.1f",
                         name, run["rows_per_s"], run["wall_seconds"], run["cpu_s"],
                         run["jvm_cpu_s"], run["python_cpu_s"], run["sessions"],
                         run["data_batches"], run["no_data_batches"], run["load_average"])
                if args.breakdown:
                    log.info("  breakdown (medians, ms): %s", run["breakdown"])
        if "static" in modes:
            # the whole input each time: native's JIT warms on the job it is timed on
            warmups: dict[str, list[float]] = {name: [] for name, _ in peers}
            for repeat in range(args.static_warmups):
                for name, make in peers if repeat % 2 == 0 else peers[::-1]:
                    run = run_static(spark, files, make(root / "static"), n_rows)
                    run["load_average"] = os.getloadavg()[0]
                    warmups[name].append(run["rows_per_s"])
                    _log_static(f"warm-up {repeat}", name, run)
            results["static_warmup_rows_per_s"] = warmups
            for repeat in range(args.static_repeats):
                for name, make in peers if repeat % 2 == 0 else peers[::-1]:
                    run = run_static(spark, files, make(root / "static"), n_rows)
                    run["load_average"] = os.getloadavg()[0]
                    static_runs[name].append(run)
                    _log_static("static", name, run)
        runs_by_mode = {mode: runs for mode, runs in (("streaming", streaming_runs),
                                                       ("static", static_runs))
                        if mode in modes}
        if "streaming" in modes:
            streaming = {name: median_run(runs) for name, runs in streaming_runs.items()}
            results["streaming"] = streaming
            results["ratios_vs_native"] = {"streaming": {
                name: streaming[name]["median_rows_per_s"] / streaming[base]["median_rows_per_s"]
                for name in streaming}}
        if "static" in modes:
            results["static"] = static_summary(static_runs, base)
            results.setdefault("ratios_vs_native", {})["static"] = {
                name: figures["ratio_of_medians"] for name, figures in results["static"].items()}
            for name, figures in results["static"].items():
                log.info("static %-24s median %9.0f rows/s (%.0f-%.0f), wall %.3f s "
                         "(%.3f-%.3f), CPU JVM %.2f + Python %.2f s; x %s: %.2f of medians, "
                         "round ratios median %.2f (%.2f-%.2f), %.2f of median CPU; load "
                         "%.1f-%.1f", name,
                         figures["median_rows_per_s"], *figures["rows_per_s_range"],
                         figures["median_seconds"], *figures["seconds_range"],
                         figures["median_jvm_cpu_s"], figures["median_python_cpu_s"], base,
                         figures["ratio_of_medians"], figures["median_round_ratio"],
                         *figures["round_ratio_range"], figures["cpu_ratio_of_medians"],
                         *figures["load_range"])
        # every run of every engine, not only the medians, must give the same sessions
        results["equal_results"] = {
            mode: len({(r["sessions"], r["checksum"]) for rs in runs.values() for r in rs}) == 1
            for mode, runs in runs_by_mode.items()
        }
        log.info("median ratios vs native: %s; equal results: %s", results["ratios_vs_native"],
                 results["equal_results"])
        results["driver_peak_rss_mb"] = peak_rss_mb()
        results["load_average"] = os.getloadavg()
    finally:
        spark.stop()
        shutil.rmtree(root, ignore_errors=True)
    if not args.no_write:
        # a run of one mode leaves the other's figures in place
        name = "spark" if len(modes) == 2 else f"spark_{modes[0]}"
        log.info("wrote %s", write_results(name, results))


if __name__ == "__main__":
    start = time.time()
    main()
    log.info("took %.0f s", time.time() - start)
