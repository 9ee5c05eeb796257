"""Engine benchmark: q11-like sweeps and Nexmark q11 (bids per bidder) on one core.

Two sweeps over q11-like streams (20k skewed keys, batches of 100k events, a commit after every
batch): out-of-orderness 0, 200 ms, 2 s and 10 s at about 2.5 events per session, and about 1.5,
2.5 and 17 events per session at 2 s out of order. Each row runs, in one process on one stream,
a plain-Python dict sessionizer written as a user would, the event-at-a-time path (``process``)
and both batch paths (``process_batch`` on Python values, ``process_table`` on an Arrow table),
the engine on the RocksDB store and in memory, ``--repeat`` times in turn; it reports medians in
wall-clock time and in CPU time. Then Nexmark q11 (10 s gap) with emit-on-close and with a Beam
trigger. A state-size sweep measures the CPU of a batch of 10k changed sessions at 10k, 100k,
1M and 5M retained open sessions (``--state-sizes``). It reports numbers and asserts none::

    python -m benchmarks.engine_bench --events 50000 --repeat 1 --skip-q11   # quick
    python -m benchmarks.engine_bench                                         # as make bench
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import logging
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from sessionstore import (
    AccumulationMode,
    AfterCount,
    AfterWatermark,
    EmitStrategy,
    InMemorySessionStore,
    SessionAggregator,
    SessionStore,
    SessionWindows,
    aggregations,
)
from sessionstore.sample import bid_stream
from sessionstore.timeutil import INT64_MAX

from .common import write_results

log = logging.getLogger("benchmarks.engine")
GAP_MS = 10_000
OUT_OF_ORDER_MS = 200
BATCH_EVENTS = 100_000
DISORDER_SWEEP_MS = (0, 200, 2_000, 10_000)
EVENTS_PER_SESSION_SWEEP = (1.5, 2.5, 17.0)
SWEEP_EVENTS_PER_SESSION = 2.5
SWEEP_DISORDER_MS = 2_000


def dict_sessionizer(keys: list[int], times: list[int], gap_ms: int = GAP_MS,
                     out_of_order_ms: int = OUT_OF_ORDER_MS) -> int:
    """What a user writes by hand: per-key open sessions in a dict, closed ones purged.

    Returns how many sessions it emitted. In memory only; not durable.
    """
    open_sessions: dict[int, list[list[int]]] = {}
    emitted = 0
    watermark = -(2**63)
    last_purge = watermark
    for key, t in zip(keys, times, strict=True):
        if watermark >= t + gap_ms:
            continue
        sessions = open_sessions.setdefault(key, [])
        start, end, count = t, t + gap_ms, 1
        keep = []
        for s in sessions:
            if s[1] >= t and s[0] <= t + gap_ms and s[1] > watermark:
                start, end, count = min(start, s[0]), max(end, s[1]), count + s[2]
            else:
                keep.append(s)
        keep.append([start, end, count])
        open_sessions[key] = keep
        if t - out_of_order_ms > watermark:
            watermark = t - out_of_order_ms
        if watermark - last_purge >= 1000:  # purge closed sessions once a second of event time
            last_purge = watermark
            for k in list(open_sessions):
                alive = [s for s in open_sessions[k] if s[1] > watermark]
                emitted += len(open_sessions[k]) - len(alive)
                if alive:
                    open_sessions[k] = alive
                else:
                    del open_sessions[k]
    return emitted + sum(len(v) for v in open_sessions.values())


def q11_like_stream(n_events: int, n_keys: int, disorder_ms: int,
                    seed: int = 11) -> tuple[np.ndarray, np.ndarray]:
    """(keys, times) in arrival order: bids at 10k/s over skewed keys, each event time up to
    ``disorder_ms`` behind its place in the stream (uniformly), so the stream is that much out
    of order."""
    keys, times = bid_stream(n_events, n_keys, seed=seed)
    in_order = (np.arange(n_events, dtype=np.int64) * 1000) // 10_000
    rng = np.random.default_rng(seed + 1)
    return keys, in_order - rng.integers(0, disorder_ms + 1, size=n_events, dtype=np.int64)


def events_per_session(keys: np.ndarray, times: np.ndarray, gap_ms: int) -> float:
    """Events per session when every event is accepted (windows that touch merge)."""
    order = np.lexsort((times, keys))
    k, t = keys[order], times[order]
    breaks = (k[1:] != k[:-1]) | (t[1:] - t[:-1] > gap_ms)
    return len(k) / (1 + int(breaks.sum())) if len(k) else 0.0


def gap_for(keys: np.ndarray, times: np.ndarray, target: float,
            max_gap_ms: int = 600_000) -> int:
    """The smallest gap (ms) that gives at least ``target`` events per session, at most
    ``max_gap_ms`` (a short stream cannot reach many events per session)."""
    low, high = 1, 1
    while events_per_session(keys, times, high) < target and high < max_gap_ms:
        high = min(2 * high, max_gap_ms)
    if events_per_session(keys, times, high) < target:
        return high
    while low < high:
        mid = (low + high) // 2
        if events_per_session(keys, times, mid) >= target:
            high = mid
        else:
            low = mid + 1
    return high


def _open_store(store_kind: str, root: Path, name: str, retention_ms: int) -> Any:
    if store_kind == "rocksdb":
        return SessionStore(root / name, retention_ms=retention_ms)
    return InMemorySessionStore(retention_ms=retention_ms)


SWEEP_PATHS = ("event", "process_batch", "process_table")


@contextlib.contextmanager
def cpu_in(owner: Any, name: str) -> Iterator[list[float]]:
    """While the block runs, add to the one-element list it yields the CPU seconds (of this
    process) spent in the function ``owner.name`` (of a module or a class), which is wrapped
    for the block and restored after it. ``cpu_in(planner, "plan")`` times the compiled plan
    kernel and its argument checks: the numerator of a row's ``kernel_share``."""
    spent = [0.0]
    original = getattr(owner, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.process_time()
        try:
            return original(*args, **kwargs)
        finally:
            spent[0] += time.process_time() - start

    setattr(owner, name, timed)
    try:
        yield spent
    finally:
        setattr(owner, name, original)


def sweep_rows(n_events: int, n_keys: int, root: Path, repeat: int = 3) -> list[dict[str, Any]]:
    """Both sweeps; the row they share (2 s, 2.5 events per session) is run once.

    Each row runs the dict sessionizer and every path on both stores ``repeat`` times, in turn,
    on one stream (``benchmarks.batch_paths.run_path``: count per key, emit-on-close, a commit
    per batch). It records the median rate of each and, per path, the median of the per-round
    ratios to the dict sessionizer, in wall-clock time and in CPU time of this process. For
    ``process_table`` it also records the median over the rounds of the CPU spent in the plan
    kernel (:func:`cpu_in`) over the run's whole CPU, the same CPU the ratio takes (every
    batch, its commit and the final watermark's closes): ``kernel_share``; and over the CPU
    of the ``process_table`` calls alone: ``kernel_share_of_calls``."""
    from sessionstore.engine import planner

    from .batch_paths import _timed_dict_cpu, _warm_up, run_path  # batch_paths imports us

    configs = [(d, SWEEP_EVENTS_PER_SESSION) for d in DISORDER_SWEEP_MS]
    configs += [(SWEEP_DISORDER_MS, e) for e in EVENTS_PER_SESSION_SWEEP
                if (SWEEP_DISORDER_MS, e) not in configs]
    rows = []
    # every batch path runs once on a small stream first, so that loading the compiled kernels
    # (and other first-call costs) is not timed in the first row
    _warm_up(root)
    for disorder_ms, target in configs:
        key_array, time_array = q11_like_stream(n_events, n_keys, disorder_ms)
        gap_ms = gap_for(key_array, time_array, target)
        keys, times = key_array.tolist(), time_array.tolist()
        walls: dict[str, list[float]] = {}
        cpus: dict[str, list[float]] = {}
        wall_ratios: dict[str, list[float]] = {}
        cpu_ratios: dict[str, list[float]] = {}
        emitted: dict[str, set[int]] = {}
        shares: dict[str, list[float]] = {}
        call_shares: dict[str, list[float]] = {}
        for _ in range(repeat):
            base, base_cpu, count = _timed_dict_cpu(keys, times, gap_ms, disorder_ms)
            walls.setdefault("dict", []).append(base)
            cpus.setdefault("dict", []).append(base_cpu)
            emitted.setdefault("dict", set()).add(count)
            for store_kind in ("rocksdb", "memory"):
                for path in SWEEP_PATHS:
                    name = f"{path}/{store_kind}"
                    with cpu_in(planner, "plan") as kernel_cpu, \
                            cpu_in(SessionAggregator, "process_table") as calls_cpu:
                        wall, count, cpu = run_path(path, key_array, time_array, gap_ms,
                                                    disorder_ms, store_kind, root)
                    if path == "process_table":
                        shares.setdefault(name, []).append(kernel_cpu[0] / cpu)
                        call_shares.setdefault(name, []).append(kernel_cpu[0] / calls_cpu[0])
                    walls.setdefault(name, []).append(wall)
                    cpus.setdefault(name, []).append(cpu)
                    wall_ratios.setdefault(name, []).append(base / wall)
                    cpu_ratios.setdefault(name, []).append(base_cpu / cpu)
                    emitted.setdefault(name, set()).add(count)
        row: dict[str, Any] = {
            "disorder_ms": disorder_ms, "target_events_per_session": target, "gap_ms": gap_ms,
            "events_per_session": events_per_session(key_array, time_array, gap_ms),
            "sweep": ("disorder" if target == SWEEP_EVENTS_PER_SESSION else "") + (
                "+" if target == SWEEP_EVENTS_PER_SESSION and disorder_ms == SWEEP_DISORDER_MS
                else "") + ("events_per_session" if disorder_ms == SWEEP_DISORDER_MS else ""),
            "repeat": repeat,
            "events_per_s": {name: n_events / statistics.median(w) for name, w in walls.items()},
            "cpu_events_per_s": {name: n_events / statistics.median(c)
                                 for name, c in cpus.items()},
            "ratio": {name: statistics.median(r) for name, r in wall_ratios.items()},
            "ratio_range": {name: [min(r), max(r)] for name, r in wall_ratios.items()},
            "cpu_ratio": {name: statistics.median(r) for name, r in cpu_ratios.items()},
            "emitted": {name: sorted(counts) for name, counts in emitted.items()},
            "kernel_share": {name: statistics.median(r) for name, r in shares.items()},
            "kernel_share_of_calls": {name: statistics.median(r)
                                      for name, r in call_shares.items()},
            "load_average": list(os.getloadavg()),
        }
        rows.append(row)
        if len({c for counts in emitted.values() for c in counts}) != 1:
            log.warning("the runs emitted different numbers of sessions: %s", row["emitted"])
        log.info("disorder %6d ms, %5.1f events/session (gap %d ms): %s", disorder_ms,
                 row["events_per_session"], gap_ms, ", ".join(
                     f"{name} {row['ratio'][name]:.2f}x/{row['cpu_ratio'][name]:.2f}x cpu"
                     for name in row["ratio"]) + "; plan kernel share (of the run, of the "
                 "calls) " + ", ".join(
                     f"{name} {share:.0%}, {row['kernel_share_of_calls'][name]:.0%}"
                     for name, share in row["kernel_share"].items()))
    return rows


STATE_SIZES = (10_000, 100_000, 1_000_000, 5_000_000)
STATE_CHANGED = 10_000
STATE_BATCHES = 5


def state_rows(sizes: tuple[int, ...], changed: int, root: Path, repeat: int = 3,
               batches: int = STATE_BATCHES) -> list[dict[str, Any]]:
    """The state-size sweep: what a batch of ``changed`` changed sessions costs when the engine
    retains ``size`` open sessions (``process_table``, count per key, emit-on-close).

    The state is loaded with one ``process_table`` call of ``size`` events on distinct keys
    (one session each, none closing: the watermark stays far below their ends) and committed;
    its rate is reported as the bulk load (sessions per second). Then ``batches`` batches each
    extend ``changed`` of those sessions (each batch's own keys), with a commit per batch on
    RocksDB. It reports the median CPU and wall time of a batch, in memory and on RocksDB."""
    import pyarrow as pa

    rows = []
    gap_ms = 3_600_000  # nothing closes during the sweep
    if sizes:  # load the compiled kernels before the first timed batch
        warm = SessionAggregator(InMemorySessionStore(retention_ms=2 * gap_ms),
                                 SessionWindows(gap_ms), aggregations.count())
        warm.process_table(pa.table({"k": np.arange(100), "t": np.zeros(100, np.int64)}),
                           key="k", time="t")
    for size in sizes:
        for store_kind in ("memory", "rocksdb"):
            cpus: list[float] = []
            walls: list[float] = []
            loads: list[float] = []
            for round_ in range(repeat):
                windows = SessionWindows(gap_ms)
                store = _open_store(store_kind, root, f"state-{size}-{round_}",
                                    windows.retention_ms + gap_ms)
                engine = SessionAggregator(store, windows, aggregations.count(),
                                           max_out_of_orderness_ms=gap_ms,
                                           emit=EmitStrategy.ON_WINDOW_CLOSE)
                keys = np.arange(size, dtype=np.int64)
                gc.collect()
                start = time.perf_counter()
                engine.process_table(pa.table({"k": keys, "t": np.zeros(size, dtype=np.int64)}),
                                     key="k", time="t")
                engine.commit()
                loads.append(size / (time.perf_counter() - start))
                rng = np.random.default_rng(round_)
                for b in range(batches):
                    changing = rng.choice(size, min(changed, size), replace=False)
                    table = pa.table({"k": changing.astype(np.int64),
                                      "t": np.full(len(changing), 1 + b, dtype=np.int64)})
                    gc.collect()
                    wall = time.perf_counter()
                    cpu = time.process_time()
                    engine.process_table(table, key="k", time="t")
                    if store_kind == "rocksdb":
                        engine.commit()
                    cpus.append(time.process_time() - cpu)
                    walls.append(time.perf_counter() - wall)
                store.close()
                del engine, store
                gc.collect()
            row = {"retained": size, "changed": changed, "store": store_kind,
                   "batch_cpu_ms": 1000 * statistics.median(cpus),
                   "batch_wall_ms": 1000 * statistics.median(walls),
                   "load_sessions_per_s": statistics.median(loads),
                   "load_average": list(os.getloadavg())}
            rows.append(row)
            log.info("retained %9d, %s: a batch of %d changes %7.1f ms cpu (%7.1f ms wall); "
                     "load %9.0f sessions/s", size, store_kind, changed, row["batch_cpu_ms"],
                     row["batch_wall_ms"], row["load_sessions_per_s"])
    return rows


def run_engine(
    keys: list[int], times: list[int], store_kind: str, batched: bool, trigger: bool,
    root: Path, chunk: int = 100_000,
) -> tuple[float, int]:
    windows = SessionWindows(GAP_MS)
    store = _open_store(store_kind, root, f"q11-{batched}-{trigger}",
                        windows.retention_ms + OUT_OF_ORDER_MS)
    options: dict[str, Any] = (
        {"trigger": AfterWatermark(early=AfterCount(100)),
         "accumulation": AccumulationMode.ACCUMULATING}
        if trigger else {"emit": EmitStrategy.ON_WINDOW_CLOSE}
    )
    engine = SessionAggregator(store, windows, aggregations.count(),
                               max_out_of_orderness_ms=OUT_OF_ORDER_MS, **options)
    emitted = 0
    gc.collect()
    start = time.perf_counter()
    if batched:
        for i in range(0, len(keys), chunk):
            emitted += len(engine.process_batch(keys[i:i + chunk], keys[i:i + chunk],
                                                times[i:i + chunk]))
    else:
        process = engine.process
        for key, t in zip(keys, times, strict=True):
            emitted += len(process(key, key, t))
    emitted += len(engine.advance_watermark(INT64_MAX))
    engine.commit()
    elapsed = time.perf_counter() - start
    store.close()
    return elapsed, emitted


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=400_000,
                        help="events per sweep row (400k: enough for 17 events per session)")
    parser.add_argument("--q11-events", type=int, default=300_000, help="events for q11")
    parser.add_argument("--repeat", type=int, default=3,
                        help="runs of each sweep cell (medians are reported)")
    parser.add_argument("--bidders", type=int, default=20_000)
    parser.add_argument("--skip-q11", action="store_true", help="run the sweeps only")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--state-sizes", type=int, nargs="*", default=list(STATE_SIZES),
                        help="retained open sessions of the state-size sweep (none: skip it)")
    parser.add_argument("--state-changed", type=int, default=STATE_CHANGED,
                        help="changed sessions per batch in the state-size sweep")
    parser.add_argument("--skip-sweeps", action="store_true",
                        help="skip the q11-like sweeps")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    root = Path(tempfile.mkdtemp(prefix="engine-bench-"))
    conditions: dict[str, Any] = {"date": time.strftime("%Y-%m-%d", time.gmtime()),
                                  "load_average_start": list(os.getloadavg())}
    try:
        sweeps = [] if args.skip_sweeps else sweep_rows(args.events, args.bidders, root,
                                                         args.repeat)
        states = state_rows(tuple(args.state_sizes), args.state_changed, root, args.repeat)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    rows: list[dict[str, Any]] = []
    if not args.skip_q11:
        rows = q11_rows(args.q11_events, args.bidders)
    if not args.no_write:
        conditions["load_average_end"] = list(os.getloadavg())
        path = write_results("engine", {**conditions,
                                        "events": args.events, "q11_events": args.q11_events,
                                        "repeat": args.repeat, "bidders": args.bidders,
                                        "gap_ms": GAP_MS, "batch_events": BATCH_EVENTS,
                                        "sweeps": sweeps, "state_sweep": states,
                                        "runs": rows})
        log.info("wrote %s", path)


