"""The CLI misuse suite (issue 13): every way the command line could lose or skip input.

Each test runs the real command (in process through ``main`` or as a subprocess where a crash,
a signal or a resource limit is part of the case) on real files, RocksDB state and filesystems.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sessionstore import ReadOnlySessionStore, SessionStore
from sessionstore.cli import main
from sessionstore.io import MAX_JSON_DEPTH, check_json_depth
from sessionstore.io import InputError as IoInputError

ROOT = Path(__file__).resolve().parents[2]
ROWS = [
    {"user": "a", "ts": 0, "amount": 5},
    {"user": "b", "ts": 1000, "amount": 1},
    {"user": "a", "ts": 60_000, "amount": 2},
    {"user": "a", "ts": 10_000_000, "amount": 7},
]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def sessionize(source: Path | str, out: Path | str, *extra: str) -> list[str]:
    return ["sessionize", str(source), "--key", "user", "--time", "ts", "--gap", "30m",
            "--out", str(out), "--no-progress", *extra]


def refused(capsys: pytest.CaptureFixture[str], argv: list[str], *needles: str) -> str:
    """Run ``argv``; it must fail with exit 2 and one line on stderr containing ``needles``."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("sessionstore: error: ") and err.count("\n") == 1, err
    for needle in needles:
        assert needle in err, err
    return err


def snapshot_tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file()}


# -- --out and --state that overlap the input -------------------------------------------------


def test_out_equal_to_the_input_is_refused_and_the_input_kept(tmp_path, capsys):
    source = write_jsonl(tmp_path / "in.jsonl", ROWS)
    before = source.read_bytes()
    refused(capsys, sessionize(source, source), "resolves to the input file")
    assert source.read_bytes() == before


def test_out_through_a_symlink_relative_path_or_hard_link_is_refused(tmp_path, capsys,
                                                                     monkeypatch):
    (tmp_path / "data").mkdir()
    source = write_jsonl(tmp_path / "data" / "in.jsonl", ROWS)
    before = source.read_bytes()
    (tmp_path / "alias.jsonl").symlink_to(source)
    refused(capsys, sessionize(source, tmp_path / "alias.jsonl"), "resolves to the input")
    monkeypatch.chdir(tmp_path / "data")
    refused(capsys, sessionize("in.jsonl", "../data/./in.jsonl"), "resolves to the input")
    os.link(source, tmp_path / "hard.jsonl")
    refused(capsys, sessionize(source, tmp_path / "hard.jsonl"), "resolves to the input")
    assert source.read_bytes() == before


def test_out_inside_an_input_directory_or_matching_its_glob_is_refused(tmp_path, capsys):
    folder = tmp_path / "events"
    folder.mkdir()
    write_jsonl(folder / "a.jsonl", ROWS)
    before = snapshot_tree(folder)
    refused(capsys, sessionize(folder, folder / "sessions.jsonl"), "inside the input directory")
    refused(capsys, sessionize(f"{folder}/*.jsonl", folder / "out.jsonl"), "matches the input glob")
    refused(capsys, sessionize(folder, tmp_path / "o.jsonl", "--state", str(folder / "st")),
            "--state", "inside the input directory")
    assert snapshot_tree(folder) == before


def test_state_overlapping_out_or_holding_the_input_is_refused(tmp_path, capsys):
    source = write_jsonl(tmp_path / "in.jsonl", ROWS)
    refused(capsys, sessionize(source, tmp_path / "o.parquet", "--state",
                               str(tmp_path / "o.parquet" / "state")), "overlap")
    refused(capsys, sessionize(source, tmp_path / "x" / "o.jsonl", "--state", str(tmp_path)),
            "holds the input file")


# -- resuming against something else ------------------------------------------------------------


def first_run(tmp_path: Path, source: Path, out: Path, *extra: str) -> list[str]:
    argv = sessionize(source, out, "--state", str(tmp_path / "state"), *extra)
    assert main(argv) == 0
    return argv


