"""A ``None`` value deletes the session, as a null aggregate does in Kafka's session stores
(``AbstractSessionBytesStoreTest.shouldRemoveOnNullAggValue``), on ``put`` and ``put_many`` of
both stores and through the write cache; stream time still advances."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sessionstore import InMemorySessionStore, Session, SessionStore
from sessionstore.store.caching import CachingSessionStore
from sessionstore.timeutil import INT64_MAX, INT64_MIN


def _open(kind: str, root: Path) -> Any:
    if kind == "memory":
        return InMemorySessionStore(retention_ms=10_000)
    return SessionStore(root / "s", retention_ms=10_000)


def _all(store: Any) -> list[tuple[tuple[Any, int, int], Any]]:
    return [(tuple(s), v) for s, v in store.find_sessions(INT64_MIN, INT64_MAX)]


@pytest.mark.parametrize("kind", ["memory", "rocksdb"])
def test_put_none_removes(kind: str, tmp_path: Path) -> None:
    store = _open(kind, tmp_path)
    a, b = Session("a", 0, 1000), Session("a", 1500, 2500)
    store.put(a, 1)
    store.put(b, 2)
    assert store.put(a, None) is True
    assert list(store.find_sessions_to_merge("a", 0, 1000)) == []
    assert store.fetch_session("a", 0, 1000) is None
    assert _all(store) == [(("a", 1500, 2500), 2)]
    assert store.put(Session("z", 3000, 4000), None) is True  # nothing there: still advances
    assert store.observed_stream_time == 4000
    assert _all(store) == [(("a", 1500, 2500), 2)]
    store.close()


@pytest.mark.parametrize("kind", ["memory", "rocksdb"])
def test_put_many_none_removes_and_the_last_write_wins(kind: str, tmp_path: Path) -> None:
    store = _open(kind, tmp_path)
    store.put_many(["a", "b", "c"], [0, 0, 0], [10, 20, 30], [1, 2, 3])
    # b deleted; c put then deleted in one call; d deleted then put in one call; e never there
    written = store.put_many(["b", "c", "c", "d", "d", "e"], [0, 0, 0, 0, 0, 0],
                             [20, 30, 30, 40, 40, 50], [None, 9, None, None, 4, None])
    assert written.tolist() == [True] * 6
    assert _all(store) == [(("a", 0, 10), 1), (("d", 0, 40), 4)]
    assert store.observed_stream_time == 50
    store.commit()
    assert _all(store) == [(("a", 0, 10), 1), (("d", 0, 40), 4)]
    store.close()


def test_put_none_through_the_write_cache(tmp_path: Path) -> None:
    cache = CachingSessionStore(SessionStore(tmp_path / "s", retention_ms=10_000), 100)
    cache.sessions_of("a", INT64_MIN)
    cache.put(Session("a", 0, 10), 1)
    cache.flush()
    cache.sessions_of("a", INT64_MIN)
    cache.put(Session("a", 0, 10), None)
    assert list(cache.find_sessions_to_merge("a", INT64_MIN, INT64_MAX)) == []
    cache.flush()
    assert _all(cache.wrapped) == []
    cache.wrapped.close()
