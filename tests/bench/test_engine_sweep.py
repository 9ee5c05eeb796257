"""The engine benchmark's sweep, at a tiny size: every path on both stores emits the sessions the
plain-Python sessionizer counts, and the report renders one table line per stream."""

from __future__ import annotations

from pathlib import Path

from benchmarks.engine_bench import SWEEP_PATHS, sweep_rows
from benchmarks.report import SWEEP_RUNS, sweep_table
from sessionstore import SessionAggregator
from sessionstore.engine import planner


def test_every_sweep_cell_emits_the_dict_sessionizers_count(tmp_path: Path) -> None:
    plan, call = planner.plan, SessionAggregator.process_table
    rows = sweep_rows(3_000, 300, tmp_path, repeat=1)
    # the kernel-share timers put the planner and the method back
    assert planner.plan is plan and SessionAggregator.process_table is call
    assert len(rows) == 6  # four disorders at 2.5 events/session, then 1.5 and 17
    names = {f"{path}/{store}" for path in SWEEP_PATHS for store in ("rocksdb", "memory")}
    for row in rows:
        assert set(row["ratio"]) == names == {name for name, _ in SWEEP_RUNS}
        assert len(row["emitted"]["dict"]) == 1
        assert row["emitted"]["dict"][0] > 0
        for name in names:
            assert row["emitted"][name] == row["emitted"]["dict"], (row["disorder_ms"], name)
            assert row["ratio"][name] > 0 and row["cpu_ratio"][name] > 0
        # the plan kernel's share of each process_table run's CPU: timed, and a part of it
        assert set(row["kernel_share"]) == {"process_table/rocksdb", "process_table/memory"}
        assert set(row["kernel_share_of_calls"]) == set(row["kernel_share"])
        for name, share in row["kernel_share"].items():  # the calls are a part of the run
            assert 0 < share <= row["kernel_share_of_calls"][name] < 1
    table = sweep_table(rows)
    assert len(table) == 2 + len(rows)
    assert all("(all equal)" in line for line in table[2:])
