"""Maximum duration under arrival disorder: one key's events in time order, newest first,
shuffled and slightly disordered (issue 25, item 3). Reports CPU and wall time per row and the
growth per doubling of the input; asserts nothing::

    python -m benchmarks.max_duration_bench                      # 4k, 8k, 16k events
    python -m benchmarks.max_duration_bench --sizes 16000 64000 --aggs count fsum \
        --paths event batch cli --orders reversed shuffled --layouts chained

Events are 10 ms apart with a 100 ms gap, under two maximum durations: 10 s (a chain of
sessions of 1,000 events, cut by the maximum duration: a newest-first event moves the first
event of each, so each is written again) and one day (one session). ``events_re_cut`` counts
the events of the sessions re-cuts wrote, ``re_cut_steps`` the steps they took one by one.
Lateness covers the whole input, so every event is accepted whatever the order; except for
``swapped`` (each pair of neighbouring events swapped: slight disorder in a long stream), whose
lateness is 50 ms, so that the watermark moves with the events and sessions close as they go
(not in the CLI rows).

Aggregations: ``count`` and ``fsum`` (a float sum, whose value depends on the order of its adds),
and two with user functions (issue 25: held with ``ON_WINDOW_CLOSE`` since, re-cut per event
before): ``reduce`` (``reduce(lambda a, b: a + b)`` over the float values) and ``aggregate``
(``aggregate`` with an initializer, aggregator and merger adding the float values); ``text``:
the minimum and maximum of str values (:func:`text_of`). The CLI rows take ``count`` and
``fsum`` only.
Paths: ``event`` (``process`` per event, ``ON_WINDOW_CLOSE``), ``event-update`` (the same with
``ON_WINDOW_UPDATE``: every event emits its changes, so a newest-first chain is output-bound),
``batch`` (one ``process_batch``, ``ON_WINDOW_CLOSE``), ``batch-update`` (one ``process_batch``,
``ON_WINDOW_UPDATE``), ``cli`` and ``cli-update`` (``sessionize --state`` in a child process,
``--gap 100ms --max-duration 10s --grace 1d``, ``--emit update`` for the second; the input as
JSON Lines; its CPU is the child's user + system time; the CLI has only the chained layout).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
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
ORDERS = ("sorted", "reversed", "shuffled", "swapped")
AGGS = ("count", "fsum", "reduce", "aggregate", "text")
SWAPPED_LATENESS_MS = 5 * STEP_MS
PATHS = ("event", "event-update", "batch", "batch-update", "cli", "cli-update")


def value_of(t: int) -> float:
    """The float an event at ``t`` carries for ``fsum`` (not exactly representable sums)."""
    return t * 0.1 + 0.3


def text_of(t: int) -> str:
    """The str an event at ``t`` carries for ``text`` (its order is not the order of the
    times)."""
    return f"v{t * 7_919 % 100_003:06d}"


def _add(a: float, b: float) -> float:
    return a + b


def aggregation_of(agg: str) -> aggregations.Aggregation:
    """The aggregation of an ``--aggs`` name (see the module docstring)."""
    if agg == "count":
        return aggregations.count()
    if agg == "fsum":
        return aggregations.sum_of()
    if agg == "reduce":
        return aggregations.reduce(_add)
    if agg == "aggregate":
        return aggregations.aggregate(float, lambda key, value, acc: acc + value,
                                      lambda key, a, b: a + b)
    if agg == "text":
        return aggregations.combine({"min": aggregations.min_of(),
                                     "max": aggregations.max_of()})
    raise ValueError(f"unknown aggregation {agg!r}; expected one of {', '.join(AGGS)}")


def arrival(n: int, order: str, seed: int = 1) -> list[int]:
    """The event times of one key, ``STEP_MS`` apart, in the given arrival order."""
    times = list(range(0, n * STEP_MS, STEP_MS))
    if order == "reversed":
        times.reverse()
    elif order == "shuffled":
        random.Random(seed).shuffle(times)
    elif order == "swapped":
        for i in range(0, n - 1, 2):
            times[i], times[i + 1] = times[i + 1], times[i]
    return times


def run(n: int, order: str, path: str, layout: str, agg: str = "count") -> dict[str, Any]:
    """One row: feed the events through ``process``, one ``process_batch`` or the CLI; close
    all."""
    if path.startswith("cli"):
        return run_cli(n, order, layout, agg, path)
    windows = SessionWindows(GAP_MS, max_duration_ms=MAX_DURATIONS_MS[layout])
    lateness = SWAPPED_LATENESS_MS if order == "swapped" else n * STEP_MS
    updates = path.endswith("-update")
    emit = EmitStrategy.ON_WINDOW_UPDATE if updates else EmitStrategy.ON_WINDOW_CLOSE
    engine = SessionAggregator(
        InMemorySessionStore(retention_ms=windows.retention_ms + lateness), windows,
        aggregation_of(agg), emit=emit, max_out_of_orderness_ms=lateness)
    times = arrival(n, order)
    values: list[Any] = ([None] * n if agg == "count" else list(map(text_of, times))
                         if agg == "text" else [value_of(t) for t in times])
    cpu, wall = time.process_time(), time.perf_counter()
    if path.startswith("event"):
        out = []
        for t, v in zip(times, values, strict=True):
            out += engine.process("k", v, t)
    else:
        out = engine.process_batch(["k"] * n, values, np.array(times, dtype=np.int64))
    closed = engine.advance_watermark(INT64_MAX)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    if not updates:
        out += closed
    if agg == "count" and not updates and sum(e.value for e in out) != n:
        raise AssertionError(f"{order} {path} {n}: {sum(e.value for e in out)} events out")
    recut = engine.recut_counts
    return {"events": n, "order": order, "path": path, "layout": layout, "agg": agg,
            "sessions": len(out), "events_re_cut": recut["events"],
            "re_cut_steps": recut["steps"],
            "cpu_s": round(cpu, 3), "wall_s": round(wall, 3)}


def run_cli(n: int, order: str, layout: str, agg: str, path: str) -> dict[str, Any]:
    """One CLI row: ``sessionize --state`` over the events as JSON Lines (``cli-update``:
    with ``--emit update``)."""
    if layout != "chained":
        raise ValueError(f"the CLI rows use the chained layout, got {layout!r}")
    if agg not in ("count", "fsum"):
        raise ValueError(f"the CLI rows take count or fsum, got {agg!r}")
    if order == "swapped":
        raise ValueError("the CLI rows cover the whole input with their lateness; not swapped")
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "in.jsonl"
        with source.open("w") as f:
            for t in arrival(n, order):
                f.write(json.dumps({"k": "k", "t": t, "v": value_of(t)}) + "\n")
        command = [sys.executable, "-m", "sessionstore.cli", "sessionize", str(source),
                   "--key", "k", "--time", "t", "--gap", "100ms", "--max-duration", "10s",
                   "--grace", "1d", "--agg", "n=count" if agg == "count" else "s=sum:v",
                   "--state", str(Path(tmp) / "state"), "--out", str(Path(tmp) / "out.jsonl"),
                   "--no-progress", *(["--emit", "update"] if path == "cli-update" else [])]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        wall = time.perf_counter()
        subprocess.run(command, check=True, env={**os.environ}, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - wall
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        sessions = sum(1 for _ in (Path(tmp) / "out.jsonl").open())
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"events": n, "order": order, "path": path, "layout": layout, "agg": agg,
            "sessions": sessions, "cpu_s": round(cpu, 3), "wall_s": round(wall, 3)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[4_000, 8_000, 16_000])
    parser.add_argument("--paths", nargs="+", default=["event", "batch"], choices=PATHS)
    parser.add_argument("--orders", nargs="+", default=list(ORDERS), choices=ORDERS)
    parser.add_argument("--aggs", nargs="+", default=["count"], choices=AGGS)
    parser.add_argument("--name", default="max_duration",
                        help="the results file's name (docs/bench/NAME.json)")
    parser.add_argument("--layouts", nargs="+", default=list(MAX_DURATIONS_MS),
                        choices=list(MAX_DURATIONS_MS))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    rows = []
    load_before = os.getloadavg()[0]  # the machine's load, to judge the figures by
    for layout in args.layouts:
        for path in args.paths:
            if path.startswith("cli") and layout != "chained":
                continue
            aggs = [a for a in args.aggs
                    if not path.startswith("cli") or a in ("count", "fsum")]
            for agg, order in [(a, o) for a in aggs for o in args.orders]:
                previous = None
                for n in args.sizes:
                    row = run(n, order, path, layout, agg)
                    if previous is not None:
                        row["cpu_growth"] = round(row["cpu_s"] / max(previous["cpu_s"], 1e-3),
                                                  2)
                        row["size_growth"] = round(n / previous["events"], 2)
                    previous = row
                    rows.append(row)
                    log.info("%s", row)
    load = {"before": round(load_before, 2), "after": round(os.getloadavg()[0], 2)}
    log.info("wrote %s", write_results(args.name, {"rows": rows, "load_average_1m": load}))


if __name__ == "__main__":
    main()