def test_a_replaced_input_is_refused_with_state_and_output_unchanged(tmp_path, capsys):
    source = write_jsonl(tmp_path / "in.jsonl", ROWS)
    out = tmp_path / "o.jsonl"
    argv = first_run(tmp_path, source, out)
    capsys.readouterr()
    state_before, out_before = snapshot_tree(tmp_path / "state"), out.read_bytes()
    # same size, other content: only the fingerprint can tell
    write_jsonl(source, [dict(r, user=r["user"].upper()) for r in ROWS])
    refused(capsys, argv, "belongs to another input", "different content")
    write_jsonl(source, [*ROWS, {"user": "c", "ts": 20_000_000, "amount": 1}])
    refused(capsys, argv, "belongs to another input", "bytes")
    assert out.read_bytes() == out_before
    assert {k for k in snapshot_tree(tmp_path / "state") if "checkpoints" in k} == \
        {k for k in state_before if "checkpoints" in k}


def test_a_touched_but_identical_input_resumes(tmp_path, capsys):
    source = write_jsonl(tmp_path / "in.jsonl", ROWS)
    out = tmp_path / "o.jsonl"
    argv = first_run(tmp_path, source, out)
    rows = read_jsonl(out)
    os.utime(source, (time.time() + 100, time.time() + 100))
    assert main(argv) == 0
    assert read_jsonl(out) == rows  # nothing left to do, nothing written twice


def test_a_file_added_to_an_input_directory_is_refused(tmp_path, capsys):
    folder = tmp_path / "events"
    folder.mkdir()
    write_jsonl(folder / "a.jsonl", ROWS)
    argv = first_run(tmp_path, folder, tmp_path / "o.jsonl")
    capsys.readouterr()
    write_jsonl(folder / "b.jsonl", ROWS)
    refused(capsys, argv, "file 'b.jsonl' is new")
    (folder / "b.jsonl").unlink()
    (folder / "a.jsonl").rename(folder / "c.jsonl")
    refused(capsys, argv, "file 'a.jsonl' is gone")


def test_resuming_with_another_output_format_or_place_is_refused(tmp_path, capsys):
    source = write_jsonl(tmp_path / "in.jsonl", ROWS)
    first_run(tmp_path, source, tmp_path / "o.jsonl")
    capsys.readouterr()
    state = ["--state", str(tmp_path / "state")]
    for other in (tmp_path / "o.parquet", tmp_path / "o.csv", tmp_path / "elsewhere.jsonl"):
        err = refused(capsys, sessionize(source, other, *state), "resume with that --out")
        assert "KeyError" not in err
    refused(capsys, sessionize(source, tmp_path / "o.jsonl", *state, "--gap", "1m"),
            "other options")


@pytest.mark.parametrize(("first", "then"), [("final", "update"), ("update", "final")])
def test_resuming_with_another_emit_mode_is_refused(tmp_path, capsys, first, then):
    # final writes each session once, update every change with retractions: a resume that
    # switched would leave one output file in two modes (issue 25: the fingerprint must keep
    # --emit)
    source = write_jsonl(tmp_path / "in.jsonl", ROWS)
    out, state = tmp_path / "o.jsonl", ["--state", str(tmp_path / "state")]
    assert main(sessionize(source, out, *state, "--emit", first)) == 0
    capsys.readouterr()
    written = out.read_bytes()
    refused(capsys, sessionize(source, out, *state, "--emit", then), "other options", "emit")
    assert out.read_bytes() == written
    assert main(sessionize(source, out, *state, "--emit", first)) == 0  # the same mode resumes


# -- how values are read --------------------------------------------------------------------------


def test_csv_keys_are_strings_unless_a_type_is_declared(tmp_path, capsys):
    source = tmp_path / "in.csv"
    source.write_text("user,ts\n007,0\n7,1000\n007,2000\n")
    out = tmp_path / "o.jsonl"
    assert main(sessionize(source, out)) == 0
    assert sorted((r["user"], r["events"]) for r in read_jsonl(out)) == [("007", 2), ("7", 1)]
    assert main(sessionize(source, out, "--key-type", "int64")) == 0
    assert [(r["user"], r["events"]) for r in read_jsonl(out)] == [(7, 3)]


def test_hive_partition_keys_are_strings(tmp_path):
    for user, times in (("007", [0, 1000]), ("7", [500])):
        (tmp_path / "in" / f"user={user}").mkdir(parents=True)
        pq.write_table(pa.table({"ts": pa.array(times, pa.int64())}),
                       tmp_path / "in" / f"user={user}" / "part-0.parquet")
    out = tmp_path / "o.jsonl"
    assert main(sessionize(tmp_path / "in", out)) == 0
    assert sorted((r["user"], r["events"]) for r in read_jsonl(out)) == [("007", 2), ("7", 1)]


