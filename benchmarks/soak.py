"""Crash loops: SIGKILL real processes at random moments and check that nothing is lost or
duplicated. The test suite runs them at a moderate count; run a soak here::

    python -m benchmarks.soak --kills 1000

Three loops:

* ``engine``: ``sessionstore sessionize --state`` (emit-on-close, offsets committed with the
  state) over a generated Parquet stream with frequent commits and frequent segment expiry. After
  the kills, one last uninterrupted run finishes the input; its output must equal a crash-free
  run's output exactly.
* ``snapshots``: the Spark provider's batch loop (load ``b - 1``, process, commit ``b`` and
  upload its snapshot). After each kill, a fresh executor restores the newest published
  snapshot, and its sessions must hold exactly the events of the batches it claims.
* ``checkpoints``: a store committing in a loop, killed while RocksDB builds, renames and
  deletes checkpoints. Each reopen must be exact and remove every interrupted commit's leftover.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

log = logging.getLogger("benchmarks.soak")
ROOT = Path(__file__).resolve().parents[1]
EVENTS = 60_000


def make_input(path: Path, n: int = EVENTS, seed: int = 3) -> Path:
    rng = np.random.default_rng(seed)
    times = np.sort(rng.integers(0, n * 20, size=n))
    table = pa.table({"user": rng.integers(0, 500, size=n), "ts": times,
                      "amount": rng.integers(0, 100, size=n)})
    pq.write_table(table, path, row_group_size=1_000)
    return path


def _cli(args: list[str]) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, "-m", "sessionstore.cli", *args], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _lines(path: Path) -> list[str]:
    return sorted(path.read_text().splitlines()) if path.exists() else []


def engine_crash_loop(work: Path, kills: int, seed: int = 7) -> dict[str, Any]:
    """Kill ``sessionstore sessionize --state`` ``kills`` times; compare with a clean run."""
    rng = random.Random(seed)
    source = make_input(work / "events.parquet")
    common = ["sessionize", str(source), "--key", "user", "--time", "ts", "--gap", "300ms",
              "--grace", "100ms", "--agg", "n=count", "--agg", "total=sum:amount",
              "--commit-every", "1000", "--batch-rows", "1000", "--no-progress"]
    clean = _cli([*common, "--out", str(work / "clean.jsonl")])
    if clean.wait(timeout=600) != 0:
        raise RuntimeError(clean.stderr.read().decode() if clean.stderr else "clean run failed")
    state, out = work / "state", work / "crashy.jsonl"
    done = killed = 0
    while killed < kills:
        child = _cli([*common, "--state", str(state), "--out", str(out)])
        time.sleep(rng.uniform(0.35, 1.2))
        if child.poll() is None:
            child.send_signal(signal.SIGKILL)
            killed += 1
        else:
            done += 1  # finished before the kill: start over on a fresh state
            if child.returncode != 0:
                raise RuntimeError(child.stderr.read().decode() if child.stderr else "failed")
            if _lines(out) != _lines(work / "clean.jsonl"):
                raise AssertionError("a completed resumed run differs from the clean run")
            shutil.rmtree(state, ignore_errors=True)
            out.unlink(missing_ok=True)
        child.wait(timeout=60)
    final = _cli([*common, "--state", str(state), "--out", str(out)])
    if final.wait(timeout=600) != 0:
        raise RuntimeError(final.stderr.read().decode() if final.stderr else "final run failed")
    crashy, expected = _lines(out), _lines(work / "clean.jsonl")
    lost = len(set(expected) - set(crashy))
    duplicated = len(crashy) - len(set(crashy))
    return {"kills": killed, "completed_runs": done, "sessions": len(expected),
            "identical": crashy == expected, "lost": lost, "duplicated": duplicated,
            "events_counted": sum(json.loads(line)["n"] for line in crashy)}


SNAPSHOT_CHILD = """
import sys
from spark_adapter.provider import SessionStoreProvider
from sessionstore import EmitStrategy, SessionAggregator, SessionWindows, aggregations
state, local = sys.argv[1], sys.argv[2]
windows = SessionWindows(50)
print("ready", flush=True)
while True:
    # maintenance every 3 batches with no grace: deletions run under the kills too
    provider = SessionStoreProvider(state, "soak", 0, local_root=local, retention_ms=10_000,
                                    keep_versions=3, orphan_grace_ms=0, maintenance_every=3)
    versions = provider.versions()
    batch = versions[-1] + 1 if versions else 0
    store = provider.load(batch - 1)
    engine = SessionAggregator(store, windows, aggregations.count(),
                               emit=EmitStrategy.ON_WINDOW_CLOSE, watermark="external")
    for i in range(200):
        engine.process(f"k{i % 37}", None, batch * 1_000 + i * 5)
    provider.commit(engine.commit, batch)
    provider.close()
    print("published", batch, flush=True)
