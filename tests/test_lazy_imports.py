"""Start-up (issue 23, item 4): the bounded path and the CLI's parsing load none of what only
the incremental engine needs, and every public name still resolves."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import sessionstore

ROOT = Path(__file__).resolve().parents[1]
# (matplotlib is loaded by --summary's histogram, which the run below asks for)
HEAVY = ("numba", "rocksdict", "msgpack", "tqdm", "sessionstore.engine", "sessionstore.store")


def test_a_bounded_run_loads_nothing_the_engine_needs(tmp_path):
    # kills: eager imports in sessionstore/__init__.py, the CLI, the writers or the report
    code = f"""
import sys
import pyarrow as pa
import sessionstore
from sessionstore.cli import main
table = pa.table({{"user": ["a", "a"], "ts": [0, 5]}})
sessionstore.sessionize(table, key="user", time="ts", gap=10, aggregations=["n=count"])
import pyarrow.parquet as pq
pq.write_table(table, {str(tmp_path / "in.parquet")!r})
assert main(["sessionize", {str(tmp_path / "in.parquet")!r}, "--key", "user", "--time", "ts",
             "--gap", "1s", "--out", {str(tmp_path / "o.jsonl")!r}, "--no-progress",
             "--summary", "--summary-png", {str(tmp_path / "h.png")!r}]) == 0
loaded = sorted(name for name in {HEAVY!r} if name in sys.modules)
print("loaded=" + ",".join(loaded))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, check=True)
    assert done.stdout.strip().splitlines()[-1] == "loaded=", done.stdout


def test_every_public_name_resolves():
    for name in sessionstore.__all__:
        assert getattr(sessionstore, name) is not None, name
    assert callable(sessionstore.sessionize)
    assert "SessionAggregator" in dir(sessionstore)
