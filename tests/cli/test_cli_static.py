"""The CLI on input that is all there (issue 23, item 3).

Without ``--state`` a run takes the bounded path: the exact sessions whatever the row order, so a
file sorted by key (as MovieLens ratings are) loses nothing. With ``--state`` lateness applies,
but a drop is reported on stderr and, above ``--max-dropped-share``, fails the run. Integer
times take ``--time-unit``; CSV takes TSV and ``--delimiter``; durations take days and weeks.
Each test runs the real command in process on real files, against :mod:`tests.oracle`.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sessionstore.cli import EXIT_DROPPED, main
from sessionstore.report import ACTIVE, WINDOW
from tests import oracle

GAP_MS = 30 * 60_000


def ratings(n_users: int = 300, seed: int = 7, unit_ms: int = 1) -> pa.Table:
    """A MovieLens-like ratings table: many users, each rating in a few visits spread over
    years, rows sorted by user (then by movie, so not by time within a user); times are epoch
    ``unit_ms`` ticks (1: milliseconds, 1000: seconds)."""
    rng = np.random.default_rng(seed)
    users, movies, stars, times = [], [], [], []
    for user in range(1, n_users + 1):
        visits = rng.integers(1, 6)
        for _ in range(visits):
            start = int(rng.integers(946_684_800, 1_600_000_000)) * 1000  # 2000 to 2020
            count = int(rng.integers(1, 25))
            # think times of seconds to an hour, so that some visits split into sessions
            offsets = np.cumsum(rng.integers(1_000, 3_000_000, count))
            times.extend((start + offsets).tolist())
            users.extend([user] * count)
            movies.extend(rng.integers(1, 200_000, count).tolist())
            stars.extend(rng.integers(1, 11, count).tolist())
    order = np.lexsort((np.array(movies), np.array(users)))
    take = pa.array(order)
    table = pa.table({"userId": users, "movieId": movies, "rating": stars,
                      "timestamp": np.array(times, np.int64) // unit_ms})
    return table.take(take)


def write_csv(table: pa.Table, path: Path, delimiter: str = ",") -> Path:
    lines = [delimiter.join(table.column_names)]
    for row in zip(*[c.to_pylist() for c in table.columns], strict=True):
        lines.append(delimiter.join(str(v) for v in row))
    path.write_text("\n".join(lines) + "\n")
    return path


def offline(table: pa.Table, gap_ms: int, unit_ms: int = 1) -> set[tuple]:
    """The oracle's offline answer: every event in, a watermark that never moves."""
    steps = [("event", str(u), r, t * unit_ms) for u, r, t in zip(
        table.column("userId").to_pylist(), table.column("rating").to_pylist(),
        table.column("timestamp").to_pylist(), strict=True)]
    sessions, dropped = oracle.sessionize(steps, gap=gap_ms, out_of_orderness=None)
    assert not dropped
    return {(k, s, e, len(v), sum(v)) for k, s, e, v in sessions}


def written(out: Path) -> set[tuple]:
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    found = {(r["userId"], r["session_start_ms"], r["session_end_ms"], r["n"], r["stars"])
             for r in rows}
    assert len(found) == len(rows)
    return found


def argv(source: Path, out: Path, *extra: str) -> list[str]:
    return ["sessionize", str(source), "--key", "userId", "--time", "timestamp", "--gap", "30m",
            "--agg", "n=count", "--agg", "stars=sum:rating", "--out", str(out),
            "--no-progress", *extra]


def run(capsys: pytest.CaptureFixture[str], args: list[str]) -> tuple[int, dict, str]:
    status = main(args)
    captured = capsys.readouterr()
    lines = captured.out.strip().splitlines()
    return status, json.loads(lines[-1]) if lines else {}, captured.err


def test_a_key_sorted_file_without_state_gives_the_exact_sessions_and_drops_nothing(
        tmp_path, capsys):
    # kills: a run without --state on the streaming path (it dropped most of a key-sorted file
    # as late, exit 0 and nothing on stderr)
    table = ratings()
    source = write_csv(table, tmp_path / "ratings.csv")
    out = tmp_path / "sessions.jsonl"
    status, report, err = run(capsys, argv(source, out))
    assert status == 0, err
    assert report["late_dropped"] == 0 and report["events_in"] == table.num_rows
    assert "dropped" not in err
    assert written(out) == offline(table, GAP_MS)
    # the same answer whatever the row order: reversed, and shuffled
    for order in (np.arange(table.num_rows)[::-1],
                  np.random.default_rng(3).permutation(table.num_rows)):
        write_csv(table.take(pa.array(order)), source)
        assert run(capsys, argv(source, out))[0] == 0
        assert written(out) == offline(table, GAP_MS)


