"""An adversarial run against ``sessionstore.sessionize`` on the shapes of Arrow data a user
hands it (sliced tables whose arrays start at an offset, many tiny and empty chunks, a dictionary
per chunk, several time types) and the duration objects a pandas or numpy user passes: each
answer is checked against an oracle written here (a sort and a sweep per key, sharing no code
with the project).
"""

from __future__ import annotations

import datetime as dt
import random
from collections import defaultdict
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sessionstore
from sessionstore import SessionWindows
from sessionstore.bounded import run

# -- the oracle ---------------------------------------------------------------------------------


def oracle(events: list[dict[str, Any]], gap: int | None, max_duration: int | None,
           inclusive: bool) -> list[tuple[Any, int, int, int, int | None, list[Any], Any]]:
    """``(key, start, end, count, sum of v, collected w, first w)`` per session, sorted by key
    and start. An event is a dict of ``k``, ``t``, ``g`` (its own gap when ``gap`` is None),
    ``v``, ``w``; its list position is its arrival."""
    by_key: dict[Any, list[tuple[int, int, int]]] = defaultdict(list)
    for i, e in enumerate(events):
        own = gap if gap is not None else e["g"]
        if own is None or own <= 0:
            continue  # Spark drops a row whose gap is null or not positive
        by_key[e["k"]].append((e["t"], i, own))
    out = []
    for key, rows in by_key.items():
        rows.sort()
        sessions: list[list[Any]] = []
        for t, i, own in rows:
            last = sessions[-1] if sessions else None
            if last is not None:
                near = t <= last[2] if inclusive else t < last[2]
                if near and (max_duration is None or t < last[1] + max_duration):
                    last[2] = max(last[2], t + own)
                    last[3].append(i)
                    continue
            sessions.append([key, t, t + own, [i]])
        for key_, start, reach, members in sessions:
            end = reach if max_duration is None else min(reach, start + max_duration)
            vs = [events[i]["v"] for i in members if events[i]["v"] is not None]
            ws = [events[i]["w"] for i in members]
            out.append((key_, start, end, len(members), sum(vs) if vs else None,
                        [w for w in ws if w is not None], ws[0]))
    out.sort(key=lambda s: (s[0], s[1]))
    return out


AGGREGATIONS = ["n=count", "s=sum:v", "ws=collect:w", "fw=first:w"]


def answer(table: pa.Table) -> list[tuple[Any, ...]]:
    starts = table.column("session_start").cast(pa.int64()).to_pylist()
    ends = table.column("session_end").cast(pa.int64()).to_pylist()
    return [(r["k"], s, e, r["n"], r["s"], r["ws"], r["fw"])
            for r, s, e in zip(table.to_pylist(), starts, ends, strict=True)]


# -- sliced, chunked and per-chunk-dictionary input against the oracle -------------------------

#: time column types: (Arrow type, ticks per stored value, time_unit to pass)
TIME_TYPES = {
    "int64": (pa.int64(), 1, None),
    "int32": (pa.int32(), 1, None),
    "uint32": (pa.uint32(), 1, None),
    "int16 with time_unit": (pa.int16(), 1, "s"),
    "timestamp[s]": (pa.timestamp("s"), 1, None),
    "timestamp[ns, tz]": (pa.timestamp("ns", tz="Asia/Kolkata"), 1, None),
    "date32": (pa.date32(), 86_400, None),
}
KEY_FORMS = ["string", "large_string", "string_view", "dictionary per chunk",
             "dictionary of views per chunk", "int8", "uint64", "binary", "bool"]


def _key_values(form: str, codes: list[int]) -> list[Any]:
    if form in ("string", "large_string", "string_view") or form.startswith("dictionary"):
        return [["", "a", "a\x00", "B", "é"][c] for c in codes]
    if form == "int8":
        return [[-128, 127, 0, -1, 5][c] for c in codes]
    if form == "uint64":
        return [[2**64 - 1, 0, 2**63, 2**63 - 1, 7][c] for c in codes]
    if form == "binary":
        return [[b"", b"\x00", b"\xff", b"a", b"a\x00"][c] for c in codes]
    return [c % 2 == 0 for c in codes]


