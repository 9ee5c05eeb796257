"""Compaction under the caller's control: ``SessionStore(auto_compaction=False)`` and
``compact_segments`` (real RocksDB files)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from sessionstore import Session, SessionStore

SEGMENT_MS = 1_000


def all_sessions(store: SessionStore) -> list[tuple[str, int, int, int]]:
    return sorted((s.key, s.start, s.end, v) for s, v in store.find_sessions(-(2**62), 2**62))


def fill(store: SessionStore, commits: int) -> None:
    """``commits`` commits, each writing and removing sessions in segments 0 and 1."""
    for c in range(commits):
        for i in range(20):
            store.put(Session(f"k{i}", c * 10, c * 10 + 5 + i), c)
            store.put(Session(f"k{i}", SEGMENT_MS + c, SEGMENT_MS + c + 1), c)
        if c:
            store.remove(Session("k3", (c - 1) * 10, (c - 1) * 10 + 8))
        store.commit()


def test_files_accumulate_until_compact_segments_and_data_is_unchanged(tmp_path: Path):
    """Kills: auto_compaction=False ignored (RocksDB compacts after four flushes), and
    compact_segments ignoring its threshold or skipping due segments."""
    store = SessionStore(tmp_path / "s", retention_ms=10**6, segment_interval_ms=SEGMENT_MS,
                         auto_compaction=False)
    fill(store, 6)
    assert len(store.live_files()) == 12  # one file per commit and segment
    expected = all_sessions(store)
    assert store.compact_segments(7) == []
    assert len(store.live_files()) == 12
    assert store.compact_segments(6) == [0, 1]
    assert len(store.live_files()) == 2
    assert all_sessions(store) == expected
    store.commit()
    store.close()
    reopened = SessionStore(tmp_path / "s", retention_ms=10**6, segment_interval_ms=SEGMENT_MS)
    assert all_sessions(reopened) == expected
    reopened.close()


def test_compaction_in_another_thread_beside_writes_and_a_close(tmp_path: Path):
    """The owner keeps writing and then closes while a thread compacts: nothing is lost, and
    close waits for the compaction."""
    store = SessionStore(tmp_path / "s", retention_ms=10**6, segment_interval_ms=SEGMENT_MS,
                         auto_compaction=False)
    fill(store, 5)
    worker = threading.Thread(target=store.compact_segments, args=(2,))
    worker.start()
    store.put(Session("late", 7, 9), 99)
    store.commit()
    expected = all_sessions(store)
    store.close()
    worker.join()
    reopened = SessionStore(tmp_path / "s", retention_ms=10**6, segment_interval_ms=SEGMENT_MS)
    assert all_sessions(reopened) == expected
    assert ("late", 7, 9, 99) in expected
    reopened.close()


@pytest.mark.parametrize("value", [0, True, 2.0])
def test_compact_segments_checks_its_threshold(tmp_path: Path, value: object):
    store = SessionStore(tmp_path / "s", retention_ms=10**6)
    with pytest.raises(ValueError, match="min_level0_files"):
        store.compact_segments(value)  # type: ignore[arg-type]
    store.close()


def test_auto_compaction_must_be_a_bool(tmp_path: Path):
    with pytest.raises(ValueError, match="auto_compaction"):
        SessionStore(tmp_path / "s", retention_ms=10**6, auto_compaction=1)  # type: ignore[arg-type]
