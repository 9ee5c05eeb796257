"""Adversarial runs of the bounded (static) path: ``sessionstore.sessionize`` and the CLI without
``--state``, against an oracle written here (a plain sort and sweep that shares no code with the
project), and the failures that must change nothing.
"""

from __future__ import annotations

import csv
import decimal
import json
import math
import os
import random
import resource
import signal
import struct
import subprocess
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import sessionstore
from sessionstore.cli import main

ROOT = Path(__file__).resolve().parents[2]
INT64_MAX = 2**63 - 1


# -- the oracle ---------------------------------------------------------------------------------


class SumOverflow(Exception):
    pass


def _fold(kind: str, values: list[Any]) -> Any:
    """One aggregation over a session's values in (time, input order)."""
    if kind == "count":
        return len(values)
    if kind == "first":
        return values[0]
    if kind == "last":
        return values[-1]
    present = [v for v in values if v is not None]
    if kind == "collect":
        return present
    if not present:
        return None
    if kind == "sum":
        if all(isinstance(v, int) for v in present):
            total = sum(present)
            if not -(2**63) <= total <= INT64_MAX:
                raise SumOverflow(total)
            return total
        acc = 0  # from 0, as Spark adds: a sum of -0.0 is 0.0
        for v in present:
            acc = acc + v
        return acc
    best = present[0]
    for v in present[1:]:
        if isinstance(v, float) and isinstance(best, float) and (v != v or best != best):
            # NaN is above every value (Spark's order of doubles)
            if (best != best and v == v) if kind == "min" else (v != v and best == best):
                best = v
        elif (v < best) if kind == "min" else (v > best):
            best = v
        elif isinstance(v, float) and v == 0 and best == 0:  # IEEE: -0.0 < 0.0
            below = math.copysign(1, v) < math.copysign(1, best)
            if below == (kind == "min"):
                best = v
    return best


def oracle(rows: list[dict[str, Any]], keys: list[str], gap: int | None,
           max_duration: int | None, inclusive: bool,
           aggregations: list[tuple[str, str, str | None]]
           ) -> list[tuple[tuple[Any, ...], int, int, dict[str, Any]]]:
    """Sessions of ``rows`` (dicts with the keys, ``t``, ``g`` for a per-row gap when ``gap`` is
    None, and values), sorted by (key, start)."""
    groups: dict[tuple[Any, ...], list[tuple[int, int, int, dict[str, Any]]]] = \
        defaultdict(list)
    for i, row in enumerate(rows):
        own = gap if gap is not None else row["g"]
        if own is None or own <= 0:
            continue
        groups[tuple(row[k] for k in keys)].append((row["t"], i, own, row))
    out = []
    for key, events in groups.items():
        events.sort(key=lambda e: (e[0], e[1]))
        current: dict[str, Any] | None = None
        for t, _, own, row in events:
            if current is not None:
                joins = t <= current["reach"] if inclusive else t < current["reach"]
                if max_duration is not None and t >= current["start"] + max_duration:
                    joins = False
                if joins:
                    current["reach"] = max(current["reach"], t + own)
                    current["rows"].append(row)
                    continue
                out.append(current)
            current = {"key": key, "start": t, "reach": t + own, "rows": [row]}
        if current is not None:
            out.append(current)
    result = []
    for s in out:
        end = s["reach"] if max_duration is None else min(s["reach"], s["start"] + max_duration)
        values = {name: _fold(kind, [r.get(c) for r in s["rows"]])
                  for name, kind, c in aggregations}
        result.append((s["key"], s["start"], end, values))
    result.sort(key=lambda s: (s[0], s[1]))
    return result


