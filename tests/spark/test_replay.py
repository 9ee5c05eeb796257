"""Replays are deterministic: a driver SIGKILLed between the sink's commit and Spark's commits/N
replays batch N after a restart with exactly the first attempt's output.

Each run is its own driver process (tests.spark.replay_driver), on real files and real RocksDB,
for both engines: the Arrow engine, whose watermark is committed with its state, and the
processor engine (transformWithStateInPandas, Spark >= 4), whose watermark Spark replays from
its offset log.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

from tests.spark.streams import driver_outputs, final_rows, prepare_source, run_driver

RNG = random.Random(11)
# file i holds events in [100 i, 100 i + 30): the watermark of batch i + 2 closes its sessions
FILES = [[(f"u{RNG.randrange(8)}", 100 * i + RNG.randrange(30), RNG.randrange(50))
          for _ in range(40)] for i in range(5)]
KILL_AT = 3  # kill no earlier than this data batch, which closes sessions of earlier files


def drive(root: Path, *args: str) -> int:
    """The driver's exit status; its stderr's end goes to the test's captured output if it
    failed (a killed Python worker's faulthandler stack is there)."""
    done = run_driver("tests.spark.replay_driver", root, *args)
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-20_000:])
    return done.returncode


def prepare(root: Path) -> Path:
    return prepare_source(root, FILES)


@pytest.fixture(scope="module")
def native_rows(tmp_path_factory: pytest.TempPathFactory) -> list[tuple]:
    """Native session_window's output on the same files (one driver for both engines)."""
    native = prepare(tmp_path_factory.mktemp("native"))
    assert drive(native, "--native") == 0
    rows = final_rows(driver_outputs(native))
    assert len(rows) > 20
    return rows


@pytest.mark.parametrize("engine", ["arrow", "processor"])
def test_driver_kill_between_sink_and_commit_log_replays_identically(tmp_path, engine,
                                                                     native_rows):
    clean = prepare(tmp_path / "clean")
    assert drive(clean, "--engine", engine) == 0
    clean_outputs = driver_outputs(clean)
    assert final_rows(clean_outputs) == native_rows
    # kill in the first batch from KILL_AT on that emits; both engines close a session in the
    # micro-batch whose watermark passes its end, as native does (test_calendar_gap compares
    # them batch by batch), so this is the same batch on both
    kill_at = min(b for b, outs in clean_outputs.items() if b >= KILL_AT and outs[0])

    crashed = prepare(tmp_path / "crashed")
    assert drive(crashed, "--engine", engine, "--kill-at", str(kill_at)) == -9
    assert not (crashed / "checkpoint" / "commits" / str(kill_at)).exists()
    assert drive(crashed, "--engine", engine) == 0
    attempts = driver_outputs(crashed)
    assert len(attempts[kill_at]) == 2, "the killed batch must have run twice"
    first, replay = attempts[kill_at]
    assert first == replay and first, "the replay must repeat the first attempt exactly"
    assert sorted(map(tuple, first)) == sorted(map(tuple, clean_outputs[kill_at][0]))
    assert final_rows(attempts) == native_rows
    assert len(set(final_rows(attempts))) == len(final_rows(attempts))  # nothing duplicated
