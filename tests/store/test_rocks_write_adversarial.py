"""The RocksDB write path under attack (issue 22): buffers a thread reuses shared by name across
stores and threads, buffers above the reuse limit then small again, many 1 ms segments per
batch, same-size files whose digests the commit takes from the write, a SIGKILL between the
write and the commit, and keys that encode lowest beside the pad deletion each file starts
with. Every case compares the store with a plain dict of what it must hold."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sessionstore import SessionStore
from sessionstore.errors import StoreCorruptedError
from sessionstore.store import rocksdb as rocksdb_module
from sessionstore.store import sstfile
from sessionstore.store.checkpoint import describe_files, read_manifest, verify_files

ROOT = Path(__file__).resolve().parents[2]
N = rocksdb_module.BULK_LAYOUT_MIN_SESSIONS  # the fewest sessions a segment's SST file takes
LOW, HIGH = -(2**63), 2**63 - 1
Model = dict[tuple[Any, int, int], Any]


def contents(store: SessionStore) -> Model:
    return {(s.key, s.start, s.end): v for s, v in store.find_sessions(LOW, HIGH)}


def assert_checkpoint_digests(store: SessionStore) -> None:
    """Every file of the last commit has the size and SHA-256 its manifest records."""
    checkpoint = store.checkpoint_path()
    _state, recorded = read_manifest(checkpoint)
    verify_files(checkpoint, recorded)
    for name, (size, digest) in recorded.files.items():
        data = (checkpoint / name).read_bytes()
        assert (len(data), hashlib.sha256(data).digest()) == (size, digest), name


def put(store: SessionStore, model: Model, rows: list[tuple[Any, int, int, Any]]) -> None:
    store.put_many([r[0] for r in rows], np.array([r[1] for r in rows], dtype=np.int64),
                   np.array([r[2] for r in rows], dtype=np.int64), [r[3] for r in rows])
    for key, start, end, value in rows:
        model[(key, start, end)] = value


def remove(store: SessionStore, model: Model, sessions: list[tuple[Any, int, int]]) -> None:
    store.remove_many([s[0] for s in sessions], np.array([s[1] for s in sessions]),
                      np.array([s[2] for s in sessions]))
    for session in sessions:
        model.pop(session, None)


def drive(path: Path, seed: int, committed: Model) -> Iterator[tuple[SessionStore, Model]]:
    """Bulk writes of 1-3 one-millisecond segments each, of values from 5 bytes to 2 KB (so a
    thread's buffers go above the reuse limit and back), removals folded into the next files,
    commits and aborts; yields after each write, leaves what is committed in ``committed``."""
    rng = np.random.default_rng(seed)
    model: Model = {}
    with SessionStore(path, retention_ms=10**12, segment_interval_ms=1) as store:
        for step in range(6):
            width = [10, 2000, 5, 400, 3000, 8][step]
            rows = []
            for segment in range(int(rng.integers(1, 4))):
                end = 10 + 2 * step + segment
                for i in range(N + int(rng.integers(0, 200))):
                    rows.append((f"k{int(rng.integers(0, 4 * N))}", end - int(rng.integers(0, 3)),
                                 end, b"%c" % (65 + step) * width + b"%d" % i))
            put(store, model, rows)
            remove(store, model, sorted(model)[::5][:400])
            yield store, model
            if step % 3 == 2:
                store.abort()
                model = dict(committed)
            else:
                store.commit()
                committed.clear()
                committed.update(model)
                assert_checkpoint_digests(store)


def test_stores_sharing_a_threads_buffers_and_stores_in_threads_match_a_dict(
        tmp_path: Path, monkeypatch: Any) -> None:
    # Two stores interleave their bulk writes in one thread (the reused buffers are the
    # thread's, by name, whoever calls), three more write at once from threads of their own,
    # a sixth writes from a new thread each time.
    # A low reuse limit makes the larger writes take fresh buffers, the smaller ones reused.
    # Kills: a buffer reused while a staged file still needs it, buffers shared across
    # threads, a stale buffer's tail read past the current size, a digest not the file's.
    monkeypatch.setattr(sstfile, "OUTPUT_BUFFER_REUSE_BYTES", 256 << 10)
    committed: list[Model] = [{} for _ in range(6)]
    drivers = [drive(tmp_path / "a", 1, committed[0]), drive(tmp_path / "b", 2, committed[1])]
    failures: list[BaseException] = []

    def alone(i: int) -> None:
        try:
            for store, model in drive(tmp_path / f"t{i}", 10 + i, committed[i]):
                assert contents(store) == model
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            failures.append(exc)

    threads = [threading.Thread(target=alone, args=(i,)) for i in (2, 3, 4)]
    for thread in threads:
        thread.start()
    # a sixth store changes threads at every write, as a task's store may
    hopping = drive(tmp_path / "h", 5, committed[5])

    def hop() -> None:
        try:
            for store, model in [next(hopping)]:
                assert contents(store) == model
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            failures.append(exc)

    for one, other in zip(*drivers, strict=True):
        for store, model in (one, other):
            assert contents(store) == model
        hopper = threading.Thread(target=hop)
        hopper.start()
        hopper.join()
    assert next(hopping, None) is None  # closed
    for thread in threads:
        thread.join()
    assert not failures, failures
    for i, name in enumerate(["a", "b", "t2", "t3", "t4", "h"]):
        with SessionStore(tmp_path / name, retention_ms=10**12) as store:
            assert contents(store) == committed[i] and committed[i]


def same_size_rows(segment: int, value: bytes) -> list[tuple[Any, int, int, Any]]:
    """N sessions of one 1000 ms segment, the same keys and offsets whatever the segment: each
    segment's file has the same size."""
    return [(f"u{i:05d}", segment * 1000 + i % 7, segment * 1000 + 500 + i % 7, value)
            for i in range(N)]


def test_files_of_one_size_each_get_their_own_digest_across_aborts(tmp_path: Path) -> None:
    # Files of one size in one commit, and a file of the size of an aborted one: the tail
    # (which holds the file's random session id) tells them apart. Kills: matching a written
    # digest by size alone, the first candidate of a size taken for every file, digests kept
    # across an abort (each fails the manifest's check, here and on reopen).
    path = tmp_path / "s"
    model: Model = {}
    with SessionStore(path, retention_ms=10**9, segment_interval_ms=1000) as store:
        put(store, model, same_size_rows(1, b"a" * 9) + same_size_rows(2, b"b" * 9))
        assert [len(v) for v in store._written.values()] == [2]  # two files, one size
        store.commit()
        assert_checkpoint_digests(store)
        committed = dict(model)
        put(store, model, same_size_rows(3, b"c" * 9))
        (aborted,) = store._written
        store.abort()
        model = dict(committed)
        put(store, model, same_size_rows(3, b"d" * 9))  # the same size as the aborted file
        assert list(store._written) == [aborted] and len(store._written[aborted]) == 1
        store.commit()
        assert_checkpoint_digests(store)
    with SessionStore(path, retention_ms=10**9) as store:
        assert contents(store) == model


CHILD = """
import sys, numpy as np
from sessionstore import SessionStore
from sessionstore.errors import StoreCorruptedError
rows = [(f"k{i}", 100 * s + i % 5, 100 * s + 50 + i % 5, [s, i]) for s in range(3)
        for i in range(N_ROWS)]
with SessionStore(sys.argv[1], retention_ms=10**9, segment_interval_ms=100) as store:
    for step in range(2):
        mine = [r for r in rows if r[3][0] <= step]
        store.put_many([r[0] for r in mine], np.array([r[1] + step for r in mine]),
                       np.array([r[2] + step for r in mine]), [r[3] + [step] for r in mine])
        store.remove_many(["k1", "k2"], np.array([1 + step, 2 + step]),
                          np.array([51 + step, 52 + step]))
        if step == 0:
            store.commit()
    print("written", sum(map(len, store._written.values())), flush=True)
    sys.stdin.readline()  # killed here: between the write and its commit
"""


def test_sigkill_between_a_bulk_write_and_its_commit_reopens_at_the_commit(
        tmp_path: Path) -> None:
    # Kills: digests handed to a later commit across a restart, a file ingested but
    # uncommitted surviving the reopen, a reopen that fails on the written files left in live/.
    path = tmp_path / "s"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD.replace("N_ROWS", str(N + 10)), str(path)], cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)), stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdin is not None
    assert child.stdout.readline() == "written 2\n"  # two files ingested, not committed
    child.send_signal(signal.SIGKILL)
    child.wait()
    child.stdout.close()
    child.stdin.close()
    assert child.returncode == -signal.SIGKILL
    expected: Model = {(f"k{i}", 100 * s + i % 5, 100 * s + 50 + i % 5): [s, i, 0]
                       for s in range(1) for i in range(N + 10)}
    del expected[("k1", 1, 51)], expected[("k2", 2, 52)]
    with SessionStore(path, retention_ms=10**9) as store:
        assert contents(store) == expected
        assert_checkpoint_digests(store)
        model = dict(expected)
        put(store, model, [(f"k{i}", 300, 350, i) for i in range(N)])
        store.commit()
        assert_checkpoint_digests(store)
    with SessionStore(path, retention_ms=10**9) as store:
        assert contents(store) == model