def same(a: Any, b: Any) -> bool:
    """Equal, with floats compared bit for bit (NaN equal to NaN, -0.0 apart from 0.0)."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or struct.pack("<d", a) == struct.pack("<d", b)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


# -- sessionstore.sessionize against the oracle -------------------------------------------------

KEY_POOLS: dict[str, tuple[pa.DataType | str, list[Any]]] = {
    "int64": (pa.int64(), [-(2**63), 0, 5, INT64_MAX, -1]),
    "int8": (pa.int8(), [-128, 127, 0, -1]),
    "uint64": (pa.uint64(), [0, 2**64 - 1, 2**63, 3]),
    "string": (pa.string(), ["", "a", "é", "a\x00b", "B"]),
    "large_string": (pa.large_string(), ["x", "", "ß", "zz"]),
    "dictionary": ("dictionary", ["p", "q", "", "r"]),
    "string_view": ("string_view", ["v", "w", ""]),
    "binary": (pa.binary(), [b"", b"\x00", b"\xff", b"a"]),
    "bool": (pa.bool_(), [True, False]),
}
TIME_MODES: dict[str, Callable[[random.Random], int]] = {
    "small": lambda r: r.randint(0, 30),
    "equal": lambda r: 7,
    "negative": lambda r: r.randint(-50, 50),
    "int64 min": lambda r: -(2**63) + r.randint(0, 40),
    "int64 max": lambda r: INT64_MAX - 1000 - r.randint(0, 40),
    "wide": lambda r: r.choice([-(2**62), 0, 2**62, r.randint(-100, 100)]),
}
TIME_TYPES = {"int64": pa.int64(), "s": pa.timestamp("s"), "ms": pa.timestamp("ms"),
              "us": pa.timestamp("us"), "ns": pa.timestamp("ns"),
              "tz": pa.timestamp("us", tz="Europe/Paris")}
AGGREGATIONS = [("n", "count", None), ("si", "sum", "vi"), ("sf", "sum", "vf"),
                ("mnf", "min", "vf"), ("mxf", "max", "vf"), ("mni", "min", "vi"),
                ("mxs", "max", "vs"), ("fs", "first", "vs"), ("lf", "last", "vf"),
                ("cs", "collect", "vs"), ("ci", "collect", "vi")]


def _key_array(kind: str, values: list[Any]) -> pa.Array:
    data_type = KEY_POOLS[kind][0]
    if data_type == "dictionary":
        return pa.array(values, pa.string()).dictionary_encode()
    if data_type == "string_view":
        return pa.array(values, pa.string()).cast(pa.string_view())
    return pa.array(values, data_type)


def _case(seed: int) -> tuple[Any, dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    """A random adversarial input: ``(data, sessionize kwargs, oracle rows, oracle args)``."""
    rnd = random.Random(seed)
    n = rnd.choice([0, 1, 2, 5, 20, 60])
    kinds = [rnd.choice(sorted(KEY_POOLS)) for _ in range(rnd.choice([1, 1, 2]))]
    keys = [f"k{i}" for i in range(len(kinds))]
    key_values = [[rnd.choice(KEY_POOLS[k][1][:rnd.choice([1, 2, 4])]) for _ in range(n)]
                  for k in kinds]
    mode = rnd.choice(sorted(TIME_MODES))
    times = [TIME_MODES[mode](rnd) for _ in range(n)]
    time_type = rnd.choice(sorted(TIME_TYPES))
    own_gaps = [rnd.choice([None, 0, -3, 1, 2, 5, 9]) for _ in range(n)]
    ints = [rnd.choice([None, 1, -1, 2**62, -(2**62), INT64_MAX, -(2**63), 3])
            if rnd.random() < 0.3 else rnd.choice([None, 1, -7, 100]) for _ in range(n)]
    floats = [rnd.choice([None, 0.0, -0.0, math.nan, math.inf, -math.inf, 1.5, 1e308, -2.25])
              for _ in range(n)]
    strings = [rnd.choice([None, "a", "", "zz", "é"]) for _ in range(n)]
    order = list(range(n))
    how = rnd.choice(["as is", "reversed", "shuffled", "key-sorted"])
    if how == "reversed":
        order.reverse()
    elif how == "shuffled":
        rnd.shuffle(order)
    elif how == "key-sorted":
        order.sort(key=lambda i: tuple(repr(v[i]) for v in key_values))
    columns = {name: _key_array(kind, [v[i] for i in order])
               for name, kind, v in zip(keys, kinds, key_values, strict=True)}
    columns["t"] = pa.array([times[i] for i in order], pa.int64()).cast(TIME_TYPES[time_type])
    columns["g"] = pa.array([own_gaps[i] for i in order], pa.int64())
    columns["vi"] = pa.array([ints[i] for i in order], pa.int64())
    columns["vf"] = pa.array([floats[i] for i in order], pa.float64())
    columns["vs"] = pa.array([strings[i] for i in order], pa.string())
    table = pa.table(columns)
    rows = [{**{k: v[i] for k, v in zip(keys, key_values, strict=True)}, "t": times[i],
             "g": own_gaps[i], "vi": ints[i], "vf": floats[i], "vs": strings[i]}
            for i in order]
    aggregations = [a for a in AGGREGATIONS if a[1] == "count" or rnd.random() < 0.5]
    kwargs: dict[str, Any] = {
        "key": keys if len(keys) > 1 else keys[0], "time": "t",
        "inclusive_gap": rnd.choice([True, False]),
        "aggregations": [f"{n}={k}" + (f":{c}" if c else "") for n, k, c in aggregations]}
    gap: int | None = rnd.choice([1, 3, 10, 2**62, INT64_MAX - 5])
    if rnd.random() < 0.3:
        kwargs["gap"], gap = "g", None
    elif rnd.random() < 0.3 and time_type not in ("int64",):
        seconds = rnd.randint(1, 50)
        kwargs["gap"] = f"{seconds}s"
        gap = seconds * {"s": 1, "ms": 10**3, "us": 10**6, "ns": 10**9, "tz": 10**6}[time_type]
    else:
        kwargs["gap"] = gap
    max_duration = rnd.choice([None, None, 1, 4, 15])
    if max_duration is not None:
        kwargs["max_duration"] = max_duration
    data: Any = table
    chunking = rnd.choice(["one chunk", "chunks", "reader", "spilled reader"])
    if chunking != "one chunk":
        batches = table.to_batches(max_chunksize=rnd.choice([1, 3, 7]))
        empty = pa.RecordBatch.from_pylist([], schema=table.schema)
        batches = [empty, *batches, empty]  # zero-length chunks at both ends
        if chunking == "chunks":
            data = pa.Table.from_batches(batches, schema=table.schema)
        else:
            data = pa.RecordBatchReader.from_batches(table.schema, iter(batches))
            if chunking == "spilled reader":
                kwargs["memory_limit"] = 200
    expected = {"keys": keys, "gap": gap, "max_duration": max_duration,
                "inclusive": kwargs["inclusive_gap"], "aggregations": aggregations}
    return data, kwargs, rows, expected


@pytest.mark.parametrize("seed", range(300))
def test_sessionize_equals_the_oracle_on_adversarial_input(seed: int) -> None:
    """Key-sorted, reversed and shuffled rows; equal times; int64 extremes in times, keys and
    sums; NaN, infinities and -0.0; nulls in values and per-row gaps (null, zero, negative);
    dictionary, view and large types; zero-length chunks; a spilling stream; every kind."""
    data, kwargs, rows, args = _case(seed)
    gap = args["gap"]
    passes_int64 = any(r["t"] + own > INT64_MAX for r in rows
                       for own in [gap if gap is not None else r["g"]]
                       if own is not None and own > 0)
    try:
        expected = oracle(rows, args["keys"], gap, args["max_duration"], args["inclusive"],
                          args["aggregations"])
        overflow = False
    except SumOverflow:
        overflow = True
    if passes_int64:
        with pytest.raises(ValueError, match="adding its gap passes the largest int64 time"):
            sessionstore.sessionize(data, **kwargs)
        return
    if overflow:
        with pytest.raises(ValueError, match=r"aggregation 'si': the sum of key .*, session "
                                             r"\[-?\d+, -?\d+\) is -?\d+, which does not fit"):
            sessionstore.sessionize(data, **kwargs)
        return
    got = sessionstore.sessionize(data, **kwargs)
    starts = got.column("session_start").cast(pa.int64()).to_pylist()
    ends = got.column("session_end").cast(pa.int64()).to_pylist()
    rows_out = got.drop_columns(["session_start", "session_end"]).to_pylist()
    assert len(rows_out) == len(expected)
    for i, (key, start, end, values) in enumerate(expected):
        assert tuple(rows_out[i][k] for k in args["keys"]) == key
        assert (starts[i], ends[i]) == (start, end)
        for name, value in values.items():
            assert same(rows_out[i][name], value), (name, rows_out[i][name], value)


# -- sums that do not fit, and hidden names -----------------------------------------------------


@pytest.mark.parametrize("values", [[2**63], [2**64 - 1, 1], [5, 2**63]])
def test_an_unsigned_sum_beyond_int64_names_the_aggregation_key_and_session(values) -> None:
    """Kills: a uint64 value column converted to int64 with an error that names the array
    position (``values[0]``) instead of the session, as the engine's int64 check does."""
    table = pa.table({"user": ["u"] * len(values), "t": list(range(len(values))),
                      "v": pa.array(values, pa.uint64())})
    with pytest.raises(ValueError, match=r"aggregation 's': the sum of key 'u', session "
                                         r"\[0, \d+\) is \d+, which does not fit in int64"):
        sessionstore.sessionize(table, key="user", time="t", gap=10, aggregations="s=sum:v")


