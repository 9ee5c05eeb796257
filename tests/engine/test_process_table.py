"""process_table: its contract at the edges (the property tests check its results)."""

from __future__ import annotations

import decimal

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionstore import (
    AfterWatermark,
    EmitStrategy,
    InMemorySessionStore,
    SessionAggregator,
    SessionStore,
    SessionWindows,
    aggregations,
)
from sessionstore.timeutil import INT64_MAX


def engine(agg=None, store=None, **options):
    store = store or InMemorySessionStore(retention_ms=100)
    return SessionAggregator(store, SessionWindows(10), agg or aggregations.count(), **options)


def test_composite_keys_come_back_as_their_columns():
    e = engine(emit=EmitStrategy.ON_WINDOW_CLOSE)
    table = pa.table({"user": ["a", "a", "b"], "site": [1, 2, 1], "t": [0, 1, 2]})
    assert e.process_table(table, key=["user", "site"], time="t").num_rows == 0
    out = e.process_table(pa.table({"user": ["a"], "site": [1], "t": [100]}),
                          key=["user", "site"], time="t")
    assert out.to_pylist() == [
        {"user": "a", "site": 1, "session_start_ms": 0, "session_end_ms": 10, "count": 1},
        {"user": "a", "site": 2, "session_start_ms": 1, "session_end_ms": 11, "count": 1},
        {"user": "b", "site": 1, "session_start_ms": 2, "session_end_ms": 12, "count": 1},
    ]
    assert out.schema.field("site").type == pa.int64()
    assert [s for s, _ in e.sessions(("a", 1))][0].key == ("a", 1)


def test_a_bad_table_raises_naming_the_column_and_row_and_changes_nothing():
    e = engine(aggregations.sum_of(column="x"))
    good = pa.table({"k": ["a", "b"], "x": [1, 2], "t": [0, 1]})
    e.process_table(good, key="k", time="t")
    before = e.metrics["records-in"]
    with pytest.raises(ValueError, match=r"x\[1\] is null"):
        e.process_table(pa.table({"k": ["a", "b"], "x": [1, None], "t": [5, 6]}),
                        key="k", time="t")
    with pytest.raises(ValueError, match=r"k\[0\] is null"):
        e.process_table(pa.table({"k": [None, "b"], "x": [1, 1], "t": [5, 6]}),
                        key="k", time="t")
    with pytest.raises(TypeError, match="time column 't' must hold integers"):
        e.process_table(pa.table({"k": ["a"], "x": [1], "t": [1.5]}), key="k", time="t")
    with pytest.raises(ValueError, match="column 'x'"):
        e.process_table(pa.table({"k": ["a"], "t": [1]}), key="k", time="t")
    with pytest.raises(ValueError, match="time='nope' is not a column"):
        e.process_table(good, key="k", time="nope")
    with pytest.raises(TypeError, match="pyarrow Table"):
        e.process_table({"k": ["a"]}, key="k", time="t")
    assert e.metrics["records-in"] == before
    assert [(s.start, s.end, v) for s, v in e.sessions("a")] == [(0, 10, 1)]


def test_values_msgpack_cannot_store_are_refused_by_row():
    e = engine(aggregations.last_of(column="x"))
    x = pa.array([decimal.Decimal("1.5"), decimal.Decimal("2")])
    with pytest.raises(TypeError, match=r"x\[0\] cannot be stored"):
        e.process_table(pa.table({"k": ["a", "a"], "x": x, "t": [0, 1]}), key="k", time="t")
    assert e.metrics["records-in"] == 0


def test_custom_aggregations_take_the_exact_path_with_rows_as_dicts():
    agg = aggregations.aggregate(lambda: 0, lambda k, v, acc: acc + v["x"] * v["y"],
                                 lambda k, a, b: a + b)
    e = engine(agg, emit=EmitStrategy.ON_WINDOW_UPDATE)
    out = e.process_table(pa.table({"k": [1, 1], "x": [2, 3], "y": [10, 100], "t": [0, 1]}),
                          key="k", time="t")
    assert out.to_pylist() == [{"k": 1, "session_start_ms": 0, "session_end_ms": 11,
                                "retracted": False, "aggregate": 320}]


def test_triggers_are_refused():
    e = engine(trigger=AfterWatermark())
    with pytest.raises(TypeError, match="process_batch"):
        e.process_table(pa.table({"k": ["a"], "t": [0]}), key="k", time="t")


