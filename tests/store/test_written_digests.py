"""What a commit reads to describe its checkpoint: the digests of the SST files the store
wrote itself are computed from the buffer each file was written from and handed to the commit,
which finds the file RocksDB ingested it as by its size and last bytes, instead of reading it
back; and RocksDB's MANIFEST, which every commit copies and hashes, stays bounded."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from sessionstore import SessionStore
from sessionstore.store import checkpoint as checkpoint_module
from sessionstore.store import rocksdb as rocksdb_module
from sessionstore.store import sstfile
from sessionstore.store.checkpoint import describe_files, verify_files


def write_file(path: Path, count: int, session_id: str) -> sstfile.WrittenTable:
    keys = [b"K%06d" % i for i in range(count)]
    key_data = np.frombuffer(b"".join(keys), dtype=np.uint8)
    key_offsets = np.arange(count + 1, dtype=np.int64) * 7
    values = np.frombuffer(b"".join(b"v%05d" % i for i in range(count)), dtype=np.uint8)
    value_first = np.arange(count, dtype=np.int64) * 6
    return sstfile.write_table(path, key_data, key_offsets, count, values, value_first,
                               value_first + 6, session_id=session_id, file_number=1)


def files_read(monkeypatch: Any) -> list[str]:
    """The names of the files checkpoint.file_digest reads from now on (it still reads them)."""
    real = checkpoint_module.file_digest
    read: list[str] = []

    def counted(path: Any) -> bytes:
        read.append(Path(path).name)
        return real(path)

    monkeypatch.setattr(checkpoint_module, "file_digest", counted)
    return read


def test_a_listed_file_takes_its_written_digest_and_any_other_is_hashed(
        tmp_path: Path, monkeypatch: Any) -> None:
    # kills: matching by size alone (another file of the same size gets a wrong digest),
    # ignoring the list (the file read back), a tail compared at the wrong offset
    ours = write_file(tmp_path / "000011.sst", 3000, "A" * 20)
    other = write_file(tmp_path / "000012.sst", 3000, "B" * 20)  # same size, other session id
    assert ours.size == other.size and ours.tail != other.tail
    (tmp_path / "CURRENT").write_bytes(b"MANIFEST-000005\n")
    read = files_read(monkeypatch)
    listed = b"\x01" * 32  # not the file's digest: shows it is taken, not recomputed
    files = describe_files(tmp_path, None, {ours.size: [(other.tail[:-1] + b"x", b"\x02" * 32),
                                                        (ours.tail, listed)]})
    assert files["000011.sst"] == (ours.size, listed)
    assert files["000012.sst"] == (other.size, hashlib.sha256(
        (tmp_path / "000012.sst").read_bytes()).digest())
    assert sorted(read) == ["000012.sst", "CURRENT"]
    # a file recorded by an earlier commit keeps that record; a listed size that no file has
    # changes nothing
    read.clear()
    again = describe_files(tmp_path, files, {ours.size + 1: [(ours.tail, b"\x03" * 32)]})
    assert again["000011.sst"] == files["000011.sst"] and read == ["CURRENT"]


def test_a_commit_records_its_ingested_files_without_reading_them(
        tmp_path: Path, monkeypatch: Any) -> None:
    # kills: the store not handing the written digests over (every new SST read back), a
    # digest of other bytes than the file's (the reopen's full check fails), digests kept
    # across an abort
    read = files_read(monkeypatch)
    n = 2 * rocksdb_module.BULK_LAYOUT_MIN_SESSIONS
    path = tmp_path / "s"
    with SessionStore(path, retention_ms=10**9, segment_interval_ms=1000) as store:
        for batch in range(3):
            # n sessions in each of three segments: a file each
            ends = np.repeat(np.arange(3, dtype=np.int64) * 1000 + 500, n) + batch
            store.put_many([f"k{i % n}" for i in range(3 * n)], ends - 5, ends,
                           [batch] * (3 * n))
            store.commit()
            assert not [name for name in read if name.endswith(".sst")]
        one_segment = np.arange(n, dtype=np.int64) % 900 + 10
        store.put_many([f"k{i}" for i in range(n)], one_segment - 5, one_segment, [9] * n)
        store.abort()
        assert store._written == {}
        store.put_many([f"j{i}" for i in range(n)], one_segment - 5, one_segment, [7] * n)
        store.commit()
        assert not [name for name in read if name.endswith(".sst")]
        checkpoint = store.checkpoint_path()
    # every recorded digest is the file's own: what an open checks
    _state, contents = checkpoint_module.read_manifest(checkpoint)
    verify_files(checkpoint, contents)
    assert len([name for name in contents.files if name.endswith(".sst")]) >= 4
    with SessionStore(path, retention_ms=10**9) as store:
        assert {v for _, v in store.fetch("j5")} == {7}
        # three batches of sessions in three segments, none aborted
        assert sorted(v for _, v in store.fetch("k5")) == [0, 0, 0, 1, 1, 1, 2, 2, 2]


def test_rocksdbs_manifest_stays_bounded_over_many_commits(tmp_path: Path,
                                                          monkeypatch: Any) -> None:
    # Each commit copies RocksDB's MANIFEST into its checkpoint and hashes it; at RocksDB's
    # default limit (1 GiB) it grew by every ingestion and compaction for the life of the
    # store. Kills: the limit not passed to RocksDB (the copy grows with every commit).
    monkeypatch.setattr(rocksdb_module, "MAX_MANIFEST_BYTES", 8 << 10)
    n = rocksdb_module.BULK_LAYOUT_MIN_SESSIONS
    sizes = []
    with SessionStore(tmp_path / "s", retention_ms=10**12, segment_interval_ms=10**9) as store:
        for commit in range(1, 41):
            ends = np.arange(n, dtype=np.int64) + commit * 10_000
            store.put_many([f"k{i}" for i in range(n)], ends - 5, ends, [commit] * n)
            store.commit()
            (manifest,) = store.checkpoint_path().glob("MANIFEST-*")
            sizes.append(manifest.stat().st_size)
        assert max(sizes) < 3 * (8 << 10), sizes
        assert len({v for _, v in store.fetch("k7")}) == 40
    with SessionStore(tmp_path / "s", retention_ms=10**12) as store:
        assert len(list(store.fetch("k7"))) == 40
