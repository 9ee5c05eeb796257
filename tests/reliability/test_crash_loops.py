"""Crash loops at CI scale (benchmarks/soak.py runs them at soak scale)."""

from __future__ import annotations

import json

from benchmarks.soak import checkpoint_crash_loop, engine_crash_loop, snapshot_crash_loop

ENGINE_KILLS = 100
SNAPSHOT_KILLS = 25
CHECKPOINT_KILLS = 10


def test_engine_survives_sigkill_loop_with_nothing_lost_or_duplicated(tmp_path):
    report = engine_crash_loop(tmp_path, ENGINE_KILLS)
    assert report["kills"] == ENGINE_KILLS
    assert report["identical"] and report["lost"] == 0 and report["duplicated"] == 0
    assert report["events_counted"] == 60_000
    (tmp_path / "report.json").write_text(json.dumps(report))


def test_snapshots_survive_sigkill_loop(tmp_path):
    report = snapshot_crash_loop(tmp_path, SNAPSHOT_KILLS)
    assert report["kills"] == SNAPSHOT_KILLS
    assert report["exact_restores"] == SNAPSHOT_KILLS  # every kill, none tolerated
    # every fourth kill waits for a published batch: the kills hit a loop that advances
    assert report["batches_published"] >= SNAPSHOT_KILLS // 4 + 1



def test_store_reopens_exactly_and_removes_leftovers_after_sigkill_in_commits(tmp_path):
    report = checkpoint_crash_loop(tmp_path, CHECKPOINT_KILLS)
    assert report["kills"] == CHECKPOINT_KILLS
    assert report["exact_reopens"] == CHECKPOINT_KILLS  # every kill, none tolerated
    assert report["batches_committed"] >= 1