def test_rocksdb_mixed_with_the_event_path_and_restart(tmp_path):
    """The table, the event path and a reopened engine see one state (the store's)."""
    agg = aggregations.combine({"n": aggregations.count(), "xs": aggregations.collect()})
    store = SessionStore(tmp_path / "s", retention_ms=100)
    e = engine(agg, store, emit=EmitStrategy.ON_WINDOW_CLOSE)
    e.process_table(pa.table({"k": ["a", "b"], "v": [1, 2], "t": [0, 3]}), key="k", time="t",
                    value="v")
    e.process("a", 3, 5)  # the event path takes over from the table
    out = e.process_table(pa.table({"k": ["a"], "v": [4], "t": [9]}), key="k", time="t",
                          value="v")
    assert out.num_rows == 0
    e.commit()
    store.close()
    store = SessionStore(tmp_path / "s", retention_ms=100)
    e = engine(agg, store, emit=EmitStrategy.ON_WINDOW_CLOSE)
    out = e.process_table(pa.table({"k": ["b"], "v": [5], "t": [40]}), key="k", time="t",
                          value="v")
    assert out.to_pylist() == [
        {"k": "b", "session_start_ms": 3, "session_end_ms": 13, "n": 1, "xs": [2]},
        {"k": "a", "session_start_ms": 0, "session_end_ms": 19, "n": 3, "xs": [1, 3, 4]},
    ]
    rest = e.advance_watermark(INT64_MAX)
    assert [(x.session.key, x.value) for x in rest] == [("b", {"n": 1, "xs": [5]})]
    store.close()


def _loop_and_batch(agg, keys, values, times, emit=EmitStrategy.ON_WINDOW_CLOSE):
    results = []
    for batched in (False, True):
        e = engine(agg, emit=emit)
        if batched:
            out = e.process_batch(keys, values, times)
        else:
            out = [x for k, v, t in zip(keys, values, times, strict=True)
                   for x in e.process(k, v, t)]
        out += e.advance_watermark(INT64_MAX)
        results.append((out, e))
    return results


@pytest.mark.parametrize("values", [
    [1, 2.5, 3, 4],              # ints and floats: Python's own arithmetic decides
    [1.0, float("nan"), 2.0, 0.5],  # NaN: left to the exact rule (aggregations.smaller)
])  # (an integer sum beyond int64 is an error on every path: tests/engine/test_sum_overflow.py)
def test_batches_the_fast_path_cannot_take_exactly_take_the_exact_path(values):
    agg = aggregations.combine({"sum": aggregations.sum_of(), "min": aggregations.min_of()})
    (loop, _), (batch, e) = _loop_and_batch(agg, ["a", "a", "b", "a"], values, [0, 1, 2, 3])
    assert repr(batch) == repr(loop)  # repr: nan == nan is False
    assert e._core.table is None  # the exact path ran


def test_the_fast_path_runs_for_the_built_ins_and_writes_every_session():
    agg = aggregations.combine({"n": aggregations.count(), "last": aggregations.last_of()})
    (loop, _), (batch, e) = _loop_and_batch(agg, ["a", "a", "b", "a"], [1, 2, 3, 4],
                                            [0, 30, 2, 5], EmitStrategy.ON_WINDOW_UPDATE)
    assert e._core.table is not None
    assert [(s.start, s.end, v) for s, v in e.sessions("a")] == [
        (0, 10, {"n": 1, "last": 1}), (30, 40, {"n": 1, "last": 2})]
    assert e.metrics["dropped-records"] == 2  # t=2 and t=5 arrive after W=30: late
    final = {x.session: x.value for x in loop if not x.retraction}
    assert {x.session: x.value for x in batch if not x.retraction}.items() <= final.items()


@settings(max_examples=40, deadline=None)
@given(chunks=st.lists(st.lists(st.integers(-(2**63), 2**63 - 1) | st.integers(-3, 3),
                                max_size=40), min_size=1, max_size=3))
def test_an_int64_key_column_is_factorized_as_arrow_does(chunks: list[list[int]]) -> None:
    """process_table's own factorizing of an int64 key column (any chunking) gives what the
    general path (Arrow's dictionary encoding) gives: codes, keys and their Arrow array."""
    from sessionstore import batch
    from sessionstore.engine.tables import _table_keys

    table = pa.table({"k": pa.chunked_array(chunks, type=pa.int64())})
    codes, uniques, arrow = _table_keys(table, ["k"])
    want_codes, want_uniques, want_arrow = batch.factorize_keys_arrow(table.column("k"), "k")
    assert codes.tolist() == want_codes.tolist()
    assert list(uniques) == want_uniques and all(type(key) is int for key in uniques)
    assert arrow.equals(want_arrow)
