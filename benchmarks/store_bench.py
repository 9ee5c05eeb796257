"""Store benchmark: the segmented SessionStore against KIP-94's rejected key-value layout.

Both hold the same sessions, generated once; the figures are rates (operations per second) and
the cost of expiring a segment that holds every session. Run::

    python -m benchmarks.store_bench --sessions 1000000

It reports numbers and asserts none.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import rocksdict

from sessionstore import InMemorySessionStore, Session, SessionStore
from sessionstore.keyschema import encode_key
from sessionstore.store.rocksdb import BULK_LAYOUT_MIN_SESSIONS

from .common import timed, write_results

log = logging.getLogger("benchmarks.store")


def make_sessions(n: int, n_keys: int, seed: int = 7) -> list[Session]:
    """``n`` sessions over ``n_keys`` users; ends grow with the index, as in a stream."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        end = i * 3 + rng.randrange(0, 1000)
        out.append(Session(f"user{rng.randrange(n_keys)}", end - rng.randrange(1, 5000), end))
    return out


class KeyValueListStore:
    """KIP-94's rejected alternative: one RocksDB value per key holding a list of sessions."""

    def __init__(self, path: Path) -> None:
        opts = rocksdict.Options(raw_mode=True)
        opts.create_if_missing(True)
        self.db = rocksdict.Rdict(str(path), options=opts)
        wo = rocksdict.WriteOptions()
        # rocksdict's stub declares a method; at run time it is a property (as in the store)
        setattr(wo, "disable_wal", True)  # noqa: B010
        self.db.set_write_options(wo)

    def put(self, session: Session, value: Any) -> None:
        k = encode_key(session.key)
        raw = self.db.get(k)
        rows = msgpack.unpackb(raw) if raw is not None else []
        rows = [r for r in rows if not (r[0] == session.start and r[1] == session.end)]
        rows.append([session.start, session.end, value])
        self.db[k] = msgpack.packb(rows)

    def find_sessions_to_merge(self, key: Any, earliest_end: int, latest_start: int
                               ) -> list[Any]:
        raw = self.db.get(encode_key(key))
        rows = msgpack.unpackb(raw) if raw is not None else []
        return sorted(
            (r for r in rows if r[1] >= earliest_end and r[0] <= latest_start),
            key=lambda r: (r[1], r[0]),
        )

    def expire_before(self, end_limit: int) -> None:
        """Without segments, expiry must read and rewrite every key."""
        for k, raw in list(self.db.items()):
            rows = msgpack.unpackb(raw)
            kept = [r for r in rows if r[1] >= end_limit]
            if not kept:
                del self.db[k]
            elif len(kept) != len(rows):
                self.db[k] = msgpack.packb(kept)

    def close(self) -> None:
        self.db.close()


BULK_CHUNK = 100_000


def bulk_write_timed(data: list[Session], store: Any) -> tuple[float, float]:
    """``(wall-clock seconds, CPU seconds)`` to write ``data`` with ``put_many`` in chunks of
    100k sessions, columnar input (each distinct key once, plus an index), as the engine's batch
    path hands it over. Building the columns is not timed."""
    distinct: dict[Any, int] = {}
    index = np.array([distinct.setdefault(s.key, len(distinct)) for s in data], dtype=np.int64)
    keys = list(distinct)
    starts = np.array([s.start for s in data], dtype=np.int64)
    ends = np.array([s.end for s in data], dtype=np.int64)
    values = [1] * len(data)
    start, cpu = time.perf_counter(), time.process_time()
    for i in range(0, len(data), BULK_CHUNK):
        stop = i + BULK_CHUNK
        store.put_many(keys, starts[i:stop], ends[i:stop], values[i:stop],
                       key_index=index[i:stop])
    return time.perf_counter() - start, time.process_time() - cpu


