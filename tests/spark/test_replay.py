"""Replays are deterministic: a driver SIGKILLed between the sink's commit and Spark's commits/N
replays batch N after a restart with exactly the first attempt's output.

Each run is its own driver process (tests.spark.replay_driver), on real files and real RocksDB.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests.spark.streams import driver_outputs, final_rows, prepare_source, run_driver

RNG = random.Random(11)
# file i holds events in [100 i, 100 i + 30): the watermark of batch i + 2 closes its sessions
FILES = [[(f"u{RNG.randrange(8)}", 100 * i + RNG.randrange(30), RNG.randrange(50))
          for _ in range(40)] for i in range(5)]
KILL_AT = 3  # a data batch that also closes sessions of earlier files


def drive(root: Path, *args: str) -> int:
    return run_driver("tests.spark.replay_driver", root, *args).returncode


def prepare(root: Path) -> Path:
    return prepare_source(root, FILES)


@pytest.mark.parametrize("engine", ["arrow"])
def test_driver_kill_between_sink_and_commit_log_replays_identically(tmp_path, engine):
    crashed = prepare(tmp_path / "crashed")
    assert drive(crashed, "--engine", engine, "--kill-at", str(KILL_AT)) == -9
    assert not (crashed / "checkpoint" / "commits" / str(KILL_AT)).exists()
    assert drive(crashed, "--engine", engine) == 0
    attempts = driver_outputs(crashed)
    assert len(attempts[KILL_AT]) == 2, "batch KILL_AT must have run twice"
    first, replay = attempts[KILL_AT]
    assert first == replay and first, "the replay must repeat the first attempt exactly"

    clean = prepare(tmp_path / "clean")
    assert drive(clean, "--engine", engine) == 0
    native = prepare(tmp_path / "native")
    assert drive(native, "--native") == 0
    assert final_rows(attempts) == final_rows(driver_outputs(clean)) \
        == final_rows(driver_outputs(native))
    assert len(set(final_rows(attempts))) == len(final_rows(attempts))  # nothing duplicated
