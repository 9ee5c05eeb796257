"""sessionstore.sessionize: inputs, time types, arguments, output types, errors and spilling."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sessionstore
from sessionstore import (
    EmitStrategy,
    InMemorySessionStore,
    SessionAggregator,
    SessionWindows,
    aggregations,
    aggspec,
)
from sessionstore.bounded import run, sessionize
from sessionstore.bounded.scan import scan_sessions, session_starts

EVENTS = pa.table({"user": ["a", "b", "a", "a", "b", "a"],
                   "ts": [0, 5, 10, 100, 6, 125],
                   "amount": [1, 2, 3, 4, 5, 6]})


def test_sessionize_is_exported_from_the_package() -> None:
    assert sessionstore.sessionize is sessionize


def test_the_answer_whatever_the_row_order() -> None:
    out = sessionize(EVENTS, key="user", time="ts", gap=30,
                     aggregations=["n=count", "total=sum:amount"])
    assert out.column_names == ["user", "session_start", "session_end", "n", "total"]
    assert out.to_pylist() == [
        {"user": "a", "session_start": 0, "session_end": 40, "n": 2, "total": 4},
        {"user": "a", "session_start": 100, "session_end": 155, "n": 2, "total": 10},
        {"user": "b", "session_start": 5, "session_end": 36, "n": 2, "total": 7},
    ]
    reversed_rows = EVENTS.take(pa.array(range(EVENTS.num_rows - 1, -1, -1)))
    assert sessionize(reversed_rows, key="user", time="ts", gap=30,
                      aggregations=["n=count", "total=sum:amount"]).equals(out)


def test_cli_strings_and_spark_mapping_are_the_same_language() -> None:
    cli = sessionize(EVENTS, key="user", time="ts", gap=30,
                     aggregations=["n=count", "hi=max:amount", "all=collect:amount"])
    spark = sessionize(EVENTS, key="user", time="ts", gap=30,
                       aggregations={"n": "count", "hi": ("max", "amount"),
                                     "all": ("collect", "amount")})
    assert cli.equals(spark)
    one = sessionize(EVENTS, key="user", time="ts", gap=30, aggregations="n=count")
    assert one.column("n").to_pylist() == [2, 2, 2]


def test_every_input_form_gives_the_same_answer(tmp_path: Path) -> None:
    pd = pytest.importorskip("pandas")
    pl = pytest.importorskip("polars")
    want = sessionize(EVENTS, key="user", time="ts", gap=30, aggregations=["n=count"])
    pq.write_table(EVENTS, tmp_path / "events.parquet")
    forms = [EVENTS.to_batches()[0],
             pa.RecordBatchReader.from_batches(EVENTS.schema, EVENTS.to_batches(max_chunksize=2)),
             ds.dataset(tmp_path / "events.parquet"),
             pd.DataFrame(EVENTS.to_pydict()),
             pl.DataFrame(EVENTS.to_pydict())]
    for form in forms:
        got = sessionize(form, key="user", time="ts", gap=30, aggregations=["n=count"])
        # polars strings arrive as large_string, kept as the input's key type
        assert got.to_pylist() == want.to_pylist(), type(form)


def test_unsupported_data_is_refused_by_name() -> None:
    with pytest.raises(TypeError, match="data must be a pyarrow Table"):
        sessionize([1, 2], key="user", time="ts", gap=30, aggregations="n=count")


def test_timestamps_keep_their_unit_and_zone() -> None:
    zone = pa.timestamp("us", tz="Europe/Paris")
    base = 1_700_000_000_000_000
    table = pa.table({"k": [1, 1, 1], "t": pa.array([base, base + 1, base + 600_000_002], zone)})
    out = sessionize(table, key="k", time="t", gap="10 minutes", aggregations="n=count")
    assert out.schema.field("session_start").type == zone
    # 600_000_001 us after the second event: one microsecond past the gap
    assert out.column("session_start").cast(pa.int64()).to_pylist() == [base, base + 600_000_002]
    assert out.column("session_end").cast(pa.int64()).to_pylist() == [
        base + 1 + 600_000_000, base + 600_000_002 + 600_000_000]
    assert out.column("n").to_pylist() == [2, 1]
    delta = sessionize(table, key="k", time="t", gap=dt.timedelta(microseconds=600_000_000),
                       aggregations="n=count")
    assert delta.equals(out)


def test_dates_are_read_as_midnight_timestamps() -> None:
    table = pa.table({"k": ["x"] * 3, "d": pa.array([dt.date(2024, 1, 1), dt.date(2024, 1, 2),
                                                     dt.date(2024, 1, 5)], pa.date32())})
    out = sessionize(table, key="k", time="d", gap="1d", aggregations="n=count")
    assert out.schema.field("session_start").type == pa.timestamp("s")
    assert out.column("n").to_pylist() == [2, 1]
    assert out.column("session_end").to_pylist()[0] == dt.datetime(2024, 1, 3)


def test_integer_times_take_time_unit_for_durations() -> None:
    table = pa.table({"k": [1, 1, 1], "t": [0, 1_799, 3_600]})
    with pytest.raises(ValueError, match="time_unit"):
        sessionize(table, key="k", time="t", gap="30m", aggregations="n=count")
    seconds = sessionize(table, key="k", time="t", gap="30m", time_unit="s",
                         aggregations="n=count")
    assert seconds.to_pylist() == [
        {"k": 1, "session_start": 0, "session_end": 3_599, "n": 2},
        {"k": 1, "session_start": 3_600, "session_end": 5_400, "n": 1}]
    assert seconds.schema.field("session_start").type == pa.int64()
    # an integer gap is in the column's own unit, with or without time_unit
    assert sessionize(table, key="k", time="t", gap=1_800, aggregations="n=count").equals(seconds)
    with pytest.raises(ValueError, match="not a whole number of s"):
        sessionize(table, key="k", time="t", gap="1500ms", time_unit="s", aggregations="n=count")
    with pytest.raises(ValueError, match="time_unit must be one of"):
        sessionize(table, key="k", time="t", gap=5, time_unit="minutes", aggregations="n=count")


def test_time_types_that_cannot_be_times_are_refused() -> None:
    table = pa.table({"k": [1], "t": [0.5]})
    with pytest.raises(TypeError, match="time column 't' has type double"):
        sessionize(table, key="k", time="t", gap=5, aggregations="n=count")
    stamped = pa.table({"k": [1], "t": pa.array([0], pa.timestamp("ms"))})
    with pytest.raises(ValueError, match="contradicts"):
        sessionize(stamped, key="k", time="t", gap=5, time_unit="s", aggregations="n=count")


def test_dynamic_gap_from_a_column_needs_no_max_gap() -> None:
    # a short-gap event inside a long-gap session does not shorten it: 19 joins (19 <= 20)
    table = pa.table({"k": ["a"] * 4, "t": [0, 15, 19, 40], "g": [20, 2, 2, 5]})
    out = sessionize(table, key="k", time="t", gap="g", aggregations="n=count")
    assert [(r["session_start"], r["session_end"], r["n"]) for r in out.to_pylist()] == [
        (0, 21, 3), (40, 45, 1)]
    with pytest.raises(ValueError, match="exceeds max_gap = 10"):
        sessionize(table, key="k", time="t", gap="g", max_gap=10, aggregations="n=count")


def test_invalid_own_gaps_are_dropped_and_counted() -> None:
    table = pa.table({"k": ["a"] * 4, "t": [0, 1, 2, 3], "g": [5, None, 0, -1]})
    out, stats = run(table, key="k", time="t", gap="g", aggregations="n=count")
    assert out.column("n").to_pylist() == [1]
    assert stats.invalid_gap_dropped == 3
    assert stats.events_in == 4


def test_gap_column_of_durations() -> None:
    table = pa.table({"k": ["a"] * 3, "t": pa.array([0, 1_000, 9_000], pa.timestamp("ms")),
                      "g": pa.array([2, 2, 2], pa.duration("s"))})
    out = sessionize(table, key="k", time="t", gap="g", aggregations="n=count")
    assert out.column("n").to_pylist() == [2, 1]


def test_bad_gap_and_duration_arguments_name_themselves() -> None:
    with pytest.raises(ValueError, match="gap 'nope' is neither a duration"):
        sessionize(EVENTS, key="user", time="ts", gap="nope", aggregations="n=count")
    with pytest.raises(ValueError, match="gap must be > 0"):
        sessionize(EVENTS, key="user", time="ts", gap=0, aggregations="n=count")
    with pytest.raises(TypeError, match="gap must be an int"):
        sessionize(EVENTS, key="user", time="ts", gap=1.5, aggregations="n=count")
    with pytest.raises(ValueError, match="max_duration must be > 0"):
        sessionize(EVENTS, key="user", time="ts", gap=5, max_duration=-1,
                   aggregations="n=count")
    with pytest.raises(ValueError, match="max_gap applies to a gap column only"):
        sessionize(EVENTS, key="user", time="ts", gap=5, max_gap=10, aggregations="n=count")


def test_columns_and_nulls_are_named() -> None:
    with pytest.raises(ValueError, match="key column 'who' is not in the input"):
        sessionize(EVENTS, key="who", time="ts", gap=5, aggregations="n=count")
    with pytest.raises(ValueError, match="time column 'when' is not in the input"):
        sessionize(EVENTS, key="user", time="when", gap=5, aggregations="n=count")
    with pytest.raises(ValueError, match="names column 'price'"):
        sessionize(EVENTS, key="user", time="ts", gap=5, aggregations="p=sum:price")
    with pytest.raises(ValueError, match="output name 'user' is also a key"):
        sessionize(EVENTS, key="user", time="ts", gap=5, aggregations="user=count")
    nulls = pa.table({"k": ["a", None], "t": [0, 1]})
    with pytest.raises(ValueError, match="key column 'k' is null at row 1"):
        sessionize(nulls, key="k", time="t", gap=5, aggregations="n=count")
    nulls = pa.table({"k": ["a", "b"], "t": [0, None]})
    with pytest.raises(ValueError, match="time column 't' is null at row 1"):
        sessionize(nulls, key="k", time="t", gap=5, aggregations="n=count")


def test_integer_sum_overflow_is_an_error_naming_aggregation_key_and_session() -> None:
    table = pa.table({"k": ["big", "big", "small"], "t": [0, 1, 0], "v": [2**62, 2**62, 1]})
    with pytest.raises(ValueError, match=r"aggregation 'total': the sum of key 'big', session "
                                         r"\[0, 6\) is 9223372036854775808"):
        sessionize(table, key="k", time="t", gap=5, aggregations="total=sum:v")


def test_output_types_are_the_cli_types() -> None:
    table = pa.table({
        "k": ["a", "a", "b"], "t": [0, 1, 2],
        "d": pa.array([decimal.Decimal("1.25"), decimal.Decimal("2.50"), None],
                      pa.decimal128(5, 2)),
        "s": ["x", "a", None],
        "w": pa.array([5, 3, 7], pa.timestamp("ms")),
        "i": pa.array([1, 2, 3], pa.int8()),
        "f": pa.array([1.5, 2.5, None], pa.float32()),
    })
    specs = ["ds=sum:d", "smin=min:s", "smax=max:s", "wmin=min:w", "isum=sum:i",
             "fsum=sum:f", "sc=collect:s", "sf=first:s", "dl=last:d", "imax=max:i"]
    out = sessionize(table, key="k", time="t", gap=5, aggregations=specs)
    planned = aggspec.plan(aggspec.parse_specs(specs), table.schema)
    assert out.schema.remove(0).remove(0).remove(0) == pa.schema(planned.output_fields)
    assert out.to_pylist() == [
        {"k": "a", "session_start": 0, "session_end": 6, "ds": decimal.Decimal("3.75"),
         "smin": "a", "smax": "x", "wmin": dt.datetime(1970, 1, 1, 0, 0, 0, 3000), "isum": 3,
         "fsum": 4.0, "sc": ["x", "a"], "sf": "x", "dl": decimal.Decimal("2.50"), "imax": 2},
        {"k": "b", "session_start": 2, "session_end": 7, "ds": None, "smin": None,
         "smax": None, "wmin": dt.datetime(1970, 1, 1, 0, 0, 0, 7000), "isum": 3,
         "fsum": None, "sc": [], "sf": None, "dl": None, "imax": 3},
    ]


def test_float_min_and_max_follow_the_engine_order_rule() -> None:
    # the engine's min/max over values in time order: -0.0 is below 0.0 whatever the order
    # (aggregations.smaller/larger), and NaN is above every value, as in Spark
    table = pa.table({"k": ["z", "z", "n", "n", "m", "m"], "t": [0, 1, 0, 1, 0, 1],
                      "x": [0.0, -0.0, float("nan"), 1.0, 2.0, float("nan")]})
    out = sessionize(table, key="k", time="t", gap=5,
                     aggregations=["lo=min:x", "hi=max:x"]).to_pylist()
    by_key = {r["k"]: r for r in out}
    assert math.copysign(1, by_key["z"]["lo"]) == -1 and math.copysign(1, by_key["z"]["hi"]) == 1
    assert by_key["n"]["lo"] == 1.0 and math.isnan(by_key["n"]["hi"])
    assert by_key["m"]["lo"] == 2.0 and math.isnan(by_key["m"]["hi"])
    # long sessions too, where numpy's vectorised fmin/fmax pick either zero
    for first, second in ((0.0, -0.0), (-0.0, 0.0)):
        long = pa.table({"k": ["z"] * 40, "t": list(range(40)),
                         "x": [first] * 20 + [second] * 20})
        row = sessionize(long, key="k", time="t", gap=5,
                         aggregations=["lo=min:x", "hi=max:x"]).to_pylist()[0]
        assert math.copysign(1, row["lo"]) == -1
        assert math.copysign(1, row["hi"]) == 1


class _Pages(aggregations.Aggregation):
    """A user aggregation: the pages of a session, with the key."""

    def initial(self) -> Any:
        return []

    def add(self, key: Any, value: Any, timestamp_ms: int, seq: int, acc: Any) -> Any:
        return [*acc, [key, value["page"], timestamp_ms, seq]]

    def merge(self, key: Any, acc1: Any, acc2: Any) -> Any:
        return acc1 + acc2


def test_custom_aggregations_fold_each_session_in_order() -> None:
    table = pa.table({"k": ["a", "a", "a"], "t": [10, 0, 10], "page": ["/x", "/y", "/z"]})
    out = sessionize(table, key="k", time="t", gap=50,
                     aggregations={"pages": _Pages(), "n": "count"})
    assert out.schema.field("pages").type == pa.string()
    assert json.loads(out.column("pages")[0].as_py()) == [["a", "/y", 0, 1], ["a", "/x", 10, 0],
                                                           ["a", "/z", 10, 2]]


def test_several_key_columns_order_the_output_by_key_then_start() -> None:
    table = pa.table({"a": [2, 1, 1, 2, 1], "b": ["y", "z", "x", "x", "x"],
                      "t": [0, 0, 50, 0, 0]})
    out = sessionize(table, key=["a", "b"], time="t", gap=10, aggregations="n=count")
    assert [(r["a"], r["b"], r["session_start"]) for r in out.to_pylist()] == [
        (1, "x", 0), (1, "x", 50), (1, "z", 0), (2, "x", 0), (2, "y", 0)]


def test_memory_limit_forms() -> None:
    for limit in (1 << 30, "1GB", "512 MiB", "2gb"):
        sessionize(EVENTS, key="user", time="ts", gap=5, aggregations="n=count",
                   memory_limit=limit)
    with pytest.raises(ValueError, match="memory_limit 'lots' is not a size"):
        sessionize(EVENTS, key="user", time="ts", gap=5, aggregations="n=count",
                   memory_limit="lots")
    with pytest.raises(ValueError, match="memory_limit must be > 0"):
        sessionize(EVENTS, key="user", time="ts", gap=5, aggregations="n=count",
                   memory_limit=0)


def _many(rows: int, keys: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table({"u": rng.integers(0, keys, rows).astype(str),
                     "t": rng.integers(-10_000, 10_000, rows),
                     "v": rng.integers(-100, 100, rows),
                     "x": rng.normal(size=rows)})


def test_a_stream_over_the_memory_limit_spills_and_cleans_up(tmp_path: Path) -> None:
    table = _many(20_000, 300, 1)
    aggs = ["n=count", "s=sum:v", "xs=sum:x", "c=collect:v", "f=first:x", "l=last:v"]
    want = sessionize(table, key="u", time="t", gap=40, aggregations=aggs)
    reader = pa.RecordBatchReader.from_batches(table.schema,
                                               table.to_batches(max_chunksize=1_000))
    spill_dir = tmp_path / "spill"
    spill_dir.mkdir()
    got, stats = run(reader, key="u", time="t", gap=40, aggregations=aggs,
                     memory_limit=200_000, spill_dir=spill_dir)
    assert stats.partitions > 1 and stats.spilled_bytes > 0
    assert got.equals(want)
    assert list(spill_dir.iterdir()) == []


def test_spill_files_go_when_a_partition_fails(tmp_path: Path) -> None:
    table = _many(5_000, 50, 2).append_column("big", pa.array([2**62] * 5_000))
    with pytest.raises(ValueError, match="does not fit in int64"):
        run(table, key="u", time="t", gap=40, aggregations="s=sum:big",
            memory_limit=50_000, spill_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []


@st.composite
def sorted_events(draw: st.DrawFn) -> tuple[Any, ...]:
    n = draw(st.integers(1, 60))
    wide = draw(st.booleans())
    span = 2**62 if wide else 50
    codes = np.sort(np.array(draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))))
    times = np.array(draw(st.lists(st.integers(-span, span), min_size=n, max_size=n)))
    order = np.lexsort((times, codes))
    codes, times = codes[order].astype(np.int64), times[order].astype(np.int64)
    fixed = draw(st.booleans())
    gaps = np.full(n, draw(st.integers(1, 30))) if fixed else \
        np.array(draw(st.lists(st.integers(1, 30), min_size=n, max_size=n)))
    return codes, times, times + gaps.astype(np.int64), fixed, draw(st.booleans())


@settings(max_examples=300)
@given(sorted_events())
def test_array_boundaries_equal_the_sequential_rule(case: tuple[Any, ...]) -> None:
    codes, times, ends, fixed, inclusive = case
    want = scan_sessions(codes, times, ends, inclusive, 0)
    got = session_starts(codes, times, ends, inclusive=inclusive, fixed_gap=fixed,
                         max_duration=None)
    assert got.tolist() == want.tolist()


def test_nulls_in_a_stream_name_the_input_row_also_when_spilling(tmp_path: Path) -> None:
    times: list[Any] = list(range(3_000))
    times[2_500] = None
    table = pa.table({"k": [i % 7 for i in range(3_000)], "t": pa.array(times, pa.int64())})
    for limit in (None, 20_000):  # in memory, and spilled long before row 2,500
        reader = pa.RecordBatchReader.from_batches(table.schema,
                                                   table.to_batches(max_chunksize=100))
        with pytest.raises(ValueError, match="time column 't' is null at row 2500"):
            sessionize(reader, key="k", time="t", gap=5, aggregations="n=count",
                       memory_limit=limit, spill_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []


@st.composite
def one_key_events(draw: st.DrawFn) -> tuple[list[list[Any]], int, bool]:
    times = sorted(draw(st.lists(st.integers(-50, 50), min_size=1, max_size=40)))
    events = [[t, seq, t + draw(st.integers(1, 30)), None] for seq, t in enumerate(times)]
    return events, draw(st.integers(1, 40)), draw(st.booleans())


@settings(max_examples=300)
@given(one_key_events())
def test_the_engines_cut_is_the_sorted_rule(case: tuple[list[list[Any]], int, bool]) -> None:
    # the engine's per-key re-cut (engine/max_duration.py) is a second form of the rule for
    # sorted events; this pins the two together
    from sessionstore.bounded.scan import session_bounds
    from sessionstore.engine.cuts import cut

    events, max_duration, inclusive = case
    times = np.array([e[0] for e in events], dtype=np.int64)
    ends = np.array([e[2] for e in events], dtype=np.int64)
    first = scan_sessions(np.zeros(len(events), dtype=np.int64), times, ends, inclusive,
                          max_duration)
    starts_at = np.flatnonzero(first).astype(np.int64)
    start, end = session_bounds(starts_at, times, ends, max_duration, fixed_gap=False)
    cuts = cut(events, max_duration, inclusive)
    assert [(c[0], c[1]) for c in cuts] == list(zip(start.tolist(), end.tolist(), strict=True))
    assert [c[3] for c in cuts] == [*starts_at[1:].tolist(), len(events)]


def test_a_float_sum_of_negative_zeros_is_zero_as_spark_adds() -> None:
    # Spark's sum is coalesce(sum, 0) + value: 0 + -0.0 is 0.0; so are the engine's sum_of and
    # the CLI's, on every path
    table = pa.table({"k": ["a", "a", "b", "c", "c"], "t": [0, 1, 0, 0, 1],
                      "x": [-0.0, -0.0, -0.0, -0.0, 1.5]})
    out = {r["k"]: r["s"] for r in sessionize(table, key="k", time="t", gap=5,
                                              aggregations=["s=sum:x"]).to_pylist()}
    assert [repr(out[k]) for k in "abc"] == ["0.0", "0.0", "1.5"]
    planned = aggspec.plan(aggspec.from_mapping({"s": ("sum", "x")}), table.schema)
    rows = table.to_pylist()
    for batched in (False, True):
        windows = SessionWindows(5)
        engine = SessionAggregator(InMemorySessionStore(retention_ms=windows.retention_ms),
                                   windows, planned.aggregation,
                                   emit=EmitStrategy.ON_WINDOW_CLOSE, watermark="external")
        values = [tuple(r[c] for c in planned.value_columns) for r in rows]
        if batched:
            engine.process_batch([r["k"] for r in rows], values, [r["t"] for r in rows])
        else:
            for r, v in zip(rows, values, strict=True):
                engine.process(r["k"], v, r["t"])
        got = {e.session.key: e.value["s"] for e in engine.advance_watermark(100)}
        assert [repr(got[k]) for k in "abc"] == ["0.0", "0.0", "1.5"], batched