def run_bulk(n_sessions: int, n_keys: int) -> dict[str, Any]:
    """The bulk-write figures alone (``--bulk-only``): RocksDB and in memory, each in wall-clock
    and in CPU time of the process (the one to compare on a shared machine; it includes
    RocksDB's background threads), and the commit after the RocksDB write."""
    data = make_sessions(n_sessions, n_keys)
    interval = max(s.end for s in data) + 1
    root = Path(tempfile.mkdtemp(prefix="store-bench-"))
    results: dict[str, Any] = {"sessions": n_sessions, "keys": n_keys}
    try:
        # one untimed bulk write first, as the engine sweeps warm up: it loads numba and the
        # compiled SST writer (0.3-0.5 s of CPU, once per process), which a process running
        # the engine has loaded already
        warm = SessionStore(root / "warm", retention_ms=interval, segment_interval_ms=interval)
        bulk_write_timed(data[:4 * BULK_LAYOUT_MIN_SESSIONS], warm)
        warm.close()
        bulk = SessionStore(root / "bulk", retention_ms=interval, segment_interval_ms=interval)
        wall, cpu_secs = bulk_write_timed(data, bulk)
        results["segmented_put_many_per_s"] = n_sessions / wall
        results["segmented_put_many_cpu_per_s"] = n_sessions / cpu_secs
        cpu = time.process_time()
        secs, _ = timed(lambda: bulk.commit())
        commit_cpu = time.process_time() - cpu
        results["segmented_put_many_commit_ms"] = secs * 1000
        results["segmented_put_many_commit_cpu_ms"] = commit_cpu * 1000
        # the figure: the writes and the commit that makes them durable, together
        results["segmented_put_many_and_commit_per_s"] = n_sessions / (wall + secs)
        results["segmented_put_many_and_commit_cpu_per_s"] = n_sessions / (cpu_secs + commit_cpu)
        results["load_average_1m"] = os.getloadavg()[0]
        bulk.close()
        memory = InMemorySessionStore(retention_ms=interval, segment_interval_ms=interval)
        wall, cpu_secs = bulk_write_timed(data, memory)
        results["memory_put_many_per_s"] = n_sessions / wall
        results["memory_put_many_cpu_per_s"] = n_sessions / cpu_secs
        memory.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return results


def run(n_sessions: int, n_keys: int, n_queries: int) -> dict[str, Any]:
    # the bulk figures first, as ``--bulk-only`` takes them: later, the million sessions of the
    # other runs' objects make every collector pass during the writes slower
    bulk = run_bulk(n_sessions, n_keys)
    data = make_sessions(n_sessions, n_keys)
    max_end = max(s.end for s in data)
    rng = random.Random(11)
    probes = [data[rng.randrange(n_sessions)] for _ in range(n_queries)]
    root = Path(tempfile.mkdtemp(prefix="store-bench-"))
    results: dict[str, Any] = {**bulk, "queries": n_queries}
    try:
        # one segment holds everything, so that the expiry figure is "a segment of N sessions"
        interval = max_end + 1
        store = SessionStore(root / "segmented", retention_ms=interval,
                             segment_interval_ms=interval)
        secs, _ = timed(lambda: [store.put(s, 1) for s in data])
        results["segmented_put_per_s"] = n_sessions / secs
        secs, _ = timed(lambda: [
            list(store.find_sessions_to_merge(s.key, s.end - 2000, s.end + 2000)) for s in probes
        ])
        results["segmented_find_sessions_to_merge_per_s"] = n_queries / secs
        windows = [(lo, lo + 3000) for lo in (rng.randrange(max_end) for _ in range(n_queries // 10))]
        count = 0

        def scan_windows() -> None:
            nonlocal count
            for lo, hi in windows:
                count += sum(1 for _ in store.find_sessions(lo, hi))

        secs, _ = timed(scan_windows)
        results["segmented_find_sessions_per_s"] = len(windows) / secs
        results["segmented_find_sessions_rows_per_s"] = count / secs
        secs, _ = timed(lambda: store.commit())
        results["segmented_commit_ms"] = secs * 1000
        before = time.perf_counter()
        store.put(Session("trigger", 3 * interval, 3 * interval), 0)  # expires segment 0
        results["segmented_expiry_ms"] = (time.perf_counter() - before) * 1000
        results["segmented_sessions_after_expiry"] = sum(1 for _ in store.find_sessions(0, max_end))
        store.close()


        kv = KeyValueListStore(root / "kv")
        def put_all() -> None:
            for s in data:
                kv.put(s, 1)

        secs, _ = timed(put_all)
        results["kvlist_put_per_s"] = n_sessions / secs
        secs, _ = timed(lambda: [
            kv.find_sessions_to_merge(s.key, s.end - 2000, s.end + 2000) for s in probes
        ])
        results["kvlist_find_sessions_to_merge_per_s"] = n_queries / secs
        secs, _ = timed(lambda: kv.expire_before(max_end + 1))
        results["kvlist_expiry_ms"] = secs * 1000
        kv.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=100_000)
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--bulk-only", action="store_true",
                        help="only the bulk-write figures (print only)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.bulk_only:
        for name, value in sorted(run_bulk(args.sessions, args.keys).items()):
            log.info("%-45s %14.1f", name, value)
        return
    results = run(args.sessions, args.keys, args.queries)
    for name, value in sorted(results.items()):
        log.info("%-45s %14.1f", name, value)
    if not args.no_write:
        log.info("wrote %s", write_results("store", results))


if __name__ == "__main__":
    main()