def q11_rows(n_events: int, n_bidders: int) -> list[dict[str, Any]]:
    """Nexmark q11 with a 10 s gap: emit-on-close and a Beam trigger, every path and store."""
    bidders, event_times = bid_stream(n_events, n_bidders)
    keys, times = bidders.tolist(), event_times.tolist()
    root = Path(tempfile.mkdtemp(prefix="engine-bench-"))
    rows: list[dict[str, Any]] = []

    def record(name: str, fn: Callable[[], tuple[float, int]]) -> None:
        elapsed, emitted = fn()
        rows.append({"name": name, "events_per_s": n_events / elapsed,
                     "seconds": elapsed, "emitted": emitted})
        log.info("%-50s %12.0f events/s  %8d emitted", name, n_events / elapsed, emitted)

    try:
        record("plain-Python dict sessionizer (in memory)", lambda: _timed_dict(keys, times))
        for store_kind in ("rocksdb", "memory"):
            for batched in (False, True):
                for trigger in (False, True):
                    label = (f"{'process_batch' if batched else 'process'} on {store_kind}, "
                             f"{'trigger early=AfterCount(100)' if trigger else 'ON_WINDOW_CLOSE'}")
                    record(label, functools.partial(run_engine, keys, times, store_kind,
                                                    batched, trigger, root))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return rows


def _timed_dict(keys: list[int], times: list[int], gap_ms: int = GAP_MS,
                out_of_order_ms: int = OUT_OF_ORDER_MS) -> tuple[float, int]:
    gc.collect()
    start = time.perf_counter()
    emitted = dict_sessionizer(keys, times, gap_ms, out_of_order_ms)
    return time.perf_counter() - start, emitted


if __name__ == "__main__":
    main()
