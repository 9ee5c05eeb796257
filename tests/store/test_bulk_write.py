"""put_many / remove_many against put / remove on a twin store of the same backend."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionstore import InMemorySessionStore, Session, SessionStore, keyschema
from sessionstore.store import rocksdb as rocksdb_module
from sessionstore.store.base import SegmentedSessionStore

# Sizes are for the default profile (100 examples); a soak profile with more scales them up.
PROFILE_SCALE = settings.default.max_examples / 100

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
ALL_KEYS = ["a", "ab", b"a", 0, 1, 300, -7, ("a", 1), "", "é" * 40, 2**40]
VALUES = st.one_of(st.integers(-5, 5), st.text(max_size=3), st.none(),
                   st.lists(st.integers(0, 3), max_size=2))
# a call with a None value is written row by row (a None deletes): these keep the bulk layouts
SOME_VALUES = st.one_of(st.integers(-5, 5), st.text(max_size=3))


@contextmanager
def twin_stores(backend: str, **config: Any) -> Iterator[tuple[SegmentedSessionStore,
                                                               SegmentedSessionStore]]:
    """Two empty stores of one backend and configuration: one for bulk calls, one for loops."""
    if backend == "memory":
        yield InMemorySessionStore(**config), InMemorySessionStore(**config)
        return
    # "rocksdb-blocks": every bulk call takes the large-write layout (an SST file with an index
    # block per segment, removals of key-first records alone), however few sessions it has
    # and carries every deferred removal of its segments; "rocksdb-mixed": segments with at
    # least 3 sessions in a call take that layout, the others a WriteBatch (both in one call),
    # and a file carries its segment's removals when they are no more than its sessions
    threshold = rocksdb_module.BULK_LAYOUT_MIN_SESSIONS
    ratio = rocksdb_module.FOLD_REMOVALS_RATIO
    if backend == "rocksdb-blocks":
        rocksdb_module.BULK_LAYOUT_MIN_SESSIONS = 1
        rocksdb_module.FOLD_REMOVALS_RATIO = 0
    elif backend == "rocksdb-mixed":
        rocksdb_module.BULK_LAYOUT_MIN_SESSIONS = 3
        rocksdb_module.FOLD_REMOVALS_RATIO = 1
    with tempfile.TemporaryDirectory(prefix="bulk-") as root:
        bulk = SessionStore(Path(root) / "bulk", **config)
        loop = SessionStore(Path(root) / "loop", **config)
        try:
            yield bulk, loop
        finally:
            rocksdb_module.BULK_LAYOUT_MIN_SESSIONS = threshold
            rocksdb_module.FOLD_REMOVALS_RATIO = ratio
            bulk.close()
            loop.close()


def contents(store: SegmentedSessionStore) -> list[Any]:
    """Everything a reader can see: the cross-key index and every key's own records."""
    by_time = [(tuple(s), v) for s, v in store.find_sessions(INT64_MIN, INT64_MAX)]
    by_key = [[(tuple(s), v) for s, v in store.fetch(key)] for key in ALL_KEYS]
    return [by_time, by_key, store.observed_stream_time, dict(store.metrics)]


@st.composite
def configurations(draw: st.DrawFn) -> dict[str, Any]:
    retention = draw(st.sampled_from([0, 1, 50, 1_000]))
    interval = draw(st.sampled_from([1, 7, 100, None]))
    config: dict[str, Any] = {"retention_ms": retention}
    if interval is not None:
        config["segment_interval_ms"] = interval
    return config


@st.composite
def session_batches(draw: st.DrawFn, value_strategy: st.SearchStrategy[Any] = VALUES
                    ) -> tuple[list[Any], list[int], list[int], list[Any]]:
    base = draw(st.sampled_from([0, -10_000, INT64_MIN + 2_000, INT64_MAX - 2_000]))
    n = draw(st.integers(0, 25))
    keys, starts, ends, values = [], [], [], []
    for _ in range(n):
        if starts and draw(st.integers(0, 5)) == 0:  # the same session again: later wins
            j = draw(st.integers(0, len(starts) - 1))
            keys.append(keys[j])
            starts.append(starts[j])
            ends.append(ends[j])
        else:
            keys.append(draw(st.sampled_from(ALL_KEYS)))
            start = base + draw(st.integers(-1_500, 1_500))
            starts.append(start)
            ends.append(start + draw(st.integers(0, 300)))
        values.append(draw(value_strategy))
    return keys, starts, ends, values


OPERATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("put"), session_batches()),
        st.tuples(st.just("remove"), session_batches()),
        st.tuples(st.just("cap"), st.one_of(st.none(), st.integers(-5_000, 5_000))),
        st.tuples(st.just("commit"), st.none()),
        st.tuples(st.just("abort"), st.none()),
    ),
    max_size=6,
)


def apply(bulk: SegmentedSessionStore, loop: SegmentedSessionStore, operation: str,
          argument: Any, distinct_keys: bool) -> None:
    if operation == "put":
        keys, starts, ends, values = argument
        if distinct_keys:  # the columnar form: each key once, plus an index
            distinct = list(dict.fromkeys(keys))
            index = np.array([distinct.index(k) for k in keys], dtype=np.int64)
            written = bulk.put_many(distinct, np.array(starts, dtype=np.int64),
                                    np.array(ends, dtype=np.int64), values, key_index=index)
        else:
            written = bulk.put_many(keys, starts, ends, values)
        expected = [loop.put(Session(k, s, e), v)
                    for k, s, e, v in zip(keys, starts, ends, values, strict=True)]
        assert written.tolist() == expected
    elif operation == "remove":
        keys, starts, ends, _ = argument
        bulk.remove_many(keys, starts, ends)
        for k, s, e in zip(keys, starts, ends, strict=True):
            loop.remove(Session(k, s, e))
    elif operation == "cap":
        bulk.cap_expiry_time(argument)
        loop.cap_expiry_time(argument)
    elif operation == "commit":
        assert bulk.commit() == loop.commit()
    else:
        bulk.abort()
        loop.abort()


@pytest.mark.parametrize("backend", ["memory", "rocksdb", "rocksdb-blocks"])
@settings(max_examples=round(60 * PROFILE_SCALE))
@given(config=configurations(), operations=OPERATIONS, distinct_keys=st.booleans())
def test_bulk_calls_equal_loops_of_single_calls(
    backend: str, config: dict[str, Any], operations: list[tuple[str, Any]],
    distinct_keys: bool,
) -> None:
    """Same return values, contents, stream time, drops and expired segments."""
    with twin_stores(backend, **config) as (bulk, loop):
        for operation, argument in operations:
            apply(bulk, loop, operation, argument, distinct_keys)
            assert contents(bulk) == contents(loop)


@pytest.mark.parametrize("backend", ["rocksdb-blocks", "rocksdb-mixed"])
@settings(max_examples=round(20 * PROFILE_SCALE))
@given(config=configurations(), data=st.data())
def test_removals_then_bulk_writes_read_only_at_the_end_equal_loops(
    backend: str, config: dict[str, Any], data: st.DataObject,
) -> None:
    """The RocksDB store defers removals until its next call, carrying them in the SST files
    of a bulk write that follows. Rounds of the engine's pattern with no read between calls:
    remove some sessions written before, then write a batch holding fresh sessions, sessions
    ending where removed ones ended (their segments) and some removed sessions again."""
    with twin_stores(backend, **config) as (bulk, loop):
        written: list[tuple[Any, int, int]] = []
        for _ in range(data.draw(st.integers(1, 4), label="rounds")):
            removed = data.draw(st.lists(st.sampled_from(written), max_size=15, unique=True)
                                if written else st.just([]), label="removed")
            keys, starts, ends = ([k for k, _, _ in removed], [s for _, s, _ in removed],
                                  [e for _, _, e in removed])
            apply(bulk, loop, "remove", (keys, starts, ends, []), distinct_keys=False)
            keys, starts, ends, values = data.draw(session_batches(SOME_VALUES), label="fresh")
            for key, start, end in removed:
                shift = data.draw(st.sampled_from([None, 0, 1]), label="again")
                if shift is not None:  # the session again, or another one in its segment
                    keys.append(key)
                    starts.append(start - shift)
                    ends.append(end)
                    values.append(data.draw(SOME_VALUES, label="value"))
            written += zip(keys, starts, ends, strict=True)
            apply(bulk, loop, "put", (keys, starts, ends, values),
                  distinct_keys=data.draw(st.booleans(), label="distinct keys"))
            step = data.draw(st.sampled_from(["none", "none", "commit", "abort", "check"]),
                             label="then")
            if step == "check":
                assert contents(bulk) == contents(loop)
            elif step != "none":
                apply(bulk, loop, step, None, distinct_keys=False)
        assert contents(bulk) == contents(loop)
        assert bulk.commit() == loop.commit()
        assert contents(bulk) == contents(loop)


