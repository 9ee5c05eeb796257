"""The CLI end to end on a large one-event-per-key input, counted against the oracle.

This input is what made engine v1's batch path lose about a tenth of the sessions (the cache
filled mid-batch and expiry dropped sessions nobody had emitted)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from sessionstore.cli import main
from tests import oracle


def test_sessionize_counts_match_the_oracle_on_250k_one_event_users(tmp_path: Path, capsys):
    n = 250_000
    rng = np.random.default_rng(7)
    times = np.arange(n, dtype=np.int64) + rng.integers(-1_500, 1_500, n)  # some events late
    users = [f"user{i}" for i in range(n)]
    source = tmp_path / "in.parquet"
    pq.write_table(pa.table({"user": users, "ts": pa.array(times, pa.int64())}), source)
    out_dir = tmp_path / "out.parquet"
    assert main(["sessionize", str(source), "--key", "user", "--time", "ts", "--gap", "1s",
                 "--out", str(out_dir), "--no-progress", "--state", str(tmp_path / "state"),
                 "--max-dropped-share", "1"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    table = pa.concat_tables(pq.read_table(p) for p in sorted(out_dir.glob("*.parquet")))
    steps = [("event", u, None, t) for u, t in zip(users, times.tolist(), strict=True)]
    sessions, dropped = oracle.sessionize(steps, gap=1_000)
    assert len(dropped) > 0  # the input does exercise lateness
    assert table.num_rows == len(sessions) == n - len(dropped)
    assert report["sessions_out"] == len(sessions) and report["late_dropped"] == len(dropped)
    assert set(table["user"].to_pylist()) == {s[0] for s in sessions}
