"""Large bulk writes: an SST file per segment with an index block instead of time-first records.

The oracle is the in-memory store (no layouts at all) fed the same calls, and single puts on a
RocksDB twin; readers must see exactly the same sessions, before and after commit and reopen,
and through a read-only view.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest

from sessionstore import (
    InMemorySessionStore,
    ReadOnlySessionStore,
    Session,
    SessionStore,
    StoreCorruptedError,
    keyschema,
)
from sessionstore.store import base as base_module
from sessionstore.store import rocksdb as rocksdb_module
from sessionstore.store.checkpoint import MANIFEST_NAME, locate_committed

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
N = 8 * rocksdb_module.BULK_LAYOUT_MIN_SESSIONS  # above the threshold in every segment


def everything(store: Any) -> list[tuple[tuple[Any, int, int], Any]]:
    return [(tuple(s), v) for s, v in store.find_sessions(INT64_MIN, INT64_MAX)]


def blocks_in(store: SessionStore) -> int:
    return sum(1 for cf in store._cfs.values() for k in cf.keys(from_key=b"I") if k[:1] == b"I")


def batch(seed: int, n: int = N, keys: int = 500) -> tuple[list[Any], Any, Any, list[Any]]:
    rng = np.random.default_rng(seed)
    key_list = [f"user{k}" if k % 3 else k for k in rng.integers(0, keys, n).tolist()]
    ends = rng.integers(0, 40_000, n).astype(np.int64)
    starts = ends - rng.integers(0, 500, n)
    return key_list, starts, ends, [[seed, i] for i in range(n)]


def test_large_bulk_writes_and_removals_read_as_the_in_memory_model(tmp_path: Path) -> None:
    config = {"retention_ms": 10**9, "segment_interval_ms": 10_000}
    model = InMemorySessionStore(**config)
    with SessionStore(tmp_path / "s", **config) as store:
        for seed in range(3):
            keys, starts, ends, values = batch(seed)
            assert (store.put_many(keys, starts, ends, values)
                    == model.put_many(keys, starts, ends, values)).all()
            assert blocks_in(store) == 4 * (seed + 1)  # one per segment and call
            # remove a large share of what was written (and some sessions that never were)
            doomed = np.arange(0, N, 2)
            store.remove_many([keys[i] for i in doomed], starts[doomed], ends[doomed] + seed % 2)
            model.remove_many([keys[i] for i in doomed], starts[doomed], ends[doomed] + seed % 2)
            assert everything(store) == everything(model)
            for low, high in [(0, 9_999), (5_000, 25_000), (12_345, 12_345), (39_000, INT64_MAX)]:
                assert list(store.find_sessions(low, high)) == list(model.find_sessions(low, high))
                # backward over block-listed sessions: the exact reverse (KIP-617)
                assert (list(store.find_sessions(low, high, backward=True))
                        == list(model.find_sessions(low, high, backward=True))
                        == list(model.find_sessions(low, high))[::-1])
            for key in keys[:50]:
                assert list(store.fetch(key)) == list(model.fetch(key))
        store.commit()
        expected = everything(model)
        assert everything(store) == expected
    with SessionStore(tmp_path / "s", **config) as store:
        assert everything(store) == expected
        # block ids continue after a reopen: a new block never replaces an old one
        keys, starts, ends, values = batch(7)
        store.put_many(keys, starts, ends, values)
        model.put_many(keys, starts, ends, values)
        assert blocks_in(store) == 16
        assert everything(store) == everything(model)
        store.commit()
    with ReadOnlySessionStore(tmp_path / "s") as view:
        assert view.find_sessions(INT64_MIN, INT64_MAX) == list(model.find_sessions(
            INT64_MIN, INT64_MAX))
        assert view.find_sessions(INT64_MIN, INT64_MAX, backward=True) == list(
            model.find_sessions(INT64_MIN, INT64_MAX, backward=True))


def test_a_session_written_by_blocks_and_by_single_puts_is_listed_once(tmp_path: Path) -> None:
    with SessionStore(tmp_path / "s", retention_ms=10**9) as store:
        keys, starts, ends, values = batch(1)
        store.put_many(keys, starts, ends, values)
        store.put_many(keys, starts, ends, values)  # the same sessions again: a second block
        store.put(Session(keys[0], int(starts[0]), int(ends[0])), "single")  # and a record
        found = [tuple(s) for s, _ in store.find_sessions(INT64_MIN, INT64_MAX)]
        assert len(found) == len(set(found)) == len(set(zip(keys, starts.tolist(),
                                                            ends.tolist(), strict=True)))
        assert store.fetch_session(keys[0], int(starts[0]), int(ends[0])) == "single"


def test_a_damaged_index_block_raises_naming_the_store_not_less_data(tmp_path: Path) -> None:
    """A range that covers part of a segment reads its index blocks (one that covers whole
    segments reads their key-first records alone, and needs no block)."""
    with SessionStore(tmp_path / "s", retention_ms=10**9, segment_interval_ms=10**6) as store:
        keys, starts, ends, values = batch(2)
        store.put_many(keys, starts, ends, values)
        (block_key,) = [k for k in store._cfs[0].keys(from_key=b"I") if k[:1] == b"I"]
        good = store._cfs[0][block_key]
        store._blocks.clear()  # the cache holds the block as written; read it back from disk
        store._cfs[0][block_key] = good[:-3]
        latest = int(ends.max())  # below the segment's last end: part of the segment
        with pytest.raises(StoreCorruptedError, match="index block") as info:
            list(store.find_sessions(INT64_MIN, latest))
        assert str(tmp_path / "s" / "live") in str(info.value)
        store._cfs[0][block_key] = good
        assert len(list(store.find_sessions(INT64_MIN, latest))) == len(
            set(zip(keys, starts.tolist(), ends.tolist(), strict=True)))


def test_a_format_2_store_opens_and_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                          ) -> None:
    """Stores written before index blocks (format 2) hold time-first records only."""
    monkeypatch.setattr(base_module, "STORE_FORMAT_VERSION", 2)
    with SessionStore(tmp_path / "s", retention_ms=10**9) as store:
        for i in range(50):
            store.put(Session(f"k{i % 7}", i * 10, i * 10 + 5), i)
        store.commit()
        expected = everything(store)
    monkeypatch.undo()
    with ReadOnlySessionStore(tmp_path / "s") as view:
        assert [(tuple(s), v) for s, v in view.find_sessions(INT64_MIN, INT64_MAX)] == expected
    with SessionStore(tmp_path / "s", retention_ms=10**9) as store:
        assert everything(store) == expected
        keys, starts, ends, values = batch(3)
        store.put_many(keys, starts, ends, values)
        store.commit()
    latest = locate_committed(tmp_path / "s")
    assert latest is not None and latest.state.version == 2
    raw = msgpack.unpackb((latest.directory / MANIFEST_NAME).read_bytes()[36:],
                          strict_map_key=False)
    assert raw["format"] == base_module.STORE_FORMAT_VERSION == 3


def test_index_block_round_trip_and_damage() -> None:
    encoded = [keyschema.encode_key(k) for k in ["b", "a", 7, ("x", 1)]]
    index = np.array([0, 1, 1, 3, 2], dtype=np.int64)
    ends = np.array([5, 5, 9, 9, 12], dtype=np.int64)
    starts = np.array([1, 0, 9, 2, 12], dtype=np.int64)
    data, block = keyschema.encode_index_block(encoded, index, ends, starts)
    decoded = keyschema.decode_index_block(data, 5, 12)
    expected = [(5, encoded[0], 1), (5, encoded[1], 0), (9, encoded[1], 9), (9, encoded[3], 2),
                (12, encoded[2], 12)]
    assert decoded.rows(INT64_MIN, INT64_MAX) == block.rows(INT64_MIN, INT64_MAX) == expected
    assert decoded.rows(6, 9) == expected[2:4]
    assert decoded.rows(13, 20) == []
    for damaged, match in [(data[:-1], "header implies"), (data[:10], "shorter"),
                           (b"XXXX" + data[4:], "magic"), (data[:4] + b"\x09" + data[5:],
                                                            "version 9")]:
        with pytest.raises(ValueError, match=match):
            keyschema.decode_index_block(damaged, 5, 12)
    with pytest.raises(ValueError, match="out of range"):
        keyschema.decode_index_block(data, 6, 12)  # the key says no end below 6
    key = keyschema.index_block_key(-5, 12, 3)
    assert keyschema.split_index_block_key(key) == (-5, 12, 3)
    with pytest.raises(ValueError, match="not an index block key"):
        keyschema.split_index_block_key(key[:-1])


def test_long_keys_take_the_per_key_path_and_read_back(tmp_path: Path) -> None:
    """Keys over 256 encoded bytes are not put in a padded matrix; the bytes are the same."""
    config = {"retention_ms": 10**9, "segment_interval_ms": 10**6}
    keys, starts, ends, values = batch(5, keys=50)
    keys = [("x" * 300 + str(k)) if i % 2 else k for i, k in enumerate(keys)]
    model = InMemorySessionStore(**config)
    with SessionStore(tmp_path / "s", **config) as store:
        store.put_many(keys, starts, ends, values)
        model.put_many(keys, starts, ends, values)
        assert blocks_in(store) == 1
        store._blocks.clear()  # decode the block from disk
        assert everything(store) == everything(model)


@pytest.mark.parametrize("bulk", [False, True])
def test_ranges_that_end_one_short_of_a_segment_or_start_one_into_it(tmp_path: Path,
                                                                     bulk: bool) -> None:
    """A range covering whole segments reads them in one pass over their key-first records;
    one that misses a segment's first or last millisecond must not. Kills an off-by-one in
    that choice."""
    interval = 1_000
    config = {"retention_ms": 10**9, "segment_interval_ms": interval}
    model = InMemorySessionStore(**config)
    n = rocksdb_module.BULK_LAYOUT_MIN_SESSIONS if bulk else 3
    keys = [f"k{i}" for i in range(n)]
    with SessionStore(tmp_path / "s", **config) as store:
        for end in (999, 1_000, 1_999, 2_000):
            ends = np.full(n, end, dtype=np.int64)
            for target in (store, model):
                target.put_many(keys, ends - 5, ends, list(range(n)))
        for low, high in [(0, 1_998), (1_001, 2_999), (1_000, 1_999), (0, 2_999)]:
            for backward in (False, True):
                assert list(store.find_sessions(low, high, backward=backward)) \
                    == list(model.find_sessions(low, high, backward=backward))


def test_a_removal_then_a_large_write_adds_one_file(tmp_path: Path) -> None:
    """The engine's batch pattern (remove the merged-away sessions, then write the batch): the
    removals travel as tombstones in the ingested SST file. Written through the memtable they
    made the ingestion flush it first, a second level-0 file per batch (kills applying them
    before the ingestion)."""
    config = {"retention_ms": 10**9, "segment_interval_ms": 10**6}
    model = InMemorySessionStore(**config)
    with SessionStore(tmp_path / "s", auto_compaction=False, **config) as store:
        for seed in range(4):
            keys, starts, ends, values = batch(seed, keys=3_000)
            if seed:
                previous = batch(seed - 1, keys=3_000)
                doomed = np.arange(seed, N, 20)  # few enough to carry (two records each)
                for target in (store, model):
                    target.remove_many([previous[0][i] for i in doomed],
                                       previous[1][doomed], previous[2][doomed])
            store.put_many(keys, starts, ends, values)
            model.put_many(keys, starts, ends, values)
            store.commit()
            # one file per batch: the ingested one (the levels they land in are RocksDB's
            # choice, and differ between compaction styles)
            assert len(store.live_files()) == seed + 1
        assert everything(store) == everything(model)


def test_an_open_iterator_sees_a_removal_made_while_it_runs(tmp_path: Path) -> None:
    """An iterator reads RocksDB segment by segment as it goes, so a removal made while it runs
    is seen in the segments it has not reached yet, as before removals were deferred."""
    with SessionStore(tmp_path / "s", retention_ms=10**9, segment_interval_ms=100) as store:
        store.put_many(["a"] * 3, [0, 150, 250], [10, 160, 260], [1, 2, 3])
        found = store.fetch("a")
        assert next(found)[1] == 1
        store.remove_many(["a"], [250], [260])
        assert [value for _, value in found] == [2]
