"""Exact lineage: the regression test of the retry / maintenance / stale-local-copy repro.

Attempt 0 of batch b on executor A publishes b; the retry on executor B publishes b again;
maintenance runs and deletes what only A's attempt referenced; A then runs b+1. Before exact
lineage, A reused its local copy "at b" and its own SST name map, so manifest b+1 pointed at
deleted objects and a fresh executor's load(b+1) failed. Executors are separate local
directories, or separate processes; the snapshots are real RocksDB files on a local file system
and on S3 (moto's server on loopback).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest

from sessionstore import EmitStrategy, SessionAggregator, SessionWindows, aggregations
from spark_adapter.provider import SessionStoreProvider
from tests.spark.s3_server import state_location

ROOT = Path(__file__).resolve().parents[2]
GAP_MS = 10
BATCH = 3  # the batch that is retried


def batch_events(batch: int) -> list[tuple[str, int]]:
    rng = random.Random(batch)
    return [(f"user{rng.randrange(12)}", batch * 40 + rng.randrange(45)) for _ in range(30)]


def oracle(events: list[tuple[str, int]]) -> list[tuple[str, int, int, int]]:
    """(key, start, end, count) of every session, by a plain sort-and-scan over all events."""
    by_key: dict[str, list[int]] = {}
    for key, t in events:
        by_key.setdefault(key, []).append(t)
    sessions = []
    for key, times in by_key.items():
        times.sort()
        first = last = times[0]
        count = 0
        for t in times:
            if t > last + GAP_MS:  # windows [t, t + gap) that touch still merge
                sessions.append((key, first, last + GAP_MS, count))
                first, count = t, 0
            last = t
            count += 1
        sessions.append((key, first, last + GAP_MS, count))
    return sorted(sessions)


def make_provider(state: str, local: Path, fs: pafs.FileSystem | None) -> SessionStoreProvider:
    return SessionStoreProvider(state, "sessionize-op", 0, local_root=local, retention_ms=10**6,
                                filesystem=fs, keep_versions=1, orphan_grace_ms=0,
                                maintenance_every=0)


def run_batch(p: SessionStoreProvider, batch: int) -> dict[str, int]:
    """One task: load ``batch - 1``, sessionize the batch's events, commit ``batch``."""
    store = p.load(batch - 1)
    engine = SessionAggregator(store, SessionWindows(GAP_MS), aggregations.count(),
                               emit=EmitStrategy.ON_WINDOW_CLOSE, watermark="external")
    for key, t in batch_events(batch):
        engine.process(key, None, t)
    p.commit(engine.commit, batch)
    p.close()
    return p.metrics


def sessions_at(p: SessionStoreProvider, version: int) -> list[tuple[str, int, int, int]]:
    store = p.load(version)
    try:
        return sorted((s.key, s.start, s.end, record[0])
                      for s, record in store.find_sessions(-(2**63), 2**63 - 1))
    finally:
        p.close()


def referenced_objects(p: SessionStoreProvider, version: int) -> set[str]:
    return {e["object"] for e in p.read_manifest(version)["files"].values() if "object" in e}


def stored_objects(fs: pafs.FileSystem, p: SessionStoreProvider) -> set[str]:
    return {info.base_name for info in fs.get_file_info(pafs.FileSelector(f"{p.base}/sst"))}


@pytest.fixture(params=["local", "s3"])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Any]]:
    with state_location(request.param, tmp_path) as found:
        yield found


def test_retry_on_another_executor_then_maintenance_then_stale_executor(location, tmp_path):
    state, fs = location
    a = make_provider(state, tmp_path / "executor-A", fs)
    b = make_provider(state, tmp_path / "executor-B", fs)
    remote = a.fs
    for batch in range(BATCH):
        run_batch(a, batch)
    run_batch(a, BATCH)                      # attempt 0 of batch b on A publishes b
    first_attempt = a.read_manifest(BATCH)
    run_batch(b, BATCH)                      # the retry on B publishes b again
    published = b.read_manifest(BATCH)
    assert published["id"] != first_attempt["id"]
    assert published["parent"] == first_attempt["parent"]
    first_objects = {e["object"] for e in first_attempt["files"].values() if "object" in e}
    only_a = first_objects - referenced_objects(b, BATCH)  # what A's attempt uploaded alone
    assert only_a, "the retry must leave objects that only the first attempt referenced"
    run = b.maintenance()                    # deletes them: nothing retained references them
    assert run["orphans_deleted"] >= len(only_a)
    assert not only_a & stored_objects(remote, a)

    metrics = run_batch(a, BATCH + 1)        # A runs b+1: its local copy holds the other id
    assert metrics["loads_reused"] == BATCH  # batches 1..b-1 and attempt 0 of b reused it...
    assert metrics["loads_restored"] == 2    # ...but b+1 restored (batch 0 restored -1)
    assert metrics["local_copies_discarded"] == 1
    newest = a.read_manifest(BATCH + 1)
    assert newest["parent"] == published["id"]
    assert referenced_objects(a, BATCH + 1) <= stored_objects(remote, a)

    fresh = make_provider(state, tmp_path / "executor-C", fs)
    events = [e for batch in range(BATCH + 2) for e in batch_events(batch)]
    assert sessions_at(fresh, BATCH + 1) == oracle(events)
    assert fresh.metrics["loads_restored"] == 1


STEP = """
import json, sys
from tests.spark.test_lineage import make_provider, run_batch
state, local, batch, maintain = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
p = make_provider(state, local, None)
metrics = run_batch(p, batch) if batch >= 0 else {}
run = p.maintenance() if maintain else {}
print(json.dumps({"metrics": metrics, "maintenance": run}))
"""


def step(state: Path, executor: Path, batch: int, maintain: bool = False) -> dict[str, Any]:
    """One task (or one maintenance run) in its own process, as on a separate executor."""
    out = subprocess.run(
        [sys.executable, "-c", STEP, str(state), str(executor), str(batch), str(int(maintain))],
        env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, check=True,
        timeout=120,
    )
    result: dict[str, Any] = json.loads(out.stdout.decode().strip().splitlines()[-1])
    return result


def test_the_repro_with_executors_as_separate_processes(tmp_path):
    state, a, b = tmp_path / "state", tmp_path / "A", tmp_path / "B"
    for batch in range(BATCH + 1):
        step(state, a, batch)
    step(state, b, BATCH)
    assert step(state, b, -1, maintain=True)["maintenance"]["orphans_deleted"] > 0
    metrics = step(state, a, BATCH + 1)["metrics"]
    assert metrics["loads_restored"] == 1 and metrics["local_copies_discarded"] == 1
    fresh = make_provider(str(state), tmp_path / "C", None)
    events = [e for batch in range(BATCH + 2) for e in batch_events(batch)]
    assert sessions_at(fresh, BATCH + 1) == oracle(events)
