"""Snapshot benchmark: what the Spark provider uploads per micro-batch, and how long a restore of
a large state takes, on a local file system or on S3 (moto's server on loopback).

A partition's store is filled with ``--sessions`` open sessions (one per user), committed in
build batches, then ``--batches`` micro-batches each touch ``--changed`` users (half extend a
session, half are new users). Per micro-batch it reports the bytes the commit uploaded against
the changed data: the bytes of the key-value records the batch changed (each written session's
record key and value, and each removed session's record key), uncompressed. Background uploads
(compaction output) are reported apart. Then a fresh executor (empty local disk) loads the
newest version, and runs one more batch, which reads the open sessions back into the engine;
both are timed. Run::

    python -m benchmarks.snapshot_bench --sessions 1000000 --fs s3

It reports numbers and asserts none.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import logging
import pstats
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from sessionstore import EmitStrategy, SessionAggregator, SessionWindows, aggregations
from sessionstore.keyschema import encode_key, key_first

from .common import peak_rss_mb, write_results

log = logging.getLogger("benchmarks.snapshot")

GAP_MS = 600_000
BUILD_CHUNK = 250_000


@contextlib.contextmanager
def state_location(kind: str, work: Path) -> Iterator[tuple[str, pafs.FileSystem | None]]:
    """A local directory, or a bucket on a moto S3 server on loopback."""
    if kind == "local":
        yield str(work / "state"), None
        return
    import socket

    from moto.server import ThreadedMotoServer

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        fs = pafs.S3FileSystem(access_key="bench", secret_key="bench", region="us-east-1",
                               endpoint_override=f"127.0.0.1:{port}", scheme="http",
                               allow_bucket_creation=True)
        fs.create_dir("bench")
        yield "bench/state", fs
    finally:
        server.stop()


def provider(location: str, fs: pafs.FileSystem | None, local: Path,
             compact_level0_files: int | None = None) -> Any:
    from spark_adapter.provider import SessionStoreProvider

    extra = {} if compact_level0_files is None else {
        "compact_level0_files": compact_level0_files}
    return SessionStoreProvider(location, "op", 0, local_root=local, retention_ms=4 * GAP_MS,
                                segment_interval_ms=4 * GAP_MS, filesystem=fs,
                                maintenance_every=0, **extra)


def engine_on(store: Any) -> SessionAggregator:
    return SessionAggregator(store, SessionWindows(GAP_MS), aggregations.count(),
                             emit=EmitStrategy.ON_WINDOW_CLOSE, watermark="external")


def events(users: np.ndarray, time_ms: int) -> pa.Table:
    return pa.table({"user": pa.array([f"user{u}" for u in users.tolist()]),
                     "t": pa.array(np.full(len(users), time_ms, dtype=np.int64))})


def run_batch(p: Any, batch: int, table: pa.Table, measure: bool = False) -> dict[str, int]:
    """Process ``table`` as batch ``batch`` on the open provider ``p`` (a kept partition: the
    store stays open between batches) and commit it; the upload counters of the commit (and
    the background uploads joined by it). ``measure``: also the changed bytes."""
    before = dict(p.metrics)
    engine = engine_on(p.store)
    users = table.column("user").to_pylist()
    old_ends = _session_ends(p.store, users) if measure else {}
    engine.process_table(table, key="user", time="t")
    started = time.perf_counter()
    p.commit(engine.commit, batch)
    commit_s = time.perf_counter() - started
    out = {name: p.metrics.get(name, 0) - before.get(name, 0)
           for name in ("bytes_uploaded", "objects_uploaded", "background_bytes_uploaded")}
    out["commit_ms"] = int(commit_s * 1000)
    if measure:
        out["changed_bytes"] = _changed_bytes(p.store, users, old_ends)
    return out


def _session_ends(store: Any, users: list[str]) -> dict[str, list[tuple[int, int, int]]]:
    """Each user's sessions as (end, start, value bytes)."""
    return {user: [(s.end, s.start, len(msgpack.packb(v))) for s, v in store.fetch(user)]
            for user in users}


def _changed_bytes(store: Any, users: list[str],
                   before: dict[str, list[tuple[int, int, int]]]) -> int:
    """Bytes of the records a batch changed: each new or rewritten session's record key and
    value, and each removed session's record key."""
    after = _session_ends(store, users)
    total = 0
    for user in users:
        encoded = encode_key(user)
        old, new = set(before[user]), set(after[user])
        total += sum(len(key_first(encoded, end, start)) + size for end, start, size in new - old)
        total += sum(len(key_first(encoded, end, start)) for end, start, _ in old - new)
    return total