def _key_array(form: str, values: list[Any], rnd: random.Random) -> pa.Array:
    if form == "large_string":
        return pa.array(values, pa.large_string())
    if form == "string_view":
        return pa.array(values, pa.string()).cast(pa.string_view())
    if form.startswith("dictionary"):
        # each chunk its own dictionary, in its own order, with values it does not use
        used = sorted(set(values), key=lambda _: rnd.random())
        spare = ["zz", "unused"][:rnd.randint(0, 2)]
        dictionary = used + spare
        indices = pa.array([dictionary.index(v) for v in values], pa.int32())
        words = pa.array(dictionary, pa.string())
        if form == "dictionary of views per chunk":
            words = words.cast(pa.string_view())
        return pa.DictionaryArray.from_arrays(indices, words)
    data_type = {"string": pa.string(), "int8": pa.int8(), "uint64": pa.uint64(),
                 "binary": pa.binary(), "bool": pa.bool_()}[form]
    return pa.array(values, data_type)


@st.composite
def shaped_inputs(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(0, 40))
    return {
        "codes": draw(st.lists(st.integers(0, 4), min_size=n, max_size=n)),
        "times": draw(st.lists(st.integers(0, 40), min_size=n, max_size=n)),
        "gaps": draw(st.lists(st.one_of(st.none(), st.integers(-2, 9)), min_size=n,
                              max_size=n)),
        "v": draw(st.lists(st.one_of(st.none(), st.integers(-(2**40), 2**40)), min_size=n,
                           max_size=n)),
        "w": draw(st.lists(st.one_of(st.none(), st.sampled_from(["x", "", "yy"])),
                           min_size=n, max_size=n)),
        "key_form": draw(st.sampled_from(KEY_FORMS)),
        "time_type": draw(st.sampled_from(sorted(TIME_TYPES))),
        "dynamic": draw(st.booleans()),
        "gap": draw(st.integers(1, 9)),
        "max_duration": draw(st.one_of(st.none(), st.integers(1, 15))),
        "inclusive": draw(st.booleans()),
        # rows cut off before and after (the arrays of the slice start at an offset)
        "head": draw(st.integers(0, 9)),
        "tail": draw(st.integers(0, 3)),
        "form": draw(st.sampled_from(["table", "record batch", "reader", "spilling reader",
                                      "spilling table"])),
        "seed": draw(st.integers(0, 2**32 - 1)),
    }


