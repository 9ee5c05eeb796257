"""The store's read side as Kafka's session-store tests expect it.

* open iterators and ``close()`` / ``abort()`` (Kafka AbstractSessionBytesStoreTest
  ``shouldCloseOpenIteratorsWhenStoreIsClosedAndNotThrowInvalidStateStoreExceptionOnHasNext``);
* reads skip sessions ending before ``expiry time - retention + 1`` (``shouldRemoveExpired``,
  ``shouldNotFetchExpiredSessions``), on the expiry time the engine caps;
* backward iteration (KIP-617: ``backwardFetch``, ``backwardFindSessions``).

Every scenario runs on both backends; the property test checks them, and the read-only view, against
a list of sessions filtered and sorted in the test.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionstore import InMemorySessionStore, ReadOnlySessionStore, Session, SessionStore
from sessionstore.keyschema import encode_key
from tests.conftest import StoreFactory

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
SEGMENT_INTERVAL = 60_000
RETENTION = 10_000


def values(rows: Any) -> list[Any]:
    return [v for _, v in rows]


def sessions(rows: Any) -> list[tuple[Any, int, int, Any]]:
    return [(s.key, s.start, s.end, v) for s, v in rows]


# -- F2: unfinished iterators, close and abort ---------------------------------------------------

READERS = {
    "fetch": lambda s: s.fetch("a"),
    "fetch_backward": lambda s: s.fetch("a", backward=True),
    "find_sessions": lambda s: s.find_sessions(0, 1000),
    "find_sessions_backward": lambda s: s.find_sessions(0, 1000, backward=True),
    "find_sessions_to_merge": lambda s: s.find_sessions_to_merge("a", 0, 1000),
    "find_sessions_to_merge_backward":
        lambda s: s.find_sessions_to_merge("a", 0, 1000, backward=True),
}


def _three_sessions(store: Any) -> None:
    for i in range(3):
        store.put(Session("a", i * 10, i * 10 + 5), i)


@pytest.mark.parametrize("reader", sorted(READERS))
@pytest.mark.parametrize("started", [True, False])
def test_abort_with_an_unfinished_iterator(make_store: StoreFactory, reader: str,
                                           started: bool) -> None:
    store: Any = make_store(retention_ms=10**12)
    _three_sessions(store)
    store.commit()
    store.put(Session("a", 100, 105), 9)  # uncommitted: abort must drop it
    it = READERS[reader](store)
    if started:
        next(it)
    store.abort()  # was: StoreCorruptedError "lock hold by current process" on RocksDB
    assert list(it) == []  # closed by abort: nothing more
    assert values(store.fetch("a")) == [0, 1, 2]
    assert store.committed_version == 1


@pytest.mark.parametrize("reader", sorted(READERS))
def test_close_ends_open_iterators_and_reopen_works(tmp_path: Path, reader: str) -> None:
    store = SessionStore(tmp_path / "s", retention_ms=10**12)
    _three_sessions(store)
    store.commit()
    it = READERS[reader](store)
    first = next(it)
    assert first[0].key == "a"
    store.close()
    with pytest.raises(StopIteration):  # Kafka: hasNext() is false after the store closed
        next(it)
    with SessionStore(tmp_path / "s", retention_ms=10**12) as again:
        assert values(again.fetch("a")) == [0, 1, 2]


def test_close_ends_open_iterators_in_memory() -> None:
    """Kafka's scenario (``fetch("a")``, ``hasNext``, close, ``hasNext`` false) in memory."""
    store = InMemorySessionStore(retention_ms=RETENTION)
    store.put(Session("a", 0, 0), 1)
    store.put(Session("b", 10, 50), 2)
    store.put(Session("c", 100, 500), 3)
    it = store.fetch("a")
    store.close()
    assert list(it) == []
    with pytest.raises(ValueError, match="closed"):
        store.fetch("a")


