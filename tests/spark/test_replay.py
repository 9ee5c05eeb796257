"""Replays are deterministic: a driver SIGKILLed between the sink's commit and Spark's commits/N
replays batch N after a restart with exactly the first attempt's output.

Each run is its own driver process (tests.spark.replay_driver), on real files and real RocksDB.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from tests.spark.streams import write_file

ROOT = Path(__file__).resolve().parents[2]
RNG = random.Random(11)
# file i holds events in [100 i, 100 i + 30): the watermark of batch i + 2 closes its sessions
FILES = [[(f"u{RNG.randrange(8)}", 100 * i + RNG.randrange(30), RNG.randrange(50))
          for _ in range(40)] for i in range(5)]
KILL_AT = 3  # a data batch that also closes sessions of earlier files


def drive(root: Path, *args: str) -> int:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run([sys.executable, "-m", "tests.spark.replay_driver", str(root), *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    return done.returncode


def prepare(root: Path) -> Path:
    source = root / "source"
    source.mkdir(parents=True)
    for i, rows in enumerate(FILES):
        write_file(source, i, rows)
        # the file source takes files in modification-time order: make it the file order
        os.utime(source / f"f{i:04d}.json", (1_700_000_000 + i, 1_700_000_000 + i))
    return root


def outputs(root: Path) -> dict[int, list[list]]:
    """Batch id -> the rows of each attempt, in the order the attempts ran."""
    found: dict[int, list[tuple[float, list]]] = {}
    for path in (root / "out").glob("*.json"):
        batch = int(path.name.split(".")[0])
        found.setdefault(batch, []).append((path.stat().st_mtime, json.loads(path.read_text())))
    return {b: [rows for _, rows in sorted(attempts, key=lambda a: a[0])]
            for b, attempts in found.items()}


def final(attempts: dict[int, list[list]]) -> list[tuple]:
    return sorted(tuple(r) for b in attempts for r in attempts[b][-1])


@pytest.mark.parametrize("engine", ["arrow"])
def test_driver_kill_between_sink_and_commit_log_replays_identically(tmp_path, engine):
    crashed = prepare(tmp_path / "crashed")
    assert drive(crashed, "--engine", engine, "--kill-at", str(KILL_AT)) == -9
    assert not (crashed / "checkpoint" / "commits" / str(KILL_AT)).exists()
    assert drive(crashed, "--engine", engine) == 0
    attempts = outputs(crashed)
    assert len(attempts[KILL_AT]) == 2, "batch KILL_AT must have run twice"
    first, replay = attempts[KILL_AT]
    assert first == replay and first, "the replay must repeat the first attempt exactly"

    clean = prepare(tmp_path / "clean")
    assert drive(clean, "--engine", engine) == 0
    native = prepare(tmp_path / "native")
    assert drive(native, "--native") == 0
    assert final(attempts) == final(outputs(clean)) == final(outputs(native))
    assert len(set(final(attempts))) == len(final(attempts))  # nothing duplicated
