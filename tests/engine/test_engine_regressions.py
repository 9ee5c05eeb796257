"""Regression tests, one per defect found in engine v1 (issue 10)."""

from __future__ import annotations

import decimal
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sessionstore import (
    EmitStrategy,
    InMemorySessionStore,
    SessionAggregator,
    SessionStore,
    SessionWindows,
    aggregations,
)
from sessionstore.timeutil import INT64_MAX


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
@pytest.mark.parametrize("cache", [0, 1, 1_000])
def test_batch_path_never_loses_sessions_when_the_cache_fills_mid_batch(tmp_path: Path,
                                                                        backend, cache):
    n = 6_000
    windows = SessionWindows(1_000)
    store = (InMemorySessionStore(retention_ms=windows.retention_ms) if backend == "memory"
             else SessionStore(tmp_path / "s", retention_ms=windows.retention_ms))
    engine = SessionAggregator(store, windows, aggregations.count(),
                               emit=EmitStrategy.ON_WINDOW_CLOSE, cache_max_sessions=cache)
    keys = [f"user{i}" for i in range(n)]
    out = engine.process_batch(keys, [None] * n, np.arange(n, dtype=np.int64))
    out += engine.advance_watermark(INT64_MAX)
    assert len(out) == n and {e.session.key for e in out} == set(keys)
    assert engine.metrics["dropped-records"] == 0
    assert engine.metrics["store-dropped-records"] == 0
    store.close()


def test_restart_keeps_a_session_when_stream_time_is_exactly_zero(tmp_path: Path):
    windows = SessionWindows(10)

    def open_engine() -> SessionAggregator:
        return SessionAggregator(SessionStore(tmp_path / "s", retention_ms=100), windows,
                                 aggregations.count(), emit=EmitStrategy.ON_WINDOW_CLOSE)

    engine = open_engine()
    assert engine.process("k", None, -10) == []  # session [-10, 0): the store's stream time is 0
    engine.commit()
    engine.store.close()
    engine = open_engine()
    out = engine.advance_watermark(50)
    engine.store.close()
    assert [tuple(e.session) for e in out] == [("k", -10, 0)]


def test_write_cache_retracts_a_delivered_session_updated_then_merged_away():
    windows = SessionWindows(10)
    engine = SessionAggregator(InMemorySessionStore(retention_ms=1_000), windows,
                               aggregations.count(), watermark="external", write_cache=True)
    engine.process("k", None, 0)
    assert [(tuple(e.session), e.value) for e in engine.flush()] == [(("k", 0, 10), 1)]
    engine.process("k", None, 0)    # inside [0, 10): an update in place, not delivered yet
    engine.process("k", None, 10)   # [10, 20) touches [0, 10): merged away into [0, 20)
    got = [(tuple(e.session), e.value, e.retraction) for e in engine.flush()]
    # the retraction carries what was delivered (1), not the undelivered in-place update (2)
    assert got == [(("k", 0, 10), 1, True), (("k", 0, 20), 3, False)]


def test_unencodable_values_are_refused_up_front_and_change_nothing():
    windows = SessionWindows(10)
    engine = SessionAggregator(InMemorySessionStore(retention_ms=1_000), windows,
                               aggregations.collect(), emit=EmitStrategy.ON_WINDOW_UPDATE)
    engine.process("k", 1, 0)
    engine.commit()
    with pytest.raises(TypeError, match="value cannot be stored"):
        engine.process("k", decimal.Decimal("1.5"), 1)
    values: list[object] = list(range(5_000))
    values[4_000] = {1, 2}
    with pytest.raises(TypeError, match=r"values\[4000\] cannot be stored"):
        engine.process_batch([f"u{i}" for i in range(5_000)], values, list(range(5_000)))
    assert engine.metrics["records-in"] == 1
    engine.commit()  # the earlier session is still there, and nothing of the bad batch
    assert [(tuple(s), v) for s, v in engine.sessions("k")] == [(("k", 0, 10), [1])]
    assert engine.sessions("u0") == []


def test_unencodable_accumulator_is_refused_before_any_change():
    windows = SessionWindows(10)
    agg = aggregations.sum_of(lambda v: decimal.Decimal(v))
    engine = SessionAggregator(InMemorySessionStore(retention_ms=1_000), windows, agg)
    with pytest.raises(TypeError, match="accumulator"):
        engine.process("k", 1, 0)
    with pytest.raises(TypeError, match="accumulator"):
        engine.process_batch(["a", "b"], [1, 2], [0, 1])
    assert engine.sessions("k") == [] and engine.sessions("a") == []


def test_failed_commit_keeps_every_pending_write_for_the_retry():
    windows = SessionWindows(10)
    store = InMemorySessionStore(retention_ms=1_000)
    engine = SessionAggregator(store, windows, aggregations.count(),
                               emit=EmitStrategy.ON_WINDOW_CLOSE)
    engine.process("a", None, 0)
    engine.commit()
    engine.process("a", None, 5)
    engine.process("b", None, 6)
    real_put = store.put
    calls = {"n": 0}

    def flaky_put(session, value):
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError("disk hiccup")
        return real_put(session, value)

    store.put = flaky_put  # type: ignore[method-assign]
    with pytest.raises(OSError):
        engine.commit()
    engine.commit()  # the retry writes what the failed flush had not
    store.abort()    # back to the last commit: it must hold both events of a and b
    assert [(tuple(s), v[0]) for s, v in store.fetch("a")] == [(("a", 0, 15), 2)]
    assert [(tuple(s), v[0]) for s, v in store.fetch("b")] == [(("b", 6, 16), 1)]