def test_iterators_survive_commit(make_store: StoreFactory) -> None:
    """Only close and abort end iterators: a commit (or a write) in the middle does not."""
    store: Any = make_store(retention_ms=10**12)
    _three_sessions(store)
    it = store.fetch("a")
    assert next(it)[1] == 0
    store.commit()
    assert values(it) == [1, 2]


# -- F4: expired sessions are not returned ----------------------------------------------------


def test_kafka_should_remove_expired(make_store: StoreFactory) -> None:
    """Kafka shouldRemoveExpired (its RocksDB variant: 60 s segments, 10 s retention): values 2
    and 3 end in a segment still held, but before stream time - retention + 1."""
    store: Any = make_store(retention_ms=RETENTION, segment_interval_ms=SEGMENT_INTERVAL)
    store.put(Session("a", 0, 0), 1)
    store.put(Session("aa", 0, SEGMENT_INTERVAL), 2)
    store.put(Session("a", 10, SEGMENT_INTERVAL), 3)
    store.put(Session("aa", 10, 2 * SEGMENT_INTERVAL), 4)
    assert values(store.find_sessions(INT64_MIN, INT64_MAX)) == [4]
    assert values(store.fetch("a")) == []
    assert values(store.fetch("aa")) == [4]
    assert store.fetch_session("aa", 0, SEGMENT_INTERVAL) is None
    assert store.fetch_session("aa", 10, 2 * SEGMENT_INTERVAL) == 4


def test_kafka_should_remove_expired_in_memory_variant(make_store: StoreFactory) -> None:
    """Kafka's in-memory variant: stream time = retention expires only the session ending at 0."""
    store: Any = make_store(retention_ms=RETENTION, segment_interval_ms=SEGMENT_INTERVAL)
    store.put(Session("a", 0, 0), 1)
    store.put(Session("aa", 0, 10), 2)
    store.put(Session("a", 10, 20), 3)
    store.put(Session("aa", 10, RETENTION), 4)
    assert sorted(values(store.find_sessions(INT64_MIN, INT64_MAX))) == [2, 3, 4]
    assert store.read_floor_ms == 1


