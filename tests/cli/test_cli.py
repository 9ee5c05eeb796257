"""The sessionstore command: every subcommand, its errors, and crash-and-resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sessionstore.cli import main

ROOT = Path(__file__).resolve().parents[2]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


ROWS = [
    {"user": "a", "ts": 0, "amount": 5, "page": "/"},
    {"user": "b", "ts": 1000, "amount": 1, "page": "/x"},
    {"user": "a", "ts": 60_000, "amount": 2, "page": "/cart"},
    {"user": "a", "ts": 10_000_000, "amount": 7, "page": "/"},
]


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_help_on_every_command(capsys):
    for argv in (["--help"], ["sessionize", "--help"], ["inspect", "--help"], ["bench", "--help"]):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 0
        assert "usage: sessionstore" in capsys.readouterr().out


def test_sessionize_jsonl_to_jsonl(tmp_path, capsys):
    source = write_jsonl(tmp_path / "in.jsonl", ROWS)
    out = tmp_path / "out.jsonl"
    code = main(["sessionize", str(source), "--key", "user", "--time", "ts", "--gap", "30m",
                 "--agg", "n=count", "--agg", "total=sum:amount", "--agg", "pages=collect:page",
                 "--out", str(out), "--no-progress"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["events_in"] == 4 and summary["sessions_out"] == 3
    got = sorted((r["user"], r["session_start_ms"], r["n"], r["total"], r["pages"])
                 for r in read_jsonl(out))
    assert got == [("a", 0, 2, 7, ["/", "/cart"]), ("a", 10_000_000, 1, 7, ["/"]),
                   ("b", 1000, 1, 1, ["/x"])]


def test_sessionize_csv_and_parquet_and_iso_times(tmp_path, capsys):
    csv_in = tmp_path / "in.csv"
    csv_in.write_text("user,ts,amount\na,2024-01-01T00:00:00,1\na,2024-01-01T00:10:00,2\n"
                      "b,2024-01-01T05:00:00,3\n")
    out_dir = tmp_path / "out.parquet"
    assert main(["sessionize", str(csv_in), "--key", "user", "--time", "ts", "--gap",
                 "15 minutes", "--agg", "total=sum:amount", "--out", str(out_dir),
                 "--no-progress"]) == 0
    table = pa.concat_tables(pq.read_table(p) for p in sorted(out_dir.glob("*.parquet")))
    assert sorted(zip(table["user"].to_pylist(), table["total"].to_pylist(), strict=True)) == [
        ("a", 3), ("b", 3)]
    pq_in = tmp_path / "in.parquet"
    pq.write_table(pa.table({"user": ["x", "x"], "ts": pa.array([0, 5], pa.int64())}), pq_in)
    csv_out = tmp_path / "o.csv"
    assert main(["sessionize", str(pq_in), "--key", "user", "--time", "ts", "--gap", "1s",
                 "--emit", "update", "--out", str(csv_out), "--no-progress"]) == 0
    lines = csv_out.read_text().splitlines()
    assert lines[0] == "user,session_start_ms,session_end_ms,events,retracted"
    # a batch emits what the event path emits with its write cache flushed at the batch end
    assert lines[1:] == ["x,0,1005,2,False"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--time", "nope"], "input has no column 'nope'"),
        (["--time", "ts", "--gap", "soon"], "--gap is not a duration"),
        (["--time", "ts", "--gap", "0"], "--gap must be > 0"),
        (["--time", "ts", "--agg", "x=median:amount"], "KIND must be count"),
        (["--time", "ts", "--agg", "x=sum:missing"], "names column 'missing'"),
        (["--time", "page"], "time column 'page'"),
    ],
)
def test_errors_are_one_human_line(tmp_path, capsys, extra, message):
    source = write_jsonl(tmp_path / "in.jsonl", ROWS)
    argv = ["sessionize", str(source), "--key", "user", "--gap", "30m",
            "--out", str(tmp_path / "o.jsonl"), "--no-progress", *extra]
    if "--gap" in extra:
        argv.remove("30m")
        argv.remove("--gap")
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("sessionstore: error:") and message in err
    assert "\n" not in err and "Traceback" not in err


def test_unreadable_and_missing_inputs(tmp_path, capsys):
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"not parquet at all")
    assert main(["sessionize", str(broken), "--key", "u", "--time", "t", "--gap", "1m",
                 "--out", str(tmp_path / "o.jsonl"), "--no-progress"]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert main(["sessionize", str(tmp_path / "none.csv"), "--key", "u", "--time", "t",
                 "--gap", "1m", "--out", str(tmp_path / "o.jsonl"), "--no-progress"]) == 2
    assert "does not exist" in capsys.readouterr().err
    broken.with_suffix(".txt").write_text("user,ts\n")
    assert main(["sessionize", str(broken.with_suffix(".txt")), "--key", "u", "--time", "t",
                 "--gap", "1m", "--out", str(tmp_path / "o.jsonl"), "--no-progress"]) == 2
    assert "unknown format" in capsys.readouterr().err
    null_keys = write_jsonl(tmp_path / "nulls.jsonl", [{"user": None, "ts": 1}])
    assert main(["sessionize", str(null_keys), "--key", "user", "--time", "ts", "--gap", "1m",
                 "--out", str(tmp_path / "o.jsonl"), "--no-progress"]) == 2
    assert "None" in capsys.readouterr().err


def test_debug_shows_the_traceback(tmp_path):
    with pytest.raises(ValueError):
        main(["--debug", "sessionize", str(write_jsonl(tmp_path / "i.jsonl", ROWS)), "--key",
              "user", "--time", "ts", "--gap", "nope", "--out", str(tmp_path / "o.jsonl")])


def test_inspect_shows_versions_segments_and_samples(tmp_path, capsys):
    source = write_jsonl(tmp_path / "in.jsonl", ROWS)
    state = tmp_path / "state"
    assert main(["sessionize", str(source), "--key", "user", "--time", "ts", "--gap", "30m",
                 "--state", str(state), "--out", str(tmp_path / "o.jsonl"),
                 "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["inspect", str(state)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["committed_version"] >= 1 and report["versions"]
    assert report["metadata"]["user"]["offset"] == 4
    # the two early sessions were emitted, then expired with their segment: one remains
    assert sum(s["sessions"] for s in report["segments"]) == 1
    segment = report["segments"][0]
    assert segment["sample"] == [["'a'", 10_000_000, 11_800_000]]
    assert segment["end_from_ms"] <= 11_800_000 <= segment["end_to_ms"]
    assert main(["inspect", str(tmp_path)]) == 2


def test_bench_reports_rates(capsys):
    assert main(["bench", "--events", "20000", "--path", "both"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report["events_per_s"]) == {"process", "process_batch"}
    assert all(v > 0 for v in report["events_per_s"].values())


def test_state_of_another_input_is_refused(tmp_path, capsys):
    state = tmp_path / "state"
    one = write_jsonl(tmp_path / "one.jsonl", ROWS)
    args = ["--key", "user", "--time", "ts", "--gap", "30m", "--state", str(state),
            "--out", str(tmp_path / "o.jsonl"), "--no-progress"]
    assert main(["sessionize", str(one), *args]) == 0
    two = write_jsonl(tmp_path / "two.jsonl", ROWS)
    assert main(["sessionize", str(two), *args]) == 2
    assert "belongs to another input" in capsys.readouterr().err


def big_input(path: Path, n: int) -> Path:
    import numpy as np

    rng = np.random.default_rng(1)
    users = rng.integers(0, 2000, size=n)
    times = np.sort(rng.integers(0, n * 50, size=n))
    pq.write_table(pa.table({"user": users, "ts": times, "amount": rng.integers(0, 9, size=n)}),
                   path, row_group_size=5_000)
    return path


def run_cli(args: list[str]) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, "-m", "sessionstore.cli", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_crash_and_resume_neither_loses_nor_duplicates(tmp_path):
    source = big_input(tmp_path / "events.parquet", 200_000)
    common = ["sessionize", str(source), "--key", "user", "--time", "ts", "--gap", "2s",
              "--agg", "n=count", "--agg", "total=sum:amount", "--commit-every", "5000",
              "--batch-rows", "5000", "--no-progress"]
    clean = run_cli([*common, "--out", str(tmp_path / "clean.jsonl")])
    assert clean.wait(timeout=300) == 0
    out = tmp_path / "crashy.jsonl"
    state = tmp_path / "state"
    kills = 0
    for delay in (0.8, 1.2, 0.9, 1.5):
        child = run_cli([*common, "--state", str(state), "--out", str(out)])
        time.sleep(delay)
        if child.poll() is None:
            child.send_signal(signal.SIGKILL)
            kills += 1
        child.wait(timeout=60)
    final = run_cli([*common, "--state", str(state), "--out", str(out)])
    assert final.wait(timeout=300) == 0, final.stderr.read()
    assert kills >= 1
    clean_rows = sorted(map(json.dumps, read_jsonl(tmp_path / "clean.jsonl")))
    crashy_rows = sorted(map(json.dumps, read_jsonl(out)))
    assert crashy_rows == clean_rows
    assert sum(r["n"] for r in read_jsonl(out)) == 200_000
