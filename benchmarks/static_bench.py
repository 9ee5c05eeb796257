"""Static input: ``sessionstore.sessionize`` against DuckDB and polars (and the CLI), one file.

The workload is the one of issue 23: a Parquet file of events of ~526k users with Pareto
(heavy-tailed) activity, sessionized with a 30 minute gap into a count and a sum per session.
It is generated deterministically and cached under ``benchmarks/.data/`` (git-ignored). Every
tool runs in its own subprocess, reads the same file and writes its sessions to Parquet; the
parent measures each child's wall time, CPU (user + system, from ``wait4``) and peak RSS, takes
the median of ``--repeat`` runs, and checks that every tool found the same sessions (count and
sum of sums). It reports numbers and asserts none::

    python -m benchmarks.static_bench                 # 10M events, then the 1.2M sample
    python -m benchmarks.static_bench --large         # also 50M events, memory_limit 1 GB
    python -m benchmarks.static_bench --cli           # also time the CLI

DuckDB and polars are in the ``bench-static`` extra (not ``bench``: that one pins
apache-flink, whose pyarrow and pandas pins conflict with PySpark in ``dev``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .common import write_results

log = logging.getLogger("benchmarks.static_bench")
ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = Path(__file__).resolve().parent / ".data"
GAP_MS = 30 * 60_000
USERS_PER_EVENT = 526_000 / 10_000_000
TOOLS = ("sessionize", "duckdb", "polars")


def sample_dataset(events: int) -> Path:
    """The bundled sample clickstream (``make run``'s 1.2M events) as a cached Parquet file of
    the same columns as :func:`dataset`, in its arrival order."""
    DATA_DIR.mkdir(exist_ok=True)
    path = DATA_DIR / f"sample_{events}.parquet"
    if path.exists():
        return path
    import pyarrow as pa
    import pyarrow.parquet as pq

    from sessionstore.sample import generate

    stream = generate(events)
    table = pa.table({"user_id": stream.users,
                      "ts": pa.array(stream.times_ms, pa.timestamp("ms")),
                      "amount": stream.amounts})
    tmp = path.with_suffix(".tmp")
    pq.write_table(table, tmp, row_group_size=1 << 20)
    tmp.rename(path)
    return path


def dataset(events: int) -> Path:
    """The cached Parquet file of ``events`` events (generated on first use).

    Columns: ``user_id`` (int64), ``ts`` (timestamp[ms]), ``amount`` (int64). Users have
    Pareto-distributed activity; each user's events come in bursts (a burst's events a few
    minutes apart, bursts hours apart) over 30 days; rows are in a random order, so that no
    tool benefits from a sorted file.
    """
    DATA_DIR.mkdir(exist_ok=True)
    path = DATA_DIR / f"events_{events}.parquet"
    if path.exists():
        return path
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(23)
    users = max(1, round(events * USERS_PER_EVENT))
    weight = rng.pareto(1.3, users) + 1.0
    user = rng.choice(users, size=events, p=weight / weight.sum()).astype(np.int64)
    # about ten events per burst: a burst per user and burst number, starting anywhere in 30
    # days; events spread over up to 20 minutes inside it (exponential steps of ~2 min)
    month_ms = 30 * 86_400_000
    burst = rng.integers(0, 1 << 62, users, dtype=np.int64)
    rank = np.empty(events, dtype=np.int64)
    order = np.argsort(user, kind="stable")
    counts = np.bincount(user, minlength=users)
    starts = np.repeat(np.cumsum(counts) - counts, counts)
    rank[order] = np.arange(events, dtype=np.int64) - starts
    del order, starts, counts
    burst_id = rank // 10
    del rank
    seed = (burst[user] ^ (burst_id * np.int64(0x9E3779B97F4A7C15 & 0x7FFFFFFFFFFFFFFF)))
    burst_start = np.abs(seed) % month_ms
    del seed, burst_id
    ts = 1_700_000_000_000 + burst_start + rng.integers(0, 20 * 60_000, events)
    del burst_start
    amount = rng.integers(1, 1_000, events, dtype=np.int64)
    shuffle = rng.permutation(events)
    table = pa.table({"user_id": user[shuffle], "ts": pa.array(ts[shuffle], pa.timestamp("ms")),
                      "amount": amount[shuffle]})
    tmp = path.with_suffix(".tmp")
    pq.write_table(table, tmp, row_group_size=1 << 20)
    tmp.rename(path)
    return path


# -- the tools, each run in its own child process --------------------------------------------

def child_sessionize(source: Path, out: Path, memory_limit: str | None) -> None:
    import pyarrow.parquet as pq

    import sessionstore

    # a stream of the file's batches, as DuckDB and polars read the file themselves: the call
    # owns what it reads and frees each column once converted
    columns = ["user_id", "ts", "amount"]
    parquet = pq.ParquetFile(source, pre_buffer=False)
    reader = pa_reader(parquet.schema_arrow, parquet.iter_batches(batch_size=1 << 20,
                                                                  columns=columns), columns)
    table = sessionstore.sessionize(reader, key="user_id", time="ts", gap="30m",
                                    aggregations=["n=count", "total=sum:amount"],
                                    memory_limit=memory_limit)
    pq.write_table(table, out)


def pa_reader(schema: Any, batches: Any, columns: list[str]) -> Any:
    import pyarrow as pa

    return pa.RecordBatchReader.from_batches(pa.schema([schema.field(c) for c in columns]),
                                             batches)


def child_duckdb(source: Path, out: Path, memory_limit: str | None) -> None:
    import duckdb

    con = duckdb.connect()
    if memory_limit:
        con.execute(f"SET memory_limit = '{memory_limit}'")
    con.execute(f"""
        COPY (
          WITH ordered AS (
            SELECT user_id, ts, amount,
                   LAG(ts) OVER (PARTITION BY user_id ORDER BY ts) AS prev
            FROM read_parquet('{source}')),
          numbered AS (
            SELECT user_id, ts, amount,
                   SUM(CASE WHEN prev IS NULL OR ts - prev > INTERVAL 30 MINUTE THEN 1 ELSE 0
                       END) OVER (PARTITION BY user_id ORDER BY ts
                                  ROWS UNBOUNDED PRECEDING) AS session
            FROM ordered)
          SELECT user_id, MIN(ts) AS session_start,
                 MAX(ts) + INTERVAL 30 MINUTE AS session_end,
                 COUNT(*) AS n, SUM(amount) AS total
          FROM numbered GROUP BY user_id, session
        ) TO '{out}' (FORMAT PARQUET)""")


def child_polars(source: Path, out: Path, memory_limit: str | None) -> None:
    import polars as pl

    gap = pl.duration(milliseconds=GAP_MS)
    (pl.scan_parquet(source)
     .sort("user_id", "ts")
     .with_columns(
         ((pl.col("ts").diff().over("user_id") > gap)
          | pl.col("ts").diff().over("user_id").is_null()).cum_sum().over("user_id")
         .alias("session"))
     .group_by("user_id", "session")
     .agg(pl.col("ts").min().alias("session_start"),
          (pl.col("ts").max() + gap).alias("session_end"),
          pl.len().alias("n"), pl.col("amount").sum().alias("total"))
     .sink_parquet(out))


def child_cli(source: Path, out: Path, memory_limit: str | None) -> None:
    args = [sys.executable, "-m", "sessionstore.cli", "sessionize", str(source),
            "--key", "user_id", "--time", "ts", "--gap", "30m", "--agg", "n=count",
            "--agg", "total=sum:amount", "--out", str(out), "--no-progress"]
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL, cwd=ROOT)


CHILDREN = {"sessionize": child_sessionize, "duckdb": child_duckdb, "polars": child_polars,
            "cli": child_cli}


# -- the parent: time each child, check the answers ------------------------------------------

def measure(tool: str, source: Path, memory_limit: str | None, work: Path) -> dict[str, Any]:
    """One run of ``tool`` in a child process: wall, CPU and peak RSS of the child (and of its
    own children, for the CLI), and what it found."""
    out = work / f"{tool}.parquet"
    if out.is_dir():
        import shutil

        shutil.rmtree(out)
    elif out.exists():
        out.unlink()
    command = [sys.executable, "-m", "benchmarks.static_bench", "--child", tool,
               "--source", str(source), "--out", str(out)]
    if memory_limit:
        command += ["--memory-limit", memory_limit]
    # bytecode caching as on a normal install (an environment may turn it off): otherwise
    # every run would compile this package's modules again, which the peers do not do
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    started = time.perf_counter()
    process = subprocess.Popen(command, cwd=ROOT, env=env)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode:
        raise RuntimeError(f"{tool} failed with exit code {process.returncode}")
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime,
            "peak_rss_mb": usage.ru_maxrss / 1024, **_in_child("--answer", str(out))}


def _in_child(*args: str) -> dict[str, Any]:
    """Run one of this module's helpers in a child process and return its JSON answer.

    The parent stays small: Linux counts the memory a process had when it spawned a child (a
    vfork shares it until exec) in that child's peak RSS, so a parent that had loaded a large
    table would inflate every tool's figure.
    """
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "benchmarks.static_bench", *args], cwd=ROOT,
                          env=env, check=True, capture_output=True, text=True)
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def answer(out: Path) -> dict[str, Any]:
    """What a tool found: sessions, events in them and the sum of their sums."""
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    table = ds.dataset(out, format="parquet").to_table(columns=["n", "total"])
    return {"sessions": table.num_rows, "events": int(pc.sum(table.column("n")).as_py()),
            "total": int(pc.sum(table.column("total")).as_py())}


def run(workload: str, events: int, tools: list[str], repeat: int, memory_limit: str | None,
        work: Path) -> dict[str, Any]:
    source = Path(_in_child("--generate", workload, str(events))["path"])
    runs: dict[str, list[dict[str, Any]]] = {tool: [] for tool in tools}
    for i in range(repeat):
        for tool in tools:
            result = measure(tool, source, memory_limit, work)
            log.info("%s events, %s, run %d: %s", f"{events:,}", tool, i + 1, result)
            runs[tool].append(result)
    rows = []
    for tool, results in runs.items():
        rows.append({"tool": tool,
                     **{k: statistics.median(r[k] for r in results)
                        for k in ("wall_s", "cpu_s", "peak_rss_mb")},
                     "runs": results, **{k: results[0][k] for k in ("sessions", "events",
                                                                       "total")}})
    answers = {(r["sessions"], r["events"], r["total"]) for r in rows}
    return {"workload": workload, "events": events, "memory_limit": memory_limit, "rows": rows,
            "same_sessions": len(answers) == 1}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, action="append",
                        help="events of the issue's workload, repeatable (default 10M; the "
                             "1.2M sample always runs too)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per tool (median)")
    parser.add_argument("--large", action="store_true",
                        help="also 50M events with a 1 GB memory limit (must spill)")
    parser.add_argument("--large-only", action="store_true",
                        help="only the 50M run (written to static_large.json)")
    parser.add_argument("--cli", action="store_true", help="also time the CLI")
    parser.add_argument("--tools", default=",".join(TOOLS), help=argparse.SUPPRESS)
    parser.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    parser.add_argument("--source", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--memory-limit", help=argparse.SUPPRESS)
    parser.add_argument("--answer", help=argparse.SUPPRESS)
    parser.add_argument("--generate", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.answer:
        print(json.dumps(answer(Path(args.answer))))
        return
    if args.generate:
        workload, events = args.generate[0], int(args.generate[1])
        made = sample_dataset(events) if workload == "sample" else dataset(events)
        print(json.dumps({"path": str(made)}))
        return
    if args.child:
        CHILDREN[args.child](Path(args.source), Path(args.out), args.memory_limit)
        return
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    tools = [t for t in args.tools.split(",") if t] + (["cli"] if args.cli else [])
    sizes: list[tuple[str, int, str | None]] = [
        ("pareto", n, None) for n in (args.events or [10_000_000])]
    sizes.append(("sample", 1_200_000, None))
    if args.large or args.large_only:
        sizes.append(("pareto", 50_000_000, "1GB"))
    if args.large_only:
        sizes = sizes[-1:]
    load_start = list(os.getloadavg())
    with tempfile.TemporaryDirectory(prefix="static-bench-") as work:
        results = [run(name, n, tools, args.repeat, limit, Path(work))
                   for name, n, limit in sizes]
    payload = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               "load_average_start": load_start, "load_average_end": list(os.getloadavg()),
               "gap": "30m", "aggregations": ["n=count", "total=sum:amount"],
               "repeat": args.repeat, "results": results}
    path = write_results("static_large" if args.large_only else "static", payload)
    log.info("wrote %s", path)
    for result in results:
        log.info(json.dumps({k: v for k, v in result.items() if k != "rows"}))
        for row in result["rows"]:
            log.info("  %-10s wall %6.2f s  cpu %6.2f s  rss %6.0f MB  sessions %s",
                     row["tool"], row["wall_s"], row["cpu_s"], row["peak_rss_mb"],
                     f"{row['sessions']:,}")


if __name__ == "__main__":
    main()
