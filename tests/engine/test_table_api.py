"""The table-shaped engine surface: ``process_table``, ``advance_watermark_table`` and
``flush_table`` return Arrow tables with the same columns, and together they emit exactly what
the event path emits, which is what the independent oracle computes."""

from __future__ import annotations

import tempfile

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
from tests import oracle

SESSION_COLUMNS = ["session_start_ms", "session_end_ms"]


def aggregation() -> aggregations.Aggregation:
    return aggregations.combine({"n": aggregations.count(),
                                 "total": aggregations.sum_of(column="v"),
                                 "vals": aggregations.collect(column="v")})


@st.composite
def runs(draw: st.DrawFn) -> dict[str, object]:
    """A configuration and an input cut into batches, with watermark advances between some."""
    emit = draw(st.sampled_from(["close", "update"]))
    n = draw(st.integers(0, 30))
    times = sorted(draw(st.lists(st.integers(0, 200), min_size=n, max_size=n)))
    events = [(draw(st.sampled_from(["a", "b", "c"])), t + draw(st.sampled_from([0, 0, -7, -40])),
               draw(st.integers(-5, 5))) for t in times]
    cuts = sorted(draw(st.sets(st.integers(1, max(n - 1, 1)), max_size=4)))
    batches = [events[i:j] for i, j in zip([0, *cuts], [*cuts, n], strict=True) if i < j] \
        if n else []
    return {
        "emit": emit,
        "write_cache": emit == "update" and draw(st.booleans()),
        "store": draw(st.sampled_from(["memory", "rocksdb"])),
        "int_keys": draw(st.booleans()),
        "gap": draw(st.integers(1, 20)),
        "grace": draw(st.integers(0, 10)),
        "ooo": draw(st.integers(0, 25)),
        "inclusive": draw(st.booleans()),
        "batches": batches,
        "advances": [draw(st.one_of(st.none(), st.integers(-10, 220))) for _ in batches],
    }


def make_engine(run: dict, path: str) -> SessionAggregator:
    windows = SessionWindows(run["gap"], grace_ms=run["grace"], inclusive_gap=run["inclusive"])
    store = (InMemorySessionStore(retention_ms=windows.retention_ms + run["ooo"])
             if run["store"] == "memory"
             else SessionStore(path, retention_ms=windows.retention_ms + run["ooo"]))
    emit = EmitStrategy.ON_WINDOW_CLOSE if run["emit"] == "close" \
        else EmitStrategy.ON_WINDOW_UPDATE
    return SessionAggregator(store, windows, aggregation(), emit=emit,
                             max_out_of_orderness_ms=run["ooo"], write_cache=run["write_cache"])


def key_of(run: dict, key: str) -> object:
    return ord(key) if run["int_keys"] else key


@settings(max_examples=60)
@given(runs())
def test_tables_equal_the_event_path_and_the_oracle(run):
    end = 10_000  # past every session's end plus grace: closes everything
    with tempfile.TemporaryDirectory() as folder:
        tables_engine = make_engine(run, f"{folder}/tables")
        events_engine = make_engine(run, f"{folder}/events")
        tables: list[pa.Table] = []
        emits = []
        steps: list[tuple[object, ...]] = []
        for batch, advance in zip(run["batches"], run["advances"], strict=True):
            keys = [key_of(run, k) for k, _, _ in batch]
            times = [t for _, t, _ in batch]
            values = [v for _, _, v in batch]
            tables.append(tables_engine.process_table(
                pa.table({"user": keys, "ts": pa.array(times, pa.int64()),
                          "v": pa.array(values, pa.int64())}), key="user", time="ts"))
            emits += events_engine.process_batch(keys, [{"v": v} for v in values], times)
            steps += [("event", k, v, t) for k, t, v in zip(keys, times, values, strict=True)]
            if advance is not None:
                tables.append(tables_engine.advance_watermark_table(advance))
                emits += events_engine.advance_watermark(advance)
                steps.append(("watermark", advance))
        if not run["batches"]:  # nothing came: the key names must be given
            tables.append(tables_engine.process_table(
                pa.table({"user": pa.array([], pa.int64() if run["int_keys"] else pa.string()),
                          "ts": pa.array([], pa.int64()), "v": pa.array([], pa.int64())}),
                key="user", time="ts"))
        tables.append(tables_engine.advance_watermark_table(end))
        tables.append(tables_engine.flush_table())
        emits += events_engine.advance_watermark(end)
        emits += events_engine.flush()
        for engine in (tables_engine, events_engine):
            engine.store.close()

    # one shape: every call returns the same columns, with the same types
    assert len({t.schema for t in tables}) == 1, [t.schema for t in tables]
    columns = tables[0].column_names
    updates = run["emit"] == "update"
    assert columns == ["user", *SESSION_COLUMNS, *(["retracted"] if updates else []),
                       "n", "total", "vals"]
    rows = pa.concat_tables(tables).to_pylist()
    # the same rows, in the same order, as the event path's Emit objects
    expected = [{"user": e.session.key, "session_start_ms": e.session.start,
                 "session_end_ms": e.session.end, **({"retracted": e.retraction} if updates
                                                     else {}), **e.value} for e in emits]
    assert rows == expected
    # and the sessions the oracle finds: each once when closed, or the last update standing
    final: dict[tuple[object, int, int], dict] = {}
    for row in rows:
        session = (row["user"], row["session_start_ms"], row["session_end_ms"])
        if row.get("retracted"):
            del final[session]
        else:
            assert not (session in final and not updates), f"{session} emitted twice"
            final[session] = row
    sessions, _ = oracle.sessionize(steps, run["gap"], run["grace"], run["inclusive"],
                                    run["ooo"])
    assert sorted(((k, s, e, len(vs), sum(vs), vs) for k, s, e, vs in sessions),
                  key=repr) == sorted(((*key, r["n"], r["total"], r["vals"])
                                       for key, r in final.items()), key=repr)