def test_a_decimal_sum_beyond_its_precision_names_the_key_and_session() -> None:
    big = decimal.Decimal("9" * 36 + ".99")
    table = pa.table({"user": ["a", "b", "b"], "t": [0, 0, 1],
                      "v": pa.array([big, big, big], pa.decimal128(38, 2))})
    with pytest.raises(ValueError, match=r"aggregation 's': the sum of key 'b', session "
                                         r"\[0, 11\) is 1(9){36}\.98, which does not fit in "
                                         r"decimal128\(38, 2\)"):
        sessionstore.sessionize(table, key="user", time="t", gap=10, aggregations="s=sum:v")


@pytest.mark.parametrize("role", ["value", "key"])
def test_a_column_named_like_the_hidden_row_column_survives_spilling(role: str) -> None:
    """Kills: spill files numbering rows in a fixed hidden column, ``__sessionstore_row``, that
    collides with an input column of that name (a KeyError from Arrow)."""
    name = "__sessionstore_row"
    table = pa.table({"user": [i % 7 for i in range(400)], "t": [i * 3 for i in range(400)],
                      name: [i % 5 for i in range(400)]})
    key = name if role == "key" else "user"
    aggregations = ["n=count", f"m=max:{'user' if role == 'key' else name}"]
    in_memory = sessionstore.sessionize(table, key=key, time="t", gap=10,
                                        aggregations=aggregations)
    reader = pa.RecordBatchReader.from_batches(table.schema, table.to_batches(max_chunksize=50))
    spilled, stats = sessionstore.bounded.run(reader, key=key, time="t", gap=10,
                                              aggregations=aggregations, memory_limit=1_000)
    assert stats.partitions > 1
    assert spilled.equals(in_memory)


DECIMALS = [decimal.Decimal("12345678901234567890.1234567891"),
            decimal.Decimal("-49999999999999999999999999.999999999999"),
            decimal.Decimal("0.0000000000000000000000000000000000001")]


@pytest.mark.parametrize("value", DECIMALS)
def test_decimals_of_more_than_28_digits_keep_every_digit(value: decimal.Decimal) -> None:
    """Kills: ``Decimal.scaleb`` under Python's default context (28 significant digits), which
    rounded a decimal(38) value on its way to the engine and back, and so every sum."""
    data_type = pa.decimal128(38, -value.as_tuple().exponent)
    array = pa.array([value, None, value.copy_negate()], data_type)
    engine = sessionstore.aggspec.to_engine(array)
    assert sessionstore.aggspec.from_engine(engine, data_type).equals(array)
    table = pa.table({"user": ["u", "u", "u"], "t": [0, 1, 2],
                      "v": pa.array([value, value, None], data_type)})
    got = sessionstore.sessionize(table, key="user", time="t", gap=10,
                                  aggregations=["s=sum:v", "m=max:v", "c=collect:v"])
    assert got.column("s").to_pylist() == [_exact_double(value)]
    assert got.column("m").to_pylist() == [value]
    assert got.column("c").to_pylist() == [[value, value]]