def test_store_metrics_are_rates_over_a_window():
    windows = SessionWindows(10)
    engine = SessionAggregator(InMemorySessionStore(retention_ms=1_000), windows,
                               aggregations.count(), cache_max_sessions=0)
    for i in range(5):
        engine.process("k", None, i * 100)
    metrics = engine.metrics
    assert metrics["store-put-total"] == 5
    assert metrics["store-put-rate"] > 0 and metrics["store-put-latency-max"] >= 0


@pytest.mark.parametrize("path", ["batch", "table"])
@pytest.mark.parametrize("parts", [["n"], ["n", "total"]])
def test_a_combined_aggregation_of_one_part_survives_a_reopen(tmp_path: Path, path, parts):
    """The fast path stored a one-part ``combine`` accumulator bare, and the exact path, after a
    reopen, read it as the list a Combined keeps: ``TypeError`` at the first close."""
    import pyarrow as pa

    windows = SessionWindows(100)
    known = {"n": aggregations.count(), "total": aggregations.sum_of(column="v")}
    keys, times, values = ["a", "a", "b"], [0, 50, 10], [{"v": 1}, {"v": 2}, {"v": 4}]

    def engine_on(store):
        agg = aggregations.combine({name: known[name] for name in parts})
        return SessionAggregator(store, windows, agg, emit=EmitStrategy.ON_WINDOW_CLOSE)

    with SessionStore(tmp_path / "s", retention_ms=windows.retention_ms) as store:
        engine = engine_on(store)
        if path == "batch":
            assert engine.process_batch(keys, values, times) == []
        else:
            table = pa.table({"k": keys, "t": times, "v": [v["v"] for v in values]})
            assert engine.process_table(table, key="k", time="t").num_rows == 0
        engine.commit()
    with SessionStore(tmp_path / "s", retention_ms=windows.retention_ms) as store:
        out = engine_on(store).advance_watermark(INT64_MAX)
    expected = {("a", 0, 150): {"n": 2, "total": 3}, ("b", 10, 110): {"n": 1, "total": 4}}
    assert {tuple(e.session): e.value for e in out} == {
        s: {name: r[name] for name in parts} for s, r in expected.items()}


@pytest.mark.parametrize("path", ["event", "batch", "table"])
@pytest.mark.parametrize("key", [1.5, float("nan"), -0.0])
def test_float_keys_are_refused_with_the_accepted_types_and_a_cast_to_use(path, key):
    # issue 25: documented in docs/semantics.md (keys are str, bytes, int or tuples of them)
    import pyarrow as pa

    windows = SessionWindows(10)
    engine = SessionAggregator(InMemorySessionStore(retention_ms=windows.retention_ms),
                               windows, aggregations.count())
    with pytest.raises(TypeError, match=r"str, bytes, int or a tuple.*cast the column"):
        if path == "event":
            engine.process(key, None, 1)
        elif path == "batch":
            engine.process_batch([key], [None], [1])
        else:
            engine.process_table(pa.table({"k": [key], "t": [1]}), key="k", time="t")
    assert engine.metrics["records-in"] == 0


def float_key_column(kind: str) -> Any:
    import pyarrow as pa

    values = pa.array([1.5, float("nan"), -0.0, 0.0])
    return {"float64": values, "float32": values.cast(pa.float32()),
            "float16": pa.array([1.5, 2.5], pa.float32()).cast(pa.float16()),
            "dictionary": values.dictionary_encode()}[kind]


@pytest.mark.parametrize("kind", ["float64", "float32", "float16", "dictionary"])
def test_float_keys_are_refused_on_the_bounded_path_too(kind):
    # issue 25: the bounded path (sessionstore.sessionize, the CLI without --state) grouped a
    # float key column by its bits (-0.0 apart from 0.0, unlike Spark), or crashed on float16,
    # while the engine and the Spark adapter refuse floats
    import pyarrow as pa

    import sessionstore

    column = float_key_column(kind)
    table = pa.table({"k": column, "t": list(range(len(column)))})
    with pytest.raises(ValueError, match=r"key column 'k' has type .*cast the column"):
        sessionstore.sessionize(table, key="k", time="t", gap=10, aggregations="n=count")
    with pytest.raises(ValueError, match=r"key column 'k' has type .*cast the column"):
        sessionstore.sessionize(table.append_column("s", pa.array(["x"] * len(column))),
                                key=["s", "k"], time="t", gap=10, aggregations="n=count")


@pytest.mark.parametrize("state", [False, True])
def test_the_cli_refuses_a_float_key_column_with_or_without_state(tmp_path, capsys, state):
    # the same input is refused whichever path the CLI takes, and no output is written
    import pyarrow as pa
    import pyarrow.parquet as pq

    from sessionstore.cli import main

    source = tmp_path / "in.parquet"
    pq.write_table(pa.table({"k": float_key_column("float64"), "t": [0, 1, 2, 3]}), source)
    out = tmp_path / "out.jsonl"
    argv = ["sessionize", str(source), "--key", "k", "--time", "t", "--time-unit", "ms",
            "--gap", "1m", "--out", str(out), "--no-progress"]
    assert main(argv + (["--state", str(tmp_path / "state")] if state else [])) == 2
    err = capsys.readouterr().err
    assert "float" in err and "cast the column" in err, err
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.parquet", *(["state"] if state else [])]
