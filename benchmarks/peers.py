"""Peer benchmark: this engine against Spark's session_window, PyFlink's SQL SESSION window and a
plain-Python sessionizer, on the same two workloads, in one run.

Every peer runs in its own subprocess, so that its peak RSS is its own (for Spark and Flink, the
JVM's peak is added to the Python process's own). Workloads:

* ``q11``: Nexmark q11-style bids, count per bidder, 10 s session gap;
* ``clicks``: the bundled sample clickstream, count per user, 30 min gap.

PyFlink needs its own environment (``apache-flink`` pins pyarrow < 21, pandas < 2.3 and
py4j 0.10.9.7, which conflict with PySpark 4): ``make bench-peers`` creates ``.venv-bench`` with
``pip install -e .[bench]``; pass ``--flink-python`` to point at another one. It reports numbers
and asserts none::

    python -m benchmarks.peers --events 2000000
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger("benchmarks.peers")
ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = {"q11": 10_000, "clicks": 30 * 60_000}  # gap in ms
LATENESS_MS = {"q11": 200, "clicks": 10_000}


def load_workload(name: str, events: int) -> tuple[np.ndarray, np.ndarray]:
    """(keys as int64, event times in ms) of a workload, in arrival order."""
    from sessionstore.sample import bid_stream, generate

    if name == "q11":
        return bid_stream(events)
    stream = generate(events)
    return stream.users, stream.times_ms


# -- the peers, each run inside its own subprocess --------------------------------------------

def run_engine(name: str, keys: np.ndarray, times: np.ndarray, batched: bool) -> int:
    from sessionstore import (
        EmitStrategy,
        SessionAggregator,
        SessionStore,
        SessionWindows,
        aggregations,
    )
    from sessionstore.timeutil import INT64_MAX

    windows = SessionWindows(WORKLOADS[name])
    lateness = LATENESS_MS[name]
    emitted = 0
    with tempfile.TemporaryDirectory() as tmp:
        store = SessionStore(tmp, retention_ms=windows.retention_ms + lateness)
        engine = SessionAggregator(store, windows, aggregations.count(),
                                   emit=EmitStrategy.ON_WINDOW_CLOSE,
                                   max_out_of_orderness_ms=lateness)
        key_list, time_list = keys.tolist(), times.tolist()
        if batched:
            for i in range(0, len(key_list), 200_000):
                part = key_list[i:i + 200_000]
                emitted += len(engine.process_batch(part, [None] * len(part),
                                                    time_list[i:i + 200_000]))
        else:
            for key, t in zip(key_list, time_list, strict=True):
                emitted += len(engine.process(key, None, t))
        emitted += len(engine.advance_watermark(INT64_MAX))
        engine.commit()
        store.close()
    return emitted


def run_dict(name: str, keys: np.ndarray, times: np.ndarray) -> int:
    """A user's hand-written sessionizer (the one engine_bench measures), on this workload."""
    from .engine_bench import dict_sessionizer

    return dict_sessionizer(keys.tolist(), times.tolist(), WORKLOADS[name], LATENESS_MS[name])


def _write_parquet(path: Path, keys: np.ndarray, times: np.ndarray) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"key": keys, "ts": pa.array(times, pa.timestamp("ms"))}), path)


def run_spark(name: str, keys: np.ndarray, times: np.ndarray, work: Path) -> tuple[int, float]:
    """Spark's native session_window, static job in local[2]; returns (sessions, job seconds)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    path = work / f"{name}.parquet"
    _write_parquet(path, keys, times)
    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "4")
             .config("spark.driver.memory", "4g").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark.read.parquet(str(path)).count()  # warm up the JVM and the reader
    start = time.perf_counter()
    sessions = (spark.read.parquet(str(path))
                .groupBy("key", F.session_window("ts", f"{WORKLOADS[name]} milliseconds"))
                .count())
    sessions.write.mode("overwrite").parquet(str(work / f"{name}-spark-out"))
    seconds = time.perf_counter() - start
    total = spark.read.parquet(str(work / f"{name}-spark-out")).count()
    global JVM_PEAK_MB
    gateway = spark.sparkContext._gateway
    assert gateway is not None
    JVM_PEAK_MB = _peak_rss_of(gateway.proc.pid)
    spark.stop()
    return total, seconds


JVM_PEAK_MB = 0.0


def _peak_rss_of(pid: int) -> float:
    """A live process's peak resident set (VmHWM), in MiB; 0 when it cannot be read."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