def test_the_three_calls_share_columns_and_types():
    engine = SessionAggregator(InMemorySessionStore(retention_ms=100), SessionWindows(10),
                               aggregations.combine({"n": aggregations.count(),
                                                     "pages": aggregations.collect(
                                                         column="page")}),
                               emit=EmitStrategy.ON_WINDOW_UPDATE, write_cache=True)
    with pytest.raises(ValueError, match="key= is required before the first process_table"):
        engine.flush_table()
    batch = pa.table({"user": pa.array([1, 1, 2], pa.int32()), "ts": [0, 5, 30],
                      "page": ["/", "/cart", "/"]})
    first = engine.process_table(batch, key="user", time="ts")  # a batch delivers its updates
    engine.process(2, {"page": "/help"}, 35)  # the event path: held in the write cache
    flushed = engine.flush_table()
    closed = engine.advance_watermark_table(100)
    assert first.schema == flushed.schema == closed.schema
    assert first.schema.field("user").type == pa.int32()  # the input's key type, kept
    assert first.column_names == ["user", "session_start_ms", "session_end_ms", "retracted",
                                  "n", "pages"]
    assert first.to_pylist() == [
        {"user": 1, "session_start_ms": 0, "session_end_ms": 15, "retracted": False, "n": 2,
         "pages": ["/", "/cart"]},
        {"user": 2, "session_start_ms": 30, "session_end_ms": 40, "retracted": False, "n": 1,
         "pages": ["/"]}]
    assert flushed.to_pylist() == [
        {"user": 2, "session_start_ms": 30, "session_end_ms": 40, "retracted": True, "n": 1,
         "pages": ["/"]},
        {"user": 2, "session_start_ms": 30, "session_end_ms": 45, "retracted": False, "n": 2,
         "pages": ["/", "/help"]}]
    assert closed.num_rows == 0  # update mode: closing emits nothing more
    # other key names than process_table's: the columns are named after them
    assert engine.flush_table(key="visitor").column_names[0] == "visitor"


def test_composite_keys_without_a_process_table_call():
    engine = SessionAggregator(InMemorySessionStore(retention_ms=100), SessionWindows(10),
                               aggregations.count(), emit=EmitStrategy.ON_WINDOW_CLOSE)
    engine.process_batch([("a", 1), ("b", 2)], [None, None], [0, 3])
    out = engine.advance_watermark_table(50, key=["user", "site"])
    assert out.to_pylist() == [
        {"user": "a", "site": 1, "session_start_ms": 0, "session_end_ms": 10, "count": 1},
        {"user": "b", "site": 2, "session_start_ms": 3, "session_end_ms": 13, "count": 1}]


def test_triggers_are_refused():
    engine = SessionAggregator(InMemorySessionStore(retention_ms=100), SessionWindows(10),
                               aggregations.count(), trigger=AfterWatermark())
    with pytest.raises(TypeError, match="panes"):
        engine.advance_watermark_table(5, key="user")
