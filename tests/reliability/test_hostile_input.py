"""Hostile input at every public entry point: a ValueError or TypeError naming the argument,
never a crash, and nothing lost from committed state."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sessionstore import (
    EmitStrategy,
    InMemorySessionStore,
    Session,
    SessionAggregator,
    SessionStore,
    SessionWindows,
    aggregations,
)
from sessionstore.cli import main as cli_main

JUNK = st.one_of(
    st.none(), st.booleans(), st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**80), max_value=2**80), st.text(max_size=20),
    st.binary(max_size=20), st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.just(float("nan")), st.just(float("inf")), st.just(2**63), st.just(-(2**63) - 1),
    st.just("\ud800"), st.just(object()), st.just(b"\xff\xfe"),
)
ARG_NAMES = ("key", "session", "start", "end", "timestamp", "value", "earliest", "latest",
             "column",
             "None", "int64", "UTF-8", "serialisable", "encoded", "nested", "limit", "recursion",
             "integer", "tuple")


def deep(levels: int):
    value: object = 0
    for _ in range(levels):
        value = [value]
    return value


def names_argument(exc: BaseException) -> bool:
    return any(name.lower() in str(exc).lower() for name in ARG_NAMES)


@pytest.fixture(scope="module")
def rocks(tmp_path_factory):
    store = SessionStore(tmp_path_factory.mktemp("hostile") / "s", retention_ms=10**12)
    store.put(Session("keep", 0, 10), {"committed": True})
    store.commit({"offset": 1})
    yield store
    store.close()


def committed_intact(store) -> None:
    store.abort()
    assert store.fetch_session("keep", 0, 10) == {"committed": True}
    assert store.committed_metadata == {"offset": 1}


@settings(max_examples=300)
@given(key=JUNK, start=JUNK, end=JUNK, value=JUNK)
def test_store_put_rejects_junk_cleanly(rocks, key, start, end, value):
    try:
        rocks.put(Session(key, start, end), value)
    except (ValueError, TypeError) as exc:
        assert names_argument(exc), exc
    committed_intact(rocks)


@settings(max_examples=200)
@given(key=JUNK, a=JUNK, b=JUNK)
def test_store_queries_reject_junk_cleanly(rocks, key, a, b):
    for call in (lambda: list(rocks.fetch(key)),
                 lambda: list(rocks.find_sessions_to_merge(key, a, b)),
                 lambda: list(rocks.find_sessions(a, b)),
                 lambda: rocks.fetch_session(key, a, b)):
        try:
            call()
        except (ValueError, TypeError) as exc:
            assert names_argument(exc), exc
    committed_intact(rocks)


def test_huge_keys_and_deep_values(rocks):
    with pytest.raises(ValueError, match="limit"):
        rocks.put(Session("x" * (1 << 21), 0, 1), 1)
    with pytest.raises(ValueError, match="nest"):
        rocks.put(Session(deep_tuple(64), 0, 1), 1)
    with pytest.raises(ValueError, match="value cannot be encoded"):
        rocks.put(Session("k", 0, 1), deep(5000))
    committed_intact(rocks)


def deep_tuple(levels: int):
    value: object = "x"
    for _ in range(levels):
        value = (value,)
    return value


@settings(max_examples=200)
@given(key=JUNK, value=JUNK, t=JUNK)
def test_engine_process_rejects_junk_cleanly(key, value, t):
    windows = SessionWindows(10)
    # an external watermark: valid events far in the future must not expire "keep" meanwhile
    engine = SessionAggregator(InMemorySessionStore(retention_ms=100), windows,
                               aggregations.count(), emit=EmitStrategy.ON_WINDOW_UPDATE,
                               watermark="external")
    engine.process("keep", None, 0)
    engine.commit()
    try:
        engine.process(key, value, t)
    except (ValueError, TypeError) as exc:
        assert names_argument(exc), exc
    assert engine.sessions("keep")[0][1] >= 1


@settings(max_examples=150)
@given(keys=st.lists(JUNK, max_size=5), times=st.lists(JUNK, max_size=5))
@example(keys=[0], times=[[0]])  # once reached the engine as a nested list
@example(keys=[[0]], times=[0])
def test_engine_process_batch_rejects_junk_cleanly(keys, times):
    windows = SessionWindows(10)
    engine = SessionAggregator(InMemorySessionStore(retention_ms=100), windows,
                               aggregations.count(), emit=EmitStrategy.ON_WINDOW_CLOSE)
    try:
        engine.process_batch(keys, [None] * len(keys), times)
    except (ValueError, TypeError) as exc:
        assert names_argument(exc) or "rows" in str(exc), exc


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 1e300, 2**64, "1 parsec", None])
def test_bad_durations_name_the_argument(value):
    with pytest.raises((ValueError, TypeError), match="gap_ms"):
        SessionWindows(value)


@settings(max_examples=60, deadline=None)
@given(data=st.binary(max_size=300), suffix=st.sampled_from([".jsonl", ".csv", ".parquet"]))
def test_cli_readers_survive_garbage_files(tmp_path_factory, data, suffix):
    work = tmp_path_factory.mktemp("cli")
    source = work / f"in{suffix}"
    source.write_bytes(data)
    code = cli_main(["sessionize", str(source), "--key", "user", "--time", "ts", "--gap", "1m",
                     "--out", str(work / "o.jsonl"), "--no-progress"])
    assert code in (0, 2)


def test_invalid_utf8_in_inputs(tmp_path: Path, capsys):
    # CSV keys are read as UTF-8 text: invalid bytes are refused with one line, and
    # --key-type binary reads them as raw bytes, which are valid keys
    source = tmp_path / "in.csv"
    source.write_bytes(b"user,ts\n\xff\xfe,1\n")
    out = tmp_path / "o.jsonl"
    assert cli_main(["sessionize", str(source), "--key", "user", "--time", "ts", "--gap", "1m",
                     "--out", str(out), "--no-progress"]) == 2
    assert "--key-type binary" in capsys.readouterr().err
    assert cli_main(["sessionize", str(source), "--key", "user", "--time", "ts", "--gap", "1m",
                     "--out", str(out), "--no-progress", "--key-type", "binary"]) == 0
    assert len(out.read_text().splitlines()) == 1
    # JSON Lines must be UTF-8: refused with one line
    bad_json = tmp_path / "in.jsonl"
    bad_json.write_bytes(b'{"user": "\xff\xfe", "ts": 1}\n')
    assert cli_main(["sessionize", str(bad_json), "--key", "user", "--time", "ts", "--gap",
                     "1m", "--out", str(out), "--no-progress"]) == 2
    assert "sessionstore: error:" in capsys.readouterr().err
