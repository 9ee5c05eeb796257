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
    # the loop made progress between kills, so the kills hit the batch loop, not start-up
    assert report["batches_published"] > SNAPSHOT_KILLS // 2

