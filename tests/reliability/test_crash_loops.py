"""Crash loops at CI scale (benchmarks/soak.py runs them at soak scale)."""

from __future__ import annotations

import json

from benchmarks.soak import engine_crash_loop, snapshot_crash_loop

ENGINE_KILLS = 100
SNAPSHOT_KILLS = 25


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

