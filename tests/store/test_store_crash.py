"""SIGKILL a writing process at random moments; the store must reopen at its last commit."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from sessionstore import InMemorySessionStore, SessionStore
from tests.store.crash_child import INTERVAL, RETENTION, apply_step

ROOT = Path(__file__).resolve().parents[2]
KILLS = 24


def expected_after(step: int) -> InMemorySessionStore:
    model = InMemorySessionStore(retention_ms=RETENTION, segment_interval_ms=INTERVAL)
    for i in range(1, step + 1):
        apply_step(model, i)
    return model


def snapshot(store) -> list:
    return [(tuple(s), v) for s, v in store.find_sessions(-(2**63), 2**63 - 1)]


def test_sigkill_at_random_moments_reopens_at_last_commit(tmp_path: Path):
    path = tmp_path / "crash"
    rng = random.Random(94)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    steps_seen = []
    for kill in range(KILLS):
        child = subprocess.Popen(
            [sys.executable, "-m", "tests.store.crash_child", str(path)], cwd=ROOT, env=env,
            stdout=subprocess.PIPE, text=True,
        )
        # Time the kill from the child's "ready" line: starting Python takes longer than the
        # whole window on a busy machine, and a kill during start-up tests nothing.
        assert child.stdout is not None
        assert child.stdout.readline() == "ready\n"
        if kill % 4 == 3:  # sometimes wait for a commit first, so the tail moves on
            child.stdout.readline()
        time.sleep(rng.uniform(0.0, 0.3))
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
        assert child.returncode == -signal.SIGKILL
        with SessionStore(path, retention_ms=RETENTION, segment_interval_ms=INTERVAL) as store:
            step = store.committed_metadata["step"] if store.committed_metadata else 0
            assert store.committed_version == step  # the child commits once a step
            model = expected_after(step)
            assert snapshot(store) == snapshot(model)
            assert store.observed_stream_time == model.observed_stream_time
            steps_seen.append(step)
    print("committed steps after each kill:", steps_seen)
    assert steps_seen == sorted(steps_seen)
    assert steps_seen[-1] > steps_seen[0], "the child never got past its first commits"