# keys whose encodings come first, down to the longest run of zero bytes a key can hold
LOWEST_KEYS: list[Any] = ["", b"", b"\x00", bytes(4096), bytes(4095) + b"\x01", 0, -1, -(2**63),
                          (), ("",), (0, b"\x00")]


@pytest.mark.parametrize("compact", [False, True])
def test_keys_that_encode_lowest_read_back_beside_the_pad_deletion(tmp_path: Path,
                                                                   compact: bool) -> None:
    # Each ingested file starts with a deletion of 4096 zero bytes; every record starts with
    # a tag byte, so no key's record sorts at or before it. Kills: a pad that shadows or
    # hides the first records of a file (fetch, merge lookups, time and column scans, either
    # direction), a pad that a compaction or an expiry turns into a visible session.
    path = tmp_path / "s"
    model: Model = {}
    with SessionStore(path, retention_ms=10_000, segment_interval_ms=1000) as store:
        for segment in (0, 1):
            rows = [(key, segment * 1000, segment * 1000 + 5 + j, [segment, j])
                    for j, key in enumerate(LOWEST_KEYS)]
            rows += [(f"f{i}", segment * 1000, segment * 1000 + 100 + i % 500, i)
                     for i in range(N)]
            put(store, model, rows)
        # a removal of a low key travels as a tombstone of the next file of its segment
        remove(store, model, [(b"\x00", 0, 7)])
        put(store, model, [(f"g{i}", 0, 300 + i % 300, i) for i in range(N)])
        store.commit()
        if compact:
            assert store.compact_segments(1) == [0, 1]
        for state in ("live", "reopened"):
            assert contents(store) == model, state
            columns = store.find_sessions_columns(LOW)
            assert columns is not None and len(columns) == len(model)
            for key in LOWEST_KEYS:
                expected = sorted(((s, e), v) for (k, s, e), v in model.items() if k == key)
                assert sorted(((s.start, s.end), v) for s, v in store.fetch(key)) == expected
                assert [((s.start, s.end), v) for s, v in store.fetch(key, backward=True)] \
                    == expected[::-1]
                assert [v for _, v in store.find_sessions_to_merge(key, 0, 2000)] \
                    == [v for _, v in expected]
            backward = [(s.key, s.start, s.end) for s, _ in store.find_sessions(
                LOW, HIGH, backward=True)]
            assert len(backward) == len(model) and set(backward) == set(model)
            store.close()
            store = SessionStore(path, retention_ms=10_000)
        # segment 0 expires whole: what is left is segment 1's, pads and all
        put(store, model, [("late", 11_002, 11_002, 0)])
        model = {s: v for s, v in model.items() if s[2] >= 1000}
        assert contents(store) == model
        store.commit()
        store.close()
    with SessionStore(path, retention_ms=10_000) as store:
        assert contents(store) == model
        assert_checkpoint_digests(store)


