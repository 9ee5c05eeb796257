"""The engine benchmark's sweep, at a tiny size: every path on both stores emits the sessions the
plain-Python sessionizer counts, and the report renders one table line per stream."""

from __future__ import annotations

from pathlib import Path

from benchmarks.engine_bench import SWEEP_PATHS, state_rows, sweep_rows
from benchmarks.report import SWEEP_RUNS, sweep_table


def test_every_sweep_cell_emits_the_dict_sessionizers_count(tmp_path: Path) -> None:
    rows = sweep_rows(3_000, 300, tmp_path, repeat=1)
    assert len(rows) == 6  # four disorders at 2.5 events/session, then 1.5 and 17
    names = {f"{path}/{store}" for path in SWEEP_PATHS for store in ("rocksdb", "memory")}
    for row in rows:
        assert set(row["ratio"]) == names == {name for name, _ in SWEEP_RUNS}
        assert len(row["emitted"]["dict"]) == 1
        assert row["emitted"]["dict"][0] > 0
        for name in names:
            assert row["emitted"][name] == row["emitted"]["dict"], (row["disorder_ms"], name)
            assert row["ratio"][name] > 0 and row["cpu_ratio"][name] > 0
    table = sweep_table(rows)
    assert len(table) == 2 + len(rows)
    assert all("(all equal)" in line for line in table[2:])


def test_the_state_size_sweep_runs_every_size_on_both_stores(tmp_path: Path) -> None:
    rows = state_rows((500, 2_000), 300, tmp_path, repeat=2, batches=3)
    assert [(row["retained"], row["store"]) for row in rows] == [
        (500, "memory"), (500, "rocksdb"), (2_000, "memory"), (2_000, "rocksdb")]
    for row in rows:
        # the load, then three batches of 300 changes, in every round
        assert row["events_in"] == [row["retained"] + 3 * 300]
        assert row["batch_cpu_ms"] > 0 and row["load_sessions_per_s"] > 0