def _exact_double(value: decimal.Decimal) -> decimal.Decimal:
    with decimal.localcontext(decimal.Context(prec=100)):
        return value + value


# -- a run without --state that fails changes nothing -------------------------------------------


def _file_size_limit() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))


def _listing(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): (b"" if p.is_dir() else p.read_bytes())
            for p in sorted(folder.rglob("*"))}


@pytest.mark.parametrize("out_name", ["out.jsonl", "out.parquet"])
@pytest.mark.parametrize("emit", ["final", "update"])
def test_a_full_disk_without_state_leaves_the_previous_output_as_it_was(tmp_path, out_name,
                                                                        emit):
    """Kills: a run without ``--state`` deleting the previous output first and writing the new
    one in place, so that a full disk (here RLIMIT_FSIZE: EFBIG, as ENOSPC takes the same path)
    left a truncated output that reads as complete, and the old output gone. ``final`` takes the
    bounded path, ``update`` the incremental one over a temporary state."""
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"user": f"u{i % 4000}", "ts": i * 1000,
                                          "page": "p" * 30}) + "\n" for i in range(16_000)))
    place = tmp_path / "place"
    place.mkdir()
    out = place / out_name
    if out_name.endswith(".parquet"):
        out.mkdir()
        pq.write_table(pa.table({"old": [1]}), out / "part-000000.parquet")
    else:
        out.write_text('{"old": 1}\n')
    before = _listing(place)
    child = subprocess.run(
        [sys.executable, "-m", "sessionstore.cli", "sessionize", str(source), "--key", "user",
         "--time", "ts", "--gap", "30m", "--agg", "pages=collect:page", "--emit", emit,
         "--out", str(out), "--no-progress"],
        env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True,
        preexec_fn=_file_size_limit, timeout=300)
    assert child.returncode == 2, child.stderr
    assert child.stderr.startswith("sessionstore: error: ") and child.stderr.count("\n") == 1
    if emit == "final":  # (the incremental path may fill the disk in its store first)
        assert child.stderr.startswith(f"sessionstore: error: OSError: [Errno 27] writing the "
                                       f"output {str(out)!r}: ")
        assert "File too large" in child.stderr
    assert _listing(place) == before  # the old output, and nothing beside it


def test_a_failed_run_into_a_missing_directory_leaves_no_directory(tmp_path, capsys):
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"user": "u", "ts": t, "v": 2**62}) + "\n"
                              for t in range(4)))
    out = tmp_path / "new" / "deeper" / "out.jsonl"
    assert main(["sessionize", str(source), "--key", "user", "--time", "ts", "--gap", "1m",
                 "--agg", "s=sum:v", "--out", str(out), "--no-progress"]) == 2
    assert "aggregation 's'" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()
    assert main(["sessionize", str(source), "--key", "user", "--time", "ts", "--gap", "1m",
                 "--out", str(out), "--no-progress"]) == 0
    assert [json.loads(line)["events"] for line in out.read_text().splitlines()] == [4]
    assert sorted(p.name for p in out.parent.iterdir()) == ["out.jsonl"]