def test_a_segment_left_with_tombstones_and_pads_reads_as_empty(tmp_path: Path) -> None:
    # Every session of a segment removed, partly through the tombstones of a later file: the
    # segment holds deletions only (pads included) until a compaction drops them. Kills: a
    # pad or a tombstone read as a session, or a columns read that fails on a segment
    # without records.
    path = tmp_path / "s"
    model: Model = {}
    with SessionStore(path, retention_ms=10**9, segment_interval_ms=1000) as store:
        first = [(f"a{i}", 0, 10 + i % 50, i) for i in range(N)]
        put(store, model, first)
        remove(store, model, [r[:3] for r in first])
        second = [(f"b{i}", 0, 100 + i % 50, i) for i in range(N)]
        put(store, model, second)  # carries the removals of the first as tombstones
        remove(store, model, [r[:3] for r in second])
        put(store, model, [(f"c{i}", 5000, 5000 + i % 9, i) for i in range(N)])
        assert len(model) == N
        store.commit()
        for _ in range(2):
            assert contents(store) == model
            assert list(store.fetch("a1")) == [] and list(store.find_sessions(0, 999)) == []
            columns = store.find_sessions_columns(LOW)
            assert columns is not None and len(columns) == N
            store.compact_segments(1)
    with SessionStore(path, retention_ms=10**9) as store:
        assert contents(store) == model