def test_with_state_a_key_sorted_file_reports_its_drops_and_fails_above_the_threshold(
        tmp_path, capsys):
    # kills: silent drops with --state (exit 0, nothing on stderr)
    table = ratings(n_users=60)
    source = write_csv(table, tmp_path / "ratings.csv")
    status, report, err = run(capsys, argv(source, tmp_path / "a.jsonl", "--state",
                                           str(tmp_path / "state-a")))
    late = report["late_dropped"]
    assert late > 0.01 * table.num_rows  # the input is key-sorted: most of it is late
    assert status == EXIT_DROPPED
    share = f"{100 * late / table.num_rows:.2f}%"
    assert f"dropped {late:,} of {table.num_rows:,} events ({share}) as late" in err, err
    assert "--max-dropped-share" in err
    # a threshold the run stays under: the same report, exit 0
    status, report, err = run(capsys, argv(source, tmp_path / "b.jsonl", "--state",
                                           str(tmp_path / "state-b"),
                                           "--max-dropped-share", "1"))
    assert status == 0 and report["late_dropped"] == late
    assert f"dropped {late:,} of {table.num_rows:,} events ({share}) as late" in err, err
    # time-sorted input loses nothing and says nothing
    by_time = table.take(pa.array(np.argsort(table.column("timestamp").to_numpy(),
                                             kind="stable")))
    write_csv(by_time, source)
    status, report, err = run(capsys, argv(source, tmp_path / "c.jsonl", "--state",
                                           str(tmp_path / "state-c")))
    assert status == 0 and report["late_dropped"] == 0 and "dropped" not in err
    assert written(tmp_path / "c.jsonl") == offline(table, GAP_MS)


def test_a_share_outside_0_1_is_refused_naming_the_flag(tmp_path, capsys):
    source = write_csv(ratings(n_users=2), tmp_path / "ratings.csv")
    assert main(argv(source, tmp_path / "o.jsonl", "--max-dropped-share", "5")) == 2
    assert "--max-dropped-share must be a share in 0..1" in capsys.readouterr().err


def test_epoch_seconds_take_time_unit_s_and_are_refused_without_it(tmp_path, capsys):
    # kills: epoch seconds read as milliseconds without a word (a 30m gap then spans 500 h)
    table = ratings(n_users=80, unit_ms=1000)
    source = write_csv(table, tmp_path / "ratings.csv")
    out = tmp_path / "sessions.jsonl"
    status, _, err = run(capsys, argv(source, out))
    assert status == 2
    assert "time column 'timestamp'" in err and "epoch seconds" in err
    assert "--time-unit s" in err
    status, _, err = run(capsys, argv(source, out, "--time-unit", "s"))
    assert status == 0, err
    assert written(out) == offline(table, GAP_MS, unit_ms=1000)
    # the unit is the input's: milliseconds declared as such are read as they are
    assert run(capsys, argv(source, out, "--time-unit", "ms"))[0] == 0
    assert written(out) == offline(table, GAP_MS)


@pytest.mark.parametrize(("unit", "per_ms"), [("us", 1_000), ("ns", 1_000_000)])
def test_finer_units_are_refused_without_time_unit_and_floored_with_it(tmp_path, capsys, unit,
                                                                        per_ms):
    times_ms = [1_700_000_000_000, 1_700_000_060_000, 1_700_003_600_000]
    source = tmp_path / "e.parquet"
    pq.write_table(pa.table({"userId": ["a", "a", "a"], "rating": [1, 2, 3],
                             "timestamp": pa.array([t * per_ms + 7 for t in times_ms],
                                                   pa.int64())}), source)
    out = tmp_path / "o.jsonl"
    status, _, err = run(capsys, argv(source, out))
    assert status == 2 and f"--time-unit {unit}" in err and "microseconds or nanoseconds" in err
    status, report, _ = run(capsys, argv(source, out, "--time-unit", unit))
    assert status == 0 and report["times_floored_to_ms"] == 3
    assert written(out) == {("a", times_ms[0], times_ms[1] + GAP_MS, 2, 3),
                            ("a", times_ms[2], times_ms[2] + GAP_MS, 1, 3)}


def test_time_unit_on_a_timestamp_column_is_refused_naming_the_flag(tmp_path, capsys):
    source = tmp_path / "e.parquet"
    pq.write_table(pa.table({"userId": ["a"], "rating": [1],
                             "timestamp": pa.array([0], pa.timestamp("ms"))}), source)
    status, _, err = run(capsys, argv(source, tmp_path / "o.jsonl", "--time-unit", "s"))
    assert status == 2 and "--time-unit s applies to integer time columns" in err


def test_tsv_by_extension_and_delimiter_give_the_same_sessions_as_csv(tmp_path, capsys):
    # kills: .tsv refused as an unknown format; --delimiter missing or ignored
    table = ratings(n_users=40)
    expected = offline(table, GAP_MS)
    for name, delimiter, extra in (("r.tsv", "\t", ()), ("r.tab", "\t", ()),
                                   ("r.csv", ";", ("--delimiter", ";")),
                                   ("s.csv", "\t", ("--delimiter", "\\t")),
                                   ("t.txt.csv", "|", ("--delimiter", "|"))):
        source = write_csv(table, tmp_path / name, delimiter)
        out = tmp_path / f"{name}.jsonl"
        status, _, err = run(capsys, argv(source, out, *extra))
        assert status == 0, (name, err)
        assert written(out) == expected, name


