"""The CLI side of issue 12: ``--gap-column`` (a gap per event) and ``--max-duration``, checked
against the independent oracle (tests/oracle.py), and their misuse, refused naming the flag."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sessionstore.cli import main
from tests.oracle import sessionize as oracle_sessionize
from tests.oracle import sessionize_max_duration

LATENESS = 5_000
SCHEMA = pa.schema([("user", pa.string()), ("ts", pa.int64()), ("g", pa.int64()),
                    ("amount", pa.int64())])


def events(n: int, seed: int, *, bad_gaps: bool = True) -> list[dict[str, Any]]:
    """About 20 minutes of events of 60 users, slightly out of order (some late), each with its
    own gap (1 s to 2 min); with ``bad_gaps``, some gaps are null, zero or negative."""
    rng = random.Random(seed)
    rows = []
    t = 0
    for i in range(n):
        t += rng.randint(0, 900)
        gap = rng.choice([1_000, 15_000, 60_000, 120_000, rng.randint(1, 120_000)])
        if bad_gaps and i % 17 == 5:
            gap = rng.choice([None, 0, -3])
        rows.append({"user": f"u{rng.randint(0, 59)}", "ts": t - rng.randint(0, 8_000),
                     "g": gap, "amount": i})
    return rows


def write(tmp_path: Path, rows: list[dict[str, Any]], name: str,
          schema: pa.Schema = SCHEMA) -> Path:
    path = tmp_path / f"{name}.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema), path)
    return path


def run(capsys: pytest.CaptureFixture[str], source: Path, out: Path, *flags: str
        ) -> tuple[list[tuple[Any, ...]], dict[str, Any]]:
    argv = ["sessionize", str(source), "--key", "user", "--time", "ts", "--agg", "n=count",
            "--agg", "ids=collect:amount", "--max-out-of-order", f"{LATENESS}ms",
            "--out", str(out), "--no-progress", "--batch-rows", "700",
            # the incremental path, against the oracle's arrival-order answer (drops included)
            "--state", f"{out}.state", "--max-dropped-share", "1", *flags]
    assert main(argv) == 0, capsys.readouterr().err
    summary = json.loads(capsys.readouterr().out)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    got = sorted((r["user"], r["session_start_ms"], r["session_end_ms"], r["ids"])
                 for r in rows)
    assert all(r["n"] == len(r["ids"]) for r in rows)
    return got, summary


def steps(rows: list[dict[str, Any]], with_gap: bool) -> list[tuple[Any, ...]]:
    return [("event", r["user"], r["amount"], r["ts"], *([r["g"]] if with_gap else []))
            for r in rows]


def test_gap_column_equals_the_oracle_and_counts_invalid_gaps(tmp_path, capsys):
    rows = events(4_000, 1)
    got, summary = run(capsys, write(tmp_path, rows, "in"), tmp_path / "o.jsonl",
                       "--gap-column", "g", "--max-gap", "2m")
    invalid: list[Any] = []
    want, late = oracle_sessionize(steps(rows, True), None, out_of_orderness=LATENESS,
                                   invalid_gaps=invalid)
    assert got == sorted(want)
    metrics = summary["metrics"]
    assert invalid and late  # the input exercises both kinds of drop
    assert metrics["dropped-invalid-gap-records"] == len(invalid)
    assert metrics["dropped-records"] == len(invalid) + len(late)
    assert (summary["late_dropped"], summary["invalid_gap_dropped"]) == (len(late), len(invalid))
    assert metrics["cli-row-path-batches-total"] == 0  # null gaps stay on the columnar path


def test_a_duration_gap_column_equals_integer_milliseconds(tmp_path, capsys):
    rows = events(1_500, 2)
    ms_out, _ = run(capsys, write(tmp_path, rows, "ms"), tmp_path / "ms.jsonl",
                    "--gap-column", "g", "--max-gap", "2m")
    for unit, per_ms in (("us", 1_000), ("s", None)):
        if per_ms is None:  # whole seconds: round every gap to seconds, in both runs
            rows_s = [dict(r, g=None if r["g"] is None else r["g"] // 1000) for r in rows]
            expected, _ = run(capsys, write(tmp_path, [dict(r, g=None if r["g"] is None
                                                            else r["g"] * 1000)
                                                       for r in rows_s], "s_ms"),
                              tmp_path / "s_ms.jsonl", "--gap-column", "g", "--max-gap", "2m")
            data = rows_s
        else:
            expected = ms_out
            data = [dict(r, g=None if r["g"] is None else r["g"] * per_ms) for r in rows]
        schema = pa.schema([("user", pa.string()), ("ts", pa.int64()), ("g", pa.duration(unit)),
                            ("amount", pa.int64())])
        got, _ = run(capsys, write(tmp_path, data, f"dur_{unit}", schema),
                     tmp_path / f"dur_{unit}.jsonl", "--gap-column", "g", "--max-gap", "2m")
        assert got == expected, unit


@pytest.mark.parametrize("dynamic", [False, True])
def test_max_duration_equals_the_oracle(tmp_path, capsys, dynamic):
    rows = events(3_000, 3, bad_gaps=False)
    flags = ["--gap-column", "g", "--max-gap", "2m"] if dynamic else ["--gap", "45s"]
    got, summary = run(capsys, write(tmp_path, rows, "in"), tmp_path / "o.jsonl", *flags,
                       "--max-duration", "90s")
    want, late = sessionize_max_duration(steps(rows, dynamic), None if dynamic else 45_000,
                                         90_000, out_of_orderness=LATENESS)
    assert got == sorted(want)
    assert summary["metrics"]["dropped-records"] == len(late)
    assert max(end - start for _, start, end, _ in got) <= 90_000
    uncapped, _ = run(capsys, write(tmp_path, rows, "again"), tmp_path / "uncapped.jsonl",
                      *flags)
    assert max(end - start for _, start, end, _ in uncapped) > 90_000  # the cap did cut


def refused(capsys: pytest.CaptureFixture[str], argv: list[str], *needles: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("sessionstore: error: ") and err.count("\n") == 1, err
    for needle in needles:
        assert needle in err, err


def test_misuse_is_refused_naming_the_flag(tmp_path, capsys):
    source = write(tmp_path, events(50, 4, bad_gaps=False), "in")
    base = ["sessionize", str(source), "--key", "user", "--time", "ts", "--out",
            str(tmp_path / "o.jsonl"), "--no-progress"]
    refused(capsys, [*base, "--gap", "1m", "--gap-column", "g", "--max-gap", "2m"],
            "--gap and --gap-column")
    refused(capsys, base, "--gap", "--gap-column", "required")
    refused(capsys, [*base, "--gap-column", "g"], "--gap-column 'g' needs --max-gap")
    refused(capsys, [*base, "--gap", "1m", "--max-gap", "2m"], "--max-gap applies to")
    refused(capsys, [*base, "--gap-column", "nope", "--max-gap", "2m"],
            "--gap-column 'nope'", "no such column")
    refused(capsys, [*base, "--gap-column", "ts", "--max-gap", "2m"], "--gap-column 'ts'",
            "time column")
    refused(capsys, [*base, "--gap-column", "g", "--max-gap", "0"], "--max-gap must be > 0")
    refused(capsys, [*base, "--gap", "1m", "--max-duration", "0s"],
            "--max-duration must be > 0")
    refused(capsys, [*base, "--gap", "1m", "--max-duration", "soon"], "--max-duration")
    strings = write(tmp_path, [{"user": "a", "ts": 0, "g": "1m"}], "strings",
                    pa.schema([("user", pa.string()), ("ts", pa.int64()), ("g", pa.string())]))
    refused(capsys, ["sessionize", str(strings), *base[2:], "--gap-column", "g", "--max-gap",
                     "2m"], "--gap-column 'g' must hold integers or durations",
            "string")
    assert not (tmp_path / "o.jsonl").exists()


def test_a_gap_above_max_gap_names_row_and_values_and_commits_nothing(tmp_path, capsys):
    rows = events(2_000, 5, bad_gaps=False)
    rows[1_234]["g"] = 130_000
    source = write(tmp_path, rows, "in")
    out = tmp_path / "o.jsonl"
    state = tmp_path / "state"
    argv = ["sessionize", str(source), "--key", "user", "--time", "ts", "--gap-column", "g",
            "--max-gap", "2m", "--out", str(out), "--state", str(state), "--commit-every",
            "500", "--batch-rows", "500", "--no-progress"]
    refused(capsys, argv, "--gap-column 'g'", "input row 1234", "gap 130000 ms",
            "--max-gap 120000 ms")
    # the two batches before the bad one were committed, and nothing of its batch
    assert main(["inspect", str(state)]) == 0
    assert json.loads(capsys.readouterr().out)["metadata"]["user"]["offset"] == 1_000


def test_resuming_with_another_max_duration_or_gap_column_is_refused(tmp_path, capsys):
    source = write(tmp_path, events(300, 6, bad_gaps=False), "in")
    argv = ["sessionize", str(source), "--key", "user", "--time", "ts", "--out",
            str(tmp_path / "o.jsonl"), "--state", str(tmp_path / "state"), "--no-progress"]
    assert main([*argv, "--gap", "1m", "--max-duration", "5m"]) == 0
    capsys.readouterr()
    refused(capsys, [*argv, "--gap", "1m", "--max-duration", "6m"], "other options")
    refused(capsys, [*argv, "--gap-column", "g", "--max-gap", "1m", "--max-duration", "5m"],
            "other options")
    assert main([*argv, "--gap", "1m", "--max-duration", "5m"]) == 0


@pytest.mark.parametrize("emit", ["final", "update"])
def test_max_duration_float_sums_do_not_depend_on_arrival_order_or_commits(tmp_path, capsys,
                                                                           emit):
    # a chain of sessions cut by --max-duration, newest first, shuffled and in order, with
    # commits every 700 rows or not: byte-identical output, float sums included, each the
    # left fold of its session's values in time order. Kills: float sums extended in arrival
    # order by an out-of-order event inside a session (the shuffled output differed)
    times = list(range(0, 40_000, 10))
    value = {t: t * 0.1 + 0.3 for t in times}
    orders = {"sorted": list(times), "reversed": times[::-1],
              "shuffled": random.Random(11).sample(times, len(times))}
    outputs = set()
    for name, order in orders.items():
        for every in ("700", "200000"):
            source = tmp_path / f"{name}.jsonl"
            source.write_text("".join(json.dumps({"k": "k", "t": t, "v": value[t]}) + "\n"
                                      for t in order))
            out = tmp_path / f"{name}_{every}.jsonl"
            argv = ["sessionize", str(source), "--key", "k", "--time", "t", "--gap", "100ms",
                    "--max-duration", "10s", "--grace", "1d", "--agg", "s=sum:v",
                    "--emit", emit, "--commit-every", every, "--batch-rows", "500",
                    "--state", str(tmp_path / f"st_{name}_{every}"), "--out", str(out),
                    "--no-progress"]
            assert main(argv) == 0, capsys.readouterr().err
            capsys.readouterr()
            rows = [json.loads(line) for line in out.read_text().splitlines()]
            if emit == "update":  # the changelog's last word per session
                last = {(r["session_start_ms"], r["session_end_ms"]): r for r in rows}
                rows = [r for r in last.values() if not r["retracted"]]
                outputs.add(json.dumps(sorted((r["session_start_ms"], r["s"]) for r in rows)))
            else:
                outputs.add(out.read_text())
            assert len(rows) == 4
            for r in rows:
                total = 0.0
                for t in range(r["session_start_ms"], r["session_end_ms"], 10):
                    total = total + value[t]
                assert r["s"] == total
    assert len(outputs) == 1