def _built(case: dict[str, Any]) -> tuple[Any, dict[str, Any], list[dict[str, Any]]]:
    """The input as the case shapes it, the sessionize arguments, and the events the oracle
    sees (the rows of the slice, in row order, times in ticks)."""
    rnd = random.Random(case["seed"])
    n = len(case["times"])
    data_type, ticks_per_value, time_unit = TIME_TYPES[case["time_type"]]
    # the rows cut off by the slice: other keys, other times, a null value and a null gap
    head, tail = case["head"], case["tail"]
    codes = [rnd.randrange(5) for _ in range(head)] + case["codes"] + [0] * tail
    times = [rnd.randrange(41) for _ in range(head)] + case["times"] + [3] * tail
    gaps = [None] * head + case["gaps"] + [5] * tail
    # a date32 is read in seconds: the per-row gaps (in days here) are Arrow durations
    gap_ticks = [None if g is None else g * ticks_per_value for g in gaps]
    gap_type = pa.int64() if ticks_per_value == 1 else pa.duration("ms")
    gap_stored = gap_ticks if ticks_per_value == 1 else \
        [None if g is None else g * 1000 for g in gap_ticks]
    v = [None] * head + case["v"] + [1] * tail
    w = ["cut"] * head + case["w"] + ["cut"] * tail
    total = head + n + tail
    keys = _key_values(case["key_form"], codes)
    time_values = pa.array(times, pa.int64())
    if pa.types.is_timestamp(data_type):
        time_array = time_values.cast(data_type)
    elif pa.types.is_date32(data_type):
        time_array = time_values.cast(pa.int32()).view(pa.date32())
    else:
        time_array = time_values.cast(data_type)
    # cut into chunks of 0 to 4 rows (empty ones included), each chunk built alone so that a
    # dictionary key has a dictionary per chunk
    bounds = [0]
    while bounds[-1] < total:
        bounds.append(min(total, bounds[-1] + rnd.choice([0, 1, 1, 2, 3, 4])))
    batches = []
    schema = None
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        columns = {"k": _key_array(case["key_form"], keys[a:b], rnd),
                   "t": time_array.slice(a, b - a),
                   "g": pa.array(gap_stored[a:b], gap_type),
                   "v": pa.array(v[a:b], pa.int64()),
                   "w": pa.array(w[a:b], pa.string())}
        batch = pa.RecordBatch.from_pydict(columns)
        schema = schema or batch.schema
        batches.append(batch)
    if schema is None:
        schema = pa.RecordBatch.from_pydict({
            "k": _key_array(case["key_form"], [], rnd), "t": time_array.slice(0, 0),
            "g": pa.array([], gap_type), "v": pa.array([], pa.int64()),
            "w": pa.array([], pa.string())}).schema
    if case["key_form"].startswith("dictionary"):
        batches = [pa.RecordBatch.from_arrays(b.columns, schema=schema) for b in batches]
    whole = pa.Table.from_batches(batches, schema=schema)
    kept = whole.slice(head, n)  # every column of the slice starts at an offset
    data: Any = kept
    kwargs: dict[str, Any] = {}
    if case["form"] == "record batch":  # a slice of one batch: its arrays at an offset
        combined = whole.combine_chunks().to_batches()
        data = (combined[0] if combined else pa.RecordBatch.from_pylist([], schema=schema)
                ).slice(head, n)
    elif case["form"] in ("reader", "spilling reader"):
        data = pa.RecordBatchReader.from_batches(schema, kept.to_batches())
        if case["form"] == "spilling reader":
            kwargs["memory_limit"] = 300
    elif case["form"] == "spilling table":  # a table over the memory limit is streamed too
        kwargs["memory_limit"] = 300
    kwargs.update(key="k", time="t", aggregations=AGGREGATIONS,
                  inclusive_gap=case["inclusive"], time_unit=time_unit,
                  max_duration=case["max_duration"])
    kwargs["gap"] = "g" if case["dynamic"] else case["gap"]
    events = [{"k": keys[i], "t": times[i] * ticks_per_value, "g": gap_ticks[i], "v": v[i],
               "w": w[i]} for i in range(head, head + n)]
    if ticks_per_value != 1:  # dates: the fixed gap and the maximum duration in days
        kwargs["gap"] = "g" if case["dynamic"] else dt.timedelta(days=case["gap"])
        if case["max_duration"] is not None:
            kwargs["max_duration"] = f"{case['max_duration']} days"
    return data, kwargs, events


@settings(max_examples=200, deadline=None)
@given(shaped_inputs())
def test_sliced_chunked_and_per_chunk_dictionary_input_equals_the_oracle(
        case: dict[str, Any]) -> None:
    """Kills: an array read from its buffer's start instead of its offset (a slice's times,
    keys or values shifted), a validity bitmap read without the offset, codes taken from each
    chunk's own dictionary, an empty chunk that ends the input early, a per-row gap or a
    duration in days mistaken for one in the time column's ticks, and a key dictionary of
    string views refused as no key type ('dictionary<values=string_view>... cannot be a
    key', though a view key is one)."""
    data, kwargs, events = _built(case)
    ticks = TIME_TYPES[case["time_type"]][1]
    gap = None if case["dynamic"] else case["gap"] * ticks
    max_duration = None if case["max_duration"] is None else case["max_duration"] * ticks
    got = sessionstore.sessionize(data, **kwargs)
    assert answer(got) == oracle(events, gap, max_duration, case["inclusive"])


# -- duration objects: numpy and pandas -------------------------------------------------------


def _times(unit: str, values: list[int]) -> pa.Table:
    return pa.table({"k": ["a"] * len(values), "t": pa.array(values, pa.timestamp(unit))})


def _bounds(table: pa.Table) -> list[tuple[int, int, int]]:
    starts = table.column("session_start").cast(pa.int64()).to_pylist()
    ends = table.column("session_end").cast(pa.int64()).to_pylist()
    return list(zip(starts, ends, table.column("n").to_pylist(), strict=True))