@pytest.mark.parametrize("retention", [0, 2, 5])
def test_many_one_ms_segments_per_batch_at_the_least_retention(tmp_path: Path,
                                                               retention: int) -> None:
    # 1 ms segments, a retention of 0 to 5 ms: each batch spans up to four segments in
    # shuffled call order, so that stream time moves within the call and later rows fall
    # behind it (dropped) while earlier segments of the batch expire whole. The model is
    # Kafka's rule written out: stream time is the largest end so far, a session is dropped
    # when its end is before stream time - retention, reads start one after it.
    # Kills: a staged file ingested into a segment expired meanwhile, a pad or tombstone
    # surviving an expiry as a session, files of many segments built from one thread's buffers
    # overwriting each other.
    rng = np.random.default_rng(retention)
    path = tmp_path / "s"
    stored: Model = {}
    stream = LOW
    committed: tuple[Model, int] = ({}, LOW)
    with SessionStore(path, retention_ms=retention, segment_interval_ms=1) as store:
        for step in range(5):
            base = 100 + 3 * step
            rows = [(f"k{i}", base + s - 1, base + s, (step, i)) for s in range(4)
                    for i in range(N + int(rng.integers(0, 50)))]
            order = rng.permutation(len(rows)) if step % 2 else np.arange(len(rows))
            rows = [rows[i] for i in order]
            accepted = store.put_many([r[0] for r in rows], np.array([r[1] for r in rows]),
                                      np.array([r[2] for r in rows]), [r[3] for r in rows])
            for (key, start, end, value), took in zip(rows, accepted.tolist(), strict=True):
                stream = max(stream, end)
                assert took == (end >= stream - retention)
                if took:
                    stored[(key, start, end)] = list(value)
            stored = {s: v for s, v in stored.items() if s[2] >= stream - retention}
            readable = {s: v for s, v in stored.items() if s[2] > stream - retention}
            assert readable or retention == 0
            assert contents(store) == readable
            if step == 3:
                store.abort()
                stored, stream = dict(committed[0]), committed[1]
            else:
                store.commit()
                committed = (dict(stored), stream)
    with SessionStore(path, retention_ms=retention) as store:
        assert contents(store) == {s: v for s, v in committed[0].items()
                                   if s[2] > committed[1] - retention}
        assert_checkpoint_digests(store)


@pytest.mark.parametrize("from_end", [14, 700, 5000])
def test_an_ingested_file_damaged_in_its_last_bytes_before_its_commit_fails_the_next_open(
        tmp_path: Path, from_end: int) -> None:
    # The commit finds an ingested file by its size and last bytes; damage among those last
    # bytes (the footer's unused bytes: 14 from the end; the properties block: 700) made the
    # commit miss it, read it back and record the damaged bytes as the truth: the store
    # opened with the damage (footer), or RocksDB refused it naming its MANIFEST (properties).
    # 5000 from the end lies among the records, before the last bytes. Kills: a hand-off by
    # the last bytes alone (the file is the one written: the same inode, RocksDB links it).
    path = tmp_path / "s"
    n = 4 * N
    with SessionStore(path, retention_ms=10**9) as store:
        store.put_many([f"k{i}" for i in range(n)], np.zeros(n, np.int64),
                       np.arange(n, dtype=np.int64), list(range(n)))
        (sst,) = (path / "live").glob("*.sst")
        ((tail, _digest, *_),) = [c for candidates in store._written.values()
                                  for c in candidates]
        assert (from_end < len(tail)) == (from_end != 5000)
        with open(sst, "r+b") as handle:  # in place: the checkpoint links this very file
            handle.seek(-from_end, os.SEEK_END)
            byte = handle.read(1)
            handle.seek(-1, os.SEEK_CUR)
            handle.write(bytes([byte[0] ^ 0x01]))
        store.commit()
    with pytest.raises(StoreCorruptedError, match="SHA-256") as refused:
        SessionStore(path, retention_ms=10**9)
    assert refused.value.path.endswith(sst.name)


def test_a_written_files_inode_counts_only_with_its_first_bytes(tmp_path: Path) -> None:
    # A written file damaged in its last bytes keeps its written digest by its inode; a file
    # that only has the inode of a written file (freed by a compaction, then reused by a file
    # of the same size) is read back. Kills: the inode alone (a sound store refused), the
    # first bytes alone, the tail alone (damage recorded as the truth).
    n = 2000
    keys = np.frombuffer(b"".join(b"K%06d" % i for i in range(n)), dtype=np.uint8)
    values = np.frombuffer(b"v" * 5 * n, dtype=np.uint8)
    first = np.arange(n, dtype=np.int64) * 5
    written = sstfile.write_table(tmp_path / "000009.sst", keys, np.arange(n + 1) * 7, n,
                                  values, first, first + 5, session_id="S" * 20,
                                  file_number=1)
    path = tmp_path / "000009.sst"
    data = bytearray(path.read_bytes())
    data[-14] ^= 0x01  # an unused byte of the footer
    path.write_bytes(data)  # in place: the inode stays
    here = (os.stat(path).st_dev, os.stat(path).st_ino)
    actual = hashlib.sha256(data).digest()
    head = bytes(data[:8192])

    def described(*candidate: Any) -> bytes:
        return describe_files(tmp_path, None, {written.size: [candidate]})["000009.sst"][1]

    assert described(written.tail, written.sha256, here, head) == written.sha256
    assert described(written.tail, written.sha256, here, b"x" + head[1:]) == actual
    assert described(written.tail, written.sha256, (here[0], here[1] + 1), head) == actual
    assert described(written.tail, written.sha256) == actual
