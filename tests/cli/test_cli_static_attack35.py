"""An adversarial run against ``sessionstore sessionize`` without ``--state`` (the bounded path):
the same events written with every time representation the readers take must give the same
sessions, equal to an oracle written here (seconds are never read as milliseconds); an input of
no events still writes an output with its columns; misuse exits 2 naming the flag and writes
nothing.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import random
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sessionstore.cli import main

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


def oracle(events: list[tuple[str, int]], gap_ms: int, max_duration_ms: int | None
           ) -> list[tuple[str, int, int, int]]:
    """``(user, start_ms, end_ms, count)`` per session of ``(user, time_ms)`` events, with
    Spark's inclusive gap: sorted by user and start."""
    by_user: dict[str, list[int]] = defaultdict(list)
    for user, t in events:
        by_user[user].append(t)
    out = []
    for user, times in by_user.items():
        times.sort()
        current: list[int] | None = None  # [start, reach, count]
        for t in times:
            if current is not None and t <= current[1] and (
                    max_duration_ms is None or t < current[0] + max_duration_ms):
                current[1] = t + gap_ms
                current[2] += 1
                continue
            if current is not None:
                out.append((user, current[0], current[1], current[2]))
            current = [t, t + gap_ms, 1]
        if current is not None:
            out.append((user, current[0], current[1], current[2]))
    return sorted((u, s, e if max_duration_ms is None else min(e, s + max_duration_ms), n)
                  for u, s, e, n in out)


