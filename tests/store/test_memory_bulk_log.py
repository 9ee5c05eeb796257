"""The in-memory store logs bulk writes and deletes and applies them on the next read: runs of
bulk calls, single calls, commits and aborts with no read in between must leave exactly what a
loop of single calls leaves on RocksDB (another implementation) and in memory."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionstore import InMemorySessionStore, Session, SessionStore
from sessionstore.packing import pack_session_records
from sessionstore.store.base import SegmentedSessionStore
from tests.store.test_bulk_write import (
    ALL_KEYS,
    INT64_MAX,
    INT64_MIN,
    PROFILE_SCALE,
    configurations,
    contents,
    session_batches,
)


@st.composite
def scripts(draw: st.DrawFn) -> list[tuple[str, Any]]:
    """Operations on a small pool of sessions, so that logged calls hit the same sessions."""
    pool = draw(st.lists(
        st.tuples(st.sampled_from(ALL_KEYS[:4]), st.integers(-400, 400), st.integers(0, 60)),
        min_size=1, max_size=6, unique=True))
    picks = st.lists(st.integers(0, len(pool) - 1), min_size=1, max_size=8)
    # no None values here: a None (a delete) sends put_many down the row-by-row path
    values = st.integers(-5, 5)
    script: list[tuple[str, Any]] = []
    for _ in range(draw(st.integers(1, 14))):
        operation = draw(st.sampled_from(
            ["put_many", "put_many", "put_many", "remove_many", "remove_many", "put", "remove",
             "get", "read", "commit", "abort"]))
        if operation in ("put_many", "remove_many"):
            rows = [pool[i] for i in draw(picks)]
            script.append((operation, ([k for k, _, _ in rows], [s for _, s, _ in rows],
                                       [s + n for _, s, n in rows],
                                       [draw(values) for _ in rows])))
        elif operation in ("put", "remove", "get"):
            key, start, length = pool[draw(st.integers(0, len(pool) - 1))]
            script.append((operation, (key, start, length, draw(values))))
        else:
            script.append((operation, None))
    return script


# the bulk tests' random calls, with reads between them only now and then
OPERATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("put_many"), session_batches()),
        st.tuples(st.just("remove_many"), session_batches()),
        st.tuples(st.just("read"), st.none()),
        st.tuples(st.just("commit"), st.none()),
        st.tuples(st.just("abort"), st.none()),
    ),
    max_size=10,
)


def _bulk_call(store: SegmentedSessionStore, operation: str, argument: Any) -> Any:
    keys, starts, ends, values = argument
    distinct = list(dict.fromkeys(keys))  # the columnar form: each key once, plus an index
    index = np.array([distinct.index(k) for k in keys], dtype=np.int64)
    if operation == "put_many":
        return store.put_many(distinct, np.array(starts, dtype=np.int64),
                              np.array(ends, dtype=np.int64), values, key_index=index).tolist()
    store.remove_many(distinct, starts, ends, key_index=index)
    return None


def _loop_call(store: SegmentedSessionStore, operation: str, argument: Any) -> Any:
    keys, starts, ends, values = argument
    if operation == "put_many":
        return [store.put(Session(k, s, e), v)
                for k, s, e, v in zip(keys, starts, ends, values, strict=True)]
    for k, s, e in zip(keys, starts, ends, strict=True):
        store.remove(Session(k, s, e))
    return None


@settings(max_examples=round(150 * PROFILE_SCALE), deadline=None)
@given(config=configurations(), operations=st.one_of(scripts(), OPERATIONS))
def test_logged_bulk_calls_equal_loops_of_single_calls(
    config: dict[str, Any], operations: list[tuple[str, Any]]
) -> None:
    bulk = InMemorySessionStore(**config)
    loop = InMemorySessionStore(**config)
    with tempfile.TemporaryDirectory(prefix="bulk-log-") as root:
        disk = SessionStore(Path(root) / "loop", **config)
        try:
            for operation, argument in operations:
                if operation in ("put_many", "remove_many"):
                    got = _bulk_call(bulk, operation, argument)
                    assert got == _loop_call(loop, operation, argument)
                    assert got == _loop_call(disk, operation, argument)
                elif operation in ("put", "remove", "get"):
                    key, start, length, value = argument
                    session = Session(key, start, start + length)
                    if operation == "put":
                        assert bulk.put(session, value) == loop.put(session, value) \
                            == disk.put(session, value)
                    elif operation == "remove":
                        for store in (bulk, loop, disk):
                            store.remove(session)
                    else:
                        assert bulk.fetch_session(*session) == loop.fetch_session(*session) \
                            == disk.fetch_session(*session)
                elif operation == "read":
                    assert contents(bulk) == contents(loop)
                elif operation == "commit":
                    assert bulk.commit() == loop.commit() == disk.commit()
                else:
                    for store in (bulk, loop, disk):
                        store.abort()
            final = contents(bulk)
            assert final == contents(loop)
            # the RocksDB store counts its metrics its own way: compare what readers see
            assert final[:3] == contents(disk)[:3]
        finally:
            disk.close()


def test_the_log_keeps_its_own_copy_of_the_callers_columns() -> None:
    """Logged calls are applied later: changing the arguments after the call changes
    nothing (int64 arrays are taken without a copy; packed values cannot be changed)."""
    store = InMemorySessionStore(retention_ms=10_000)
    keys = ["a", "b", "c"]
    starts = np.array([0, 5, 7], dtype=np.int64)
    ends = np.array([10, 15, 17], dtype=np.int64)
    values = pack_session_records([np.array([1, 2, 3], dtype=np.int64)], combined=False)
    assert values is not None
    store.put_many(keys, starts, ends, values)
    gone_starts = np.array([7], dtype=np.int64)
    gone_ends = np.array([17], dtype=np.int64)
    store.remove_many(["c"], gone_starts, gone_ends)
    keys[0] = "z"
    starts[:] = 1
    ends[:] = 16
    gone_starts[:] = 5
    gone_ends[:] = 15
    assert [(tuple(s), v) for s, v in store.find_sessions(INT64_MIN, INT64_MAX)] == [
        (("a", 0, 10), [1, 0, 0, 0, None]), (("b", 5, 15), [2, 0, 0, 0, None])]


def test_an_unread_log_stays_within_a_bound_of_the_live_sessions() -> None:
    """Rewriting and deleting the same sessions in bulk, with no read in between, must not pile
    up a log that grows with the number of calls: it is applied once it outgrows the data."""
    from sessionstore.store import memory

    store = InMemorySessionStore(retention_ms=10**12, segment_interval_ms=10**12)
    n = 5_000
    keys = [f"user{i}" for i in range(n)]
    starts = np.arange(n, dtype=np.int64)
    for round_ in range(200):  # 1M logged writes and 1M logged deletes of 5,000 sessions
        ends = starts + 10 + round_
        store.put_many(keys, starts, ends, [round_] * n)
        store.remove_many(keys, starts, ends)
    segment = store._segments[0]  # noqa: SLF001 - the log is what this test bounds
    logged = 200 * 2 * n
    assert segment._pending_rows <= memory._MAX_UNAPPLIED_ROWS + 4 * n < logged // 10  # noqa: SLF001
    store.put_many(keys, starts, starts + 1, list(range(n)))
    assert [v for _, v in store.fetch("user7")] == [7]  # and reads still see every call
    assert sum(1 for _ in store.find_sessions(INT64_MIN, INT64_MAX)) == n