@pytest.mark.parametrize("emit", ["final", "update"])
def test_a_successful_run_without_state_replaces_a_larger_previous_output(tmp_path, capsys,
                                                                          emit):
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"user": "u", "ts": t}) + "\n" for t in range(3)))
    out = tmp_path / "out.parquet"
    out.mkdir()
    for part in range(3):  # an older, longer output of several parts
        pq.write_table(pa.table({"old": [part]}), out / f"part-{part:06d}.parquet")
    assert main(["sessionize", str(source), "--key", "user", "--time", "ts", "--gap", "1m",
                 "--emit", emit, "--out", str(out), "--no-progress"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["part-000000.parquet"]
    assert pq.read_table(out).column("events").to_pylist()[-1] == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "out.parquet"]


# -- inputs of several files --------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
def test_a_column_empty_in_the_first_file_takes_its_type_from_the_others(tmp_path, capsys,
                                                                        fmt):
    """Kills: the dataset's schema inferred from the first file alone, where a column with no
    value is of type null, so that a valid directory was refused (the sum "cannot run over
    column 'amt' of type null", or a CSV "conversion error to null" in the next file)."""
    rows = [[{"user": "a", "ts": 0, "amt": None}, {"user": "b", "ts": 0, "amt": None}],
            [{"user": "a", "ts": 5, "amt": 3}, {"user": "b", "ts": 7, "amt": None}],
            [{"user": "a", "ts": 9, "amt": -1}]]
    folder = tmp_path / "in"
    folder.mkdir()
    for i, part in enumerate(rows):
        path = folder / f"part-{i}.{fmt}"
        if fmt == "jsonl":
            path.write_text("".join(json.dumps(r) + "\n" for r in part))
        elif fmt == "csv":
            path.write_text("user,ts,amt\n" + "".join(
                f"{r['user']},{r['ts']},{'' if r['amt'] is None else r['amt']}\n" for r in part))
        else:
            amt = pa.array([r["amt"] for r in part],
                           pa.null() if all(r["amt"] is None for r in part) else pa.int64())
            pq.write_table(pa.table({"user": [r["user"] for r in part],
                                     "ts": [r["ts"] for r in part], "amt": amt}), path)
    out = tmp_path / "out.jsonl"
    assert main(["sessionize", str(folder), "--key", "user", "--time", "ts", "--gap", "1m",
                 "--agg", "s=sum:amt", "--agg", "c=collect:amt", "--out", str(out),
                 "--no-progress"]) == 0, capsys.readouterr().err
    assert [json.loads(line) for line in out.read_text().splitlines()] == [
        {"user": "a", "session_start_ms": 0, "session_end_ms": 60_009, "s": 2, "c": [3, -1]},
        {"user": "b", "session_start_ms": 0, "session_end_ms": 60_007, "s": None, "c": []}]


# -- the CLI without --state against the oracle -------------------------------------------------

CLI_AGGREGATIONS = [("n", "count", None), ("s", "sum", "amt"), ("m", "max", "fl"),
                    ("c", "collect", "amt"), ("f", "first", "fl"), ("l", "last", "amt"),
                    ("mn", "min", "fl")]
CLI_COLUMNS = ["user", "ts", "amt", "fl", "g"]


def _write_input(folder: Path, parts: list[list[dict[str, Any]]], fmt: str,
                 rnd: random.Random) -> None:
    schema = pa.schema([("user", pa.string()), ("ts", pa.int64()), ("amt", pa.int64()),
                        ("fl", pa.float64()), ("g", pa.int64())])
    for i, part in enumerate(parts):
        path = folder / f"p{i}.{fmt}"
        newline = rnd.choice(["\n", "\r\n"])
        if fmt == "parquet":
            pq.write_table(pa.Table.from_pylist(part, schema=schema), path)
        elif fmt == "jsonl":
            path.write_bytes("".join(json.dumps(r) + newline for r in part).encode())
        else:
            with open(path, "w", newline="") as handle:
                writer = csv.writer(handle, delimiter="\t" if fmt == "tsv" else ",",
                                    lineterminator=newline)
                writer.writerow(CLI_COLUMNS)
                writer.writerows([["" if r[c] is None else r[c] for c in CLI_COLUMNS]
                                  for r in part])
    if fmt != "parquet" and rnd.random() < 0.3:
        (folder / f"empty.{fmt}").write_text(rnd.choice(["", "\n", "  \r\n"]))


def _read_output(path: Path) -> list[dict[str, Any]]:
    if path.suffix == ".parquet":
        return pq.read_table(path).to_pylist()  # type: ignore[no-any-return]
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text().splitlines()]
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    numbers = {"session_start_ms", "session_end_ms", "n", "s", "l"}
    return [{k: (None if v == "" else json.loads(v) if k == "c" else
                 float(v) if k in ("m", "f", "mn") else int(v) if k in numbers else v)
             for k, v in row.items()} for row in rows]


@pytest.mark.parametrize("seed", range(40))
def test_the_cli_without_state_equals_the_oracle(tmp_path, capsys, seed: int) -> None:
    """CSV, TSV, JSON Lines and Parquet inputs of several files (CRLF line ends, blank files,
    keys with commas, quotes and spaces, "007" beside "7"), read as a directory or a glob,
    written as JSON Lines, CSV or Parquet, in any row order."""
    rnd = random.Random(seed)
    n = rnd.choice([1, 3, 10, 40])
    base = rnd.choice([0, -(10**12), 10**7])
    rows = [{"user": rnd.choice(["a", "é", "x,y", 'q"t', " sp", "7", "007"]),
             "ts": base + rnd.randint(0, 50) * rnd.choice([1, 1000, 60_000]),
             "amt": rnd.choice([1, -5, 2**40, 3, None]),
             "fl": rnd.choice([0.5, -0.0, 0.0, 1e300, 2.5, None]),
             "g": rnd.choice([None, 0, -1, 1000, 60_000, 1_800_000])} for _ in range(n)]
    rows[0]["amt"], rows[0]["fl"] = 1, 0.5  # every column has a value: its type is known
    fmt = rnd.choice(["csv", "tsv", "jsonl", "parquet"])
    files = rnd.choice([1, 1, 3])
    parts = [rows[i::files] for i in range(files)]
    folder = tmp_path / "in"
    folder.mkdir()
    _write_input(folder, parts, fmt, rnd)
    out = tmp_path / f"out.{rnd.choice(['jsonl', 'csv', 'parquet'])}"
    argv = ["sessionize", str(folder) if rnd.random() < 0.5 else str(folder / f"*.{fmt}"),
            "--key", "user", "--time", "ts", "--out", str(out), "--no-progress"]
    gap: int | None = None
    if rnd.random() < 0.3:
        argv += ["--gap-column", "g", "--max-gap", "1h"]
    else:
        name, gap = rnd.choice([("1s", 1000), ("1m", 60_000), ("30m", 1_800_000)])
        argv += ["--gap", name]
    max_duration = rnd.choice([None, None, 60_000])
    if max_duration is not None:
        argv += ["--max-duration", "1m"]
    for name, kind, column in CLI_AGGREGATIONS:
        argv += ["--agg", f"{name}={kind}" + (f":{column}" if column else "")]
    read_order = [r for part in parts for r in part]
    expected = oracle([{**r, "t": r["ts"]} for r in read_order], ["user"], gap, max_duration,
                      True, CLI_AGGREGATIONS)
    assert main(argv) == 0, capsys.readouterr().err
    got = sorted(_read_output(out), key=lambda r: (r["user"], r["session_start_ms"]))
    assert len(got) == len(expected)
    for row, (key, start, end, values) in zip(got, expected, strict=True):
        assert (row["user"], row["session_start_ms"], row["session_end_ms"]) == (key[0], start,
                                                                                 end)
        for name, value in values.items():
            assert same(row[name], value), (name, row[name], value)