def _write(path: Path, users: list[str], column: list[Any], data_type: pa.DataType | None
           ) -> None:
    """``users`` and the time ``column`` as a file of ``path``'s format (CSV and JSON Lines
    get text; Parquet gets ``data_type``)."""
    if path.suffix == ".parquet":
        pq.write_table(pa.table({"user": users, "ts": pa.array(column, data_type)}), path)
    elif path.suffix == ".jsonl":
        path.write_text("".join(json.dumps({"user": u, "ts": t}) + "\n"
                                for u, t in zip(users, column, strict=True)))
    else:
        with open(path, "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["user", "ts"])
            writer.writerows(zip(users, column, strict=True))


def _representations(seconds: list[int]) -> dict[str, tuple[str, list[Any], Any, list[str]]]:
    """The same instants as ``(suffix, values, Parquet type, extra flags)`` per form."""
    instants = [EPOCH + dt.timedelta(seconds=s) for s in seconds]
    iso = [i.strftime("%Y-%m-%dT%H:%M:%S") for i in instants]
    return {
        "csv epoch seconds": (".csv", seconds, None, ["--time-unit", "s"]),
        "jsonl epoch seconds": (".jsonl", seconds, None, ["--time-unit", "s"]),
        "jsonl epoch ns": (".jsonl", [s * 10**9 for s in seconds], None, ["--time-unit", "ns"]),
        "csv epoch ms": (".csv", [s * 1000 for s in seconds], None, []),
        "csv iso": (".csv", iso, None, []),
        "jsonl iso": (".jsonl", iso, None, []),
        "parquet int seconds": (".parquet", seconds, pa.int64(), ["--time-unit", "s"]),
        "parquet int32 seconds": (".parquet", seconds, pa.int32(), ["--time-unit", "s"]),
        "parquet timestamp[s]": (".parquet", seconds, pa.timestamp("s"), []),
        "parquet timestamp[us, tz]": (".parquet", [s * 10**6 for s in seconds],
                                      pa.timestamp("us", tz="America/Sao_Paulo"), []),
        "parquet timestamp[ns]": (".parquet", [s * 10**9 for s in seconds],
                                  pa.timestamp("ns"), []),
    }


@pytest.mark.parametrize("seed", range(6))
def test_every_time_representation_gives_the_oracles_sessions(tmp_path, capsys, seed) -> None:
    """Kills: epoch seconds read as milliseconds (with ``--time-unit s``, or a Parquet
    timestamp[s] or int32 column), a time zone shifting the instants, ISO strings read in
    another unit, and a row order or file split that changes the answer."""
    rnd = random.Random(seed)
    base = rnd.choice([1_600_000_000, 1_000_000_000, 2_000_000_000])  # epoch-second instants
    n = rnd.choice([1, 5, 30])
    users = [rnd.choice(["a", "b", "7", "007", "é"]) for _ in range(n)]
    seconds = [base + rnd.randint(0, 40) * rnd.choice([1, 30, 60, 600]) for _ in range(n)]
    gap, gap_ms = rnd.choice([("1m", 60_000), ("10 minutes", 600_000), ("30s", 30_000)])
    max_duration = rnd.choice([None, ("15m", 900_000)])
    want = oracle([(u, s * 1000) for u, s in zip(users, seconds, strict=True)], gap_ms,
                  None if max_duration is None else max_duration[1])
    for name, (suffix, column, data_type, flags) in _representations(seconds).items():
        folder = tmp_path / name.replace(" ", "_").replace(",", "")
        folder.mkdir()
        order = list(range(n))
        rnd.shuffle(order)
        files = rnd.choice([1, 2, 3])
        for f in range(files):
            rows = order[f::files]
            _write(folder / f"part{f}{suffix}", [users[i] for i in rows],
                   [column[i] for i in rows], data_type)
        out = folder.with_suffix(".jsonl")
        argv = ["sessionize", str(folder), "--key", "user", "--time", "ts", "--gap", gap,
                "--agg", "n=count", "--out", str(out), "--no-progress", *flags]
        if max_duration is not None:
            argv += ["--max-duration", max_duration[0]]
        assert main(argv) == 0, (name, capsys.readouterr().err)
        got = sorted((r["user"], r["session_start_ms"], r["session_end_ms"], r["n"])
                     for r in map(json.loads, out.read_text().splitlines()))
        assert got == want, name


@pytest.mark.parametrize("source", ["header.csv", "empty.parquet", "blank.jsonl"])
def test_an_input_of_no_events_writes_a_parquet_output_with_its_columns(tmp_path, capsys,
                                                                        source) -> None:
    """Kills: a Parquet output of no sessions left as an empty directory, which a reader
    (pyarrow, Spark) finds without any column, so that a job reading the output fails on a
    day without events."""
    path = tmp_path / source
    if source == "header.csv":
        path.write_text("user,ts,amount\n")
    elif source == "empty.parquet":
        pq.write_table(pa.table({"user": pa.array([], pa.string()),
                                 "ts": pa.array([], pa.timestamp("ms")),
                                 "amount": pa.array([], pa.int64())}), path)
    else:  # JSON Lines with a typed record that the gap column drops
        path.write_text(json.dumps({"user": "a", "ts": 5, "amount": 1, "g": 0}) + "\n")
    out = tmp_path / "out.parquet"
    argv = ["sessionize", str(path), "--key", "user", "--time", "ts", "--agg", "n=count",
            "--out", str(out), "--no-progress"]
    if source == "blank.jsonl":
        argv += ["--gap-column", "g", "--max-gap", "1h", "--agg", "total=sum:amount"]
    else:
        argv += ["--gap", "30m"]
    assert main(argv) == 0, capsys.readouterr().err
    table = pq.read_table(out)
    assert table.num_rows == 0
    names = ["user", "session_start_ms", "session_end_ms", "n"]
    assert table.schema.names == (names + ["total"] if source == "blank.jsonl" else names)
    assert table.schema.field("session_start_ms").type == pa.int64()
    assert sorted(p.name for p in out.iterdir()) == ["part-000000.parquet"]


@pytest.mark.parametrize(("flag", "argv_tail"), [
    ("--key", ["--key", "user,nope", "--time", "ts"]),
    ("--time", ["--key", "user", "--time", "nope"]),
])
def test_a_missing_key_or_time_column_exits_2_naming_the_flag_and_writes_nothing(
        tmp_path, capsys, flag, argv_tail) -> None:
    source = tmp_path / "in.csv"
    source.write_text("user,ts\na,0\n")
    out = tmp_path / "out.jsonl"
    out.write_text("previous\n")
    status = main(["sessionize", str(source), *argv_tail, "--gap", "30m", "--out", str(out),
                   "--no-progress"])
    err = capsys.readouterr().err
    assert status == 2
    assert f"{flag}: input has no column 'nope'" in err
    assert len(err.strip().splitlines()) == 1
    assert out.read_text() == "previous\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.csv", "out.jsonl"]


def test_the_summary_of_no_sessions_prints_no_warning(tmp_path, capsys) -> None:
    """Kills: the histogram of no sessions set on a log scale, which matplotlib answers with a
    UserWarning ('Data has no positive values'), printed on stderr in a run that went right."""
    pytest.importorskip("matplotlib")
    source = tmp_path / "in.csv"
    source.write_text("user,ts\n")
    png = tmp_path / "lengths.png"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        status = main(["sessionize", str(source), "--key", "user", "--time", "ts", "--gap",
                       "30m", "--out", str(tmp_path / "out.jsonl"), "--summary",
                       "--summary-png", str(png), "--no-progress"])
    assert status == 0
    assert "no sessions" in capsys.readouterr().err
    assert [str(w.message) for w in caught] == []
    assert png.stat().st_size > 0