def test_a_wrong_delimiter_is_refused_naming_the_flag(tmp_path, capsys):
    table = ratings(n_users=3)
    csv_source = write_csv(table, tmp_path / "r.csv")
    jsonl = tmp_path / "r.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in table.to_pylist()))
    for source, value, needle in ((csv_source, ";;", "--delimiter must be one character"),
                                  (csv_source, "\n", "--delimiter must be one character"),
                                  (jsonl, ";", "--delimiter applies to CSV and TSV input")):
        status, _, err = run(capsys, argv(source, tmp_path / "o.jsonl", "--delimiter", value))
        assert status == 2 and needle in err, err


@pytest.mark.parametrize(("gap", "gap_ms"), [("7d", 7 * 86_400_000), ("2w", 14 * 86_400_000),
                                             ("1w 3d", 10 * 86_400_000)])
def test_days_and_weeks_are_durations(tmp_path, capsys, gap, gap_ms):
    table = ratings(n_users=30)
    source = write_csv(table, tmp_path / "ratings.csv")
    out = tmp_path / "o.jsonl"
    args = argv(source, out)
    args[args.index("30m")] = gap
    status, _, err = run(capsys, args)
    assert status == 0, err
    assert written(out) == offline(table, gap_ms)


@pytest.mark.parametrize(("flag", "value", "unit"), [("--gap", "1y", "a year"),
                                                     ("--max-duration", "2 years", "a year"),
                                                     ("--grace", "1 month", "a month")])
def test_years_and_months_are_refused_naming_the_flag_and_why(tmp_path, capsys, flag, value,
                                                              unit):
    source = write_csv(ratings(n_users=2), tmp_path / "ratings.csv")
    args = argv(source, tmp_path / "o.jsonl")
    if flag == "--gap":
        args[args.index("30m")] = value
    else:
        args += [flag, value]
    status, _, err = run(capsys, args)
    assert status == 2
    assert f"{flag}: {unit} has no fixed length" in err and "365d" in err, err


def test_the_bounded_path_reports_events_dropped_for_an_invalid_gap(tmp_path, capsys):
    source = tmp_path / "e.parquet"
    pq.write_table(pa.table({"userId": ["a", "a", "b", "b"], "rating": [1, 2, 3, 4],
                             "timestamp": pa.array([0, 10, 20, 30], pa.int64()),
                             "g": pa.array([100, None, 0, 100], pa.int64())}), source)
    out = tmp_path / "o.jsonl"
    args = argv(source, out)
    args[args.index("--gap"):args.index("--gap") + 2] = ["--gap-column", "g", "--max-gap", "1s"]
    status, report, err = run(capsys, args)
    assert status == 0 and report["invalid_gap_dropped"] == 2
    assert "dropped 2 of 4 events (50.00%) for a null or non-positive --gap-column value" in err
    assert written(out) == {("a", 0, 100, 1, 1), ("b", 30, 130, 1, 4)}


def test_the_summary_shows_each_sessions_active_span_beside_its_window(tmp_path, capsys):
    # kills: a summary that shows only the window (first event to last event plus the gap)
    source = tmp_path / "e.parquet"
    pq.write_table(pa.table({"userId": ["a", "a", "a"], "rating": [1, 1, 1],
                             "timestamp": pa.array([0, 20 * 60_000, 45 * 60_000], pa.int64())}),
                   source)
    for extra in ((), ("--state", str(tmp_path / "state"))):
        status, _, err = run(capsys, argv(source, tmp_path / f"o{len(extra)}.jsonl",
                                          "--summary", "--summary-png",
                                          str(tmp_path / "h.png"), *extra))
        assert status == 0, err
        header = next(line for line in err.splitlines() if "first event (UTC)" in line)
        assert header.index(WINDOW) < header.index(ACTIVE) < header.index("events"), header
        row = next(line for line in err.splitlines() if line.strip().startswith("a "))
        # window 45m + 30m = 1h15m, active 45m
        assert row.split()[-3:] == ["1h15m", "45m00s", "3"], row


def test_a_tiny_memory_limit_spills_and_gives_the_same_sessions(tmp_path, capsys):
    # kills: --memory-limit not reaching the bounded path (or spilling that loses sessions)
    table = ratings(n_users=200)
    source = write_csv(table, tmp_path / "ratings.csv")
    out = tmp_path / "o.jsonl"
    status, _, err = run(capsys, argv(source, out, "--memory-limit", "64KB"))
    assert status == 0, err
    assert written(out) == offline(table, GAP_MS)
    status, _, err = run(capsys, argv(source, out, "--memory-limit", "lots"))
    assert status == 2 and "--memory-limit 'lots'" in err, err
    status, _, err = run(capsys, argv(source, out, "--memory-limit", "1GB", "--state",
                                      str(tmp_path / "state")))
    assert status == 2 and "--memory-limit applies to runs without --state" in err, err