def state_bytes(p: Any, version: int) -> int:
    return sum(int(e["size"]) for e in p.read_manifest(version)["files"].values())


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if values else 0.0


def run(n_sessions: int, n_batches: int, changed: int, fs_kind: str, profile: bool,
        compact_level0_files: int | None = None, seed: int = 5) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    work = Path(tempfile.mkdtemp(prefix="snapshot-bench-"))
    try:
        with state_location(fs_kind, work) as (location, fs):
            writer = provider(location, fs, work / "writer", compact_level0_files)
            writer.load(-1)
            batch = -1
            started = time.perf_counter()
            for first in range(0, n_sessions, BUILD_CHUNK):
                batch += 1
                users = np.arange(first, min(first + BUILD_CHUNK, n_sessions))
                run_batch(writer, batch, events(users, 1_000 + batch))
            build_s = time.perf_counter() - started
            next_user = n_sessions
            per_batch = []
            for _ in range(n_batches):
                batch += 1
                old = rng.choice(next_user, size=changed // 2, replace=False)
                new = np.arange(next_user, next_user + changed - changed // 2)
                next_user += len(new)
                counters = run_batch(writer, batch, events(np.concatenate([old, new]),
                                                           1_000 + batch), measure=True)
                counters["state_bytes"] = state_bytes(writer, batch)
                per_batch.append(counters)
            writer.close()
            background = [float(b["background_bytes_uploaded"]) for b in per_batch]
            ratios = [b["bytes_uploaded"] / max(1, b["changed_bytes"]) for b in per_batch]
            uploaded = [float(b["bytes_uploaded"]) for b in per_batch]
            commits = [float(b["commit_ms"]) for b in per_batch]
            # a fresh executor: nothing on its disk
            reader = provider(location, fs, work / "reader")
            profiler = cProfile.Profile() if profile else None
            started = time.perf_counter()
            if profiler is not None:
                profiler.enable()
            store = reader.load(batch)
            load_s = time.perf_counter() - started
            engine = engine_on(store)
            engine.process_table(events(np.array([0, next_user]), 1_000 + batch + 1),
                                 key="user", time="t")
            first_batch_s = time.perf_counter() - started - load_s
            if profiler is not None:
                profiler.disable()
                out = io.StringIO()
                pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(30)
                log.info("restore profile:\n%s", out.getvalue())
            reader.close()
            result = {
                "compact_level0_files": compact_level0_files, "fs": fs_kind, "sessions": n_sessions, "batches": n_batches,
                "changed_per_batch": changed, "build_s": round(build_s, 2),
                "state_mb": round(per_batch[-1]["state_bytes"] / 2**20, 1) if per_batch else 0,
                "uploaded_kb_p50": round(percentile(uploaded, 50) / 1024, 1),
                "uploaded_kb_p99": round(percentile(uploaded, 99) / 1024, 1),
                "uploaded_kb_max": round(max(uploaded, default=0) / 1024, 1),
                "background_kb_total": round(sum(background) / 1024, 1),
                "background_kb_max": round(max(background, default=0) / 1024, 1),
                "changed_kb_p50": round(percentile(
                    [float(b["changed_bytes"]) for b in per_batch], 50) / 1024, 1),
                "upload_ratio_p50": round(percentile(ratios, 50), 2),
                "upload_ratio_p99": round(percentile(ratios, 99), 2),
                "commit_ms_p50": percentile(commits, 50),
                "commit_ms_p99": percentile(commits, 99),
                "restore_load_s": round(load_s, 2),
                "restore_first_batch_s": round(first_batch_s, 2),
                "peak_rss_mb": round(peak_rss_mb(), 1),
            }
            log.info("%s", result)
            return result
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=1_000_000)
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--changed", type=int, default=10_000)
    parser.add_argument("--fs", choices=["local", "s3"], default="s3")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--compact-level0-files", type=int, default=None,
                        help="the provider's setting (default: its default; 0: RocksDB compacts "
                             "on its own, as before delta snapshots)")
    parser.add_argument("--out", default="", help="results name under docs/bench (none: skip)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # moto's request log
    logging.getLogger("spark_adapter").setLevel(logging.WARNING)
    result = run(args.sessions, args.batches, args.changed, args.fs, args.profile,
                 args.compact_level0_files)
    if args.out:
        log.info("wrote %s", write_results(args.out, result))


if __name__ == "__main__":
    main()