@pytest.mark.parametrize(("unit", "times", "gap", "ticks"), [
    # numpy makes timedelta64 an integer: 1500 ns must not be read as 1500 ms
    ("ms", [0, 1, 3], np.timedelta64(1_000_000, "ns"), 1),
    ("ms", [0, 2, 5], np.timedelta64(2, "ms"), 2),
    ("ns", [0, 1_400, 2_900], np.timedelta64(1500, "ns"), 1500),
    ("ms", [0, 60_000, 1_900_000], np.timedelta64(30, "m"), 1_800_000),
    ("s", [0, 86_400, 3 * 86_400], np.timedelta64(1, "D"), 86_400),
    ("us", [0, 5, 2_000_000], np.timedelta64(2, "s"), 2_000_000),
])
def test_a_numpy_timedelta64_gap_is_its_duration_not_a_count_of_ticks(unit, times, gap, ticks
                                                                       ) -> None:
    """Kills: ``timedelta64`` taken as a bare int (numpy makes it one), so that 1500 ns is a
    gap of 1500 ms, and 30 minutes a ``TypeError`` from ``int()`` naming nothing."""
    table = _times(unit, times)
    got = sessionstore.sessionize(table, key="k", time="t", gap=gap, aggregations="n=count")
    want = sessionstore.sessionize(table, key="k", time="t", gap=ticks, aggregations="n=count")
    assert _bounds(got) == _bounds(want)


def test_numpy_timedelta64_max_duration_and_max_gap_are_durations() -> None:
    table = pa.table({"k": ["a"] * 4, "t": pa.array([0, 50, 100, 150], pa.timestamp("s")),
                      "g": pa.array([60, 60, 60, 60], pa.int64())})
    got = sessionstore.sessionize(table, key="k", time="t", gap="g",
                                  max_gap=np.timedelta64(1, "m"),
                                  max_duration=np.timedelta64(2, "m"), aggregations="n=count")
    assert _bounds(got) == [(0, 120, 3), (150, 210, 1)]
    with pytest.raises(ValueError, match="gap column 'g' holds 60 at row 0, which exceeds "
                                         "max_gap = 59"):
        sessionstore.sessionize(table, key="k", time="t", gap="g",
                                max_gap=np.timedelta64(59, "s"), aggregations="n=count")


def test_an_integer_time_column_takes_a_numpy_duration_only_with_time_unit() -> None:
    table = pa.table({"k": ["a"] * 3, "t": [0, 60, 200]})
    got = sessionstore.sessionize(table, key="k", time="t", gap=np.timedelta64(1, "m"),
                                  time_unit="s", aggregations="n=count")
    assert _bounds(got) == [(0, 120, 2), (200, 260, 1)]
    with pytest.raises(ValueError, match=r"gap .* is a duration, but the time column 't' holds "
                                         r"plain integers: give time_unit"):
        sessionstore.sessionize(table, key="k", time="t", gap=np.timedelta64(1, "m"),
                                aggregations="n=count")


@pytest.mark.parametrize(("gap", "message"), [
    (np.timedelta64("NaT"), "gap is .*NaT.*, not a duration"),
    (np.timedelta64(1, "Y"), "a year has no fixed length"),
    (np.timedelta64(2, "M"), "a month has no fixed length"),
    (np.timedelta64(5), "has no time unit"),
    (np.timedelta64(1500, "us"), "gap .* is not a whole number of ms, the time column's unit"),
])
def test_a_numpy_duration_that_is_no_whole_number_of_ticks_is_refused_naming_the_gap(
        gap, message) -> None:
    with pytest.raises(ValueError, match=message):
        sessionstore.sessionize(_times("ms", [0, 1]), key="k", time="t", gap=gap,
                                aggregations="n=count")


