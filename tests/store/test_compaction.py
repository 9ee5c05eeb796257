"""Compaction under the caller's control: ``SessionStore(auto_compaction=False)`` and
``compact_segments`` (real RocksDB files)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import rocksdict

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


def test_compact_segments_counts_every_sorted_run_of_ingested_files(tmp_path: Path):
    """Large bulk writes are ingested as files, which land in the empty levels above the
    segment's data rather than at level 0: each is still one sorted run to search, and
    compact_segments counts them all (kills counting level-0 files alone)."""
    store = SessionStore(tmp_path / "s", retention_ms=10**9, segment_interval_ms=10**9,
                         auto_compaction=False)
    _write_rounds(store, 0, 4)
    expected = all_sessions(store)
    assert len(store.live_files()) == 4
    assert store.compact_segments(5) == []
    assert store.compact_segments(4) == [0]
    assert len(store.live_files()) == 1
    assert all_sessions(store) == expected
    store.close()


@pytest.mark.parametrize("value", [0, True, 2.0])
def test_compact_segments_checks_its_threshold(tmp_path: Path, value: object):
    store = SessionStore(tmp_path / "s", retention_ms=10**6)
    with pytest.raises(ValueError, match="min_level0_files"):
        store.compact_segments(value)  # type: ignore[arg-type]
    store.close()


def test_auto_compaction_must_be_a_bool(tmp_path: Path):
    with pytest.raises(ValueError, match="auto_compaction"):
        SessionStore(tmp_path / "s", retention_ms=10**6, auto_compaction=1)  # type: ignore[arg-type]


def _settle(store: SessionStore, timeout_s: float = 30.0) -> None:
    """Wait until no compaction has run in any segment for three polls in a row (RocksDB may
    leave one due, not started, until the next write)."""
    deadline = time.monotonic() + timeout_s
    quiet = 0
    while quiet < 3:
        if time.monotonic() > deadline:
            raise AssertionError(f"RocksDB still compacting after {timeout_s} s")
        time.sleep(0.05)
        running = sum(cf.property_int_value("rocksdb.num-running-compactions")
                      for cf in store._cfs.values())
        quiet = quiet + 1 if running == 0 else 0


def test_small_batches_leave_the_bulk_of_a_segment_in_place(tmp_path: Path):
    """A batch's cost must not grow with the sessions a segment retains: a dozen small batches
    (2% of the sessions each, a remove and a write, a commit per batch) merge with each other,
    and the file holding the segment's bulk stays as it was. Kills leveled compaction (RocksDB's
    default), under which every level-0 file overlaps the whole segment and each compaction
    rewrites all of it."""
    n = 40_000
    store = SessionStore(tmp_path / "s", retention_ms=10**9, segment_interval_ms=10**9)
    keys = [f"user{i}" for i in range(n)]
    ends = np.full(n, 100, dtype=np.int64)
    store.put_many(keys, np.zeros(n, dtype=np.int64), ends, list(range(n)))
    store.commit()
    _settle(store)
    (bulk,) = store.live_files()
    rng = np.random.default_rng(5)
    for batch in range(12):
        rows = np.sort(rng.choice(n, 800, replace=False))
        store.remove_many(keys, np.zeros(len(rows), dtype=np.int64), ends[rows],
                          key_index=rows)
        ends[rows] += 1 + batch
        store.put_many(keys, np.zeros(len(rows), dtype=np.int64), ends[rows],
                       [-int(r) for r in rows], key_index=rows)
        store.commit()
        _settle(store)
    files = store.live_files()
    assert bulk in files
    assert len(files) <= 6  # the small runs were merged, not left to pile up
    expected = sorted(zip(keys, [0] * n, ends.tolist(), strict=True))
    assert sorted(s[:3] for s in all_sessions(store)) == expected
    store.close()


class LeveledStore(SessionStore):
    """A store as releases before universal compaction opened it: RocksDB's leveled style."""

    def _family_options(self) -> Any:
        options = super()._family_options()
        options.set_compaction_style(rocksdict.DBCompactionStyle.level())
        options.set_level_zero_file_num_compaction_trigger(4)
        return options


def _write_rounds(store: SessionStore, first: int, rounds: int) -> None:
    """A bulk write, then small batches: files at the last level and above it."""
    rng = np.random.default_rng(first)
    for r in range(first, first + rounds):
        n = 5_000 if r == first else 1_200
        rows = rng.choice(20_000, n, replace=False)
        store.put_many([f"k{i}" for i in rows.tolist()], np.full(n, r, dtype=np.int64),
                       np.full(n, 50 + r, dtype=np.int64), [r] * n)
        store.commit()


def test_a_store_moves_between_compaction_styles_both_ways(tmp_path: Path):
    """A store written under leveled compaction opens, reads, writes and compacts under
    universal, and the older style reads what universal wrote. Kills an option that refuses
    the other style's layout (universal with one level: RocksDB refuses files at level 6)."""
    config = {"retention_ms": 10**9, "segment_interval_ms": 10**9}
    expected = None
    for turn, style in enumerate([LeveledStore, SessionStore, LeveledStore, SessionStore]):
        with style(tmp_path / "s", **config) as store:
            if expected is not None:
                assert all_sessions(store) == expected
            _write_rounds(store, 10 * turn, 6)
            _settle(store)
            if style is SessionStore:  # a full compaction, then more runs on top of it
                assert store.compact_segments(1) == [0]
                _write_rounds(store, 10 * turn + 6, 2)
            expected = all_sessions(store)