def test_deep_json_is_refused_before_the_parser_can_crash(tmp_path):
    source = tmp_path / "deep.jsonl"
    source.write_text(json.dumps(ROWS[0]) + "\n" + '{"user":"a","ts":1,"v":'
                      + "[" * 20_000 + "]" * 20_000 + "}\n")
    child = subprocess.run([sys.executable, "-m", "sessionstore.cli",
                            *sessionize(source, tmp_path / "o.jsonl")],
                           capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert child.returncode == 2, child.stderr
    assert child.stderr.count("\n") == 1
    assert "line 2: JSON nested deeper than 1000 levels" in child.stderr


def reference_depth(line: str) -> int:
    """A character-by-character JSON nesting scanner: the oracle for the vectorised one."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in line:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


@pytest.mark.parametrize("block_bytes", [1, 7, 64, 1 << 20])
def test_the_depth_guard_matches_a_reference_scanner(tmp_path, block_bytes):
    rng = np.random.default_rng(block_bytes)
    atoms = ['1', '"a\\\\"', '"x[{\\"]"', '"\\\\\\""', "null", '"]]]}}"', '"[[[[["']

    def value(depth: int) -> str:
        if depth == 0 or rng.random() < 0.2:
            return str(rng.choice(atoms))
        if rng.random() < 0.5:
            return "[" + ",".join(value(depth - 1) for _ in range(rng.integers(1, 3))) + "]"
        return "{" + ",".join(f'"k{i}[\\"":{value(depth - 1)}'
                              for i in range(rng.integers(1, 3))) + "}"

    for _ in range(30):
        lines = [json.dumps({"a": 1})[:-1] + ',"v":' + value(int(rng.integers(0, 9))) + "}"
                 for _ in range(int(rng.integers(1, 6)))]
        for line in lines:
            json.loads(line)  # the generator writes valid JSON
        path = tmp_path / "x.jsonl"
        path.write_text("\n".join(lines) + "\n")
        deepest = max(map(reference_depth, lines))
        check_json_depth(path, limit=deepest, block_bytes=block_bytes)
        if deepest > 0:
            with pytest.raises(IoInputError, match="nested deeper"):
                check_json_depth(path, limit=deepest - 1, block_bytes=block_bytes)
    assert MAX_JSON_DEPTH == 1000


@pytest.mark.parametrize("content", ["null", "nullptr", "  null\n", "\n\nnull null",
                                     json.dumps(ROWS[0]) + "\nnull\n"])
def test_a_bare_null_record_is_refused_before_the_parser_can_crash(tmp_path, content):
    """pyarrow 26's JSON reader crashes the process (SIGSEGV) on a block that starts with a
    bare null; the guard refuses any record that is not an object, naming its line."""
    source = tmp_path / "in.jsonl"
    source.write_text(content)
    child = subprocess.run([sys.executable, "-m", "sessionstore.cli",
                            *sessionize(source, tmp_path / "o.jsonl")],
                           capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert child.returncode == 2, child.stderr
    line = 1 + content[:content.index("null")].count("\n")
    assert f"line {line}: a JSON null, not an object" in child.stderr
    assert child.stderr.count("\n") == 1
    assert not (tmp_path / "o.jsonl").exists()


def test_a_json_lines_file_opening_with_a_byte_order_mark_is_refused_by_name(tmp_path, capsys):
    """pyarrow's JSON dataset reader fails on a UTF-8 byte order mark with a parse error that
    names neither the mark nor the line; the guard names it, and nothing is written. The same
    records without the mark run (the control), as does a CSV file with one (pyarrow's CSV
    reader skips it)."""
    text = '{"user": "a", "ts": 1}\n{"user": "a", "ts": 2}\n'
    marked = tmp_path / "marked.jsonl"
    marked.write_bytes(b"\xef\xbb\xbf" + text.encode())
    refused(capsys, sessionize(marked, tmp_path / "o.jsonl"), f"input {str(marked)!r} line 1",
            "byte order mark")
    assert not (tmp_path / "o.jsonl").exists()
    plain = tmp_path / "plain.jsonl"
    plain.write_text(text)
    assert main(sessionize(plain, tmp_path / "p.jsonl")) == 0
    csv = tmp_path / "marked.csv"
    csv.write_bytes(b"\xef\xbb\xbfuser,ts\na,1\na,2\n")
    assert main(sessionize(csv, tmp_path / "c.jsonl")) == 0
    expected = [json.loads(x) for x in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert [json.loads(x) for x in (tmp_path / "c.jsonl").read_text().splitlines()] == expected
    assert [(r["user"], r["events"]) for r in expected] == [("a", 2)]


@pytest.mark.parametrize("block_bytes", [1, 5, 64, 1 << 20])
def test_records_that_are_not_objects_are_refused_at_their_line(tmp_path, block_bytes):
    """Objects written over one line or several (nulls, brackets and quotes inside them,
    in strings too) pass; a bare value between two records is refused at its own line,
    whatever the block size. Kills a guard that reads lines instead of the file's depth (it
    would refuse a multi-line object's inner null) and one that loses its state between
    blocks."""
    rng = np.random.default_rng(block_bytes)
    values = [None, 1, "x null [ { \\\" ", [None, [None]], {"n": None, "s": "}\\"}, True]
    strays = ["null", "1", '"s"', "true", "[1]", "]", "}"]
    for _ in range(25):
        records = [json.dumps({"user": "a", "ts": 1, "v": values[int(rng.integers(len(values)))]},
                              indent=None if rng.random() < 0.5 else int(rng.integers(0, 3)))
                   for _ in range(int(rng.integers(1, 5)))]
        path = tmp_path / "x.jsonl"
        path.write_text("\n".join(records) + "\n")
        check_json_depth(path, block_bytes=block_bytes)
        at = int(rng.integers(0, len(records) + 1))
        stray = strays[int(rng.integers(len(strays)))]
        text = "\n".join([*records[:at], " " + stray, *records[at:]]) + "\n"
        path.write_text(text)
        line = 1 + sum(r.count("\n") + 1 for r in records[:at])
        with pytest.raises(IoInputError, match=f"line {line}: .*, not an object"):
            check_json_depth(path, block_bytes=block_bytes)


@pytest.mark.parametrize(("unit", "per_ms"), [("us", 1_000), ("ns", 1_000_000)])
def test_sub_millisecond_timestamps_are_floored_and_counted(tmp_path, capsys, unit, per_ms):
    # -1 tick is before 1970: flooring puts it in millisecond -1, truncation would say 0
    ticks = [-1, 0, 999 * per_ms // 1000, 5 * per_ms + 1, 40 * 60_000 * per_ms + 7]
    source = tmp_path / "in.parquet"
    pq.write_table(pa.table({"user": ["a"] * 5, "ts": pa.array(ticks, pa.timestamp(unit))}),
                   source)
    out = tmp_path / "o.jsonl"
    assert main(sessionize(source, out, "--agg", "n=count", "--agg", "first=first:ts")) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["times_floored_to_ms"] == 4  # every tick count but 0 has a sub-ms part
    rows = sorted(read_jsonl(out), key=lambda r: r["session_start_ms"])
    assert [(r["session_start_ms"], r["session_end_ms"], r["n"]) for r in rows] == [
        (-1, 5 + 30 * 60_000, 4), (40 * 60_000, 70 * 60_000, 1)]
    # a timestamp value column keeps its full precision in the output
    assert rows[0]["first"] == "1969-12-31 23:59:59." + "9" * {"us": 6, "ns": 9}[unit]
    parquet = tmp_path / "o.parquet"
    assert main(sessionize(source, parquet, "--agg", "first=first:ts")) == 0
    table = pq.read_table(next(parquet.glob("part-*.parquet")))
    assert table.schema.field("first").type == pa.timestamp(unit)
    assert sorted(table["first"].cast(pa.int64()).to_pylist()) == [-1, ticks[-1]]


# -- failures: disk full, crashes, signals -----------------------------------------------------


def run_cli(args: list[str], env: dict[str, str] | None = None,
            preexec: object = None) -> subprocess.Popen[str]:
    environment = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
    return subprocess.Popen([sys.executable, "-m", "sessionstore.cli", *args], env=environment,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=preexec)  # type: ignore[arg-type]


def many_sessions(path: Path, n: int) -> Path:
    rng = np.random.default_rng(3)
    pq.write_table(pa.table({"user": rng.integers(0, 5000, n).astype(str),
                             "ts": np.sort(rng.integers(0, n * 40, n))}), path,
                   row_group_size=3000)
    return path


@contextlib.contextmanager
def tiny_filesystem(path: Path, size: str) -> Iterator[bool]:
    """A real tmpfs of ``size`` at ``path``; yields False when mounting is not permitted."""
    path.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                      capture_output=True).returncode != 0:
        yield False
        return
    try:
        yield True
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.mark.parametrize("limit", ["tmpfs", "rlimit"])
def test_disk_full_is_one_line_exit_2_and_the_committed_state_resumes(tmp_path, limit):
    """``tmpfs``: state and output on a real 600 KiB tmpfs (when root may mount one; otherwise
    this case falls back to the other). ``rlimit``: RLIMIT_FSIZE in the child makes a write past
    400 kB fail with EFBIG, through the same code path."""
    source = many_sessions(tmp_path / "in.parquet", 20_000)
    args = ["sessionize", str(source), "--key", "user", "--time", "ts", "--gap", "1s",
            "--commit-every", "3000", "--batch-rows", "3000", "--no-progress"]
    clean = run_cli([*args, "--out", str(tmp_path / "clean.jsonl")])
    assert clean.wait(timeout=300) == 0, clean.stderr.read()  # type: ignore[union-attr]
    with tiny_filesystem(tmp_path / "small", "600k") if limit == "tmpfs" \
            else contextlib.nullcontext(False) as mounted:
        place = tmp_path / "small"
        place.mkdir(exist_ok=True)
        state, out = place / "state", place / "out.jsonl"
        full_args = [*args, "--state", str(state), "--out", str(out)]

        def file_size_limit() -> None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (400_000, 400_000))

        child = run_cli(full_args, preexec=None if mounted else file_size_limit)
        _, err = child.communicate(timeout=300)
        assert child.returncode == 2, err
        assert err.count("\n") == 1 and "Traceback" not in err
        assert err.startswith("sessionstore: error: OSError: [Errno")
        assert ("No space left on device" if mounted else "File too large") in err
        with ReadOnlySessionStore(state) as view:  # the last commit is intact and readable
            committed = view.metadata["user"]
        assert 0 < committed["offset"] < 20_000
        assert out.stat().st_size >= committed["output"]["bytes"]
        if mounted:
            subprocess.run(["mount", "-o", "remount,size=64m", str(place)], check=True)
        final = run_cli(full_args)
        assert final.wait(timeout=300) == 0, final.stderr.read()  # type: ignore[union-attr]
        assert sorted(out.read_text().splitlines()) == \
            sorted((tmp_path / "clean.jsonl").read_text().splitlines())


def test_temporary_state_is_removed_after_sigterm_and_after_a_crash(tmp_path):
    source = many_sessions(tmp_path / "in.parquet", 200_000)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    # --emit update: a run without --state that takes the incremental path, in a temporary
    # state (the bounded path keeps no state)
    args = ["sessionize", str(source), "--key", "user", "--time", "ts", "--gap", "1s",
            "--commit-every", "3000", "--batch-rows", "3000", "--no-progress", "--emit",
            "update"]

    def started_child(out: str) -> subprocess.Popen[str]:
        child = run_cli([*args, "--out", str(tmp_path / out)], env={"TMPDIR": str(scratch)})
        deadline = time.monotonic() + 60
        while not list(scratch.glob("sessionstore-cli-*/checkpoints")):
            assert time.monotonic() < deadline and child.poll() is None
            time.sleep(0.05)
        return child

    child = started_child("a.jsonl")
    child.send_signal(signal.SIGTERM)
    assert child.wait(timeout=60) == 128 + signal.SIGTERM
    assert list(scratch.iterdir()) == []
    child = started_child("b.jsonl")
    child.kill()
    child.wait(timeout=60)
    assert len(list(scratch.glob("sessionstore-cli-*"))) == 1  # SIGKILL cannot clean up
    small = write_jsonl(tmp_path / "small.jsonl", ROWS)
    finished = run_cli(sessionize(small, tmp_path / "c.jsonl", "--emit", "update"),
                       env={"TMPDIR": str(scratch)})
    assert finished.wait(timeout=60) == 0
    assert list(scratch.iterdir()) == []  # the next run swept the dead run's directory


# -- durability order and read-only inspect -------------------------------------------------


def test_parts_and_their_directory_are_fsynced_before_the_commit(tmp_path, monkeypatch):
    from sessionstore.engine import SessionAggregator
    from sessionstore.io import writers as sio

    events: list[str] = []
    real_fsync, real_commit = os.fsync, SessionAggregator.commit

    def fsync(fd: int) -> None:
        events.append("fsync:" + os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    def commit(self: SessionAggregator, metadata: object = None) -> int:
        events.append("commit")
        return real_commit(self, metadata)

    monkeypatch.setattr(sio.os, "fsync", fsync)
    monkeypatch.setattr(SessionAggregator, "commit", commit)
    source = write_jsonl(tmp_path / "in.jsonl", ROWS)
    out = tmp_path / "o.parquet"
    assert main(sessionize(source, out, "--commit-every", "2", "--batch-rows", "2", "--state",
                           str(tmp_path / "state"))) == 0
    parts = sorted(p.name for p in out.iterdir())
    assert parts and all(p.startswith("part-") for p in parts)  # no temporary left behind
    for part in parts:
        synced_file = events.index(f"fsync:{out}/.{part}.inprogress")
        synced_dir = events.index(f"fsync:{out}", synced_file)
        assert "commit" in events[synced_dir:]
        assert "commit" not in events[synced_file:synced_dir]


def test_inspect_reads_the_committed_version_without_a_lock_or_a_change(tmp_path, capsys):
    source = write_jsonl(tmp_path / "in.jsonl", ROWS)
    state = tmp_path / "state"
    assert main(sessionize(source, tmp_path / "o.jsonl", "--state", str(state))) == 0
    capsys.readouterr()
    before = snapshot_tree(state)
    with SessionStore(state, retention_ms=3_600_000) as writer:  # holds the writer's lock
        writer.put(("zz", 1, 2), [0])  # uncommitted: inspect must not see it
        assert main(["inspect", str(state)]) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["committed_version"] == writer.committed_version
        assert all("zz" not in json.dumps(s["sample"]) for s in report["segments"])
    assert main(["inspect", str(state)]) == 0
    capsys.readouterr()
    after = snapshot_tree(state)
    assert {k: v for k, v in after.items() if "checkpoints" in k} == \
        {k: v for k, v in before.items() if "checkpoints" in k}


def test_the_sweep_removes_only_directories_of_dead_runs_holding_no_lock(tmp_path):
    from sessionstore.cli import sweep_stale_temp_states

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    dead_pid = int(dead.stdout)
    orphan = tmp_path / f"sessionstore-cli-{dead_pid}-a"
    locked = tmp_path / f"sessionstore-cli-{dead_pid}-b"
    mine = tmp_path / f"sessionstore-cli-{os.getpid()}-c"
    other = tmp_path / f"not-ours-{dead_pid}-d"
    for folder in (orphan, mine, other):
        folder.mkdir()
    with SessionStore(locked, retention_ms=1000):  # as a run in another PID namespace would
        assert sweep_stale_temp_states(tmp_path) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        p.name for p in (locked, mine, other))


def test_the_sweep_skips_a_directory_it_may_not_look_into(tmp_path, monkeypatch):
    # another user's dead run in a shared temp directory (mkdtemp makes it 0700): probing its
    # lock fails with EACCES, which must not fail this run. Root ignores permissions, so the
    # probe's error is injected here.
    import sessionstore.cli as cli_module

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    foreign = tmp_path / f"sessionstore-cli-{int(dead.stdout)}-x"
    foreign.mkdir()

    def denied(lock: Path) -> bool:
        raise PermissionError(13, "Permission denied", str(lock))

    monkeypatch.setattr(cli_module, "is_locked", denied)
    assert cli_module.sweep_stale_temp_states(tmp_path) == 0
    assert foreign.is_dir()


# -- an integer sum that leaves int64 (issue 25) -------------------------------------------------


def test_a_sum_leaving_int64_is_a_named_error_on_every_run_and_changes_no_state(tmp_path,
                                                                                capsys):
    rows = [{"user": f"u{i}", "ts": i * 100_000_000, "v": 1} for i in range(3)]
    rows += [{"user": "a", "ts": 400_000_000, "v": -(2**63)},
             {"user": "a", "ts": 400_000_001, "v": -1}]
    source = write_jsonl(tmp_path / "in.jsonl", rows)
    out, state = tmp_path / "out.jsonl", tmp_path / "state"
    argv = sessionize(source, out, "--time-unit", "ms", "--agg", "s=sum:v", "--state", str(state),
                      "--commit-every", "1", "--batch-rows", "1")
    refused(capsys, argv, "input rows 4..4", "'s'", "'a'", "int64", "-9223372036854775809")
    with ReadOnlySessionStore(state) as view:
        version, metadata = view.version, view.metadata
    written = out.read_bytes()
    assert sorted(r["user"] for r in read_jsonl(out)) == ["u0", "u1", "u2"]  # committed
    refused(capsys, argv, "input rows 4..4", "'s'", "'a'", "int64")  # the rerun: the same
    with ReadOnlySessionStore(state) as view:
        assert (view.version, view.metadata) == (version, metadata)
    assert out.read_bytes() == written


def output_snapshot(out: Path) -> dict[str, bytes]:
    return snapshot_tree(out) if out.is_dir() else {out.name: out.read_bytes()}


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".parquet"])
def test_a_new_state_whose_run_fails_before_its_first_commit_leaves_out_as_it_was(
        tmp_path, capsys, suffix):
    # found auditing issue 25: the first run of a new --state emptied an existing --out when
    # it opened it, so a run that failed on its first rows (a sum leaving int64, a float key)
    # destroyed the previous output and wrote nothing. It now writes beside --out, as a run
    # without --state does, until its first commit.
    out = tmp_path / f"o{suffix}"
    assert main(sessionize(write_jsonl(tmp_path / "in.jsonl", ROWS), out)) == 0
    capsys.readouterr()
    before, siblings = output_snapshot(out), sorted(p.name for p in tmp_path.iterdir())
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"user": "a", "ts": 0, "v": -(2**63)},
                                               {"user": "a", "ts": 1, "v": -1}])
    argv = sessionize(bad, out, "--time-unit", "ms", "--agg", "s=sum:v", "--state",
                      str(tmp_path / "state"), "--batch-rows", "1")
    refused(capsys, argv, "input rows 1..1", "int64")
    assert output_snapshot(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*siblings, "bad.jsonl", "state"])
    # a run of the new state that succeeds replaces the output, and later runs resume it
    argv = sessionize(write_jsonl(bad, ROWS[:2]), out, "--state", str(tmp_path / "state2"),
                      "--commit-every", "1")
    assert main(argv) == 0
    assert output_snapshot(out) != before
    assert not [p for p in tmp_path.iterdir() if "inprogress" in p.name]
    after = output_snapshot(out)
    assert main(argv) == 0  # a resume: nothing new, the output as it was
    assert output_snapshot(out) == after


def test_commit_every_commits_exactly_every_n_rows_inside_a_read_batch(tmp_path, capsys):
    # --commit-every 3 with read batches of 10 rows: commits at rows 3 and 6, so a failure at
    # row 8 resumes from row 6 (it committed only at batch boundaries before: from row 0)
    rows = [{"user": f"u{i}", "ts": i * 100_000_000, "v": 1} for i in range(7)]
    rows += [{"user": "a", "ts": 800_000_000, "v": -(2**63)},
             {"user": "a", "ts": 800_000_001, "v": -1},
             {"user": "z", "ts": 900_000_000, "v": 1}]
    source = write_jsonl(tmp_path / "in.jsonl", rows)
    out, state = tmp_path / "out.jsonl", tmp_path / "state"
    argv = sessionize(source, out, "--time-unit", "ms", "--agg", "s=sum:v", "--state", str(state),
                      "--commit-every", "3", "--batch-rows", "10")
    refused(capsys, argv, "input rows 6..8", "'s'")
    with ReadOnlySessionStore(state) as view:
        assert view.metadata["user"]["offset"] == 6
        assert view.version == 2  # one commit per 3 rows, none for the failed part
    # the sessions closed by row 6 are in the output, once
    assert sorted(r["user"] for r in read_jsonl(out)) == [f"u{i}" for i in range(5)]
