"""Adversarial inputs to the bounded path, each checked against a brute-force sessionizer.

The brute force shares no code with ``sessionstore.bounded``: per key, events sorted by (time,
input order), a new session when an event is past the reach (the largest ``t + gap`` so far;
``>`` with ``inclusive_gap``, ``>=`` without) or at or past ``start + max_duration``; a session
is ``[first t, min(reach, start + max_duration))`` (docs/semantics.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from sessionstore.bounded import run, sessionize


def brute(rows: Sequence[dict[str, Any]], key: Sequence[str], gap: int,
          max_duration: int | None = None, inclusive: bool = True,
          value: str | None = None) -> list[tuple[Any, ...]]:
    """``(key..., start, end, count, values in order)`` per session, sorted by key and start."""
    by_key: dict[tuple[Any, ...], list[tuple[int, int, Any]]] = {}
    for i, row in enumerate(rows):
        by_key.setdefault(tuple(row[k] for k in key), []).append(
            (row["t"], i, row[value] if value else None))
    out = []
    for k, events in by_key.items():
        events.sort(key=lambda e: (e[0], e[1]))
        session: list[tuple[int, int, Any]] = []
        start = reach = 0
        for event in events:
            t = event[0]
            past = t > reach if inclusive else t >= reach
            if not session or past or (max_duration is not None and t >= start + max_duration):
                if session:
                    out.append(_close(k, start, reach, max_duration, session))
                session, start, reach = [], t, t + gap
            session.append(event)
            reach = max(reach, t + gap)
        if session:
            out.append(_close(k, start, reach, max_duration, session))
    return sorted(out, key=lambda s: (*s[:len(key)], s[len(key)]))


def _close(key: tuple[Any, ...], start: int, reach: int, max_duration: int | None,
           session: list[tuple[int, int, Any]]) -> tuple[Any, ...]:
    end = reach if max_duration is None else min(reach, start + max_duration)
    return (*key, start, end, len(session), [e[2] for e in session])


def got(table: pa.Table, key: Sequence[str], value: bool = False) -> list[tuple[Any, ...]]:
    return [(*(r[k] for k in key), r["session_start"], r["session_end"], r["n"],
             r["v"] if value else [None] * r["n"]) for r in table.to_pylist()]


@pytest.mark.parametrize("data_type", [pa.int8(), pa.int16(), pa.uint8(), pa.uint16()])
def test_narrow_integer_keys_spanning_their_type_lose_no_event(data_type: pa.DataType) -> None:
    # Killed bug: key codes were computed as (column - min) in the column's own narrow type,
    # which wraps for int8/int16 keys spanning more than half their range: the codes went
    # negative, the output was out of key order, and past 2 buckets (> 131072 rows) the rows
    # of the wrapped keys fell in a bucket never visited: half the events silently vanished.
    info = np.iinfo(data_type.to_pandas_dtype())
    n = 140_000
    picks = np.array([info.max, info.min, (int(info.min) + int(info.max)) // 2])
    keys = picks[np.arange(n) % 3].astype(data_type.to_pandas_dtype())
    table = pa.table({"k": pa.array(keys, data_type), "t": np.arange(n, dtype=np.int64) // 7})
    out = sessionize(table, key="k", time="t", gap=10, aggregations="n=count")
    assert sum(out.column("n").to_pylist()) == n
    assert got(out, ["k"]) == brute(table.to_pylist(), ["k"], 10)
    two = sessionize(table.append_column("j", pa.array(["x"] * n)), key=["k", "j"],
                     time="t", gap=10, aggregations="n=count")
    assert two.drop_columns("j").equals(out)


def test_uint64_keys_beyond_float_precision_keep_their_values() -> None:
    # Killed bug: a uint64 key that is its own code was decoded as int64 code + uint64
    # minimum, which numpy computes in float64: 2**60 + 1 and 2**60 + 2 both came out as
    # 2**60.
    base = 2**60 + 1
    for values in ([base, base + 1, base, base + 7], [2**63 + 3, 2**64 - 1, 2**63 + 3, 2**64 - 2]):
        table = pa.table({"k": pa.array(values, pa.uint64()), "t": [0, 1, 2, 3]})
        out = sessionize(table, key="k", time="t", gap=10, aggregations="n=count")
        assert got(out, ["k"]) == brute(table.to_pylist(), ["k"], 10)


def test_dictionary_keys_over_several_spill_partitions(tmp_path: Path) -> None:
    # Killed bug: the sessions of several spill partitions were ordered with Table.sort_by,
    # which refuses dictionary columns: a dictionary (categorical) key of a dataset or stream
    # larger than memory_limit ended in a bare ArrowTypeError.
    rng = np.random.default_rng(7)
    parts = []
    for i in range(3):
        users = pa.array([f"u{x}" for x in rng.integers(0, 40, 1_500)]).dictionary_encode()
        part = pa.table({"k": users, "t": rng.integers(0, 200_000, 1_500),
                         "v": rng.integers(-5, 5, 1_500)})
        pq.write_table(part, tmp_path / f"p{i}.parquet")
        parts.append(part)
    schema = pa.schema([("k", pa.dictionary(pa.int32(), pa.string())), ("t", pa.int64()),
                        ("v", pa.int64())])
    dataset = ds.dataset(tmp_path, schema=schema)
    out = sessionize(dataset, key="k", time="t", gap=3_000, memory_limit=20_000,
                     aggregations=["n=count", "v=collect:v"])
    assert out.schema.field("k").type == schema.field("k").type
    rows = [r for p in parts for r in p.to_pylist()]
    assert got(out, ["k"], value=True) == brute(rows, ["k"], 3_000, value="v")
    reader = pa.RecordBatchReader.from_batches(
        schema, pa.concat_tables([p.cast(schema) for p in parts]).to_batches(
            max_chunksize=500))
    two = sessionize(reader, key=["k", "v"], time="t", gap=3_000, memory_limit=20_000,
                     aggregations="n=count")
    assert got(two, ["k", "v"]) == brute(rows, ["k", "v"], 3_000)


def test_a_duration_gap_column_too_large_for_the_time_unit_is_an_error() -> None:
    # Killed bug: a gap column of durations coarser than the time column was scaled with an
    # int64 multiplication that wrapped: 10**11 s of gap on nanosecond times became a gap of
    # some 7.8e18 ns (a session to the year 2216) without a word, and a very negative gap
    # could wrap to a positive one and keep an event that must be dropped.
    times = pa.array([0, 5, 5_000_000_000], pa.timestamp("ns"))
    table = pa.table({"k": [1, 1, 1], "t": times,
                      "g": pa.array([10**11, 5, 1], pa.duration("s"))})
    with pytest.raises(ValueError, match=r"gap column 'g' holds 100000000000 s at row 0"):
        sessionize(table, key="k", time="t", gap="g", aggregations="n=count")
    wrapped = -(2**63 // 10**9) - 1  # times 10**9 wraps to a positive number of ns
    table = pa.table({"k": [1, 1, 1], "t": times,
                      "g": pa.array([wrapped, 1, 1], pa.duration("s"))})
    out = sessionize(table, key="k", time="t", gap="g", aggregations="n=count")
    assert out.to_pylist() == [
        {"k": 1, "session_start": dt_ns(5), "session_end": dt_ns(1_000_000_005), "n": 1},
        {"k": 1, "session_start": dt_ns(5_000_000_000), "session_end": dt_ns(6_000_000_000),
         "n": 1}]


def dt_ns(value: int) -> Any:
    return pa.scalar(value, pa.timestamp("ns")).as_py()


def test_a_null_key_is_reported_at_its_input_row_after_dropped_gaps() -> None:
    # Killed bug: with a gap column, rows with a null or non-positive gap were filtered out
    # before the keys were checked, so a null key was reported at its row among the kept
    # rows (row 1 here), not at its input row.
    table = pa.table({"k": ["a", "a", "a", None], "t": [0, 1, 2, 3], "g": [None, -1, 5, 5]})
    with pytest.raises(ValueError, match=r"key column 'k' is null at row 3"):
        sessionize(table, key="k", time="t", gap="g", aggregations="n=count")
    table = pa.table({"k": pa.array([7, 9, 7, 7], pa.int16()), "t": [0, 1, 2, 30],
                      "g": [None, 5, 5, 5], "v": [1, 2, 3, 4]})
    out = sessionize(table, key="k", time="t", gap="g", aggregations=["n=count", "v=collect:v"])
    assert out.to_pylist() == [
        {"k": 7, "session_start": 2, "session_end": 7, "n": 1, "v": [3]},
        {"k": 7, "session_start": 30, "session_end": 35, "n": 1, "v": [4]},
        {"k": 9, "session_start": 1, "session_end": 6, "n": 1, "v": [2]}]


def test_a_pandas_index_can_be_the_key() -> None:
    # Killed bug: the DataFrame's index was thrown away, so a frame indexed by its key (as
    # after set_index("user")) was refused with "key column 'user' is not in the input".
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame({"user": ["b", "a", "b"], "ts": [0, 5, 50]})
    flat = sessionize(frame, key="user", time="ts", gap=10, aggregations="n=count")
    assert sessionize(frame.set_index("user"), key="user", time="ts", gap=10,
                      aggregations="n=count").equals(flat)
    assert got(flat.rename_columns(["user", "session_start", "session_end", "n"]),
               ["user"]) == brute([{"user": u, "t": t} for u, t in
                                   zip(frame["user"], frame["ts"], strict=True)], ["user"], 10)
    # an unnamed index stays out of the way, and a column named like the index wins
    assert sessionize(frame.set_index(pd.Index([7, 8, 9])), key="user", time="ts", gap=10,
                      aggregations="n=count").equals(flat)
    same = frame.set_index(pd.Index([0, 0, 0], name="ts"))
    assert sessionize(same.assign(ts=frame["ts"].to_numpy()), key="user", time="ts", gap=10,
                      aggregations="n=count").equals(flat)


def test_a_tiny_memory_limit_with_many_keys_keeps_few_files_open() -> None:
    # Killed bug: the number of spill partitions grew with (input size / memory_limit) with
    # no cap: memory_limit=1000 on 20k rows of 3000 keys opened one file per key and failed
    # with a bare OSError "Too many open files" (past the soft limit, 1024 on many systems),
    # and memory_limit=1 asked for tens of millions of partitions (a counter list of
    # hundreds of MB).
    resource = pytest.importorskip("resource")
    fd_dir = Path("/proc/self/fd")
    if not fd_dir.is_dir():
        pytest.skip("needs /proc/self/fd to count open files")
    rng = np.random.default_rng(3)
    n = 20_000
    table = pa.table({"k": rng.integers(0, 3_000, n) * 7919, "t": rng.integers(0, 10**6, n)})
    expected = sessionize(table, key="k", time="t", gap=500, aggregations="n=count")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(list(fd_dir.iterdir())) + 300, hard))
    try:
        for limit in (1_000, 1):
            reader = pa.RecordBatchReader.from_batches(
                table.schema, table.to_batches(max_chunksize=5_000))
            out = sessionize(reader, key="k", time="t", gap=500, aggregations="n=count",
                             memory_limit=limit)
            assert out.equals(expected)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    rows = table.to_pylist()
    assert got(expected, ["k"]) == brute(rows, ["k"], 500)


def test_a_partition_over_the_limit_is_still_split_again() -> None:
    # The cap on partitions and the floor under re-splitting must not stop a partition over
    # a (not tiny) memory limit from being split again: two keys of 60k rows each land in
    # two partitions of ~7 MB of working set each, over a 4 MB limit.
    n = 120_000
    table = pa.table({"k": np.arange(n) % 2, "t": (np.arange(n) * 7_919) % 1_000_000})
    expected = sessionize(table, key="k", time="t", gap=40, aggregations="n=count")
    reader = pa.RecordBatchReader.from_batches(table.schema,
                                               table.to_batches(max_chunksize=20_000))
    out, stats = run(reader, key="k", time="t", gap=40, aggregations="n=count",
                     memory_limit=4_000_000)
    assert out.equals(expected)
    assert stats.spilled_bytes > 2 * table.nbytes  # spilled, then split again


@pytest.mark.parametrize("view", ["string_view", "binary_view"])
def test_view_string_keys_are_keys(view: str) -> None:
    # Killed bug: string_view and binary_view keys (as Arrow 16+ producers emit) were refused
    # with "cannot be a key (use ... strings, binary ...)": Arrow can neither sort nor take
    # them, so they are read as large strings and binaries.
    if not hasattr(pa, view):
        pytest.skip(f"pyarrow has no {view}")
    plain = pa.table({"k": ["b", "a", "b", "c", "a"], "t": [0, 3, 40, 2, 9]})
    if view == "binary_view":
        plain = plain.set_column(0, "k", plain.column("k").cast(pa.binary()))
    viewed = plain.set_column(0, "k", plain.column("k").cast(getattr(pa, view)()))
    expected = sessionize(plain, key="k", time="t", gap=10, aggregations="n=count")
    for limit in (None, 1):
        reader = pa.RecordBatchReader.from_batches(viewed.schema,
                                                   viewed.to_batches(max_chunksize=2))
        out = sessionize(reader, key="k", time="t", gap=10, aggregations="n=count",
                         memory_limit=limit)
        large = pa.large_string() if view == "string_view" else pa.large_binary()
        assert out.schema.field("k").type == large  # as Arrow's kernels sort and take them
        assert out.set_column(0, "k", out.column("k").cast(plain.schema.field("k").type)
                              ).equals(expected)
    assert sessionize(viewed, key="k", time="t", gap=10, aggregations="n=count"
                      ).column("k").type == large
    assert got(expected, ["k"]) == brute(plain.to_pylist(), ["k"], 10)


@pytest.mark.parametrize("name", ["session_start", "session_end"])
def test_a_key_named_like_a_session_column_is_refused(name: str) -> None:
    # Killed bug: a key column called session_start (or session_end) gave a result with two
    # columns of that name, which table.column(name) cannot tell apart; an aggregation of
    # that name was already refused.
    table = pa.table({name: ["a", "a", "b"], "t": [0, 1, 2]})
    with pytest.raises(ValueError, match=f"key column {name!r} has the name of an output"):
        sessionize(table, key=name, time="t", gap=10, aggregations="n=count")
