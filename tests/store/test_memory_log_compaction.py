"""The in-memory store compacts a segment's unread bulk log in columns (``compact_log``) instead
of applying it to its dicts. A compacted log must hold exactly what applying the log would: the
same values for every session, whatever the interleaving of bulk writes, bulk deletes, single
calls, reads, commits and aborts, and whatever the segments' size."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionstore import InMemorySessionStore, Session, keyschema
from sessionstore.arrays import ByteRows
from sessionstore.store import memory
from sessionstore.store.base import SegmentedSessionStore
from tests.store.test_bulk_write import PROFILE_SCALE, configurations, contents
from tests.store.test_memory_bulk_log import OPERATIONS, _bulk_call, _loop_call, scripts

# -- compact_log against a dict that replays the log row by row ------------------------------

ENCODED = [keyschema.encode_key(k) for k in ["a", "b", 7, ("a", 1), ""]]
Entry = tuple[int, bytes, int]


@st.composite
def bulks(draw: st.DrawFn) -> memory._Bulk:
    """A bulk write or delete as the store logs it: its own key list (a key may be listed
    twice: a caller's key column may repeat a key), rows that may repeat a session in a
    delete (``put_many`` writes each session once)."""
    keys = draw(st.lists(st.sampled_from(ENCODED), min_size=1, max_size=6))
    n = draw(st.integers(0, 8))
    key_index = draw(st.lists(st.integers(0, len(keys) - 1), min_size=n, max_size=n))
    starts = draw(st.lists(st.integers(-3, 3), min_size=n, max_size=n))
    ends = [s + draw(st.integers(0, 2)) for s in starts]
    data = None
    if draw(st.booleans()):
        once = {(ends[i], keys[key_index[i]], starts[i]): i for i in range(n)}
        rows = sorted(once.values())
        key_index, starts, ends = ([column[i] for i in rows]
                                   for column in (key_index, starts, ends))
        data = [bytes([draw(st.integers(0, 255))]) for _ in rows]
    return memory._Bulk(ByteRows.of_list(keys),  # a key's encoding may be listed twice
                        np.array(key_index, dtype=np.int64),
                        np.array(starts, dtype=np.int64), np.array(ends, dtype=np.int64),
                        None if data is None else ByteRows.of_list(data))


def replayed(applied: dict[Entry, bytes], log: list[memory._Bulk]) -> dict[Entry, bytes]:
    """The oracle: each row of each bulk in turn, on a plain dict."""
    values = dict(applied)
    for bulk in log:
        keys = bulk.keys.tolist()
        data = None if bulk.data is None else bulk.data.tolist()
        for row in range(len(bulk.ends)):
            entry = (int(bulk.ends[row]), keys[int(bulk.key_index[row])],
                     int(bulk.starts[row]))
            if data is None:
                values.pop(entry, None)
            else:
                values[entry] = data[row]
    return values


def settled(applied: dict[Entry, bytes], log: list[memory._Bulk]) -> memory._Segment:
    """A segment holding ``applied`` (single writes), then ``log`` applied by a read."""
    segment = memory._Segment()
    for entry, data in applied.items():
        segment.write(entry, data)
    segment._pending = list(log)  # noqa: SLF001 - what the log holds is the subject here
    segment.values()
    return segment


def frozen(log: list[memory._Bulk]) -> list[tuple[Any, ...]]:
    return [(b.keys.tolist(), b.key_index.tolist(), b.starts.tolist(), b.ends.tolist(),
             None if b.data is None else b.data.tolist()) for b in log]


@settings(max_examples=round(300 * PROFILE_SCALE), deadline=None)
@given(applied_rows=st.lists(st.tuples(st.integers(-3, 5), st.sampled_from(ENCODED),
                                       st.integers(-3, 3), st.binary(max_size=2)),
                             max_size=6),
       log=st.lists(bulks(), max_size=6), cut=st.integers(0, 6))
def test_a_compacted_log_applies_as_the_log_does(
    applied_rows: list[tuple[int, bytes, int, bytes]], log: list[memory._Bulk], cut: int
) -> None:
    """The same sessions and values as the row-by-row oracle and as applying the whole log;
    at most one write and one delete, each session once; the logged bulks untouched (a
    commit's snapshot shares them). Compacting a compacted prefix again changes nothing."""
    applied = {(end, key, start): data for end, key, start, data in applied_rows
               if start <= end}
    expected = replayed(applied, log)
    before = frozen(log)
    for compacted in (memory.compact_log(log, applied),
                      memory.compact_log(memory.compact_log(log[:cut], applied) + log[cut:],
                                         applied)):
        assert frozen(log) == before
        assert sorted(bulk.data is None for bulk in compacted) in ([], [False], [True],
                                                                   [False, True])
        rows = [(int(b.ends[i]), b.keys.tolist()[int(b.key_index[i])], int(b.starts[i]))
                for b in compacted for i in range(len(b.ends))]
        assert len(rows) == len(set(rows))
        # a delete only of what is applied: the log stays within the data
        assert all(row in applied for b in compacted if b.data is None
                   for row in [(int(b.ends[i]), b.keys.tolist()[int(b.key_index[i])],
                                int(b.starts[i])) for i in range(len(b.ends))])
        segment = settled(applied, compacted)
        assert segment.values() == expected
        # the indexes a read uses, not only the values
        assert segment.by_time() == sorted(expected)
        reference = settled(applied, log)
        assert segment.key_index() == reference.key_index()
        assert reference.values() == expected


# -- the store, compacting often, against the store that never compacts ----------------------

@contextmanager
def log_bound(rows: int) -> Iterator[None]:
    """Compact a segment's log once it holds more than ``rows`` rows plus twice the rest."""
    saved = memory._MAX_UNAPPLIED_ROWS
    memory._MAX_UNAPPLIED_ROWS = rows
    try:
        yield
    finally:
        memory._MAX_UNAPPLIED_ROWS = saved


@contextmanager
def counted_compactions() -> Iterator[list[int]]:
    """A one-item list counting the segments' compactions while the context lasts."""
    count = [0]
    compact = memory._Segment.compact

    def counted(segment: memory._Segment) -> None:
        count[0] += 1
        compact(segment)

    memory._Segment.compact = counted  # type: ignore[method-assign]
    try:
        yield count
    finally:
        memory._Segment.compact = compact  # type: ignore[method-assign]


def observe(config: dict[str, Any], operations: list[tuple[str, Any]],
            loop: SegmentedSessionStore | None = None) -> tuple[list[Any], int]:
    """What every call returns and every read sees; the number of compactions it took."""
    store = InMemorySessionStore(**config)
    seen: list[Any] = []
    with counted_compactions() as compactions:
        for operation, argument in operations:
            if operation in ("put_many", "remove_many"):
                seen.append(_bulk_call(store, operation, argument))
                if loop is not None:
                    _loop_call(loop, operation, argument)
            elif operation in ("put", "remove", "get"):
                key, start, length, value = argument
                session = Session(key, start, start + length)
                if operation == "put":
                    seen.append(store.put(session, value))
                elif operation == "remove":
                    store.remove(session)
                else:
                    seen.append(store.fetch_session(*session))
                if loop is not None and operation != "get":
                    loop.put(session, value) if operation == "put" else loop.remove(session)
            elif operation == "read":
                seen.append(contents(store))
            elif operation == "commit":
                seen.append(store.commit())
                if loop is not None:
                    loop.commit()
            else:
                store.abort()
                if loop is not None:
                    loop.abort()
        seen.append(contents(store))
    return seen, compactions[0]


@settings(max_examples=round(150 * PROFILE_SCALE), deadline=None)
@given(config=configurations(), bound=st.sampled_from([0, 1, 4, 16]),
       operations=st.one_of(scripts(), OPERATIONS))
def test_compacting_changes_no_answer(
    config: dict[str, Any], bound: int, operations: list[tuple[str, Any]]
) -> None:
    """Every call's result and every read, with a log bound of a few rows (compacting
    often, tiny segments included), equal those of the store whose log is only ever applied,
    and the final contents equal those of single calls."""
    with log_bound(1 << 60):
        expected, never = observe(config, operations)
    assert never == 0
    loop = InMemorySessionStore(**config)
    with log_bound(bound):
        got, _ = observe(config, operations, loop)
    assert got == expected
    assert got[-1] == contents(loop)


def test_small_bounds_do_compact() -> None:
    """The property test above exercises compaction: with a bound of 0, bulk calls with no
    read in between compact the log, which stays within twice the distinct sessions, and a
    read still sees every call, also after an abort to a commit in between."""
    operations: list[tuple[str, Any]] = []
    for round_ in range(6):
        keys = ["a", "b", "c", "a"]
        starts = [0, 1, 2, 5 + round_] if round_ < 2 else [10, 11, 12, 15 + round_]
        ends = [s + 3 for s in starts]
        operations.append(("put_many", (keys, starts, ends, [round_] * 4)))
        operations.append(("remove_many", (keys[:1], starts[:1], ends[:1], [None])))
        if round_ == 1:  # applies the log: a later compaction must keep the delete of b
            operations.append(("read", None))
        if round_ == 2:
            operations.append(("remove_many", (["b"], [1], [4], [None])))
            operations.append(("commit", None))
    config = {"retention_ms": 1_000, "segment_interval_ms": 1_000}
    with log_bound(1 << 60):
        expected, never = observe(config, operations)
        expected_aborted, _ = observe(config, [*operations, ("abort", None)])
    with log_bound(0):
        got, compactions = observe(config, operations)
        got_aborted, _ = observe(config, [*operations, ("abort", None)])
    # a look at a log with less than a quarter of garbage leaves it (and waits until it has
    # doubled): fewer compactions than looks
    assert never == 0 and compactions >= 2
    assert got == expected and got_aborted == expected_aborted
    assert expected_aborted[-1] != expected[-1]  # the abort went back to the commit
    store = InMemorySessionStore(**config)
    with log_bound(0):
        for operation, argument in operations:
            if operation == "commit":
                store.commit()
            elif operation == "put_many" or operation == "remove_many":
                _bulk_call(store, operation, argument)
    # 31 rows logged over 12 distinct sessions: the log keeps at most twice what it held when
    # last looked at, which is at most one row per session after a compaction, and at most
    # 4/3 of one when it was left as it was (at most a quarter of it garbage)
    segment = store._segments[0]  # noqa: SLF001 - the log's size is what this checks
    assert segment._pending_rows <= 2 * segment._compacted_rows <= 2 * 16  # noqa: SLF001


def test_deletes_of_sessions_never_applied_do_not_pile_up() -> None:
    """Sessions written and deleted again with no read in between leave nothing in the
    compacted log, also when the segment holds applied sessions: the log stays within a
    bound of the live data, not of every session that ever came and went."""
    store = InMemorySessionStore(retention_ms=10**12, segment_interval_ms=10**12)
    store.put(Session("kept", 0, 1), "v")  # applied: the segment's dict is not empty
    n = 100
    keys = [f"user{i}" for i in range(n)]
    with log_bound(0):
        for round_ in range(50):  # 10,000 rows over 5,000 distinct sessions, all deleted
            starts = np.arange(n, dtype=np.int64) + 1_000 * round_
            store.put_many(keys, starts, starts + 10, [round_] * n)
            store.remove_many(keys, starts, starts + 10)
    segment = store._segments[0]  # noqa: SLF001 - the log's size is what this checks
    assert segment._pending_rows <= 2 * n  # noqa: SLF001 - at most the last two calls
    assert [(tuple(s), v) for s, v in store.find_sessions(-(2**63), 2**63 - 1)] == [
        (("kept", 0, 1), "v")]


# -- the compaction trigger's garbage bound against what compaction drops ---------------------

@settings(max_examples=round(200 * PROFILE_SCALE), deadline=None)
@given(applied_rows=st.lists(st.tuples(st.integers(-3, 5), st.sampled_from(ENCODED),
                                       st.integers(-3, 3), st.binary(max_size=2)),
                             max_size=6),
       log=st.lists(bulks(), max_size=8), compact_at=st.sets(st.integers(0, 8)))
def test_the_garbage_bound_bounds_what_compaction_drops(
    applied_rows: list[tuple[int, bytes, int, bytes]], log: list[memory._Bulk],
    compact_at: set[int],
) -> None:
    """A segment leaves a log whose garbage bound is under a quarter of its rows as it is,
    so the bound must never be below the rows compacting would drop: after every logged bulk,
    with compactions at random points."""
    segment = memory._Segment()
    for end, key, start, data in applied_rows:
        if start <= end:
            segment.write((end, key, start), data)
    with log_bound(1 << 60):  # compacted only where drawn
        for at, bulk in enumerate(log):
            if at in compact_at:
                segment.compact()
            segment.log(bulk)
            pending = segment._pending  # noqa: SLF001 - the log is the subject here
            kept = sum(len(b.ends) for b in memory.compact_log(pending, segment._values))  # noqa: SLF001
            assert segment.garbage_bound() >= segment._pending_rows - kept  # noqa: SLF001


def test_a_log_that_rewrites_little_is_not_compacted() -> None:
    """Bulk writes of new sessions only (a few deleted) leave the log as it is past the row
    bound: nothing to reclaim. Rewriting the same sessions then makes it compact, and a read
    sees the last values."""
    store = InMemorySessionStore(retention_ms=10**12, segment_interval_ms=10**12)
    n = 100
    keys = [f"user{i}" for i in range(n)]
    with counted_compactions() as compactions, log_bound(0):
        for round_ in range(20):
            starts = np.arange(n, dtype=np.int64) + 1_000 * round_
            store.put_many(keys, starts, starts + 10, [round_] * n)
            store.remove_many(keys[:5], starts[:5], starts[:5] + 10)
        assert compactions == [0]
        segment = store._segments[0]  # noqa: SLF001 - the log's size is what this checks
        assert segment._pending_rows == 20 * (n + 5)  # noqa: SLF001
        for round_ in range(20):  # the first round's sessions, again and again
            starts = np.arange(n, dtype=np.int64)
            store.put_many(keys, starts, starts + 10, [round_] * n)
        assert compactions[0] > 0
        assert segment._pending_rows < 20 * (n + 5) + 20 * n  # noqa: SLF001
    assert sorted(v for _, v in store.fetch("user7"))[-1] == 19