FLINK_JOB = """
import sys, time, json
from pyflink.table import EnvironmentSettings, TableEnvironment
source, sink, gap_ms, lateness_ms = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
conf = env.get_config()
conf.set("parallelism.default", "1")
conf.set("state.backend.type", "rocksdb")
conf.set("pipeline.object-reuse", "true")
env.execute_sql(f'''CREATE TABLE events (key BIGINT, ts BIGINT,
    rowtime AS TO_TIMESTAMP_LTZ(ts, 3),
    WATERMARK FOR rowtime AS rowtime - INTERVAL '{lateness_ms / 1000}' SECOND)
    WITH ('connector' = 'filesystem', 'path' = '{source}', 'format' = 'csv')''')
env.execute_sql(f'''CREATE TABLE sessions (key BIGINT, window_start TIMESTAMP(3),
    window_end TIMESTAMP(3), n BIGINT)
    WITH ('connector' = 'filesystem', 'path' = '{sink}', 'format' = 'csv')''')
start = time.perf_counter()
env.execute_sql(f'''INSERT INTO sessions SELECT key, window_start, window_end, COUNT(*)
    FROM TABLE(SESSION(TABLE events PARTITION BY key, DESCRIPTOR(rowtime),
                       INTERVAL '{gap_ms // 1000}' SECOND(6)))
    GROUP BY key, window_start, window_end''').wait()
seconds = time.perf_counter() - start
import os
jvm = 0.0
for task in os.listdir(f"/proc/{os.getpid()}/task"):
    for pid in open(f"/proc/{os.getpid()}/task/{task}/children").read().split():
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmHWM:"):
                jvm += int(line.split()[1]) / 1024
print(json.dumps({"seconds": seconds, "jvm_peak_mb": jvm}))
"""


def run_flink(name: str, keys: np.ndarray, times: np.ndarray, work: Path,
              flink_python: str) -> tuple[int, float]:
    """PyFlink SQL SESSION window, parallelism 1, RocksDB state backend, in its own Python."""
    source = work / f"{name}-flink-in.csv"
    np.savetxt(source, np.column_stack([keys, times]), fmt="%d", delimiter=",")
    sink = work / f"{name}-flink-out"
    job = work / "flink_job.py"
    job.write_text(FLINK_JOB)
    done = subprocess.run([flink_python, str(job), str(source), str(sink),
                           str(WORKLOADS[name]), str(LATENESS_MS[name])],
                          capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip().splitlines()[-1] if done.stderr else "failed")
    report = json.loads(done.stdout.strip().splitlines()[-1])
    seconds = report["seconds"]
    global JVM_PEAK_MB
    JVM_PEAK_MB = float(report["jvm_peak_mb"])
    total = 0
    for part in (f for f in sink.rglob("*") if f.is_file() and not f.name.startswith(".")):
        with open(part) as handle:
            total += sum(1 for _ in handle)
    return total, seconds


def child(peer: str, workload: str, events: int, flink_python: str | None) -> dict[str, Any]:
    keys, times = load_workload(workload, events)
    work = Path(tempfile.mkdtemp(prefix="peers-"))
    start = time.perf_counter()
    if peer == "engine-process":
        sessions, seconds = run_engine(workload, keys, times, batched=False), None
    elif peer == "engine-batch":
        sessions, seconds = run_engine(workload, keys, times, batched=True), None
    elif peer == "plain-python":
        sessions, seconds = run_dict(workload, keys, times), None
    elif peer == "spark-session-window":
        sessions, seconds = run_spark(workload, keys, times, work)
    elif peer == "pyflink-session":
        assert flink_python is not None
        sessions, seconds = run_flink(workload, keys, times, work, flink_python)
    else:
        raise ValueError(f"unknown peer {peer!r}")
    if seconds is None:
        seconds = time.perf_counter() - start
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    # a JVM peer's memory is the Python driver's plus the JVM's (a child of it)
    jvm = max(children, JVM_PEAK_MB) if peer.startswith(("spark", "pyflink")) else 0.0
    return {"peer": peer, "workload": workload, "events": events, "sessions": sessions,
            "seconds": seconds, "events_per_s": events / seconds,
            "peak_rss_mb": own + jvm}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=2_000_000)
    parser.add_argument("--flink-python", default=str(ROOT / ".venv-bench" / "bin" / "python"))
    parser.add_argument("--child", nargs=2, metavar=("PEER", "WORKLOAD"), help=argparse.SUPPRESS)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1], args.events, args.flink_python)))
        return
    peers = ["engine-batch", "engine-process", "plain-python", "spark-session-window"]
    flink_note = None
    if Path(args.flink_python).exists():
        peers.append("pyflink-session")
    else:
        flink_note = (f"PyFlink not run: no interpreter at {args.flink_python} (make "
                      f"bench-peers creates it; apache-flink cannot share the dev environment)")
        log.info(flink_note)
    rows = []
    for workload in WORKLOADS:
        for peer in peers:
            done = subprocess.run(
                [sys.executable, "-m", "benchmarks.peers", "--events", str(args.events),
                 "--flink-python", args.flink_python, "--child", peer, workload],
                capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
            )
            if done.returncode != 0:
                reason = (done.stderr.strip().splitlines() or ["failed"])[-1]
                log.info("%-22s %-7s failed: %s", peer, workload, reason)
                rows.append({"peer": peer, "workload": workload, "error": reason})
                continue
            row = json.loads(done.stdout.strip().splitlines()[-1])
            rows.append(row)
            log.info("%-22s %-7s %10.0f events/s  %7.0f MB  %8d sessions", peer, workload,
                     row["events_per_s"], row["peak_rss_mb"], row["sessions"])
    if not args.no_write:
        from .common import write_results

        log.info("wrote %s", write_results("peers", {"events": args.events, "rows": rows,
                                                     "flink_note": flink_note}))


if __name__ == "__main__":
    main()