def test_kafka_should_not_fetch_expired_sessions(make_store: StoreFactory) -> None:
    store: Any = make_store(retention_ms=RETENTION, segment_interval_ms=SEGMENT_INTERVAL)
    now = int(time.time() * 1000)
    r = RETENTION
    store.put(Session("p", now - 3 * r, now - 2 * r), 1)
    store.put(Session("q", now - 2 * r, now - r), 4)
    store.put(Session("r", now - r, now - r // 2), 3)
    store.put(Session("p", now - r, now - r // 2), 2)
    assert values(store.find_sessions_to_merge("p", now - 2 * r, now - r)) == [2]
    assert values(store.find_sessions_to_merge("p", now - 5 * r, now - 4 * r,
                                               backward=True)) == []
    assert sorted(values(store.find_sessions(now - 2 * r, now - r // 2))) == [2, 3, 4]
    assert store.fetch_session("p", now - 3 * r, now - 2 * r) is None


def test_read_floor_is_inclusive(make_store: StoreFactory) -> None:
    """A session ending exactly at stream time - retention + 1 is live, one ms earlier expired."""
    store: Any = make_store(retention_ms=100, segment_interval_ms=1_000_000)
    store.put(Session("k", 0, 899), "old")
    store.put(Session("k", 0, 900), "edge")
    store.put(Session("k", 0, 999), "new")
    assert store.read_floor_ms == 900
    assert values(store.fetch("k")) == ["edge", "new"]
    assert values(store.find_sessions(0, 2000)) == ["edge", "new"]
    assert store.fetch_session("k", 0, 899) is None
    assert store.fetch_session("k", 0, 900) == "edge"


def test_reads_use_the_capped_expiry_time(make_store: StoreFactory) -> None:
    """The engine caps expiry at its close cursor + retention: reads hide nothing above it,
    whatever stream time says; removing the cap hides by stream time again."""
    store: Any = make_store(retention_ms=100, segment_interval_ms=1_000_000)
    store.cap_expiry_time(150)  # the owner has emitted every session ending at or before 50
    store.put(Session("k", 0, 40), 1)
    store.put(Session("k", 0, 60), 2)
    store.put(Session("k", 0, 5_000), 3)
    assert store.read_floor_ms == 51
    assert values(store.fetch("k")) == [2, 3]
    assert store.fetch_session("k", 0, 60) == 2
    store.cap_expiry_time(None)
    assert values(store.fetch("k")) == [3]


def test_cap_is_committed_and_restored(tmp_path: Path) -> None:
    path = tmp_path / "s"
    with SessionStore(path, retention_ms=100, segment_interval_ms=1_000_000) as store:
        store.cap_expiry_time(150)
        store.put(Session("k", 0, 60), 2)
        store.put(Session("k", 0, 5_000), 3)
        store.commit()
        store.cap_expiry_time(None)
        store.abort()
        assert values(store.fetch("k")) == [2, 3]  # abort brought the committed cap back
    with SessionStore(path, retention_ms=100) as store:
        assert store.read_floor_ms == 51
        assert values(store.fetch("k")) == [2, 3]
    with ReadOnlySessionStore(path) as view:
        assert view.read_floor_ms == 51
        assert values(view.fetch("k")) == [2, 3]
        assert view.fetch_session("k", 0, 60) == 2


def test_read_only_view_skips_expired_sessions(tmp_path: Path) -> None:
    path = tmp_path / "s"
    with SessionStore(path, retention_ms=RETENTION, segment_interval_ms=SEGMENT_INTERVAL) as s:
        s.put(Session("a", 0, 0), 1)
        s.put(Session("aa", 0, SEGMENT_INTERVAL), 2)
        s.put(Session("a", 10, SEGMENT_INTERVAL), 3)
        s.put(Session("aa", 10, 2 * SEGMENT_INTERVAL), 4)
        s.commit()
    with ReadOnlySessionStore(path) as view:
        assert view.read_floor_ms == 2 * SEGMENT_INTERVAL - RETENTION + 1
        assert values(view.find_sessions(INT64_MIN, INT64_MAX)) == [4]
        assert values(view.fetch("aa", backward=True)) == [4]
        assert view.fetch_session("aa", 0, SEGMENT_INTERVAL) is None
        assert list(view) == view.find_sessions(INT64_MIN, INT64_MAX)


# -- F5: backward iteration (KIP-617) ----------------------------------------------------------


def test_kafka_backward_find_sessions_in_range(make_store: StoreFactory) -> None:
    store: Any = make_store(retention_ms=RETENTION)
    store.put(Session("a", 10, 10), 1)
    store.put(Session("a", 500, 1000), 2)
    store.put(Session("a", 1500, 2000), 1)
    store.put(Session("a", 2500, 3000), 2)
    assert sessions(store.find_sessions_to_merge("a", 0, 1000, backward=True)) == [
        ("a", 500, 1000, 2), ("a", 10, 10, 1)]
    assert sessions(store.find_sessions_to_merge("a", 400, 600, backward=True)) == [
        ("a", 500, 1000, 2)]


def test_kafka_backward_fetch_all_sessions_with_same_record_key(make_store: StoreFactory) -> None:
    store: Any = make_store(retention_ms=RETENTION)
    expected = [("a", 0, 0, 1), ("a", 10, 10, 2), ("a", 100, 100, 3), ("a", 1000, 1000, 4)]
    for key, start, end, value in expected:
        store.put(Session(key, start, end), value)
    store.put(Session("aa", 0, 0), 5)
    assert sessions(store.fetch("a")) == expected
    assert sessions(store.fetch("a", backward=True)) == expected[::-1]


def test_kafka_backward_find_sessions_to_merge(make_store: StoreFactory) -> None:
    store: Any = make_store(retention_ms=RETENTION)
    for i, (start, end) in enumerate([(0, 100), (101, 200), (201, 300), (301, 400), (401, 500)]):
        store.put(Session("a", start, end), i + 1)
    assert values(store.find_sessions_to_merge("a", 150, 300, backward=True)) == [3, 2]
    assert values(store.find_sessions_to_merge("a", -1, 1000, backward=True)) == [5, 4, 3, 2, 1]


def test_kafka_iterator_peek_backward(make_store: StoreFactory) -> None:
    store: Any = make_store(retention_ms=RETENTION)
    store.put(Session("a", 0, 0), 1)
    store.put(Session("aa", 0, 10), 2)
    store.put(Session("a", 10, 20), 3)
    store.put(Session("aa", 10, 20), 4)
    it = store.find_sessions_to_merge("a", 0, 20, backward=True)
    assert next(it)[0] == Session("a", 10, 20)
    assert next(it)[0] == Session("a", 0, 0)
    assert list(it) == []


def test_kafka_backward_exact_binary_keys(make_store: StoreFactory) -> None:
    store: Any = make_store(retention_ms=RETENTION)
    keys = [b"\0", b"\0\0", b"\0\0\0"]
    for i in range(9):
        store.put(Session(keys[i % 3], i + 1, 100), str(i + 1))
    assert values(store.fetch(b"\0", backward=True)) == ["7", "4", "1"]
    assert values(store.fetch(b"\0\0", backward=True)) == ["8", "5", "2"]
    assert values(store.fetch(b"\0\0\0", backward=True)) == ["9", "6", "3"]


def test_backward_same_end_orders_start_descending(make_store: StoreFactory) -> None:
    store: Any = make_store(retention_ms=RETENTION, segment_interval_ms=60_000)
    for start in (5, 1, 3):
        store.put(Session("k", start, 50), start)
        store.put(Session("j", start, 50), -start)
    assert values(store.fetch("k", backward=True)) == [5, 3, 1]
    forward = sessions(store.find_sessions(0, 100))
    assert sessions(store.find_sessions(0, 100, backward=True)) == forward[::-1]


def test_backward_find_sessions_at_int64_bounds(make_store: StoreFactory) -> None:
    store: Any = make_store(retention_ms=INT64_MAX)
    store.cap_expiry_time(INT64_MIN)  # an owner that closed nothing yet: nothing expires
    store.put(Session("k", INT64_MIN, INT64_MIN), 1)
    store.put(Session("k", INT64_MAX - 1, INT64_MAX), 2)
    store.put(Session("z", 0, INT64_MAX), 3)
    assert values(store.find_sessions(INT64_MIN, INT64_MAX, backward=True)) == \
        values(store.find_sessions(INT64_MIN, INT64_MAX))[::-1]
    assert values(store.fetch("k", backward=True)) == [2, 1]
    assert values(store.find_sessions(INT64_MAX, INT64_MAX, backward=True)) == \
        values(store.find_sessions(INT64_MAX, INT64_MAX))[::-1]


# -- the property: both stores and the view against a list model -----------------------------

KEYS = st.sampled_from(["a", "aa", "b", b"a", 0, 1, -1, ("a", 1)])
TIMES = st.integers(-60, 120)


class Model:
    """What the documented contract says, written from scratch: a list of sessions; a put
    advances stream time, is dropped when its segment is below the capped expiry time's, and
    drops every older segment; reads return sessions ending at or after ``capped - R + 1``."""

    def __init__(self, retention: int, interval: int) -> None:
        self.retention, self.interval = retention, interval
        self.rows: dict[tuple[Any, int, int], Any] = {}
        self.stream_time: int | None = None
        self.cap: int | None = None

    def reference(self) -> int | None:
        if self.stream_time is None:
            return None
        return self.stream_time if self.cap is None else min(self.stream_time, self.cap)

    def put(self, key: Any, start: int, end: int, value: Any) -> bool:
        self.stream_time = end if self.stream_time is None else max(self.stream_time, end)
        reference = self.reference()
        assert reference is not None
        min_live = (reference - self.retention) // self.interval
        if end // self.interval < min_live:
            return False
        self.rows[(key, start, end)] = value
        self.rows = {s: v for s, v in self.rows.items() if s[2] // self.interval >= min_live}
        return True

    def live(self) -> list[tuple[tuple[Any, int, int], Any]]:
        reference = self.reference()
        floor = INT64_MIN if reference is None else reference - self.retention + 1
        return [(s, v) for s, v in self.rows.items() if s[2] >= floor]

    def by_key(self, key: Any, earliest: int, latest: int) -> list[Any]:
        enc = encode_key(key)
        rows = [(s, v) for s, v in self.live() if encode_key(s[0]) == enc
                and s[2] >= earliest and s[1] <= latest]
        return [(s[0], s[1], s[2], v) for s, v in sorted(rows, key=lambda r: (r[0][2], r[0][1]))]

    def by_time(self, earliest: int, latest: int) -> list[Any]:
        rows = [(s, v) for s, v in self.live() if earliest <= s[2] <= latest]
        rows.sort(key=lambda r: (r[0][2], encode_key(r[0][0]), r[0][1]))
        return [(s[0], s[1], s[2], v) for s, v in rows]


def _check_reads(store: Any, model: Model, probes: list[tuple[Any, int, int]]) -> None:
    for key, a, b in probes:
        lo, hi = min(a, b), max(a, b)
        for backward in (False, True):
            flip = (lambda r: r[::-1]) if backward else (lambda r: r)
            assert sessions(store.find_sessions_to_merge(key, lo, hi, backward=backward)) == \
                flip(model.by_key(key, lo, hi))
            assert sessions(store.find_sessions_to_merge(key, hi, lo, backward=backward)) == \
                flip(model.by_key(key, hi, lo))
            assert sessions(store.find_sessions(lo, hi, backward=backward)) == \
                flip(model.by_time(lo, hi))
            assert sessions(store.fetch(key, backward=backward)) == \
                flip(model.by_key(key, INT64_MIN, INT64_MAX))
        live = dict(model.live())
        for (k, start, end) in list(model.rows)[:5]:
            if encode_key(k) == encode_key(key):
                assert store.fetch_session(k, start, end) == live.get((k, start, end))
    assert sessions(store.find_sessions(INT64_MIN, INT64_MAX)) == \
        model.by_time(INT64_MIN, INT64_MAX)


OPS = st.lists(st.one_of(
    st.tuples(st.just("put"), KEYS, TIMES, st.integers(0, 40), st.integers(-999, 999)),
    st.tuples(st.just("cap"), st.one_of(st.none(), TIMES)),
    st.tuples(st.just("commit")),
    st.tuples(st.just("abort")),
    st.tuples(st.just("reopen")),
    st.tuples(st.just("open_iterator"), KEYS),
), max_size=40)


@settings(max_examples=60)
@given(backend=st.sampled_from(["rocksdb", "memory"]), retention=st.integers(0, 60),
       interval=st.integers(1, 30), ops=OPS,
       probes=st.lists(st.tuples(KEYS, TIMES, TIMES), min_size=1, max_size=4))
def test_reads_match_a_list_model(backend: str, retention: int, interval: int,
                                  ops: list[tuple[Any, ...]],
                                  probes: list[tuple[Any, int, int]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "s"

        def open_store() -> Any:
            if backend == "rocksdb":
                return SessionStore(path, retention_ms=retention, segment_interval_ms=interval)
            return InMemorySessionStore(retention_ms=retention, segment_interval_ms=interval)

        store = open_store()
        model = Model(retention, interval)
        committed = (dict(model.rows), model.stream_time, model.cap)
        dangling: list[Iterator[Any]] = []
        try:
            for op in ops:
                if op[0] == "put":
                    _, key, start, length, value = op
                    assert store.put(Session(key, start, start + length), value) == \
                        model.put(key, start, start + length, value)
                elif op[0] == "cap":
                    store.cap_expiry_time(op[1])
                    model.cap = op[1]
                elif op[0] == "commit":
                    store.commit()
                    committed = (dict(model.rows), model.stream_time, model.cap)
                elif op[0] == "abort" or (op[0] == "reopen" and backend == "memory"):
                    store.abort()
                    model.rows, model.stream_time, model.cap = dict(committed[0]), *committed[1:]
                elif op[0] == "reopen":
                    store.close()
                    store = open_store()
                    model.rows, model.stream_time, model.cap = dict(committed[0]), *committed[1:]
                else:  # a reader that stops early, as the engine's consumers may
                    it = store.fetch(op[1])
                    next(it, None)
                    dangling.append(it)
            _check_reads(store, model, probes)
            if backend == "rocksdb":
                store.commit()
                with ReadOnlySessionStore(path) as view:
                    _check_reads(view, model, probes)
        finally:
            store.close()
        assert all(list(it) == [] for it in dangling)


# -- the engine's invariant: reads never hide what the engine has not emitted ----------------


@pytest.mark.parametrize("backend", ["rocksdb", "memory"])
def test_reads_keep_every_session_the_engine_has_not_emitted(tmp_path: Path,
                                                             backend: str) -> None:
    """An external watermark far behind the data: stream time - retention is past every session
    but the last, yet none is closed, so every read must still return them all."""
    from sessionstore import EmitStrategy, SessionAggregator, SessionWindows, aggregations

    windows = SessionWindows(10)
    store: Any = (SessionStore(tmp_path / "s", retention_ms=windows.retention_ms,
                               segment_interval_ms=1)
                  if backend == "rocksdb" else
                  InMemorySessionStore(retention_ms=windows.retention_ms, segment_interval_ms=1))
    engine = SessionAggregator(store, windows, aggregations.count(),
                               emit=EmitStrategy.ON_WINDOW_CLOSE, watermark="external")
    for t in range(0, 1001, 100):
        engine.process("a", None, t)
    engine.flush()
    expected = [(t, t + 10) for t in range(0, 1001, 100)]
    assert [(s.start, s.end) for s, _ in engine.sessions("a")] == expected
    assert [(s.start, s.end) for s, _ in store.find_sessions(INT64_MIN, INT64_MAX)] == expected
    engine.commit()
    if backend == "rocksdb":
        with ReadOnlySessionStore(tmp_path / "s") as view:
            assert [(s.start, s.end) for s, _ in view.fetch("a")] == expected
    out = engine.advance_watermark(505)
    assert [(e.session.start, e.session.end) for e in out] == expected[:5]
    still_open = [(s.start, s.end) for s, _ in engine.sessions("a")]
    assert still_open[-6:] == expected[5:]  # emitted ones may be hidden, open ones never
    out = engine.advance_watermark(2_000)
    assert [(e.session.start, e.session.end) for e in out] == expected[5:]
    store.close()


def test_commit_after_a_put_under_a_minimum_cap(tmp_path: Path) -> None:
    """put() kept a min-live segment below int64 (cap at INT64_MIN, 1 ms segments), and the
    commit could not write it (msgpack OverflowError); put_many already clamped it."""
    with SessionStore(tmp_path / "s", retention_ms=10, segment_interval_ms=1) as store:
        store.cap_expiry_time(INT64_MIN)
        store.put(Session("a", 0, 10), 1)
        assert store.commit() == 1
    with SessionStore(tmp_path / "s", retention_ms=10, segment_interval_ms=1) as store:
        assert values(store.fetch("a")) == [1]
