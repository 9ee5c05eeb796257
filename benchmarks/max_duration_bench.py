"""Maximum duration under arrival disorder: one key's events in time order, newest first and
shuffled (issue 25, item 3). Reports CPU and wall time per row and the growth per doubling of
the input; asserts nothing::

    python -m benchmarks.max_duration_bench                      # 4k, 8k, 16k events
    python -m benchmarks.max_duration_bench --sizes 4000 64000   # bigger (reversed is slow)

Events are 10 ms apart with a 100 ms gap, under two maximum durations: 10 s (a chain of
sessions of 1,000 events, cut by the maximum duration: a newest-first event moves the first
event of each, so each is written again) and one day (one session). ``events_re_cut`` counts
the events of the sessions re-cuts wrote, ``re_cut_steps`` the steps they took one by one.
Lateness covers the whole input, so every event is accepted whatever the order.
"""

from __future__ import annotations

import argparse
import logging
import random
import time
from typing import Any

import numpy as np

from sessionstore import (
    EmitStrategy,
    InMemorySessionStore,
    SessionAggregator,
    SessionWindows,
    aggregations,
)
from sessionstore.timeutil import INT64_MAX

from .common import write_results

log = logging.getLogger("benchmarks.max_duration")
STEP_MS, GAP_MS = 10, 100
MAX_DURATIONS_MS = {"chained": 10_000, "one session": 86_400_000}
ORDERS = ("sorted", "reversed", "shuffled")


def arrival(n: int, order: str, seed: int = 1) -> list[int]:
    """The event times of one key, ``STEP_MS`` apart, in the given arrival order."""
    times = list(range(0, n * STEP_MS, STEP_MS))
    if order == "reversed":
        times.reverse()
    elif order == "shuffled":
        random.Random(seed).shuffle(times)
    return times


def run(n: int, order: str, path: str, layout: str) -> dict[str, Any]:
    """One row: feed the events through ``process`` or one ``process_batch``; close all."""
    windows = SessionWindows(GAP_MS, max_duration_ms=MAX_DURATIONS_MS[layout])
    lateness = n * STEP_MS
    engine = SessionAggregator(
        InMemorySessionStore(retention_ms=windows.retention_ms + lateness), windows,
        aggregations.count(), emit=EmitStrategy.ON_WINDOW_CLOSE,
        max_out_of_orderness_ms=lateness)
    times = arrival(n, order)
    cpu, wall = time.process_time(), time.perf_counter()
    if path == "event":
        for t in times:
            engine.process("k", None, t)
    else:
        engine.process_batch(["k"] * n, [None] * n, np.array(times, dtype=np.int64))
    out = engine.advance_watermark(INT64_MAX)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    if sum(e.value for e in out) != n:
        raise AssertionError(f"{order} {path} {n}: {sum(e.value for e in out)} events out")
    recut = engine.recut_counts
    return {"events": n, "order": order, "path": path, "layout": layout, "sessions": len(out),
            "events_re_cut": recut["events"], "re_cut_steps": recut["steps"],
            "cpu_s": round(cpu, 3), "wall_s": round(wall, 3)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[4_000, 8_000, 16_000])
    parser.add_argument("--paths", nargs="+", default=["event", "batch"],
                        choices=["event", "batch"])
    parser.add_argument("--layouts", nargs="+", default=list(MAX_DURATIONS_MS),
                        choices=list(MAX_DURATIONS_MS))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    rows = []
    for layout in args.layouts:
        for path in args.paths:
            for order in ORDERS:
                previous = None
                for n in args.sizes:
                    row = run(n, order, path, layout)
                    if previous is not None:
                        row["cpu_growth"] = round(row["cpu_s"] / max(previous["cpu_s"], 1e-3),
                                                  2)
                        row["size_growth"] = round(n / previous["events"], 2)
                    previous = row
                    rows.append(row)
                    log.info("%s", row)
    log.info("wrote %s", write_results("max_duration", {"rows": rows}))


if __name__ == "__main__":
    main()