def test_an_unsigned_gap_beyond_int64_is_an_error_not_a_clamped_gap() -> None:
    """Kills: a uint64 gap column clamped to the largest int64, so that 2**64 - 1 became
    2**63 - 1 and the session silently ended there."""
    table = pa.table({"u": ["a", "a"], "t": [0, 3], "g": pa.array([2**64 - 1, 5], pa.uint64())})
    with pytest.raises(ValueError, match=r"gap column 'g' holds 18446744073709551615 at row 0, "
                                         r"beyond int64"):
        sessionstore.sessionize(table, key="u", time="t", gap="g", aggregations="n=count")


def test_a_missing_spill_dir_is_named_before_anything_is_read(tmp_path) -> None:
    events = pa.table({"u": ["a"] * 10, "t": list(range(10))})
    read = []

    def batches():
        read.append(True)
        yield from events.to_batches()

    reader = pa.RecordBatchReader.from_batches(events.schema, batches())
    with pytest.raises(ValueError, match=r"spill_dir '.*/missing' is not a directory"):
        sessionstore.sessionize(reader, key="u", time="t", gap=5, aggregations="n=count",
                                spill_dir=tmp_path / "missing")
    assert not read


@pytest.mark.parametrize("gap_type", [pa.uint64(), pa.duration("s")])
def test_a_bad_gap_after_spilling_names_its_input_row(gap_type: pa.DataType) -> None:
    """Kills: a gap error naming the row's place in its spill partition, not in the input."""
    n = 400
    bad = 2**64 - 1 if gap_type == pa.uint64() else 2**62
    gaps = [5] * n
    gaps[357] = bad
    events = pa.table({"u": [i % 9 for i in range(n)],
                       "t": pa.array(list(range(n)), pa.int64()).cast(pa.timestamp("ns")),
                       "g": pa.array(gaps, gap_type)})
    reader = pa.RecordBatchReader.from_batches(events.schema,
                                               events.to_batches(max_chunksize=40))
    with pytest.raises(ValueError, match=rf"gap column 'g' holds {bad}\b.* at row 357\b"):
        sessionstore.sessionize(reader, key="u", time="t", gap="g", aggregations="n=count",
                                memory_limit=1_000)


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_an_aggregation_over_a_column_without_a_value_says_why_it_has_no_type(tmp_path, capsys,
                                                                             fmt):
    source = tmp_path / f"in.{fmt}"
    if fmt == "csv":
        source.write_text("user,ts,amt\na,0,\na,5,\n")
    else:
        source.write_text('{"user": "a", "ts": 0, "amt": null}\n{"user": "a", "ts": 5}\n')
    assert main(["sessionize", str(source), "--key", "user", "--time", "ts", "--gap", "1m",
                 "--agg", "s=sum:amt", "--out", str(tmp_path / "out.jsonl"),
                 "--no-progress"]) == 2
    assert capsys.readouterr().err == (
        "sessionstore: error: --agg s=sum:amt: the column 'amt' holds no value where its type "
        "is read (a Parquet schema, or the first 4 MiB of each text file), so it has none; an "
        "aggregation needs a typed column\n")
    assert not (tmp_path / "out.jsonl").exists()


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_an_os_error_on_the_hidden_output_names_the_output(tmp_path, fmt) -> None:
    out = tmp_path / f"out.{fmt}"
    if fmt == "jsonl":
        out.write_text("old")
    else:
        out.mkdir()
    refused = pytest.raises(OSError, match=rf"\[Errno 13\] writing the output '{out}': "
                                           rf"Permission denied$")
    with refused, sessionstore.io.ReplacedOutput(out) as output:
        output.temporary.mkdir()
        raise PermissionError(13, "Permission denied", str(output.temporary / "part"))
    assert sorted(p.name for p in tmp_path.iterdir()) == [out.name]