"""


def _wait_for_line(child: subprocess.Popen[bytes], prefix: bytes, timeout_s: float) -> None:
    """Read the child's stdout until a line starts with ``prefix``; fail after ``timeout_s``."""
    assert child.stdout is not None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([child.stdout], [], [], deadline - time.monotonic())
        if not ready:
            break
        line = child.stdout.readline()
        if not line:
            stderr = child.stderr.read().decode() if child.stderr else ""
            raise RuntimeError(f"the snapshot child exited before {prefix!r}: {stderr}")
        if line.startswith(prefix):
            return
    raise RuntimeError(f"the snapshot child printed no {prefix!r} within {timeout_s} s")


def snapshot_crash_loop(work: Path, kills: int, seed: int = 11) -> dict[str, Any]:
    """Kill the provider's batch loop ``kills`` times; after every kill, a fresh executor must
    restore the newest published snapshot exactly.

    A kill is timed from the moment the child has started (interpreter and imports, which take
    a second or more on a busy machine, are not part of what is tested). The first kill also
    waits for batch 0, so that every kill leaves a published version to restore, and every
    fourth kill waits for one more batch, so that the loop advances on a busy machine. Children
    alternate between two local working copies, so kills land in restores as well as in
    reuses, commits, uploads and maintenance.
    """
    from spark_adapter.provider import SessionStoreProvider

    rng = random.Random(seed)
    script = work / "snapshot_child.py"
    script.write_text(SNAPSHOT_CHILD)
    state = work / "state"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    restored = 0
    newest = -1
    for kill in range(kills):
        local = work / rng.choice(["local-a", "local-b"])
        child = subprocess.Popen([sys.executable, str(script), str(state), str(local)], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            _wait_for_line(child, b"ready", 120)
            if newest < 0 or kill % 4 == 0:  # progress however slow the machine is
                _wait_for_line(child, b"published", 120)
            time.sleep(rng.uniform(0.0, 0.6))
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=60)
        checker = SessionStoreProvider(str(state), "soak", 0,
                                       local_root=work / f"checker-{kill}", retention_ms=10_000)
        versions = checker.versions()
        if not versions:
            raise AssertionError(f"kill {kill}: no published snapshot left")
        if versions[-1] < newest:
            raise AssertionError(f"kill {kill}: newest snapshot went back from {newest} to "
                                 f"{versions[-1]}")
        newest = versions[-1]
        store = checker.load(newest)
        total = sum(record[0] for _, record in store.find_sessions(-(2**63), 2**63 - 1))
        checker.close()
        shutil.rmtree(work / f"checker-{kill}")
        if total != 200 * (newest + 1):
            raise AssertionError(f"batch {newest} restored {total} events, "
                                 f"expected {200 * (newest + 1)}")
        restored += 1
    return {"kills": kills, "exact_restores": restored, "batches_published": newest + 1}


CHECKPOINT_CHILD = """
import sys
from sessionstore import Session, SessionStore
store = SessionStore(sys.argv[1], retention_ms=10**12)
batch = (store.committed_metadata or {"batch": -1})["batch"] + 1
print("ready", flush=True)
while True:
    # batch b replaces batch b - 1: the store keeps 300 sessions, each valued b
    for i in range(300):
        if batch:
            store.remove(Session(f"k{i}", (batch - 1) * 1_000 + i, (batch - 1) * 1_000 + i + 10))
        store.put(Session(f"k{i}", batch * 1_000 + i, batch * 1_000 + i + 10),
                  {"batch": batch, "pad": "x" * 64})
    store.commit({"batch": batch})
    print("committed", batch, flush=True)
    batch += 1
"""


