"""Engine benchmark: Nexmark q11 (bids per bidder, 10 s session gap) on one core.

Measures the event-at-a-time path (``process``) and the batch path (``process_batch``) on the
RocksDB store and the in-memory store, with emit-on-close and with a Beam trigger, next to a
plain-Python dict sessionizer written as a user would. Every run sees the same generated stream
in the same process. It reports numbers and asserts none::

    python -m benchmarks.engine_bench --events 5000000
"""

from __future__ import annotations

import argparse
import gc
import logging
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


def run_engine(
    keys: list[int], times: list[int], store_kind: str, batched: bool, trigger: bool,
    root: Path, chunk: int = 100_000,
) -> tuple[float, int]:
    windows = SessionWindows(GAP_MS)
    retention = windows.retention_ms + OUT_OF_ORDER_MS
    store: Any
    if store_kind == "rocksdb":
        store = SessionStore(root / f"q11-{batched}-{trigger}", retention_ms=retention)
    else:
        store = InMemorySessionStore(retention_ms=retention)
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
    parser.add_argument("--events", type=int, default=5_000_000)
    parser.add_argument("--bidders", type=int, default=20_000)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    bidders, event_times = bid_stream(args.events, args.bidders)
    keys, times = bidders.tolist(), event_times.tolist()
    root = Path(tempfile.mkdtemp(prefix="engine-bench-"))
    rows: list[dict[str, Any]] = []

    def record(name: str, fn: Callable[[], tuple[float, int]]) -> None:
        elapsed, emitted = fn()
        rows.append({"name": name, "events_per_s": args.events / elapsed,
                     "seconds": elapsed, "emitted": emitted})
        log.info("%-50s %12.0f events/s  %8d emitted", name, args.events / elapsed, emitted)

    try:
        record("plain-Python dict sessionizer (in memory)", lambda: _timed_dict(keys, times))
        for store_kind in ("rocksdb", "memory"):
            for batched in (False, True):
                for trigger in (False, True):
                    label = (f"{'process_batch' if batched else 'process'} on {store_kind}, "
                             f"{'trigger early=AfterCount(100)' if trigger else 'ON_WINDOW_CLOSE'}")
                    record(label, lambda s=store_kind, b=batched, tr=trigger:
                           run_engine(keys, times, s, b, tr, root))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if not args.no_write:
        path = write_results("engine", {"events": args.events, "bidders": args.bidders,
                                        "gap_ms": GAP_MS, "runs": rows})
        log.info("wrote %s", path)


def _timed_dict(keys: list[int], times: list[int]) -> tuple[float, int]:
    start = time.perf_counter()
    emitted = dict_sessionizer(keys, times)
    return time.perf_counter() - start, emitted


if __name__ == "__main__":
    main()
