"""Adversarial runs of the command line: misuse of every flag, hostile values in the input, and
outputs that must stay parseable and unambiguous.

Every refusal must be one line on stderr naming the flag (or the input row), exit status 2,
and leave the output and the state as they were.
"""

from __future__ import annotations

import base64
import contextlib
import json
import math
import socket
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from sessionstore.cli import build_parser, main

ROWS = [{"user": "a", "ts": 0}, {"user": "b", "ts": 1000}, {"user": "a", "ts": 60_000}]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def sessionize(source: Path, out: Path, *extra: str) -> list[str]:
    return ["sessionize", str(source), "--key", "user", "--time", "ts", "--gap", "30m",
            "--out", str(out), "--no-progress", *extra]


def refused(capsys: pytest.CaptureFixture[str], argv: list[str], *needles: str) -> str:
    """``argv`` must fail with exit status 2 and one line on stderr holding every needle."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("sessionstore: error: ") and err.count("\n") == 1, err
    for needle in needles:
        assert needle in err, err
    return err


def tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file()}


def committed(state: Path) -> dict[str, bytes]:
    """What a state directory has committed (live/ is rebuilt from it on every open)."""
    return {name: data for name, data in tree(state).items() if not name.startswith("live/")}


# -- --help and the flags' own checks -----------------------------------------------------------


@pytest.mark.parametrize("command", [[], ["sessionize"], ["inspect"], ["bench"]])
def test_help_of_every_subcommand_exits_0_and_describes_every_option(command, capsys):
    with pytest.raises(SystemExit) as stop:
        main([*command, "--help"])
    assert stop.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: sessionstore")
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    target = sub.choices[command[0]] if command else parser  # type: ignore[index]
    for action in target._actions:
        if action.option_strings and action.help != "==SUPPRESS==":
            assert action.help, f"{command}: {action.option_strings} has no help text"
            assert action.option_strings[-1] in text


@pytest.mark.parametrize("flag", ["--gap", "--grace", "--max-out-of-order", "--max-duration"])
def test_a_negative_duration_is_refused_by_its_own_flag(tmp_path, capsys, flag):
    source = write_jsonl(tmp_path / "in.jsonl", ROWS)
    argv = sessionize(source, tmp_path / "o.jsonl")
    if flag == "--gap":
        argv[argv.index("--gap") + 1] = "-5m"
    else:
        argv += [flag, "-5m"]
    refused(capsys, argv, flag, "negative")
    assert not (tmp_path / "o.jsonl").exists()


def test_a_negative_max_gap_is_refused_by_its_own_flag(tmp_path, capsys):
    source = write_jsonl(tmp_path / "in.jsonl", [{**r, "g": 1000} for r in ROWS])
    argv = ["sessionize", str(source), "--key", "user", "--time", "ts", "--gap-column", "g",
            "--max-gap", "-1h", "--out", str(tmp_path / "o.jsonl"), "--no-progress"]
    refused(capsys, argv, "--max-gap", "negative")


@pytest.mark.parametrize(("extra", "needles"), [
    (["--commit-every", "0"], ["--commit-every must be >= 1, got 0"]),
    (["--batch-rows", "0"], ["--batch-rows must be >= 1, got 0"]),
    (["--metrics-port", "-1"], ["--metrics-port", "1..65535", "-1"]),
    (["--metrics-port", "0"], ["--metrics-port", "1..65535"]),
    (["--metrics-port", "70000"], ["--metrics-port", "1..65535", "70000"]),
    (["--summary-png", "x.png"], ["--summary-png", "--summary"]),
])
def test_bad_sessionize_options_name_their_flag(tmp_path, capsys, extra, needles):
    source = write_jsonl(tmp_path / "in.jsonl", ROWS)
    out = tmp_path / "o.jsonl"
    out.write_text("kept\n")
    refused(capsys, sessionize(source, out, *extra), *needles)
    assert out.read_text() == "kept\n"


@pytest.mark.parametrize(("argv", "needle"), [
    (["bench", "--events", "0"], "--events must be >= 1, got 0"),
    (["bench", "--events", "-5"], "--events must be >= 1, got -5"),
])
def test_bad_bench_options_name_their_flag(capsys, argv, needle):
    refused(capsys, argv, needle)


def test_a_negative_inspect_sample_names_its_flag(tmp_path, capsys):
    source = write_jsonl(tmp_path / "in.jsonl", ROWS)
    state = tmp_path / "state"
    assert main(sessionize(source, tmp_path / "o.jsonl", "--state", str(state))) == 0
    capsys.readouterr()
    refused(capsys, ["inspect", str(state), "--sample", "-1"], "--sample must be >= 0")
    assert main(["inspect", str(state), "--sample", "0"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["segments"] and all(s["sample"] == [] for s in report["segments"])


@contextlib.contextmanager
def busy_port() -> Iterator[int]:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    try:
        yield holder.getsockname()[1]
    finally:
        holder.close()


def test_a_metrics_port_in_use_is_named_and_changes_nothing(tmp_path, capsys):
    pytest.importorskip("prometheus_client")
    source = write_jsonl(tmp_path / "in.jsonl", ROWS)
    out, state = tmp_path / "o.jsonl", tmp_path / "state"
    assert main(sessionize(source, out, "--state", str(state), "--commit-every", "1")) == 0
    capsys.readouterr()
    before_out, before_state = out.read_bytes(), tree(state)
    # a second run on a new state would delete and rewrite the output: the port is checked first
    with busy_port() as port:
        refused(capsys, sessionize(source, out, "--metrics-port", str(port)),
                f"--metrics-port {port}", "cannot serve metrics")
        refused(capsys, sessionize(source, out, "--state", str(state), "--metrics-port",
                                   str(port)), f"--metrics-port {port}")
    assert out.read_bytes() == before_out
    assert tree(state) == before_state


# -- hostile values in the input ------------------------------------------------------------------


def test_a_null_time_names_its_input_row_across_batches(tmp_path, capsys):
    rows = [{"user": "a", "ts": i} for i in range(5)] + [{"user": "b", "ts": None}]
    source = write_jsonl(tmp_path / "in.jsonl", rows)
    refused(capsys, sessionize(source, tmp_path / "o.jsonl", "--batch-rows", "2"),
            "time column 'ts' is null at input row 5")


def test_a_time_too_late_for_int64_names_its_input_row_and_the_flags(tmp_path, capsys):
    limit = 2**63 - 1 - 30 * 60_000 - 5_000  # the latest time with --gap 30m and --grace 5s
    rows = [{"user": "a", "ts": 0}, {"user": "a", "ts": 1}, {"user": "a", "ts": limit},
            {"user": "b", "ts": limit + 1}]
    source = write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "o.jsonl"
    # --time-unit ms: times near int64's end look like nanoseconds, which needs saying
    err = refused(capsys, sessionize(source, out, "--grace", "5s", "--batch-rows", "2",
                                     "--time-unit", "ms"),
                  "input row 3", f"ts = {limit + 1}", "--gap", "--grace", str(limit))
    assert "input row 2" not in err
    # the limit itself is a valid time: without the last row the run succeeds
    write_jsonl(source, rows[:3])
    assert main(sessionize(source, out, "--grace", "5s", "--batch-rows", "2",
                           "--time-unit", "ms")) == 0
    ends = sorted(json.loads(line)["session_end_ms"] for line in out.read_text().splitlines())
    assert ends == [1 + 30 * 60_000, limit + 30 * 60_000]


# -- outputs that stay parseable and unambiguous --------------------------------------------------


def binary_and_float_input(tmp_path: Path) -> Path:
    # b"\x00" and b"\x00\x00" are two keys; so are the bytes b"a" and the text "b'a'" in another
    # run; NaN and the infinities are valid doubles
    table = pa.table({
        "user": pa.array([b"\x00", b"\x00\x00", b"a", b"\x00"], pa.binary()),
        "ts": pa.array([0, 1, 2, 3], pa.int64()),
        "amount": pa.array([math.nan, 1.5, math.inf, -math.inf], pa.float64()),
    })
    path = tmp_path / "in.parquet"
    pq.write_table(table, path)
    return path


def expected_binary_sessions() -> dict[bytes, tuple[int, float, list[bytes]]]:
    # independent of the engine: every event of a key lies within 30 minutes of the previous one
    return {b"\x00": (2, math.nan, [b"\x00", b"\x00"]), b"\x00\x00": (1, 1.5, [b"\x00\x00"]),
            b"a": (1, math.inf, [b"a"])}


def same_float(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


AGGS = ["--agg", "n=count", "--agg", "total=sum:amount", "--agg", "users=collect:user"]


def test_jsonl_output_is_strict_json_with_base64_bytes_and_spark_style_non_finite_floats(
        tmp_path, capsys):
    source = binary_and_float_input(tmp_path)
    out = tmp_path / "o.jsonl"
    assert main(sessionize(source, out, *AGGS)) == 0

    def strict(text: str) -> dict:
        def refuse(name: str) -> float:
            raise AssertionError(f"bare {name} in JSON output: {text}")
        return json.loads(text, parse_constant=refuse)  # type: ignore[no-any-return]

    rows = [strict(line) for line in out.read_text().splitlines()]
    floats = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
    got = {base64.b64decode(r["user"], validate=True):
           (r["n"], floats.get(r["total"], r["total"]),
            [base64.b64decode(u, validate=True) for u in r["users"]]) for r in rows}
    expected = expected_binary_sessions()
    assert got.keys() == expected.keys() and len(rows) == len(expected)
    for key, (n, total, users) in expected.items():
        assert got[key][0] == n and got[key][2] == users
        assert same_float(got[key][1], total), (key, got[key])


def test_csv_output_keeps_binary_keys_apart_and_collects_bytes(tmp_path, capsys):
    source = binary_and_float_input(tmp_path)
    out = tmp_path / "o.csv"
    assert main(sessionize(source, out, *AGGS)) == 0
    table = pacsv.read_csv(out, convert_options=pacsv.ConvertOptions(
        column_types={"user": pa.string(), "users": pa.string()}))
    got = {base64.b64decode(r["user"], validate=True):
           (r["n"], [base64.b64decode(u, validate=True) for u in json.loads(r["users"])])
           for r in table.to_pylist()}
    expected = expected_binary_sessions()
    assert got == {k: (n, users) for k, (n, _, users) in expected.items()}


def test_a_text_key_that_looks_like_bytes_is_not_confused_with_bytes(tmp_path, capsys):
    text = tmp_path / "text.parquet"
    pq.write_table(pa.table({"user": ["b'a'"], "ts": pa.array([0], pa.int64())}), text)
    binary = tmp_path / "binary.parquet"
    pq.write_table(pa.table({"user": pa.array([b"a"], pa.binary()),
                             "ts": pa.array([0], pa.int64())}), binary)
    assert main(sessionize(text, tmp_path / "t.jsonl")) == 0
    assert main(sessionize(binary, tmp_path / "b.jsonl")) == 0
    from_text = json.loads((tmp_path / "t.jsonl").read_text())["user"]
    from_binary = json.loads((tmp_path / "b.jsonl").read_text())["user"]
    assert from_text == "b'a'" and base64.b64decode(from_binary) == b"a"
    assert from_text != from_binary


# -- inputs with empty files ---------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_empty_part_files_as_spark_writes_them_hold_no_rows(tmp_path, capsys, suffix):
    # Spark and Hadoop write a 0-byte part file for every empty partition; a directory of such
    # output must sessionize as if those files were absent
    rows = [{"user": "a", "ts": 0}, {"user": "a", "ts": 30_000}, {"user": "b", "ts": 5}]
    full, parts = tmp_path / "full", tmp_path / "parts"
    full.mkdir()
    parts.mkdir()

    def write(path: Path, chunk: list[dict]) -> None:
        if suffix == ".jsonl":
            write_jsonl(path, chunk)
        else:
            path.write_text("user,ts\n" + "".join(f"{r['user']},{r['ts']}\n" for r in chunk))

    write(full / f"part-00000{suffix}", rows)
    (parts / f"part-00000{suffix}").write_bytes(b"")
    write(parts / f"part-00001{suffix}", rows[:2])
    (parts / f"part-00002{suffix}").write_bytes(b"\n  \n")
    write(parts / f"part-00003{suffix}", rows[2:])
    outputs = []
    for source in (full, parts):
        out = tmp_path / f"{source.name}.jsonl"
        assert main(sessionize(source, out, "--gap", "1m")) == 0
        summary = json.loads(capsys.readouterr().out)
        assert summary["events_in"] == len(rows)
        outputs.append(sorted(out.read_text().splitlines()))
    assert outputs[0] == outputs[1] and len(outputs[0]) == 2


def test_an_input_of_only_empty_files_is_refused_naming_it(tmp_path, capsys):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.jsonl").write_bytes(b"")
    (tmp_path / "d" / "b.jsonl").write_bytes(b" \n")
    refused(capsys, sessionize(tmp_path / "d", tmp_path / "o.jsonl"), "holds no rows",
            "every file is empty")
    single = tmp_path / "e.csv"
    single.write_bytes(b"")
    refused(capsys, sessionize(single, tmp_path / "o.jsonl"), repr(str(single)), "holds no rows")


@pytest.mark.parametrize(("bad_line", "needle"), [
    ('{"user": 7, "ts": 40001}', "line 40002: 'user' changed from string to number"),
    ('{"user": "u", "ts": 1', "line 40002: not valid JSON at column 22: Expecting"),
    ("[1, 2]", "line 40002: a JSON array, not an object"),
])
def test_a_bad_json_line_is_named_by_its_file_line_not_arrows_block_row(tmp_path, capsys,
                                                                       bad_line, needle):
    # the JSON reader parses 4 MiB blocks and counts rows from each block's start: a bad line
    # past the first block was reported as, for example, "row 13685" for line 40,002
    pad = "x" * 120
    lines = [json.dumps({"user": f"u{i % 50}", "ts": i, "pad": pad}) for i in range(40_000)]
    lines += [json.dumps({"user": None, "ts": 40_000, "pad": pad}), bad_line]
    source = tmp_path / "in.jsonl"
    source.write_text("\n".join(lines) + "\n")
    assert source.stat().st_size > 4 << 20  # the bad line lies past the first block
    refused(capsys, sessionize(source, tmp_path / "o.jsonl"), repr(str(source)), needle)


# -- outputs changed between a commit and a resume ------------------------------------------------


@pytest.mark.parametrize("damage", ["delete", "truncate"])
def test_a_committed_parquet_part_changed_before_a_resume_is_refused(tmp_path, capsys, damage):
    # a JSON Lines output shorter than committed was refused, but a Parquet output with a
    # committed part deleted or cut resumed "successfully" with its sessions lost
    rows = [{"user": f"u{i % 7}", "ts": i * 1000} for i in range(3000)]
    source = write_jsonl(tmp_path / "in.jsonl", rows)
    out, state = tmp_path / "o.parquet", tmp_path / "state"
    argv = sessionize(source, out, "--gap", "500ms", "--state", str(state), "--commit-every",
                      "500", "--batch-rows", "500")
    assert main(argv) == 0
    capsys.readouterr()
    intact = pq.read_table(out).num_rows
    assert intact == len(rows)  # every event is a session of its own
    part = out / "part-000001.parquet"
    kept = part.read_bytes()
    if damage == "delete":
        part.unlink()
    else:
        part.write_bytes(kept[:100])
    before_out, before_state = tree(out), committed(state)
    refused(capsys, argv, repr(str(out)), "part-000001.parquet",
            "missing" if damage == "delete" else "100 bytes")
    assert tree(out) == before_out
    assert committed(state) == before_state
    # put back, the same resume goes through and writes nothing twice
    part.write_bytes(kept)
    assert main(argv) == 0
    assert pq.read_table(out).num_rows == intact


def test_a_key_column_named_twice_is_refused_by_key(tmp_path, capsys):
    # it failed deep in the writer: "Column 2 named session_start_ms expected length 4 ..."
    source = write_jsonl(tmp_path / "in.jsonl", ROWS)
    argv = sessionize(source, tmp_path / "o.jsonl")
    argv[argv.index("--key") + 1] = "user, user"
    refused(capsys, argv, "--key 'user, user' names the column 'user' twice")


def test_a_parquet_output_directory_with_files_of_others_is_refused_and_kept(tmp_path, capsys):
    # a Spark dataset's part-00000-<uuid>.snappy.parquet was taken for a part of ours and
    # deleted; a part-abc.parquet failed with "invalid literal for int()"
    source = write_jsonl(tmp_path / "in.jsonl", ROWS)
    for names in (["part-00000-1b2c-c000.snappy.parquet", "_SUCCESS"], ["part-abc.parquet"],
                  ["part-000000.parquet.bak"]):
        out = tmp_path / f"out{len(names)}{names[0][-5:]}.parquet"
        out.mkdir()
        for name in names:
            pq.write_table(pa.table({"x": [1]}), out / name)
        before = tree(out)
        refused(capsys, sessionize(source, out), repr(str(out)), "did not write",
                repr(sorted(names)[0]))
        assert tree(out) == before
    # a directory holding only our own parts (an earlier run's output) is replaced
    out = tmp_path / "ours.parquet"
    assert main(sessionize(source, out)) == 0
    assert main(sessionize(source, out, "--gap", "1s")) == 0
    assert sorted(p.name for p in out.iterdir()) == ["part-000000.parquet"]
    assert pq.read_table(out).num_rows == 3  # 1 s apart or more: every event its own session


def test_a_retention_beyond_int64_names_the_flags_that_add_up_to_it(tmp_path, capsys):
    source = write_jsonl(tmp_path / "in.jsonl", ROWS)
    refused(capsys, sessionize(source, tmp_path / "o.jsonl", "--max-out-of-order",
                               str(2**63 - 1)),
            "--gap + --grace + --max-out-of-order", str(2**63 - 1 + 30 * 60_000))