def _leftovers(state: Path) -> tuple[int, int, int]:
    """The interrupted-commit leftovers under ``state/checkpoints``: their count, how many are
    RocksDB's ``.tmp`` work directories, and the bytes of the files they hold (hard links to
    SSTs included: the space stays held while they exist)."""
    found = tmp = size = 0
    root = state / "checkpoints"
    for entry in (root.iterdir() if root.is_dir() else []):
        if entry.name.startswith((".staging-", ".deleting-")):
            found += 1
            tmp += entry.name.endswith(".tmp")
            size += sum(f.stat().st_size for f in entry.rglob("*") if f.is_file())
    return found, tmp, size


def checkpoint_crash_loop(work: Path, kills: int, seed: int = 13) -> dict[str, Any]:
    """SIGKILL a store that commits in a loop (RocksDB checkpoints built and renamed) ``kills``
    times. After each kill, count the leftovers of interrupted commits, then open the store: it
    must be at the newest batch seen or a later one, hold exactly that batch's sessions, and
    have removed every leftover of its own naming. The store keeps 300 sessions (each batch replaces the
    last), so every kill costs the same however long the loop runs."""
    from sessionstore import SessionStore

    rng = random.Random(seed)
    script = work / "checkpoint_child.py"
    script.write_text(CHECKPOINT_CHILD)
    state = work / "state"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    newest = -1
    seen = seen_tmp = held = exact = 0
    for kill in range(kills):
        child = subprocess.Popen([sys.executable, str(script), str(state)], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            _wait_for_line(child, b"ready", 120)
            time.sleep(rng.uniform(0.0, 0.4))
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=60)
        found, tmp, size = _leftovers(state)
        seen += found
        seen_tmp += tmp
        held += size
        with SessionStore(state, retention_ms=10**12) as store:
            batch = (store.committed_metadata or {"batch": -1})["batch"]
            values = [v["batch"] for _, v in store.find_sessions(-(2**63), 2**63 - 1)]
        if batch < newest:
            raise AssertionError(f"kill {kill}: the store went back from batch {newest} to "
                                 f"{batch}")
        newest = batch
        if values != ([batch] * 300 if batch >= 0 else []):
            raise AssertionError(f"kill {kill}: batch {batch} holds {len(values)} sessions of "
                                 f"batches {sorted(set(values))}, expected 300 of {batch}")
        after = _leftovers(state)
        if after[0]:
            raise AssertionError(f"kill {kill}: {after[0]} leftovers survived an open")
        exact += 1
    return {"kills": kills, "exact_reopens": exact, "batches_committed": newest + 1,
            "leftovers_found": seen, "rocksdb_tmp_found": seen_tmp, "bytes_freed": held}


def main(argv: list[str] | None = None) -> None:
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=1000)
    parser.add_argument("--snapshot-kills", type=int, default=200)
    parser.add_argument("--checkpoint-kills", type=int, default=220)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("engine", "snap", "checkpoint"):
            (Path(tmp) / name).mkdir()
        engine = engine_crash_loop(Path(tmp) / "engine", args.kills)
        log.info("engine crash loop: %s", engine)
        snapshots = snapshot_crash_loop(Path(tmp) / "snap", args.snapshot_kills)
        log.info("snapshot crash loop: %s", snapshots)
        checkpoints = checkpoint_crash_loop(Path(tmp) / "checkpoint", args.checkpoint_kills)
        log.info("checkpoint crash loop: %s", checkpoints)
    from .common import write_results

    log.info("wrote %s", write_results("soak", {"engine": engine, "snapshots": snapshots,
                                                "checkpoints": checkpoints}))


if __name__ == "__main__":
    main()