@pytest.mark.parametrize("emit", ["final", "update"])
def test_a_directory_where_a_file_output_goes_is_refused_naming_it(tmp_path, capsys, emit):
    source = tmp_path / "in.jsonl"
    source.write_text('{"user": "a", "ts": 0}\n')
    out = tmp_path / "out.jsonl"
    (out / "inner").mkdir(parents=True)
    assert main(["sessionize", str(source), "--key", "user", "--time", "ts", "--gap", "1m",
                 "--emit", emit, "--out", str(out), "--no-progress"]) == 2
    assert capsys.readouterr().err == (f"sessionstore: error: output {str(out)!r} is a "
                                       f"directory: a jsonl output is a file\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "out.jsonl"]
    assert [p.name for p in out.iterdir()] == ["inner"]


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_a_file_holding_its_partition_column_is_refused_not_overridden(tmp_path, capsys, fmt):
    """Kills: a file under ``user=a/`` whose own ``user`` column says ``b`` read as user a (the
    partition value silently replaced the file's), so that b's events joined a's sessions."""
    folder = tmp_path / "in"
    (folder / "user=a").mkdir(parents=True)
    (folder / "user=c").mkdir()
    rows = [{"user": "b", "ts": 0}, {"user": "a", "ts": 1000}]
    for part, data in [("user=a", rows), ("user=c", None)]:
        path = folder / part / f"p.{fmt}"
        if fmt == "jsonl":
            path.write_text("".join(json.dumps(r) + "\n" for r in data or [{"ts": 5}]))
        elif fmt == "csv":
            path.write_text("user,ts\nb,0\na,1000\n" if data else "ts\n5\n")
        else:
            pq.write_table(pa.Table.from_pylist(data or [{"ts": 5}]), path)
    out = tmp_path / "out.jsonl"
    assert main(["sessionize", str(folder), "--key", "user", "--time", "ts", "--gap", "1m",
                 "--out", str(out), "--no-progress"]) == 2
    assert capsys.readouterr().err == (
        f"sessionstore: error: input file {str(folder / 'user=a' / f'p.{fmt}')!r} holds a "
        f"column 'user', which is also its partition (user=a/): which of the two holds the "
        f"value is ambiguous; remove the column from the file or the directory level\n")
    assert not out.exists()


@pytest.mark.parametrize("png", ["hist.txt", "hist", "folder.png"])
@pytest.mark.parametrize("state", [False, True])
def test_a_bad_summary_png_is_refused_before_the_run(tmp_path, capsys, png, state):
    """Kills: ``--summary-png hist.txt`` (or a directory) failing in matplotlib after the run,
    with exit status 2 ("nothing was done") though the output was written and the state
    committed, and a message that did not name the flag."""
    source = tmp_path / "in.jsonl"
    source.write_text('{"user": "a", "ts": 0}\n')
    (tmp_path / "folder.png").mkdir()
    out = tmp_path / "out.jsonl"
    assert main(["sessionize", str(source), "--key", "user", "--time", "ts", "--gap", "1m",
                 "--summary", "--summary-png", str(tmp_path / png), "--out", str(out),
                 "--no-progress", *(["--state", str(tmp_path / "st")] if state else [])]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"sessionstore: error: --summary-png {str(tmp_path / png)!r}: ")
    assert err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder.png", "in.jsonl"]


@pytest.mark.parametrize("text", ['{"user": "a", "ts": 5}', '\n{"user": "a", "ts": 5}',
                                  '{"user": "a", "ts": 5}   '])
def test_a_json_lines_file_of_one_record_without_a_final_newline_is_read(tmp_path, capsys,
                                                                        text):
    """Kills: pyarrow's dataset reader (newlines_in_values=False) reading a file of one record
    and no final newline as one row of nulls, refused as 'key column is null'."""
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.jsonl").write_text('{"user": "a", "ts": 0}\n{"user": "b", "ts": 1}')
    (folder / "b.jsonl").write_text(text)
    out = tmp_path / "out.jsonl"
    assert main(["sessionize", str(folder), "--key", "user", "--time", "ts", "--gap", "1m",
                 "--out", str(out), "--no-progress"]) == 0, capsys.readouterr().err
    assert [(r["user"], r["events"]) for r in map(json.loads, out.read_text().splitlines())] \
        == [("a", 2), ("b", 1)]


def test_nan_in_a_csv_float_column_is_nan_not_a_missing_value(tmp_path, capsys) -> None:
    """Kills: pyarrow's CSV default of reading "NaN" and "nan" as null, so that a NaN (a value,
    which makes a sum NaN, as in Spark) was skipped as missing; sessionstore's own CSV output
    writes NaN that way. Empty fields and NULL-like markers stay null."""
    source = tmp_path / "in.csv"
    source.write_text("user,ts,v\na,0,1.5\na,1,NaN\na,2,\na,3,NULL\nb,0,nan\nb,1,-2\nc,0,-nan\n")
    out = tmp_path / "out.jsonl"
    assert main(["sessionize", str(source), "--key", "user", "--time", "ts", "--gap", "1m",
                 "--agg", "s=sum:v", "--agg", "c=collect:v", "--out", str(out),
                 "--no-progress"]) == 0, capsys.readouterr().err
    assert [(r["user"], r["s"], r["c"]) for r in map(json.loads, out.read_text().splitlines())] \
        == [("a", "NaN", [1.5, "NaN"]), ("b", "NaN", ["NaN", -2.0]), ("c", "NaN", ["NaN"])]


def test_what_a_killed_run_left_beside_the_output_is_swept_by_the_next(tmp_path, capsys):
    """A run SIGKILLed while writing leaves its hidden sibling; the next run without --state to
    the same output removes those of processes that are gone, and keeps a live one's."""
    source = tmp_path / "in.jsonl"
    source.write_text('{"user": "a", "ts": 0}\n')
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    live = str(os.getppid())
    left = [tmp_path / f".out.parquet.inprogress-{gone}.parquet",
            tmp_path / f".out.parquet.replaced-{gone}"]
    for folder in left:
        folder.mkdir()
        (folder / "part-000000.parquet").write_bytes(b"partial")
    running = tmp_path / f".out.parquet.inprogress-{live}.parquet"
    running.mkdir()
    assert main(["sessionize", str(source), "--key", "user", "--time", "ts", "--gap", "1m",
                 "--out", str(tmp_path / "out.parquet"), "--no-progress"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["in.jsonl", "out.parquet", running.name])


@pytest.mark.parametrize("stream", [False, True])
def test_a_null_in_a_dictionary_keys_values_is_a_null_key_named_at_its_row(stream: bool) -> None:
    """Kills: a null key that sits in a dictionary column's values (Arrow's ``null_count``
    counts only null indices) passing the null-key check and failing later in numpy with an
    IndexError that names nothing."""
    keys = pa.DictionaryArray.from_arrays(pa.array([0, 0, 1, 0], pa.int32()),
                                          pa.array(["a", None]))
    table = pa.table({"k": keys, "t": [0, 1, 2, 3]})
    data: Any = table
    if stream:
        data = pa.RecordBatchReader.from_batches(table.schema,
                                                 table.to_batches(max_chunksize=2))
    with pytest.raises(ValueError, match=r"key column 'k' is null at row 2: every event needs "
                                         r"a key"):
        sessionstore.sessionize(data, key="k", time="t", gap=5, aggregations="n=count",
                                memory_limit=1 if stream else None)
    # a dictionary holding a null that no row uses has no null key
    unused = pa.DictionaryArray.from_arrays(pa.array([0, 0], pa.int32()), pa.array(["a", None]))
    assert sessionstore.sessionize(pa.table({"k": unused, "t": [0, 1]}), key="k", time="t",
                                   gap=5, aggregations="n=count").column("n").to_pylist() == [2]


def test_categorical_value_columns_are_aggregated_as_their_values(tmp_path, capsys) -> None:
    """Kills: a dictionary-encoded value column (pandas' categorical, which pandas' Parquet
    files keep) refused as 'only atomic columns' by the CLI and by sessionize."""
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame({"user": pd.Categorical(["a", "b", "a"]), "ts": [0, 1000, 2000],
                          "page": pd.Categorical(["x", "y", None])})
    aggregations = ["f=first:page", "c=collect:page", "m=max:page"]
    got = sessionstore.sessionize(frame, key="user", time="ts", gap=60_000,
                                  aggregations=aggregations)
    assert got.select(["f", "c", "m"]).to_pylist() == [
        {"f": "x", "c": ["x"], "m": "x"}, {"f": "y", "c": ["y"], "m": "y"}]
    assert got.schema.field("user").type == pa.dictionary(pa.int8(), pa.string())
    source = tmp_path / "in.parquet"
    frame.to_parquet(source)
    out = tmp_path / "out.jsonl"
    assert main(["sessionize", str(source), "--key", "user", "--time", "ts", "--gap", "1m",
                 *(f"--agg={a}" for a in aggregations), "--out", str(out),
                 "--no-progress"]) == 0, capsys.readouterr().err
    assert [json.loads(line) for line in out.read_text().splitlines()] == [
        {"user": "a", "session_start_ms": 0, "session_end_ms": 62_000, "f": "x", "c": ["x"],
         "m": "x"},
        {"user": "b", "session_start_ms": 1000, "session_end_ms": 61_000, "f": "y", "c": ["y"],
         "m": "y"}]


@pytest.mark.parametrize("out_name", ["out.jsonl", "out.parquet"])
def test_an_output_through_a_symlink_is_written_where_the_link_points(tmp_path, capsys,
                                                                      out_name):
    source = tmp_path / "in.jsonl"
    source.write_text('{"user": "a", "ts": 0}\n')
    target = tmp_path / "elsewhere" / out_name
    target.parent.mkdir()
    if out_name.endswith(".parquet"):
        target.mkdir()
        pq.write_table(pa.table({"old": [1]}), target / "part-000000.parquet")
    else:
        target.write_text("old\n")
    link = tmp_path / out_name
    link.symlink_to(target)
    assert main(["sessionize", str(source), "--key", "user", "--time", "ts", "--gap", "1m",
                 "--out", str(link), "--no-progress"]) == 0, capsys.readouterr().err
    assert link.is_symlink()
    table = pq.read_table(target) if out_name.endswith(".parquet") else None
    events = table.column("events").to_pylist() if table is not None else \
        [json.loads(line)["events"] for line in target.read_text().splitlines()]
    assert events == [1]
    assert sorted(p.name for p in target.parent.iterdir()) == [out_name]


@pytest.mark.parametrize("state", [False, True])
def test_iso_dates_in_a_csv_time_column_are_read_as_midnight(tmp_path, capsys, state):
    """Kills: a CSV time column of ISO dates, which pyarrow reads as date32, refused ('not
    date32[day]') though the help promises ISO-8601 strings and the same dates in JSON Lines
    (strings) are read."""
    source = tmp_path / "in.csv"
    source.write_text("user,ts\na,2024-01-01\na,2024-01-02\nb,2024-01-05\n")
    out = tmp_path / "out.jsonl"
    assert main(["sessionize", str(source), "--key", "user", "--time", "ts", "--gap", "1d",
                 "--out", str(out), "--no-progress",
                 *(["--state", str(tmp_path / "st")] if state else [])]) == 0, \
        capsys.readouterr().err
    day = 86_400_000
    first = 19_723 * day  # 2024-01-01
    assert sorted((r["user"], r["session_start_ms"], r["session_end_ms"], r["events"])
                  for r in map(json.loads, out.read_text().splitlines())) == [
        ("a", first, first + 2 * day, 2), ("b", first + 4 * day, first + 5 * day, 1)]


def test_a_custom_result_without_a_json_form_names_the_aggregation_and_session() -> None:
    """Kills: json.dumps' bare TypeError ('Object of type bytes is not JSON serializable')."""
    table = pa.table({"k": ["a", "a"], "t": [0, 1], "b": [b"x", b"y"]})
    collect = sessionstore.aggregations.collect(lambda v: v["b"])
    with pytest.raises(ValueError, match=r"aggregation 'c': the result for key 'a', session "
                                         r"\[0, 6\) has no JSON form: Object of type bytes"):
        sessionstore.sessionize(table, key="k", time="t", gap=5, aggregations={"c": collect})