def test_a_pandas_timedelta_keeps_its_nanoseconds() -> None:
    """Kills: a pandas ``Timedelta`` read as a ``datetime.timedelta``, whose microseconds drop
    its nanoseconds: a 1.5 µs gap on nanosecond times became 1 µs."""
    pd = pytest.importorskip("pandas")
    table = _times("ns", [0, 1_400, 2_900])
    got = sessionstore.sessionize(table, key="k", time="t", gap=pd.Timedelta(nanoseconds=1500),
                                  aggregations="n=count")
    assert _bounds(got) == [(0, 4_400, 3)]
    with pytest.raises(ValueError, match="is not a whole number of us"):
        sessionstore.sessionize(_times("us", [0, 1]), key="k", time="t",
                                gap=pd.Timedelta(nanoseconds=1500), aggregations="n=count")


@pytest.mark.parametrize(("value", "millis"), [
    (np.timedelta64(30, "m"), 1_800_000), (np.timedelta64(2_000_000, "ns"), 2),
    (np.timedelta64(1, "W"), 604_800_000), (dt.timedelta(seconds=1), 1_000)])
def test_the_engine_reads_numpy_durations_as_durations(value, millis) -> None:
    """The engine's gap goes through the same conversion (kills: ``timedelta64(2_000_000,
    'ns')`` read as two million milliseconds)."""
    assert SessionWindows(gap_ms=value).gap_ms == millis


@pytest.mark.parametrize("value", [np.timedelta64(1500, "ns"), np.timedelta64(5, "ns")])
def test_the_engine_refuses_a_numpy_duration_finer_than_a_millisecond(value) -> None:
    pd = pytest.importorskip("pandas")
    for gap in (value, pd.Timedelta(value)):
        with pytest.raises(ValueError, match="gap_ms is not a whole number of milliseconds"):
            SessionWindows(gap_ms=gap)


# -- per-row gaps that are durations ----------------------------------------------------------


def test_a_negative_duration_gap_finer_than_the_time_unit_drops_its_row() -> None:
    """Kills: the whole-tick check run over gaps that are dropped anyway, so that a negative
    gap of -1.5 ms on millisecond times failed the call instead of dropping the row, as a null
    or non-positive gap does (and as the CLI does)."""
    table = pa.table({"k": ["a"] * 4, "t": pa.array([0, 5, 9, 30], pa.timestamp("ms")),
                      "g": pa.array([10_000_000, -1_500_000, None, -500], pa.duration("ns"))})
    sessions, stats = run(table, key="k", time="t", gap="g", aggregations="n=count")
    assert _bounds(sessions) == [(0, 10, 1)]
    assert stats.invalid_gap_dropped == 3
    with pytest.raises(ValueError, match=r"gap column 'g' holds 1500000 ns at row 0, not a "
                                         r"whole number of ms"):
        run(table.set_column(2, "g", pa.array([1_500_000, 1, 1, 1], pa.duration("ns"))),
            key="k", time="t", gap="g", aggregations="n=count")


# -- dates: an int is no duration -------------------------------------------------------------


def _dates() -> pa.Table:
    return pa.table({"k": ["a"] * 3, "d": pa.array([dt.date(2024, 1, 1), dt.date(2024, 1, 2),
                                                    dt.date(2024, 1, 5)], pa.date32()),
                     "g": pa.array([1, 1, 1], pa.int64())})


@pytest.mark.parametrize(("argument", "extra"), [
    ("gap", {"gap": 1}), ("max_duration", {"gap": "1d", "max_duration": 2}),
    ("max_gap", {"gap": "g", "max_gap": 3})])
def test_an_int_duration_for_a_date_column_is_refused_naming_it(argument, extra) -> None:
    """Kills: an int gap on a date column read as seconds (the ticks a date32 is read in), so
    that ``gap=1``, one day to anyone reading the column, cut every date into its own session;
    the same for ``max_duration`` and ``max_gap``."""
    table = _dates()
    if argument == "max_gap":
        table = table.set_column(2, "g", pa.array([86_400] * 3, pa.duration("s")))
    with pytest.raises(ValueError, match=rf"{argument} 1?\d is an int, but the time column 'd' "
                                         rf"holds dates, which are read as s, not days"):
        sessionstore.sessionize(table, key="k", time="d", aggregations="n=count", **extra)


