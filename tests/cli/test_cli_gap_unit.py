"""An integer ``--gap-column`` is read in the unit of the integer time column it goes with
(``--time-unit``, ms without it) or of ``--gap-unit``, and refused where no unit is known; the
same file gives the same sessions on every entry point that takes it."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import sessionstore
from sessionstore.cli import main

T0 = 1_700_000_000  # epoch seconds
MAX_GAP_S = 3_600


def events(seed: int, n: int = 400) -> list[dict[str, Any]]:
    """Epoch-second times of a few users in time order (so that nothing is late on the
    incremental path), each with its own gap in seconds; some gaps null, zero or negative."""
    rng = random.Random(seed)
    rows = []
    t = T0
    for i in range(n):
        t += rng.choice([0, 1, 30, 600, 1_700, 2_000, 4_000])
        gap = rng.choice([1, 60, 1_800, MAX_GAP_S, rng.randint(1, MAX_GAP_S)])
        if i % 13 == 4:
            gap = rng.choice([None, 0, -1_800])
        rows.append({"user": f"u{rng.randint(0, 3)}", "ts": t, "g": gap})
    return rows


def oracle(rows: list[dict[str, Any]]) -> list[tuple[str, int, int, int]]:
    """Sessions ``(user, start, end, events)`` in the rows' own unit: per user in time order,
    an event joins when its time is at most the largest ``t + gap`` so far; an event whose gap
    is null or not positive is left out."""
    by_user: dict[str, list[tuple[int, int]]] = {}
    for r in rows:
        if r["g"] is not None and r["g"] > 0:
            by_user.setdefault(r["user"], []).append((r["ts"], r["g"]))
    out = []
    for user, own in by_user.items():
        own.sort()
        start, reach, count = own[0][0], own[0][0] + own[0][1], 1
        for t, gap in own[1:]:
            if t <= reach:
                reach, count = max(reach, t + gap), count + 1
            else:
                out.append((user, start, reach, count))
                start, reach, count = t, t + gap, 1
        out.append((user, start, reach, count))
    return sorted(out)


def write(path: Path, rows: list[dict[str, Any]], time_type: pa.DataType | None = None,
          scale: int = 1) -> Path:
    """``rows`` as Parquet; times and gaps multiplied by ``scale``, times of ``time_type``
    (int64 by default)."""
    table = pa.table({
        "user": [r["user"] for r in rows],
        "ts": pa.array([r["ts"] * scale for r in rows], pa.int64()).cast(time_type or pa.int64()),
        "g": pa.array([None if r["g"] is None else r["g"] * scale for r in rows], pa.int64())})
    pq.write_table(table, path)
    return path


def cli(capsys: pytest.CaptureFixture[str], source: Path, out: Path, *flags: str,
        state: bool = False) -> list[tuple[str, int, int, int]]:
    """The CLI's sessions of ``source``, their bounds in ms."""
    argv = ["sessionize", str(source), "--key", "user", "--time", "ts", "--gap-column", "g",
            "--max-gap", f"{MAX_GAP_S}s", "--agg", "n=count", "--out", str(out),
            "--no-progress", "--batch-rows", "97", *flags,
            # the incremental path: time-ordered input, and no session is closed before an
            # event that joins it arrives (one at a session's very end, on a watermark there)
            *(["--state", f"{out}.state", "--max-out-of-order", "2h"] if state else [])]
    assert main(argv) == 0, capsys.readouterr().err
    capsys.readouterr()
    return sorted((r["user"], r["session_start_ms"], r["session_end_ms"], r["n"])
                  for r in map(json.loads, out.read_text().splitlines()))


def in_ms(sessions: list[tuple[str, int, int, int]]) -> list[tuple[str, int, int, int]]:
    """Sessions of epoch-second bounds with their bounds in ms."""
    return [(u, s * 1000, e * 1000, n) for u, s, e, n in sessions]


