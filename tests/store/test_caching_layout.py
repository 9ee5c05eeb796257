"""The write cache (CachingSessionStore) against the store it wraps, written straight through:
the same reads at every step and the same contents after a flush, over the engine's use of it
(views loaded at a rising close cursor, puts, one-event merges, removals, closed sessions taken
from memory, ranged and full flushes, evictions, failed writes retried), with cache sizes down
to 1 and segments down to 1 ms.

It pins the cache's layout: a change stays in its view entry (NEW or CHANGED) until a flush
stages and writes it, and the end index holds keys, read again at each entry, not sessions.
The fused event step (engine/fast_event.py) writes the same layout inline; test_fast_event.py
pins it to the engine's full step."""

from __future__ import annotations

import gc
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionstore import InMemorySessionStore
from sessionstore.gap_boundary import first_open_end
from sessionstore.store.caching import CachingSessionStore
from sessionstore.timeutil import INT64_MAX, INT64_MIN
from sessionstore.types import Session

KEYS = st.sampled_from(["a", 3, ("t", 1)])
VALUES = st.one_of(st.integers(-5, 5), st.text(max_size=2))


class _Flaky:
    """The wrapped store, whose writes fail while ``armed`` (before changing anything)."""

    def __init__(self, store: InMemorySessionStore) -> None:
        self.store = store
        self.armed = False

    def _check(self) -> None:
        if self.armed:
            raise RuntimeError("injected write failure")

    def put(self, *args: Any, **kwargs: Any) -> Any:
        self._check()
        return self.store.put(*args, **kwargs)

    def put_many(self, *args: Any, **kwargs: Any) -> Any:
        self._check()
        return self.store.put_many(*args, **kwargs)

    def remove(self, *args: Any, **kwargs: Any) -> Any:
        self._check()
        return self.store.remove(*args, **kwargs)

    def remove_many(self, *args: Any, **kwargs: Any) -> Any:
        self._check()
        return self.store.remove_many(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name == "wrapped":
            raise AttributeError(name)
        return getattr(self.store, name)


OPS = st.one_of(
    st.tuples(st.just("put"), KEYS, st.integers(-3, 6), st.integers(0, 6), VALUES),
    st.tuples(st.just("merge"), KEYS, st.integers(0, 7), st.integers(-3, 6), st.integers(0, 6),
              VALUES),
    st.tuples(st.just("remove"), KEYS, st.integers(0, 3)),
    st.tuples(st.just("putback"), st.integers(0, 3), VALUES),
    st.tuples(st.just("take"), st.integers(0, 5)),
    st.tuples(st.just("flush_upto"), st.integers(-2, 8)),
    st.tuples(st.just("flush")),
    st.tuples(st.just("evict")),
    st.tuples(st.just("fail"), st.sampled_from(["flush", "flush_upto", "evict"])),
    st.tuples(st.just("read"), KEYS),
    st.tuples(st.just("view"), KEYS, st.integers(1, 6)),
)


def _open(segment: int) -> InMemorySessionStore:
    return InMemorySessionStore(retention_ms=10**9, segment_interval_ms=segment)


def _all(store: Any) -> list[tuple[Session, Any]]:
    return list(store.find_sessions(INT64_MIN, INT64_MAX))


@settings(max_examples=300)
@given(ops=st.lists(OPS, min_size=15, max_size=60), size=st.sampled_from([1, 2, 5, 1_000]),
       segment=st.sampled_from([1, 3, 50]))
def test_the_cache_reads_and_writes_what_its_store_would(ops: list[Any], size: int,
                                                         segment: int) -> None:
    flaky = _Flaky(_open(segment))
    cache = CachingSessionStore(flaky, size, index_ends=True)
    ref = _open(segment)
    cursor = 0  # the close cursor: sessions ending at or before it are never written again
    removed: list[Session] = []  # put back, they re-cut a removal not yet written
    for op in ops:
        kind = op[0]
        if kind == "view":  # at a floor past the cursor: the view forgets what ends before
            floor = cursor + op[2]
            view = cache.sessions_of(op[1], floor)
            assert sorted((b, v[0]) for b, v in view.items() if b[1] > floor) == sorted(
                ((s.start, s.end), value) for s, value in
                ref.find_sessions_to_merge(op[1], floor + 1, INT64_MAX))
            continue
        if kind == "putback":
            back = [s for s in removed if s.end > cursor]
            if back:
                session = back[op[1] % len(back)]
                cache.sessions_of(session.key, cursor)
                cache.put(session, op[2])
                ref.put(session, op[2])
            continue
        if kind in ("put", "merge", "remove"):
            key = op[1]
            view = cache.sessions_of(key, cursor)
            held = sorted(b for b in view if b[1] > cursor)
            assert held == sorted((s.start, s.end) for s, _ in
                                  ref.find_sessions_to_merge(key, cursor + 1, INT64_MAX))
            if kind == "remove":
                if held:
                    gone = Session(key, *held[op[2] % len(held)])
                    cache.remove(gone)
                    ref.remove(gone)
                    removed.append(gone)
                continue
            start = cursor + op[-3]
            end = max(start + op[-2], cursor + 1)
            joined = [b for i, b in enumerate(held) if op[2] >> i & 1] if kind == "merge" else []
            start = min([start, *(b[0] for b in joined)])
            end = max([end, *(b[1] for b in joined)])
            if kind == "merge":
                cache.put_merged(key, view, joined, (key, start, end), op[-1])
            else:
                cache.put(Session(key, start, end), op[-1])
            for b in joined:
                if b != (start, end):
                    ref.remove(Session(key, *b))
                    removed.append(Session(key, *b))
            ref.put(Session(key, start, end), op[-1])
        elif kind == "take":
            upto = cursor + op[1]
            expected = list(ref.find_sessions(first_open_end(cursor), upto))
            # the engine closes only when this says so: every session the cache has seen, even
            # one it forgot or wrote out, keeps an entry in the end index until it closes
            assert cache.has_ends_upto(upto) or not expected
            rows = cache.take_closed_rows(first_open_end(cursor), upto)
            got = (list(cache.find_sessions(first_open_end(cursor), upto)) if rows is None
                   else [(Session(row[3], row[2], row[0]), row[4]) for row in rows])
            assert got == expected
            cursor = upto
        elif kind == "flush_upto":
            cache.flush(cursor + op[1])
        elif kind == "flush":
            cache.flush()
        elif kind == "evict":
            cache.evict()
        elif kind == "fail":
            flaky.armed = True
            try:
                if op[1] == "flush":
                    cache.flush()
                elif op[1] == "flush_upto":
                    cache.flush(cursor + 3)
                else:
                    cache.evict()
            except RuntimeError:
                pass
            finally:
                flaky.armed = False
        else:  # read: a key's open sessions, through the cache and from the store
            key = op[1]
            assert sorted(cache.find_sessions_to_merge(key, cursor + 1, INT64_MAX)) == \
                sorted(ref.find_sessions_to_merge(key, cursor + 1, INT64_MAX))
            for session, value in ref.find_sessions_to_merge(key, cursor + 1, INT64_MAX):
                assert cache.fetch_session(*session) == value
    cache.flush()
    assert cache.dirty_count == 0
    assert _all(flaky.store) == _all(ref)


def _grown(cache: CachingSessionStore) -> None:
    """Key ``"a"``: a session (1, 5), grown by a merge into (1, 20), which then has no
    end-index entry of its own (the one of (1, 5) lies within it)."""
    view = cache.sessions_of("a", 0)
    cache.put(Session("a", 1, 5), 1)
    cache.put_merged("a", view, [(1, 5)], ("a", 1, 20), 2)


def test_a_session_the_view_forgets_keeps_an_end_index_entry() -> None:
    cache = CachingSessionStore(_open(50), 100, index_ends=True)
    _grown(cache)
    cache.put(Session("a", 30, 31), 3)
    cache.put(Session("a", 40, 41), 4)
    cache.sessions_of("a", 25)  # a floor past (1, 20): the view forgets it, still unwritten
    assert cache.take_closed_rows(1, 10) is None  # (1, 5)'s entry: nothing there any more
    assert cache.has_ends_upto(20)  # else the engine never reads (1, 20) back to close it
    cache.flush()
    assert _all(cache.wrapped) == [(Session("a", 1, 20), 2), (Session("a", 30, 31), 3),
                                   (Session("a", 40, 41), 4)]


def test_a_session_written_out_by_an_eviction_keeps_an_end_index_entry() -> None:
    cache = CachingSessionStore(_open(50), 100, index_ends=True)
    _grown(cache)
    cache.evict()  # (1, 20) is in the store only now
    assert cache.take_closed_rows(1, 10) is None
    assert cache.has_ends_upto(20)
    assert _all(cache.wrapped) == [(Session("a", 1, 20), 2)]


def test_a_view_stays_tracked_by_the_collector() -> None:
    """A held view is never untracked by a full collection (then re-tracked, as a young object,
    by its next new session, which made every view count towards the next full collection):
    the event path's views live as long as their keys."""
    cache = CachingSessionStore(InMemorySessionStore(retention_ms=1_000), 100, index_ends=True)
    view = cache.sessions_of("k", INT64_MIN)
    cache.put(Session("k", 1, 5), 7)
    gc.collect()
    gc.collect()
    assert gc.is_tracked(view)
    assert cache.event_layout.views["k"] is view


@pytest.mark.parametrize("count", [1, 15, 16, 17, 40])
def test_many_sessions_ending_together_all_close(count: int) -> None:
    """An end-index entry grows from a short tuple into a list (past 16 sessions): every
    session ending there closes, in store order, whether indexed when put or again after it
    grew."""
    cache = CachingSessionStore(_open(1_000), 1_000, index_ends=True)
    keys = [f"k{i:02d}" for i in range(count)]
    for i, key in enumerate(keys):
        view = cache.sessions_of(key, INT64_MIN)
        cache.put(Session(key, 10, 20), i)  # indexed at 20
        cache.put_merged(key, view, [(10, 20)], (key, 5, 30), i)  # grown: still at 20
    assert cache.take_closed_rows(1, 20) == []  # re-indexed at 30, together
    rows = cache.take_closed_rows(21, 30)
    assert rows is not None
    assert [(row[3], row[2], row[0], row[4]) for row in rows] == \
        [(key, 5, 30, i) for i, key in enumerate(keys)]