def test_a_gap_column_of_ints_for_a_date_column_is_refused_before_any_row_is_read() -> None:
    batches = iter([_dates().to_batches()[0]])
    reader = pa.RecordBatchReader.from_batches(_dates().schema, batches)
    with pytest.raises(ValueError, match="gap column 'g' holds integers, but the time column "
                                         "'d' holds dates, which are read as s, not days"):
        sessionstore.sessionize(reader, key="k", time="d", gap="g", aggregations="n=count")
    assert next(batches, None) is not None  # nothing was read


def test_durations_that_say_their_unit_sessionize_dates() -> None:
    table = _dates()
    want = [(1_704_067_200, 1_704_240_000, 2), (1_704_412_800, 1_704_499_200, 1)]
    for gap in ("1d", dt.timedelta(days=1), np.timedelta64(1, "D")):
        got = sessionstore.sessionize(table, key="k", time="d", gap=gap, aggregations="n=count")
        assert _bounds(got) == want
    by_column = table.set_column(2, "g", pa.array([86_400_000] * 3, pa.duration("ms")))
    got = sessionstore.sessionize(by_column, key="k", time="d", gap="g", aggregations="n=count")
    assert _bounds(got) == want


# -- no rows ----------------------------------------------------------------------------------


def test_a_pandas_frame_filtered_to_no_rows_has_no_sessions() -> None:
    """Kills: the untyped (null) column Arrow makes of an empty object column refused as a key
    type, so that a pipeline whose filter kept no events failed instead of giving no
    sessions."""
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame({"user": ["a", "b"], "ts": pd.to_datetime([0, 1], unit="s"),
                          "v": [1, 2]})
    none = frame[frame["user"] == "nobody"]
    for data in (none, pa.Table.from_pandas(none, preserve_index=False)):
        got = sessionstore.sessionize(data, key="user", time="ts", gap="30m",
                                      aggregations=["n=count", "s=sum:v"])
        assert got.num_rows == 0
        assert got.schema.names == ["user", "session_start", "session_end", "n", "s"]
    both = pa.table({"a": pa.nulls(0), "b": pa.array([], pa.string()),
                     "t": pa.array([], pa.int64())})
    assert sessionstore.sessionize(both, key=["a", "b"], time="t", gap=1,
                                   aggregations="n=count").num_rows == 0
    # with rows, an untyped key column is a null key, named at its row
    with pytest.raises(ValueError, match="key column 'k' is null at row 0"):
        sessionstore.sessionize(pa.table({"k": pa.nulls(2), "t": [1, 2]}), key="k", time="t",
                                gap=1, aggregations="n=count")


# -- a dictionary key aggregated --------------------------------------------------------------


@pytest.mark.parametrize("form", ["table", "spilling reader", "pandas categorical"])
def test_a_dictionary_key_is_aggregated_as_its_values(form) -> None:
    """Kills: a dictionary (categorical) key column refused as 'not atomic' by an aggregation
    that names it, though a dictionary column is documented as aggregated as its values (and
    the CLI aggregates a categorical Parquet key)."""
    rnd = random.Random(35)
    users = [rnd.choice(["b", "a", "c"]) for _ in range(40)]
    times = [rnd.randrange(60) for _ in range(40)]
    table = pa.table({"k": pa.array(users).dictionary_encode(), "t": times,
                      "v": [1] * 40, "w": users})
    kwargs: dict[str, Any] = {}
    data: Any = table
    if form == "spilling reader":
        data = pa.RecordBatchReader.from_batches(table.schema, table.to_batches(max_chunksize=3))
        kwargs["memory_limit"] = 300
    elif form == "pandas categorical":
        data = table.to_pandas()
        assert str(data["k"].dtype) == "category"
    got = sessionstore.sessionize(data, key="k", time="t", gap=4, aggregations=[
        "n=count", "s=sum:v", "ws=collect:k", "fw=first:k", "lo=min:k", "hi=max:k"], **kwargs)
    assert pa.types.is_dictionary(got.schema.field("k").type)  # as a key it stays as it is
    assert got.schema.field("fw").type == pa.string()
    events = [{"k": u, "t": t, "g": None, "v": 1, "w": u}
              for u, t in zip(users, times, strict=True)]
    want = oracle(events, 4, None, True)
    assert answer(got) == want
    assert got.column("lo").to_pylist() == got.column("hi").to_pylist() == \
        [key for key, *_ in want]
