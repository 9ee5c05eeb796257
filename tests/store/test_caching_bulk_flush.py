"""The cache's bulk flush (one remove_many and one put_many) against its session-by-session
flush (taken when a forward listener is set): same store contents, same drop counts, and a
failed flush keeps every change for a retry."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from sessionstore import InMemorySessionStore, SessionStore
from sessionstore.gap_boundary import first_open_end
from sessionstore.store.caching import _BULK_FLUSH_MIN, CachingSessionStore
from sessionstore.timeutil import INT64_MAX, INT64_MIN
from sessionstore.types import Session


def _open(kind: str, root: Path, name: str) -> Any:
    if kind == "memory":
        return InMemorySessionStore(retention_ms=5_000, segment_interval_ms=1_000)
    return SessionStore(root / name, retention_ms=5_000, segment_interval_ms=1_000)


def _contents(store: Any) -> list[tuple[Session, Any]]:
    return list(store.find_sessions(INT64_MIN, INT64_MAX))


def _play(cache: CachingSessionStore, seed: int) -> None:
    """Puts (some twice) and removes of flushed and unflushed sessions, across keys, with end
    times spread so that expiry drops some writes."""
    rng = random.Random(seed)
    live: list[Session] = []
    for i in range(3 * _BULK_FLUSH_MIN):
        key = rng.choice(["a", "b", 7, ("t", 1)])
        cache.sessions_of(key, INT64_MIN)  # the engine loads a key's view before writing it
        start = rng.randrange(0, 20_000)
        session = Session(key, start, start + rng.randrange(0, 500))
        cache.put(session, [i, rng.random()])
        live.append(session)
        if rng.random() < 0.2:
            cache.put(session, [i, "again"])
        if rng.random() < 0.15:
            cache.remove(live.pop(rng.randrange(len(live))))
        if i == _BULK_FLUSH_MIN // 2:
            cache.flush()  # a few flushed sessions, removed later from the store itself


@pytest.mark.parametrize("kind", ["memory", "rocksdb"])
@pytest.mark.parametrize("seed", [1, 2])
def test_bulk_flush_equals_one_by_one(kind: str, seed: int, tmp_path: Path) -> None:
    bulk_store = _open(kind, tmp_path, "bulk")
    single_store = _open(kind, tmp_path, "single")
    bulk = CachingSessionStore(bulk_store, max_sessions=10 * _BULK_FLUSH_MIN)
    single = CachingSessionStore(single_store, max_sessions=10 * _BULK_FLUSH_MIN,
                                 forward=lambda *_: None)
    _play(bulk, seed)
    _play(single, seed)
    assert bulk.dirty_count >= _BULK_FLUSH_MIN  # the flush below takes the bulk path
    bulk.flush()
    single.flush()
    assert bulk.dirty_count == single.dirty_count == 0
    assert _contents(bulk_store) == _contents(single_store)
    assert len(_contents(bulk_store)) > 0
    assert bulk_store.metrics["dropped-records"] == single_store.metrics["dropped-records"]
    assert bulk_store.metrics["dropped-records"] > 0  # expiry did drop some writes
    bulk_store.close()
    single_store.close()


@pytest.mark.parametrize("kind", ["memory", "rocksdb"])
def test_failed_bulk_flush_keeps_every_change(kind: str, tmp_path: Path) -> None:
    store = _open(kind, tmp_path, "fail")
    cache = CachingSessionStore(store, max_sessions=10 * _BULK_FLUSH_MIN)
    cache.sessions_of("k", INT64_MIN)
    for i in range(_BULK_FLUSH_MIN):
        cache.put(Session("k", 10 * i, 10 * i + 5), i)
    cache.put(Session("k", 2_600, 2_600), {1, 2})  # a set: the serde refuses it
    dirty = cache.dirty_count
    with pytest.raises(TypeError, match="cannot be serialised"):
        cache.flush()
    assert cache.dirty_count == dirty
    assert _contents(store) == []
    cache.put(Session("k", 2_600, 2_600), 12)  # replaced: the retry writes everything
    cache.flush()
    assert cache.dirty_count == 0
    assert len(_contents(store)) == _BULK_FLUSH_MIN + 1
    store.close()


@pytest.mark.parametrize("kind", ["memory", "rocksdb"])
def test_put_remove_put_before_a_flush_is_written_once(kind: str, tmp_path: Path) -> None:
    """A session put, removed before any flush wrote it, then put again, is tracked twice;
    a partial flush must write it once, with its last value (the bulk flush deleted it from
    the dirty set twice and raised KeyError)."""
    cache = CachingSessionStore(_open(kind, tmp_path, "a"), max_sessions=10 * _BULK_FLUSH_MIN)
    sessions = [Session(f"k{i}", 100 + i, 200 + i) for i in range(2 * _BULK_FLUSH_MIN)]
    for session in sessions:
        cache.sessions_of(session.key, INT64_MIN)
        cache.put(session, "first")
        cache.remove(session)
        cache.put(session, "second")
    cache.flush(upto_end_ms=INT64_MAX - 1)
    assert _contents(cache.wrapped) == sorted(((s, "second") for s in sessions),
                                              key=lambda row: (row[0].end, row[0].key))
    assert cache.dirty_count == 0


@pytest.mark.parametrize("listener", [False, True])
@pytest.mark.parametrize("kind", ["memory", "rocksdb"])
def test_a_session_removed_put_back_and_removed_again_leaves_the_store(
        kind: str, listener: bool, tmp_path: Path) -> None:
    # a re-cut (maximum duration) can give a session the bounds of one it removed earlier;
    # removing it again must still remove what the store holds. Before, the put back marked
    # it as never written, and the second removal only dropped the cached change: the store
    # kept the session, and closing emitted it beside the one that replaced it
    store = _open(kind, tmp_path, "store")
    cache = CachingSessionStore(store, max_sessions=100,
                                forward=(lambda *_: None) if listener else None)
    session = Session("a", 22, 27)
    cache.sessions_of("a", INT64_MIN)
    cache.put(session, [1])
    cache.flush()  # now in the store
    cache.remove(session)
    cache.put(session, [2])
    assert cache.fetch_session("a", 22, 27) == [2]
    cache.remove(session)
    cache.put(Session("a", 22, 28), [3])
    cache.flush()
    assert _contents(store) == [(Session("a", 22, 28), [3])]


def _round(cache: CachingSessionStore, rng: random.Random, floor: int, held: dict[Any, int],
           cursor: int) -> int:
    """One round between flushes, as the engine drives the cache: views loaded at a rising
    floor (forgetting what ends below it, changes included), puts, one-event merges (a
    session replaced by one holding it), removals, and closed sessions taken from memory
    (``cursor``: the close cursor, below ``floor``; returns the new one)."""
    for i in range(4 * _BULK_FLUSH_MIN):
        key = rng.randrange(80)
        if key not in held or held[key] < floor or rng.random() < 0.05:
            held[key] = floor + rng.randrange(0, 300)  # may forget sessions ending below
        view = cache.sessions_of(key, held[key])
        live = sorted(b for b in view if b[1] > held[key])
        roll = rng.random()
        if live and roll < 0.3:  # grow one: a merge replacing it
            start, end = live[rng.randrange(len(live))]
            cache.put_merged(key, view, [(start, end)], (key, start - rng.randrange(3),
                                                         end + rng.randrange(1, 50)), [i])
        elif live and roll < 0.4:
            cache.remove(Session(key, *live[rng.randrange(len(live))]))
        elif live and roll < 0.55:  # the same bounds, a new value
            cache.put(Session(key, *live[rng.randrange(len(live))]), [i, "again"])
        else:
            start = held[key] + 1 + rng.randrange(0, 2_000)
            if not any(s <= start + 40 and e >= start for s, e in live):
                cache.put(Session(key, start, start + rng.randrange(1, 40)), [i])
    if rng.random() < 0.3:
        return cursor
    upto = floor + rng.randrange(100, 500)  # below the next round's floor
    cache.take_closed_rows(first_open_end(cursor), upto)
    return upto


@pytest.mark.parametrize("kind", ["memory", "rocksdb"])
@pytest.mark.parametrize("seed", [3, 4, 5])
def test_bulk_flushes_equal_one_by_one_over_rounds(kind: str, seed: int,
                                                   tmp_path: Path) -> None:
    """Full flushes of hundreds of changes, round after round: what the bulk flush writes from
    the views (and marks clean there) equals the session-by-session flush's writes, so that a
    later merge, removal or rewrite of a flushed session, or of a forgotten change, reaches
    the store as it does one by one."""
    stores = [_open(kind, tmp_path, "bulk"), _open(kind, tmp_path, "single")]
    caches = [CachingSessionStore(stores[0], 100 * _BULK_FLUSH_MIN, index_ends=True),
              CachingSessionStore(stores[1], 100 * _BULK_FLUSH_MIN, lambda *_: None,
                                  index_ends=True)]
    helds: list[dict[Any, int]] = [{}, {}]
    cursors = [INT64_MIN, INT64_MIN]
    for round_ in range(4):
        for i in (0, 1):
            cursors[i] = _round(caches[i], random.Random(seed * 100 + round_), 500 * round_,
                                helds[i], cursors[i])
        assert caches[0].dirty_count == caches[1].dirty_count >= _BULK_FLUSH_MIN
        for cache in caches:
            cache.flush()
            assert cache.dirty_count == 0
        assert _contents(stores[0]) == _contents(stores[1])
        assert stores[0].metrics["dropped-records"] == stores[1].metrics["dropped-records"]
    for store in stores:
        store.close()
