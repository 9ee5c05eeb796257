"""Dynamic gaps (issue 12): the windows' contract, argument errors, and the gap column forms."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionstore import (
    EmitStrategy,
    InMemorySessionStore,
    SessionAggregator,
    SessionWindows,
    aggregations,
)
from sessionstore.engine import required_retention_ms
from sessionstore.timeutil import INT64_MAX, INT64_MIN


def engine(windows: SessionWindows, **options) -> SessionAggregator:
    store = InMemorySessionStore(retention_ms=required_retention_ms(windows, 0, "external"))
    return SessionAggregator(store, windows, aggregations.collect(),
                             emit=EmitStrategy.ON_WINDOW_CLOSE, watermark="external", **options)


def rows(emits) -> list[tuple]:
    return [(e.session.key, e.session.start, e.session.end, e.value) for e in emits]


# -- the windows ------------------------------------------------------------------------------


def test_dynamic_windows_attributes_and_retention():
    w = SessionWindows(None, 5, max_gap_ms="1 minute")
    assert (w.dynamic, w.gap_ms, w.gap_fn, w.max_gap_ms) == (True, None, None, 60_000)
    assert w.retention_ms == 60_005
    fixed = SessionWindows(10, 5)
    assert (fixed.dynamic, fixed.gap_ms, fixed.max_gap_ms, fixed.max_duration_ms) == \
        (False, 10, 10, None)
    assert SessionWindows(10, max_gap_ms=10).max_gap_ms == 10

    def gap_fn(key, value, t):
        return value

    w = SessionWindows(gap_fn, max_gap_ms=30, max_duration_ms=dt.timedelta(seconds=1))
    assert (w.dynamic, w.gap_fn, w.max_duration_ms) == (True, gap_fn, 1000)
    assert w.retention_ms == 30 + 1000  # max_gap + grace + max_duration
    assert required_retention_ms(w, 7, "event_time") == 1037
    assert required_retention_ms(w, 7, "external") == 1030
    assert w.merge_bounds(100, 20) == (100, 120)
    with pytest.raises(ValueError, match="needs the event's gap_ms"):
        w.merge_bounds(100)


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"gap_ms": None}, ValueError, "max_gap_ms is required with a dynamic gap_ms"),
        ({"gap_ms": lambda k, v, t: 1}, ValueError, "max_gap_ms is required"),
        ({"gap_ms": None, "max_gap_ms": 0}, ValueError, "max_gap_ms must be > 0, got 0"),
        ({"gap_ms": None, "max_gap_ms": 1.5}, TypeError, "max_gap_ms"),
        ({"gap_ms": 10, "max_gap_ms": 20}, ValueError,
         "max_gap_ms must equal a fixed gap_ms = 10"),
        ({"gap_ms": 10, "max_duration_ms": 0}, ValueError, "max_duration_ms must be > 0, got 0"),
        ({"gap_ms": 10, "max_duration_ms": "1 parsec"}, ValueError, "max_duration_ms"),
        ({"gap_ms": None, "max_gap_ms": 10, "grace_ms": 5, "retention_ms": 14}, ValueError,
         r"retention_ms must be >= max_gap_ms \+ grace_ms = 15, got 14"),
        ({"gap_ms": 10, "max_duration_ms": 100, "retention_ms": 109}, ValueError,
         r"retention_ms must be >= gap_ms \+ grace_ms \+ max_duration_ms = 110, got 109"),
        ({"gap_ms": None, "max_gap_ms": 2**62, "grace_ms": 2**62}, ValueError,
         r"retention_ms \(max_gap_ms \+ grace_ms\) must fit in int64"),
    ],
)
def test_dynamic_windows_validation_names_the_argument(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        SessionWindows(**kwargs)


def test_store_retention_must_cover_max_gap():
    windows = SessionWindows(None, max_gap_ms=100)
    with pytest.raises(ValueError, match=r"store retention_ms=99 must be >= 100 \(max_gap_ms"):
        SessionAggregator(InMemorySessionStore(retention_ms=99), windows, aggregations.count())


# -- the event path ---------------------------------------------------------------------------


def test_event_gap_argument_errors_change_nothing():
    fixed = engine(SessionWindows(10))
    with pytest.raises(ValueError, match="gap_ms=5 given, but the windows have a fixed gap"):
        fixed.process("k", 1, 0, 5)
    with pytest.raises(ValueError, match="gaps_ms given, but the windows have a fixed gap"):
        fixed.process_batch(["k"], [1], [0], [5])
    with pytest.raises(ValueError, match="gap='g' given, but the windows have a fixed gap"):
        fixed.process_table(pa.table({"k": ["k"], "t": [0], "g": [5]}), key="k", time="t",
                            gap="g")
    dyn = engine(SessionWindows(None, max_gap_ms=100))
    with pytest.raises(ValueError, match="gap_ms is required"):
        dyn.process("k", 1, 0)
    with pytest.raises(ValueError, match="gaps_ms is required"):
        dyn.process_batch(["k"], [1], [0])
    with pytest.raises(ValueError, match="gap=<column> is required"):
        dyn.process_table(pa.table({"k": ["k"], "t": [0]}), key="k", time="t")
    with pytest.raises(ValueError, match="gap='nope' is not a column"):
        dyn.process_table(pa.table({"k": ["k"], "t": [0]}), key="k", time="t", gap="nope")
    with pytest.raises(ValueError, match=r"gap_ms = 101 exceeds max_gap_ms = 100 \(event at "
                                         r"timestamp_ms 7\)"):
        dyn.process("k", 1, 7, 101)
    with pytest.raises(TypeError, match="gap_ms must be milliseconds"):
        dyn.process("k", 1, 7, 1.5)
    with pytest.raises(ValueError, match=r"timestamp_ms 9223372036854775800 \+ gap_ms 10 \+ "
                                         r"grace_ms overflows int64"):
        dyn.process("k", 1, INT64_MAX - 7, 10)
    with pytest.raises(ValueError, match="a key must not be None|key"):
        dyn.process(None, 1, 7, 5)
    called = engine(SessionWindows(lambda k, v, t: v, max_gap_ms=100))
    with pytest.raises(ValueError, match="pass one or the other"):
        called.process("k", 5, 0, 5)
    with pytest.raises(ValueError, match="pass one or the other"):
        called.process_batch(["k"], [5], [0], [5])
    with pytest.raises(ValueError, match="the gap callable's result = 200 exceeds max_gap_ms"):
        called.process("k", 200, 0)
    for e in (fixed, dyn, called):
        assert e.metrics["records-in"] == 0
        assert e.advance_watermark(INT64_MAX) == []


def test_event_gaps_as_durations_and_drops():
    dyn = engine(SessionWindows(None, max_gap_ms="1 minute"))
    out = []
    out += dyn.process("k", "a", 0, "10 seconds")
    out += dyn.process("k", "b", 5_000, dt.timedelta(seconds=30))
    out += dyn.process("k", "c", 6_000, 0)      # dropped: 0
    out += dyn.process("k", "d", 7_000, -5)     # dropped: negative
    out += dyn.process("k", "e", 60_000, np.int64(1_000))
    out += dyn.advance_watermark(INT64_MAX)
    assert rows(out) == [("k", 0, 35_000, ["a", "b"]), ("k", 60_000, 61_000, ["e"])]
    metrics = dyn.metrics
    assert (metrics["records-in"], metrics["dropped-records"],
            metrics["dropped-invalid-gap-records"]) == (5, 2, 2)


def test_callable_gap_sees_key_value_and_time_and_may_return_none():
    seen = []

    def gap_fn(key, value, t):
        seen.append((key, value, t))
        return None if value == "skip" else value["gap"]

    late = []
    e = engine(SessionWindows(gap_fn, max_gap_ms=50),
               on_late=lambda k, v, t: late.append(v))
    out = e.process("k", {"gap": 10}, 0)
    out += e.process("k", "skip", 3)
    out += e.process_batch(["k", "j"], [{"gap": 50}, {"gap": 1}], [5, 5])
    out += e.advance_watermark(INT64_MAX)
    assert seen == [("k", {"gap": 10}, 0), ("k", "skip", 3), ("k", {"gap": 50}, 5),
                    ("j", {"gap": 1}, 5)]
    assert rows(out) == [("j", 5, 6, [{"gap": 1}]), ("k", 0, 55, [{"gap": 10}, {"gap": 50}])]
    assert late == []  # an invalid gap is not a late event
    assert e.metrics["dropped-invalid-gap-records"] == 1


def test_invalid_gaps_do_not_move_the_watermark():
    windows = SessionWindows(None, max_gap_ms=10)
    store = InMemorySessionStore(retention_ms=10)
    e = SessionAggregator(store, windows, aggregations.count(),
                          emit=EmitStrategy.ON_WINDOW_CLOSE)
    e.process("k", 1, 1_000, 0)
    e.process_batch(["k"], [1], [2_000], [None])
    assert e.watermark == INT64_MIN  # no progress
    e.process("k", 1, 3_000, 5)
    assert e.watermark == 3_000
    assert e.metrics["dropped-invalid-gap-records"] == 2


# -- the batch gap column ---------------------------------------------------------------------


@pytest.mark.parametrize("form", ["list", "numpy", "arrow", "chunked", "pandas", "strings"])
def test_gap_column_forms(form):
    gaps: list = [10, None, 5, -1, 0, 100]
    if form == "numpy":
        column = np.array([10, 0, 5, -1, 0, 100], dtype=np.int32)
    elif form == "arrow":
        column = pa.array(gaps, pa.int16())
    elif form == "chunked":
        column = pa.chunked_array([pa.array(gaps[:2], pa.int64()), pa.array(gaps[2:], pa.int64())])
    elif form == "pandas":
        pd = pytest.importorskip("pandas")
        column = pd.Series(gaps, dtype="Int64")
    elif form == "strings":
        column = ["10ms", None, dt.timedelta(milliseconds=5), -1, "0 s", "100 ms"]
    else:
        column = gaps
    e = engine(SessionWindows(None, max_gap_ms=100))
    out = e.process_batch(["k"] * 6, list("abcdef"), [0, 3, 20, 21, 22, 200], column)
    out += e.advance_watermark(INT64_MAX)
    assert rows(out) == [("k", 0, 10, ["a"]), ("k", 20, 25, ["c"]), ("k", 200, 300, ["f"])]
    assert e.metrics["dropped-invalid-gap-records"] == 3
    assert e.metrics["records-in"] == 6


def test_gap_column_errors_name_the_row_and_change_nothing():
    e = engine(SessionWindows(None, max_gap_ms=100))
    with pytest.raises(ValueError, match=r"gaps_ms\[2\] = 101 exceeds max_gap_ms = 100 "
                                         r"\(event at 9\)"):
        e.process_batch(["k"] * 3, [1, 2, 3], [0, 5, 9], [1, 2, 101])
    with pytest.raises(TypeError, match=r"gaps_ms\[0\] must be milliseconds"):
        e.process_batch(["k"] * 2, [1, 2], [0, 5], np.array([1.0, 2.0]))
    with pytest.raises(TypeError, match=r"gaps_ms\[1\]"):
        e.process_batch(["k"] * 2, [1, 2], [0, 5], [1, 2.5])
    with pytest.raises(ValueError, match="gaps_ms has 1 rows, timestamps_ms has 2"):
        e.process_batch(["k"] * 2, [1, 2], [0, 5], [1])
    with pytest.raises(ValueError, match=r"timestamps_ms\[1\] = 9223372036854775800: \+ "
                                         r"gaps_ms\[1\] \(10\) \+ grace_ms overflows int64"):
        e.process_batch(["k"] * 2, [1, 2], [0, INT64_MAX - 7], [1, 10])
    # an invalid (dropped) gap on an event whose time would overflow with a gap is fine
    e.process_batch(["j"], [0], [INT64_MAX - 7], [0])
    table = pa.table({"k": ["k", "k"], "t": [0, 5], "dur": pa.array([3.0, 1.0])})
    with pytest.raises(TypeError, match="gap column 'dur' must hold integers"):
        e.process_table(table, key="k", time="t", gap="dur")
    table = pa.table({"k": ["k", "k"], "t": [0, 5], "dur": [3, 300]})
    with pytest.raises(ValueError, match=r"dur\[1\] = 300 exceeds max_gap_ms = 100"):
        e.process_table(table, key="k", time="t", gap="dur")
    assert e.metrics["records-in"] == 1
    assert e.advance_watermark(INT64_MAX) == []


def test_process_table_gap_column_with_nulls_and_a_trigger_free_fast_path():
    e = engine(SessionWindows(None, max_gap_ms=100))
    table = pa.table({"k": ["a", "a", "b", "a"], "v": [1, 2, 3, 4], "t": [0, 15, 0, 9],
                      "g": pa.array([10, None, 0, 7], pa.int64())})
    out = e.process_table(table, key="k", time="t", value="v", gap="g")
    assert out.num_rows == 0  # close mode: nothing closed yet
    closed = e.advance_watermark(INT64_MAX)
    assert rows(closed) == [("a", 0, 16, [1, 4])]
    assert e.metrics["dropped-invalid-gap-records"] == 2
    # every row invalid: nothing happens but the counts
    empty = pa.table({"k": ["a"], "v": [1], "t": [0], "g": pa.array([None], pa.int64())})
    assert e.process_table(empty, key="k", time="t", value="v", gap="g").num_rows == 0
    assert e.metrics["dropped-invalid-gap-records"] == 3


def test_triggers_with_dynamic_gaps_batch_equals_event_path():
    from sessionstore import AccumulationMode, AfterCount, AfterWatermark, ManualClock

    events = [("k", 1, 0, 10), ("k", 2, 5, 1), ("k", 3, 30, None), ("k", 4, 8, 30),
              ("j", 5, 8, 3), ("k", 6, 60, 5)]

    def run(batched: bool) -> list:
        windows = SessionWindows(None, max_gap_ms=30)
        e = SessionAggregator(InMemorySessionStore(retention_ms=30), windows,
                              aggregations.collect(), watermark="external",
                              trigger=AfterWatermark(early=AfterCount(1)),
                              accumulation=AccumulationMode.ACCUMULATING, clock=ManualClock(0))
        out = []
        if batched:
            out += e.process_batch(*(list(c) for c in zip(*[(k, v, t) for k, v, t, _ in events],
                                                          strict=True)),
                                   [g for *_, g in events])
        else:
            for k, v, t, g in events:
                out += e.process(k, v, t, 0 if g is None else g)
        out += e.advance_watermark(INT64_MAX)
        assert e.metrics["dropped-invalid-gap-records"] == 1
        return [(x.session.key, x.session.start, x.session.end, x.value, x.pane.timing)
                for x in out]

    plain = run(False)
    assert plain == run(True)
    finals = [row[:4] for row in plain if row[4].value == "ON_TIME"]
    assert ("k", 0, 38, [1, 2, 4]) in finals and ("j", 8, 11, [5]) in finals


JUNK = st.one_of(st.none(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=6),
                 st.lists(st.integers(), max_size=2), st.timedeltas())


@settings(deadline=None)
@given(gaps=st.lists(JUNK, min_size=1, max_size=6))
def test_junk_gaps_are_refused_naming_the_argument_or_accepted(gaps):
    e = engine(SessionWindows(None, max_gap_ms=100))
    n = len(gaps)
    try:
        e.process_batch(["k"] * n, list(range(n)), list(range(n)), gaps)
    except (ValueError, TypeError) as exc:
        assert "gaps_ms" in str(exc) or "max_gap_ms" in str(exc), exc
        assert e.metrics["records-in"] == 0
    else:
        assert e.metrics["records-in"] == n