@pytest.mark.parametrize("state", [False, True], ids=["bounded", "incremental"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_integer_gaps_are_in_the_time_unit_of_the_times(tmp_path, capsys, seed, state) -> None:
    """Killed bug: with ``--time-unit s`` an integer gap column was read as milliseconds, so a
    gap of 1800 (half an hour, as the times count) was 1.8 s."""
    rows = events(seed)
    source = write(tmp_path / "in.parquet", rows)
    got = cli(capsys, source, tmp_path / "o.jsonl", "--time-unit", "s", state=state)
    assert got == in_ms(oracle(rows))


@pytest.mark.parametrize("state", [False, True], ids=["bounded", "incremental"])
def test_every_entry_point_gives_the_same_sessions(tmp_path, capsys, state) -> None:
    rows = events(7)
    want = oracle(rows)
    assert any(n > 1 for *_, n in want) and len(want) > 20  # the gaps join and split sessions
    seconds = write(tmp_path / "s.parquet", rows)
    # integer epoch seconds: the CLI with --time-unit s, sessionize with time_unit="s" or none
    assert cli(capsys, seconds, tmp_path / "a.jsonl", "--time-unit", "s", state=state) \
        == in_ms(want)
    table = pq.read_table(seconds)
    for unit in ("s", None):
        api = sessionstore.sessionize(table, key="user", time="ts", gap="g", time_unit=unit,
                                      aggregations="n=count")
        assert sorted((r["user"], r["session_start"], r["session_end"], r["n"])
                      for r in api.to_pylist()) == want
    # integer epoch milliseconds and gaps in ms: no flag at all, or --gap-unit ms
    millis = write(tmp_path / "ms.parquet", rows, scale=1000)
    assert cli(capsys, millis, tmp_path / "b.jsonl", state=state) == in_ms(want)
    assert cli(capsys, millis, tmp_path / "c.jsonl", "--gap-unit", "ms", state=state) \
        == in_ms(want)
    # microsecond timestamps and gaps: the CLI with --gap-unit us, sessionize in the ticks
    micros = write(tmp_path / "us.parquet", rows, pa.timestamp("us"), scale=10**6)
    assert cli(capsys, micros, tmp_path / "d.jsonl", "--gap-unit", "us", state=state) \
        == in_ms(want)
    api = sessionstore.sessionize(pq.read_table(micros), key="user", time="ts", gap="g",
                                  aggregations="n=count")
    bounds = [api.column(c).cast(pa.int64()).to_pylist() for c in ("session_start",
                                                                     "session_end")]
    assert sorted(zip(api.column("user").to_pylist(), *bounds, api.column("n").to_pylist(),
                      strict=True)) == [(u, s * 10**6, e * 10**6, n) for u, s, e, n in want]


def refused(capsys: pytest.CaptureFixture[str], source: Path, out: Path, *flags: str) -> str:
    argv = ["sessionize", str(source), "--key", "user", "--time", "ts", "--out", str(out),
            "--no-progress", *flags]
    assert main(argv) == 2
    assert not out.exists()
    return capsys.readouterr().err


@pytest.mark.parametrize("time_type", [pa.timestamp("s"), pa.timestamp("ns"), pa.date32(),
                                       pa.string()])
def test_integer_gaps_beside_times_of_no_integer_unit_need_gap_unit(tmp_path, capsys,
                                                                    time_type) -> None:
    """Killed bug: integers beside timestamps (ISO strings, dates) were read as milliseconds,
    whatever the file meant."""
    if pa.types.is_string(time_type):
        column = pa.array(["2024-01-01T00:00:00", "2024-01-01T00:01:00"])
    elif pa.types.is_date(time_type):
        column = pa.array([0, 1], pa.int32()).cast(time_type)
    else:
        column = pa.array([T0, T0 + 60], pa.timestamp("s")).cast(time_type)
    source = tmp_path / "in.parquet"
    pq.write_table(pa.table({"user": ["a", "a"], "ts": column, "g": [100_000, 100_000]}),
                   source)
    for state in ([], ["--state", str(tmp_path / "state")]):
        err = refused(capsys, source, tmp_path / "o.jsonl", "--gap-column", "g", "--max-gap",
                      "2d", *state)
        # (Parquet keeps seconds as milliseconds)
        assert "--gap-column 'g' holds integers, but the time column 'ts' holds " \
            f"{pa.timestamp('ms') if time_type == pa.timestamp('s') else time_type}" in err
        assert "give --gap-unit" in err
    # with the unit, the run goes through: 100000 s joins the two events (a minute or a day
    # apart); read as ms, it would not
    out = tmp_path / "ok.jsonl"
    assert main(["sessionize", str(source), "--key", "user", "--time", "ts", "--gap-column",
                 "g", "--gap-unit", "s", "--max-gap", "2d", "--agg", "n=count", "--out",
                 str(out), "--no-progress"]) == 0
    (row,) = map(json.loads, out.read_text().splitlines())
    apart = 86_400 if pa.types.is_date(time_type) else 60
    assert (row["n"], row["session_end_ms"] - row["session_start_ms"]) == \
        (2, (apart + 100_000) * 1000)


def test_gap_unit_misuse_is_refused_naming_the_flag(tmp_path, capsys) -> None:
    source = tmp_path / "in.parquet"
    pq.write_table(pa.table({"user": ["a"], "ts": [T0 * 1000],
                             "d": pa.array([5], pa.duration("s"))}), source)
    err = refused(capsys, source, tmp_path / "o.jsonl", "--gap-column", "d", "--gap-unit", "ms",
                  "--max-gap", "1h")
    assert "--gap-unit ms applies to integer gap columns" in err and "duration[s]" in err
    err = refused(capsys, source, tmp_path / "o.jsonl", "--gap", "30m", "--gap-unit", "s")
    assert "--gap-unit applies to --gap-column only" in err


def test_gaps_in_seconds_too_large_for_milliseconds_are_named_not_overflowed(tmp_path,
                                                                            capsys) -> None:
    """Killed bug: a duration[s] gap that overflows int64 as milliseconds stopped the run with
    Arrow's bare "overflow", naming neither the column nor the row."""
    for kind, extra in ((pa.duration("s"), ()), (pa.int64(), ("--gap-unit", "s"))):
        source = tmp_path / "in.parquet"
        pq.write_table(pa.table({"user": ["a", "a"], "ts": [0, 1],
                                 "g": pa.array([5, 10**17], kind)}), source)
        err = refused(capsys, source, tmp_path / "o.jsonl", "--gap-column", "g", "--max-gap",
                      "1h", *extra)
        assert "--gap-column 'g': input row 1: gap 100000000000000000 s exceeds --max-gap " \
               "3600000 ms" in err, err


def test_microsecond_gaps_must_be_whole_milliseconds(tmp_path, capsys) -> None:
    source = tmp_path / "in.parquet"
    pq.write_table(pa.table({"user": ["a"] * 3, "ts": [0, 1_000, 2_000],
                             "g": [2_000, -7, 1_500]}), source)
    err = refused(capsys, source, tmp_path / "o.jsonl", "--gap-column", "g", "--max-gap",
                  "1h", "--time-unit", "us")
    assert "input row 2: gap 1500 us is not a whole number of milliseconds" in err


def test_a_state_is_not_resumed_with_its_integer_gaps_in_another_unit(tmp_path,
                                                                      capsys) -> None:
    source = write(tmp_path / "in.parquet", events(4, 50))
    out = tmp_path / "o.jsonl"
    cli(capsys, source, out, "--time-unit", "s", state=True)
    err = refused(capsys, source, tmp_path / "other.jsonl", "--gap-column", "g", "--max-gap",
                  f"{MAX_GAP_S}s", "--time-unit", "s", "--gap-unit", "ms", "--agg", "n=count",
                  "--batch-rows", "97", "--max-out-of-order", "2h", "--state", f"{out}.state")
    assert "written with other options" in err
    # the same options resume (nothing new to read)
    cli(capsys, source, out, "--time-unit", "s", state=True)


@pytest.mark.parametrize("flag", ["--gap", "--grace", "--max-out-of-order", "--max-duration"])
def test_a_bare_number_beside_a_time_unit_other_than_ms_is_refused(tmp_path, capsys,
                                                                   flag) -> None:
    """Killed bug: ``--time-unit s --gap 1800`` was a gap of 1.8 s, silently: a bare number
    is milliseconds, which the times are not."""
    source = write(tmp_path / "in.parquet", events(5, 30))
    base = ["--key", "user", "--time", "ts", "--time-unit", "s", "--no-progress"]
    gap = ["--gap", "30m"] if flag != "--gap" else []
    for unit in ("s", "us"):
        base[5] = unit
        argv = ["sessionize", str(source), *base, *gap, flag, "1800", "--out",
                str(tmp_path / "o.jsonl")]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"{flag} 1800 has no unit, and --time-unit {unit} says the times are not " \
               f"milliseconds" in err, err
    # with its unit, or 0, or beside milliseconds, a number goes through
    out = tmp_path / "ok.jsonl"
    zero = [("0", "s")] if flag in ("--grace", "--max-out-of-order") else []
    for value, unit in (("1800s", "s"), ("1800", "ms"), *zero):
        base[5] = unit
        assert main(["sessionize", str(source), *base, *gap, flag, value, "--out", str(out)
                     ]) == 0, capsys.readouterr().err
    capsys.readouterr()
