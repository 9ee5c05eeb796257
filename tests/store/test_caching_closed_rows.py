"""The closed sessions the write cache hands out from memory (``take_closed_rows``) reach the
wrapped store at the next flush, session by session or in one ``put_many``: those ending before
the expiry boundary the flush reaches are left out (a session ending exactly at it stays live),
every other one is written once, and a write that fails keeps the failed session and every one
after it for the retry."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sessionstore import InMemorySessionStore, SessionStore
from sessionstore.gap_boundary import first_open_end
from sessionstore.store.caching import _BULK_FLUSH_MIN, CachingSessionStore
from sessionstore.timeutil import INT64_MAX, INT64_MIN
from sessionstore.types import Session

RETENTION, SEGMENT = 5_000, 1_000
OPEN = Session("open", 6_900, 7_000)  # written with the flush: stream time 7000, boundary 2000
AHEAD = Session("ahead", 6_950, 7_000)


def _open(kind: str, root: Path, name: str) -> Any:
    if kind == "memory":
        return InMemorySessionStore(retention_ms=RETENTION, segment_interval_ms=SEGMENT)
    return SessionStore(root / name, retention_ms=RETENTION, segment_interval_ms=SEGMENT)


def _contents(store: Any) -> list[tuple[Session, Any]]:
    return list(store.find_sessions(INT64_MIN, INT64_MAX))


class _FailOnce:
    """The wrapped store, whose ``put`` of ``victim`` fails once (before changing anything)."""

    def __init__(self, store: Any, victim: Session | None) -> None:
        self.store = store
        self.victim = victim

    def put(self, session: Session, value: Any) -> Any:
        if session == self.victim:
            self.victim = None
            raise RuntimeError("injected write failure")
        return self.store.put(session, value)

    def __getattr__(self, name: str) -> Any:
        if name == "wrapped":
            raise AttributeError(name)
        return getattr(self.store, name)


def _closed(count: int) -> list[Session]:
    """Sessions ending from 1500 to 2600 (the flush's boundary is 2000; several end there)."""
    return [Session(f"k{i}", 1_400 - i % 9, 1_500 + 25 * (i % 45)) for i in range(count)]


@pytest.mark.parametrize("kind", ["memory", "rocksdb"])
@pytest.mark.parametrize("count", [40, 3 * _BULK_FLUSH_MIN])  # one by one, and put_many
@pytest.mark.parametrize(("fail_at", "ahead"), [
    (None, False), (None, True),  # no failure; the store's stream time already at the top
    (0.0, False), (0.7, False)])  # the first live write fails, a later one
def test_closed_sessions_reach_the_store_once_live_ones_all(
        kind: str, count: int, fail_at: float | None, ahead: bool, tmp_path: Path) -> None:
    sessions = _closed(count)
    live = [s for s in sessions if s.end >= 2_000]
    assert any(s.end == 2_000 for s in sessions)  # the boundary case is in
    victim = None if fail_at is None else live[int(fail_at * (len(live) - 1))]
    store = _open(kind, tmp_path, "cached")
    flaky = _FailOnce(store, victim)
    cache = CachingSessionStore(flaky, 10 * count, index_ends=True)
    for i, session in enumerate(sessions):
        cache.sessions_of(session.key, INT64_MIN)
        cache.put(session, [i])
    rows = cache.take_closed_rows(first_open_end(INT64_MIN), 2_600)
    assert rows is not None and len(rows) == count
    if ahead:  # a write already took the store to the flush's stream time: a put of an
        store.put(AHEAD, ["ahead"])  # expired session would be refused, a dropped write
    cache.sessions_of(OPEN.key, INT64_MIN)
    cache.put(OPEN, ["open"])
    if victim is not None and count < _BULK_FLUSH_MIN:  # put_many takes no single put
        with pytest.raises(RuntimeError, match="injected"):
            cache.flush()
        assert cache.dirty_count >= 1
    cache.flush()
    assert cache.dirty_count == 0
    ref = _open(kind, tmp_path, "ref")
    if ahead:
        ref.put(AHEAD, ["ahead"])
    for i, session in enumerate(sessions):
        if session.end >= 2_000:
            ref.put(session, [i])
    ref.put(OPEN, ["open"])
    assert _contents(store) == _contents(ref)
    assert store.metrics["dropped-records"] == 0  # nothing expired was written
    store.close()
    ref.close()
