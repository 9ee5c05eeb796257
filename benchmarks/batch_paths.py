"""Quick harness for the batch paths: the plain-Python dict sessionizer, the event path,
``process_batch`` and ``process_table``, on RocksDB and in memory, on the adverse q11-like rows
(disorder, short sessions, skew). Ratios to the dict sessionizer, repeated; it asserts nothing::

    python -m benchmarks.batch_paths --events 300000 --repeat 3

Each ratio is given twice: in wall-clock time, and in CPU time of this process (``cpu``), which
other work on a shared machine disturbs less. Commits wait for fsync, which CPU time does not
count: on RocksDB the wall-clock ratio is the one that includes durability.

Each row also runs the batch paths with a *dynamic gap* (issue 12): the same stream, with a gap
drawn per event uniformly in ``[1, 2 * gap]`` (so ``max_gap_ms = 2 * gap``), given as the
``gaps_ms`` / ``gap=`` column. Those lines show the dynamic run's CPU time over the fixed-gap
run's on the same path and store (the issue's target: at most 1.5x).

``--max-duration F`` caps sessions at ``F`` times the gap (``max_duration_ms``, issue 12) on
every path, to compare the batch paths with the event path under a maximum duration.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from sessionstore import EmitStrategy, SessionAggregator, SessionWindows, aggregations
from sessionstore.timeutil import INT64_MAX

from .engine_bench import BATCH_EVENTS, _open_store, dict_sessionizer, gap_for, q11_like_stream

# (disorder ms, events per session): the disorder sweep at 2.5, then its
# events-per-session sweep at 2 s
ROWS = ((2_000, 2.5), (0, 2.5), (200, 2.5), (10_000, 2.5), (2_000, 1.5), (2_000, 17.0))
PATHS = ("event", "process_batch", "process_table")


def run_path(path: str, keys: np.ndarray, times: np.ndarray, gap_ms: int, disorder_ms: int,
             store_kind: str, root: Path, gaps: np.ndarray | None = None,
             max_duration: float | None = None) -> tuple[float, int, float]:
    """Seconds, sessions emitted and CPU seconds: count per key, emit-on-close, a commit per
    batch. With ``gaps``, each event's own gap (and ``max_gap_ms = 2 * gap_ms``); with
    ``max_duration``, sessions last at most that many gaps."""
    cap = None if max_duration is None else max(1, round(max_duration * gap_ms))
    windows = (SessionWindows(gap_ms, max_duration_ms=cap) if gaps is None
               else SessionWindows(None, max_gap_ms=2 * gap_ms, max_duration_ms=cap))
    store = _open_store(store_kind, root, f"{path}-{time.monotonic_ns()}",
                        windows.retention_ms + disorder_ms)
    engine = SessionAggregator(store, windows, aggregations.count(),
                               max_out_of_orderness_ms=disorder_ms,
                               emit=EmitStrategy.ON_WINDOW_CLOSE)
    key_list, time_list = keys.tolist(), times.tolist()
    gap_list = None if gaps is None else gaps.tolist()
    emitted = 0
    gc.collect()
    start = time.perf_counter()
    cpu_start = time.process_time()
    for i in range(0, len(keys), BATCH_EVENTS):
        j = i + BATCH_EVENTS
        if path == "event":
            process = engine.process
            if gap_list is None:
                for key, t in zip(key_list[i:j], time_list[i:j], strict=True):
                    emitted += len(process(key, key, t))
            else:
                for key, t, g in zip(key_list[i:j], time_list[i:j], gap_list[i:j], strict=True):
                    emitted += len(process(key, key, t, g))
        elif path == "process_batch":
            emitted += len(engine.process_batch(keys[i:j], keys[i:j], times[i:j],
                                                None if gaps is None else gaps[i:j]))
        elif gaps is None:
            table = pa.table({"k": keys[i:j], "t": times[i:j]})
            emitted += engine.process_table(table, key="k", time="t").num_rows
        else:
            table = pa.table({"k": keys[i:j], "t": times[i:j], "g": gaps[i:j]})
            emitted += engine.process_table(table, key="k", time="t", gap="g").num_rows
        engine.commit()
    emitted += len(engine.advance_watermark(INT64_MAX))
    engine.commit()
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu_start
    store.close()
    return elapsed, emitted, cpu


def _timed_dict_cpu(keys: list[int], times: list[int], gap_ms: int,
                    disorder_ms: int) -> tuple[float, float, int]:
    """The dict sessionizer's wall-clock seconds, CPU seconds and sessions."""
    gc.collect()
    start, cpu_start = time.perf_counter(), time.process_time()
    emitted = dict_sessionizer(keys, times, gap_ms, disorder_ms)
    return time.perf_counter() - start, time.process_time() - cpu_start, emitted


