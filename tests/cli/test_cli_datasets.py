"""The CLI reads files, directories, globs and Hive partitions through pyarrow.dataset, resumes
across file boundaries, and summarises what it wrote."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from sessionstore import io as sio
from sessionstore.cli import main


def events(n: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table({"user": rng.integers(0, 300, n).astype(str),
                     "ts": np.sort(rng.integers(0, n * 30, n)),
                     "amount": rng.integers(0, 100, n)})


def oracle(table: pa.Table, gap_ms: int) -> list[tuple[str, int, int, int, int]]:
    """Sessions by sorting each user's events: (user, start, end, count, sum of amount)."""
    out = []
    by_user: dict[str, list[tuple[int, int]]] = {}
    for user, t, amount in zip(*(table[c].to_pylist() for c in ("user", "ts", "amount")),
                               strict=True):
        by_user.setdefault(user, []).append((t, amount))
    for user, items in by_user.items():
        items.sort()
        start, last, n, total = items[0][0], items[0][0], 0, 0
        for t, amount in items:
            if t > last + gap_ms:
                out.append((user, start, last + gap_ms, n, total))
                start, n, total = t, 0, 0
            last, n, total = t, n + 1, total + amount
        out.append((user, start, last + gap_ms, n, total))
    return sorted(out)


def cli_sessions(path: Path) -> list[tuple[str, int, int, int, int]]:
    if path.suffix == ".parquet":
        table = pa.concat_tables(pq.read_table(p) for p in sorted(path.glob("*.parquet")))
        rows = table.to_pylist()
    else:
        rows = [json.loads(line) for line in path.read_text().splitlines()]
    return sorted((r["user"], r["session_start_ms"], r["session_end_ms"], r["n"], r["total"])
                  for r in rows)


ARGS = ["--key", "user", "--time", "ts", "--gap", "2s", "--max-out-of-order", "1h",
        "--agg", "n=count", "--agg", "total=sum:amount", "--no-progress"]


@pytest.mark.parametrize("layout", ["directory", "glob", "hive", "csv-directory", "jsonl-glob"])
def test_every_layout_gives_the_oracles_sessions(tmp_path, layout):
    table = events(6000, 1)
    parts = [table.slice(i, 1500) for i in range(0, 6000, 1500)]
    folder = tmp_path / "in"
    folder.mkdir()
    if layout == "hive":
        for user_bucket in ("0", "1", "2"):
            chunk = table.filter(pa.compute.equal(
                pa.compute.utf8_slice_codeunits(table["user"], 0, 1), user_bucket))
            if chunk.num_rows:
                (folder / f"bucket={user_bucket}").mkdir()
                pq.write_table(chunk, folder / f"bucket={user_bucket}" / "part-0.parquet")
        rest = table.filter(pa.compute.invert(pa.compute.is_in(
            pa.compute.utf8_slice_codeunits(table["user"], 0, 1), pa.array(["0", "1", "2"]))))
        (folder / "bucket=9").mkdir()
        pq.write_table(rest, folder / "bucket=9" / "part-0.parquet")
        (folder / "_SUCCESS").write_text("")  # Spark's marker: not data
        spec = str(folder)
    elif layout == "csv-directory":
        for i, part in enumerate(parts):
            pacsv.write_csv(part, folder / f"part-{i}.csv")
        spec = str(folder)
    elif layout == "jsonl-glob":
        for i, part in enumerate(parts):
            (folder / f"part-{i}.jsonl").write_text(
                "".join(json.dumps(r) + "\n" for r in part.to_pylist()))
        (folder / "notes.txt").write_text("not matched by the glob")
        spec = f"{folder}/*.jsonl"
    else:
        for i, part in enumerate(parts):
            pq.write_table(part, folder / f"part-{i}.parquet")
        spec = str(folder) if layout == "directory" else f"{folder}/part-*.parquet"
    out = tmp_path / "o.jsonl"
    assert main(["sessionize", spec, *ARGS, "--out", str(out)]) == 0
    assert cli_sessions(out) == oracle(table, 2000)


@pytest.mark.parametrize("commit_every", [700, 1500, 4000])
def test_a_failed_run_resumes_across_file_boundaries(tmp_path, monkeypatch, capsys,
                                                     commit_every):
    table = events(6000, 2)
    folder = tmp_path / "in"
    folder.mkdir()
    for i in range(0, 6000, 1000):
        pq.write_table(table.slice(i, 1000), folder / f"part-{i // 1000}.parquet",
                       row_group_size=300)
    out = tmp_path / "o.parquet"
    argv = ["sessionize", str(folder), *ARGS, "--out", str(out), "--state",
            str(tmp_path / "state"), "--commit-every", str(commit_every), "--batch-rows", "450"]
    real_write = sio.SessionWriter.write_table
    calls = {"n": 0}

    def failing_write(self: sio.SessionWriter, rows: pa.Table | None) -> None:
        calls["n"] += 1
        if calls["n"] == 2:  # after one commit, and for 4000 before the last one
            raise OSError(28, "No space left on device")
        real_write(self, rows)

    monkeypatch.setattr(sio.SessionWriter, "write_table", failing_write)
    assert main(argv) == 2
    assert "OSError: [Errno 28] No space left on device" in capsys.readouterr().err
    monkeypatch.setattr(sio.SessionWriter, "write_table", real_write)
    assert main(argv) == 0
    assert cli_sessions(out) == oracle(table, 2000)


def test_summary_prints_the_longest_and_busiest_and_writes_a_histogram(tmp_path, capsys):
    table = events(3000, 4)
    source = tmp_path / "in.parquet"
    pq.write_table(table, source)
    out = tmp_path / "o.jsonl"
    png = tmp_path / "lengths.png"
    assert main(["sessionize", str(source), *ARGS, "--out", str(out), "--summary",
                 "--summary-png", str(png)]) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    assert result["summary_png"] == str(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    sessions = cli_sessions(out)
    longest = max(sessions, key=lambda s: s[2] - s[1])
    busiest = max(sessions, key=lambda s: s[3])
    text = captured.err
    assert f"{len(sessions):,} sessions" in text
    longest_block = text.split("longest sessions:")[1].split("busiest sessions:")[0]
    busiest_block = text.split("busiest sessions:")[1]
    assert longest_block.splitlines()[2].split()[0] == longest[0]
    assert busiest_block.splitlines()[2].split()[-1] == f"{busiest[3]:,}"
    assert main(["sessionize", str(source), *ARGS[:-5], "--agg", "total=sum:amount",
                 "--no-progress", "--out", str(out), "--summary"]) == 2
    assert "--summary counts events per session" in capsys.readouterr().err