def test_a_later_session_in_the_call_expires_an_earlier_ones_segment() -> None:
    with twin_stores("memory", retention_ms=10, segment_interval_ms=10) as (bulk, _):
        written = bulk.put_many(["a", "a", "b"], [0, 100, 5], [5, 105, 6], [1, 2, 3])
        assert written.tolist() == [True, True, False]
        assert bulk.metrics["dropped-records"] == 1
        assert bulk.metrics["expired-segments"] == 1  # segment 0 held "a" until "a"@105
        assert [tuple(s) for s, _ in bulk.fetch("a")] == [("a", 100, 105)]


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
@pytest.mark.parametrize("cap", [None, INT64_MIN + 700])
def test_sessions_ending_within_retention_of_the_int64_minimum_expire_as_puts_do(
        backend: str, cap: int | None) -> None:
    """Ends less than the retention above the int64 minimum, where ``end - retention``
    leaves int64 (the rule floors the segment at the minimum), with and without an expiry
    cap: the bulk call keeps and drops what a loop of puts does. Kills a segment floor
    computed in wrapping int64 for them (every such session dropped)."""
    ends = [INT64_MIN + d for d in (3, 400, 999, 1_000, 1_001, 2_500)]
    starts = [end - 2 for end in ends]
    keys = ["a", "b", "a", "c", "b", "a"]
    with twin_stores(backend, retention_ms=1_000, segment_interval_ms=100) as (bulk, loop):
        bulk.cap_expiry_time(cap)
        loop.cap_expiry_time(cap)
        written = bulk.put_many(keys, starts, ends, list(range(len(ends))))
        expected = [loop.put(Session(k, s, e), v) for k, s, e, v
                    in zip(keys, starts, ends, range(len(ends)), strict=True)]
        assert written.tolist() == expected
        assert contents(bulk) == contents(loop)
        assert any(expected)


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
@pytest.mark.parametrize(
    ("keys", "starts", "ends", "values", "error", "message"),
    [
        (["a", None], [0, 0], [1, 1], [1, 2], ValueError, r"keys\[1\]: key must not be None"),
        (["a", 1.5], [0, 0], [1, 1], [1, 2], TypeError, r"keys\[1\]: key must be str"),
        (["a", "b"], [0, 5], [1, 4], [1, 2], ValueError, r"starts_ms\[1\] must be <= ends_ms"),
        (["a", "b"], [0, 0.5], [1, 1], [1, 2], TypeError, "starts_ms must hold integer"),
        (["a", "b"], [0, 0], [1], [1, 2], ValueError, "ends_ms must be one-dimensional with 2"),
        (["a", "b"], [0, 0], [1, 1], [1], ValueError, "values has 1 rows, there are 2"),
        (["a", "b", "c"], [0, 0, 0], [1, 1, 1], [1, {2}, 3], TypeError,
         r"values\[1\] cannot be serialised"),
    ],
)
def test_a_bad_call_raises_naming_the_row_and_changes_nothing(
    backend: str, keys: list[Any], starts: list[Any], ends: list[Any], values: list[Any],
    error: type[Exception], message: str,
) -> None:
    with twin_stores(backend, retention_ms=1_000) as (store, _):
        store.put(Session("z", 0, 3), "before")
        before = contents(store)
        with pytest.raises(error, match=message):
            store.put_many(keys, starts, ends, values)
        assert contents(store) == before