def _warm_up(root: Path) -> None:
    """Run every batch path once on a small stream, so that loading the compiled kernels (and
    first-call costs) are not timed in the first row."""
    keys, times = q11_like_stream(20_000, 2_000, 2_000)
    for store_kind in ("rocksdb", "memory"):
        for path in PATHS[1:]:
            run_path(path, keys, times, 1_000, 2_000, store_kind, root)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=300_000)
    parser.add_argument("--keys", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--skip-event", action="store_true", help="skip the slow event path")
    parser.add_argument("--rows", type=int, default=len(ROWS), help="run the first N rows")
    parser.add_argument("--store", choices=("rocksdb", "memory", "both"), default="both")
    parser.add_argument("--no-dynamic", action="store_true",
                        help="skip the dynamic-gap runs")
    parser.add_argument("--max-duration", type=float, default=None, metavar="F",
                        help="cap sessions at F gaps (max_duration_ms) on every path")
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="batch-paths-"))
    try:
        _warm_up(root)
        for disorder_ms, target in ROWS[:args.rows]:
            keys, times = q11_like_stream(args.events, args.keys, disorder_ms)
            gap_ms = gap_for(keys, times, target)
            gaps = np.random.default_rng(12).integers(1, 2 * gap_ms + 1, len(keys),
                                                      dtype=np.int64)
            ratios: dict[str, list[float]] = {}
            counts: set[int] = set()
            dynamic_counts: set[int] = set()
            stores = ("rocksdb", "memory") if args.store == "both" else (args.store,)
            for _ in range(args.repeat):
                base, base_cpu, dict_count = _timed_dict_cpu(keys.tolist(), times.tolist(),
                                                             gap_ms, disorder_ms)
                counts.add(dict_count)
                for store_kind in stores:
                    for path in PATHS:
                        if path == "event" and args.skip_event:
                            continue
                        elapsed, emitted, cpu = run_path(path, keys, times, gap_ms,
                                                         disorder_ms, store_kind, root,
                                                         max_duration=args.max_duration)
                        counts.add(emitted)
                        ratios.setdefault(f"{path}/{store_kind}", []).append(base / elapsed)
                        ratios.setdefault(f"{path}/{store_kind} cpu", []).append(base_cpu / cpu)
                        if args.no_dynamic:
                            continue
                        _, dynamic_emitted, dynamic_cpu = run_path(
                            path, keys, times, gap_ms, disorder_ms, store_kind, root, gaps,
                            args.max_duration)
                        dynamic_counts.add(dynamic_emitted)
                        ratios.setdefault(f"{path}+gaps/{store_kind} cpu", []).append(
                            dynamic_cpu / cpu)
            summary: dict[str, Any] = {name: f"{statistics.median(r):.2f}x "
                                       f"({min(r):.2f}-{max(r):.2f})"
                                       for name, r in ratios.items()}
            load = " ".join(f"{x:.1f}" for x in os.getloadavg())
            print(f"disorder {disorder_ms} ms, {target} events/session, gap {gap_ms} ms, "
                  f"sessions {sorted(counts)} (dynamic gaps: {sorted(dynamic_counts)}), "
                  f"load average {load}; ratios to the dict sessionizer in wall-clock time, "
                  f"and in CPU time ('cpu'); '+gaps' lines are dynamic-gap CPU time over the "
                  f"fixed gap's on the same path and store:")
            for name, text in summary.items():
                print(f"    {name:24s} {text}", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