def test_key_index_out_of_range_is_refused() -> None:
    store = InMemorySessionStore(retention_ms=100)
    with pytest.raises(ValueError, match=r"key_index\[1\] = 2 is not in \[0, 2\)"):
        store.put_many(["a", "b"], [0, 0], [1, 1], [1, 1], key_index=[0, 2])
    with pytest.raises(ValueError, match=r"key_index\[0\] = -1 is not in \[0, 2\)"):
        store.remove_many(["a", "b"], [0], [1], key_index=[-1])


def test_a_closed_store_refuses_bulk_calls(tmp_path: Path) -> None:
    store = SessionStore(tmp_path / "s", retention_ms=100)
    store.close()
    with pytest.raises(ValueError, match="closed"):
        store.put_many(["a"], [0], [1], [1])
    with pytest.raises(ValueError, match="closed"):
        store.remove_many(["a"], [0], [1])


def test_bulk_writes_survive_commit_and_reopen(tmp_path: Path) -> None:
    n = 5_000
    keys = [f"user{i % 700}" for i in range(n)]
    starts = np.arange(n, dtype=np.int64) * 3
    with SessionStore(tmp_path / "s", retention_ms=100_000, segment_interval_ms=4_000) as store:
        store.put_many(keys, starts, starts + 10, list(range(n)))
        store.commit()
    with SessionStore(tmp_path / "s", retention_ms=100_000, segment_interval_ms=4_000) as store:
        assert len(store.live_segments()) == 4
        found = [(s.key, s.start, v) for s, v in store.find_sessions(INT64_MIN, INT64_MAX)]
        assert sorted(found, key=lambda row: row[1]) == [
            (keys[i], int(starts[i]), i) for i in range(n)]
        assert [v for _, v in store.fetch("user5")] == list(range(5, n, 700))


KEY_PARTS = st.one_of(st.text(max_size=6), st.binary(max_size=6), st.integers(INT64_MIN, INT64_MAX),
                      st.sampled_from(["a", "a\x00", b"\x00", "x" * 300, 0, -1, 128]))


@settings(max_examples=round(150 * PROFILE_SCALE))
@given(keys=st.lists(st.one_of(KEY_PARTS, st.tuples(KEY_PARTS, KEY_PARTS)), min_size=1,
                     max_size=8),
       rows=st.lists(st.tuples(st.integers(0, 7), st.integers(INT64_MIN, INT64_MAX),
                               st.integers(INT64_MIN, INT64_MAX)), max_size=30),
       by_width=st.booleans())
def test_records_many_equals_the_per_record_encoders(
    keys: list[Any], rows: list[tuple[int, int, int]], by_width: bool
) -> None:
    """Any widths, in any order or grouped by width (the two code paths), bounds included."""
    encoded = [keyschema.encode_key(k) for k in keys]
    rows = [(k % len(keys), a, b) for k, a, b in rows]
    if by_width:
        rows.sort(key=lambda row: len(encoded[row[0]]))
    index = np.array([k for k, _, _ in rows], dtype=np.int64)
    ends = np.array([e for _, e, _ in rows], dtype=np.int64)
    starts = np.array([s for _, _, s in rows], dtype=np.int64)
    assert keyschema.records_many(keyschema.KEY_FIRST, encoded, index, ends, starts) == [
        keyschema.key_first(encoded[k], e, s) for k, e, s in rows]
    assert keyschema.records_many(keyschema.TIME_FIRST, encoded, index, ends, starts) == [
        keyschema.time_first(encoded[k], e, s) for k, e, s in rows]
    ranks = keyschema.key_order(encoded).tolist()
    distinct = sorted(set(encoded))
    assert ranks == [distinct.index(e) for e in encoded]


def test_records_many_refuses_an_unknown_layout() -> None:
    none = np.zeros(0, dtype=np.int64)
    with pytest.raises(ValueError, match="tag must be KEY_FIRST or TIME_FIRST, got b'X'"):
        keyschema.records_many(b"X", [], none, none, none)
