"""The SST files the RocksDB store writes itself (``sessionstore.store.sstfile``), pinned to
rocksdict's ``SstFileWriter``: the same records and deletions, ingested into twin databases
holding the same older data, read back the same; and the key-first rows the store builds them
from, pinned to :func:`keyschema.key_first`."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import rocksdict
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionstore import SessionStore, StoreCorruptedError, keyschema
from sessionstore.store import rocksdb as rocksdb_module
from sessionstore.store import sstfile

PROFILE_SCALE = settings.default.max_examples / 100
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


def rows(pieces: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.zeros(len(pieces) + 1, dtype=np.int64)
    np.cumsum([len(p) for p in pieces], out=offsets[1:])
    return np.frombuffer(b"".join(pieces), dtype=np.uint8), offsets


def write_ours(path: Path, records: dict[bytes, bytes], gone: list[bytes]) -> None:
    keys = sorted(records)
    key_data, key_offsets = rows(keys)
    value_data, value_offsets = rows([records[k] for k in keys])
    gone_data, gone_offsets = rows(sorted(gone))
    sstfile.write_sst(path, key_data, key_offsets, value_data, value_offsets[:-1],
                      value_offsets[1:], gone_data, gone_offsets,
                      session_id=sstfile.new_session_id(), file_number=1)


def write_rocksdicts(path: Path, records: dict[bytes, bytes], gone: list[bytes]) -> None:
    writer = rocksdict.SstFileWriter(options=rocksdict.Options(raw_mode=True))
    writer.open(str(path))
    for key in sorted(set(records) | set(gone)):
        if key in records:
            writer[key] = records[key]
        else:
            del writer[key]
    writer.finish()


def open_db(path: Path) -> Any:
    options = rocksdict.Options(raw_mode=True)
    options.create_if_missing(True)
    return rocksdict.Rdict(str(path), options=options)


def ingest(db: Any, path: Path) -> None:
    options = rocksdict.IngestExternalFileOptions()
    options.set_move_files(True)
    db.ingest_external_file([str(path)], options)


# short keys over few bytes, so that keys share prefixes, one is a prefix of another, and
# records and deletions meet; values up to several blocks long
KEY = st.binary(min_size=1, max_size=12).map(lambda b: bytes(x % 3 for x in b))
VALUE = st.one_of(st.binary(max_size=20), st.binary(min_size=4000, max_size=9000))


@settings(max_examples=round(40 * PROFILE_SCALE), deadline=None)
@given(older=st.dictionaries(KEY, st.binary(max_size=5), max_size=30),
       records=st.dictionaries(KEY, VALUE, max_size=300),
       gone=st.lists(KEY, max_size=40, unique=True), many=st.integers(0, 3000))
def test_a_file_reads_as_rocksdicts_writers_file(tmp_path_factory: Any, older: dict[bytes, bytes],
                                                 records: dict[bytes, bytes], gone: list[bytes],
                                                 many: int) -> None:
    # kills: a wrong shared prefix (keys that are prefixes of others), a deletion of a written
    # key kept, restart points, block boundaries (many records, long values), the index block
    records = dict(records)
    records.update({b"\x07%08d" % i: b"v%d" % (i % 7) for i in range(many)})
    if not records and not gone:
        gone = [b"\x00"]
    root = tmp_path_factory.mktemp("sst")
    contents = []
    for name, write in (("ours", write_ours), ("theirs", write_rocksdicts)):
        db = open_db(root / name)
        for key, value in older.items():
            db[key] = value
        db.flush()
        write(root / f"{name}.sst", records, gone)
        ingest(db, root / f"{name}.sst")
        seen = list(db.items())
        db.close()
        db = open_db(root / name)  # reopened: the MANIFEST's record of the file holds
        assert list(db.items()) == seen
        db.compact_range(None, None)
        assert list(db.items()) == seen
        db.close()
        contents.append(seen)
    assert contents[0] == contents[1]
    expected = {key: value for key, value in older.items() if key not in gone}
    expected.update(records)
    assert contents[0] == sorted(expected.items())
    shutil.rmtree(root)


def test_crc32c_is_the_castagnoli_checksum() -> None:
    # kills: another polynomial, a wrong slicing table, a lost tail byte
    assert sstfile.crc32c(b"") == 0
    assert sstfile.crc32c(b"123456789") == 0xE3069283
    assert sstfile.crc32c(bytes(32)) == 0x8A9136AA
    assert sstfile.crc32c(bytes(range(32))) == 0x46DD794E


needs_sse42 = pytest.mark.skipif(not sstfile._has_sse42(),
                                 reason="the crc32 instruction needs an x86 CPU with SSE 4.2")


@needs_sse42
@given(data=st.one_of(st.binary(max_size=300), st.binary(min_size=760, max_size=2400)),
       offset=st.integers(0, 15))
@settings(max_examples=max(20, int(200 * PROFILE_SCALE)))
def test_the_crc32_instruction_kernel_is_the_table_kernel(data: bytes, offset: int) -> None:
    # kills: in the SSE 4.2 kernel, a lost head byte before the first aligned word or tail byte
    # after the last, a word read at the wrong alignment, a missing initial or final inversion;
    # in its three chains (from 768 bytes on), a run read at the wrong word, the two carries
    # swapped or carried over the wrong number of zero bytes
    from sessionstore.store.crc32c_sse42 import crc32c_sse42

    assert crc32c_sse42(data, offset) == sstfile.crc32c(data)


def test_every_block_trailer_is_sealed_by_the_hosts_kernel(tmp_path: Path) -> None:
    # kills: a block (the last data block, the index block) left without its checksum by the
    # second pass that writes them, or sealed by the two kernels differently: RocksDB checks
    # every block it reads (both kernels run where the CPU has SSE 4.2)
    records = {b"K%06d" % i: b"v" * (i % 50) for i in range(5000)}
    keys = sorted(records)
    key_data, key_offsets = rows(keys)
    value_data, value_offsets = rows([records[k] for k in keys])
    gone_data, gone_offsets = rows([b"K%06dx" % i for i in range(0, 5000, 7)])
    sealers: list[Any] = [None]
    if sstfile._has_sse42():
        from sessionstore.jit import compiled

        kernel = compiled(sstfile.seal_blocks_kernel)
        sealers.append(lambda out, first, length, blocks: kernel(out, first, length, blocks,
                                                                  sstfile._TABLES))
    written = []
    for number, sealer in enumerate(sealers):
        held = sstfile._SEALER
        if sealer is not None:
            sstfile._SEALER = sealer
        try:
            sstfile.write_sst(tmp_path / f"{number}.sst", key_data, key_offsets, value_data,
                              value_offsets[:-1], value_offsets[1:], gone_data, gone_offsets,
                              session_id="S" * 20, file_number=1)
        finally:
            sstfile._SEALER = held
        written.append((tmp_path / f"{number}.sst").read_bytes())
        db = open_db(tmp_path / f"db{number}")
        try:
            ingest(db, tmp_path / f"{number}.sst")
            assert list(db.items()) == sorted(records.items())
        finally:
            db.close()
    assert len(set(written)) == 1


def test_unsorted_or_repeated_keys_are_refused_and_leave_no_file(tmp_path: Path) -> None:
    for keys in ([b"b", b"a"], [b"a", b"a"], [b"ab", b"a"]):
        key_data, key_offsets = rows(keys)
        value_data, value_offsets = rows([b"1"] * len(keys))
        gone_data, gone_offsets = rows([])
        with pytest.raises(ValueError, match="sorted and distinct: entry 1"):
            sstfile.write_sst(tmp_path / "x.sst", key_data, key_offsets, value_data,
                              value_offsets[:-1], value_offsets[1:], gone_data, gone_offsets,
                              session_id=sstfile.new_session_id(), file_number=1)
        assert not (tmp_path / "x.sst").exists()


def test_a_flipped_bit_in_a_written_file_fails_its_block_checksum(tmp_path: Path) -> None:
    # kills: blocks written without their checksum, or a checksum type RocksDB does not check
    path = tmp_path / "x.sst"
    write_ours(path, {b"K%06d" % i: b"value %d" % i for i in range(2000)}, [])
    data = bytearray(path.read_bytes())
    data[1000] ^= 0x10  # inside the first data block
    path.write_bytes(bytes(data))
    db = open_db(tmp_path / "db")
    try:
        with pytest.raises(Exception, match="block checksum mismatch"):
            ingest(db, path)  # it reads the first and last blocks
            list(db.items())
    finally:
        db.close()


@settings(max_examples=round(60 * PROFILE_SCALE), deadline=None)
@given(keys=st.lists(st.one_of(st.text(max_size=300), st.integers(INT64_MIN, INT64_MAX),
                              st.binary(max_size=8)),
                     min_size=1, max_size=8, unique_by=keyschema.encode_key),
       data=st.data())
def test_key_first_rows_are_the_key_first_records(keys: list[Any], data: st.DataObject) -> None:
    # kills: a wrong time byte order or sign flip, a key cut at its matrix width, offsets off
    encoded = [keyschema.encode_key(k) for k in keys]
    n = data.draw(st.integers(0, 20))
    index = np.array(data.draw(st.lists(st.integers(0, len(keys) - 1), min_size=n,
                                        max_size=n)), dtype=np.int64)
    times = st.integers(INT64_MIN, INT64_MAX)
    ends = np.array(data.draw(st.lists(times, min_size=n, max_size=n)), dtype=np.int64)
    starts = np.array(data.draw(st.lists(times, min_size=n, max_size=n)), dtype=np.int64)
    expected = [keyschema.key_first(encoded[i], int(e), int(s))
                for i, e, s in zip(index.tolist(), ends.tolist(), starts.tolist(), strict=True)]
    for matrix in (keyschema.key_matrix(encoded), None):
        got, offsets = keyschema.key_first_rows(encoded, index, ends, starts, matrix)
        assert len(offsets) == n + 1
        assert [bytes(got[offsets[i]:offsets[i + 1]]) for i in range(n)] == expected


def test_a_bulk_write_after_an_abort_reads_its_own_values(tmp_path: Path,
                                                         monkeypatch: Any) -> None:
    # An abort reuses block ids, so a file written after it could have the unique id of one
    # written before it (and RocksDB's block cache hand out that file's blocks) unless each
    # file has a session id of its own. Kills: one session id per store, or per open.
    def put(store: SessionStore, value: int) -> None:
        n = 2 * rocksdb_module.BULK_LAYOUT_MIN_SESSIONS
        store.put_many([f"k{i}" for i in range(n)], np.zeros(n, np.int64),
                       np.arange(n, dtype=np.int64), [value] * n)

    with SessionStore(tmp_path / "s", retention_ms=10**9) as store:
        put(store, 1)
        assert [v for _, v in store.fetch("k3")] == [1]
        store.abort()
        put(store, 2)
        assert [v for _, v in store.fetch("k3")] == [2]
        assert {v for _, v in store.find_sessions(0, 10**6)} == {2}
        store.commit()
    with SessionStore(tmp_path / "s", retention_ms=10**9) as store:
        assert {v for _, v in store.find_sessions(0, 10**6)} == {2}


def test_a_damaged_ingested_file_is_named_as_corruption(tmp_path: Path) -> None:
    # the store's reads translate the checksum failure of a file it wrote itself
    n = 2 * rocksdb_module.BULK_LAYOUT_MIN_SESSIONS
    with SessionStore(tmp_path / "s", retention_ms=10**9) as store:
        store.put_many([f"k{i}" for i in range(n)], np.zeros(n, np.int64),
                       np.arange(n, dtype=np.int64), list(range(n)))
        live = tmp_path / "s" / "live"
        files = list(live.glob("*.sst"))
        assert len(files) == 1
        data = bytearray(files[0].read_bytes())
        data[len(data) * 3 // 4] ^= 0x01  # among the key-first records
        files[0].write_bytes(bytes(data))
        with pytest.raises(StoreCorruptedError):
            list(store.find_sessions(0, n))


def test_a_block_per_record_fits_the_buffer_and_reads_back(tmp_path: Path) -> None:
    # every value longer than a block: each record is a block of its own, with an index entry
    # each (the most room per record the writer needs; its buffer bound must hold, and two-byte
    # value lengths and block handles must read back)
    records = {b"K%05d" % i: bytes([i % 251]) * (sstfile.BLOCK_SIZE + i % 7) for i in range(3000)}
    write_ours(tmp_path / "x.sst", records, [])
    db = open_db(tmp_path / "db")
    try:
        ingest(db, tmp_path / "x.sst")
        assert list(db.items()) == sorted(records.items())
    finally:
        db.close()


def test_a_buffer_too_small_is_refused_not_overrun() -> None:
    # kills: the kernel writing past its buffer (it has no bounds checks of its own)
    from sessionstore.jit import compiled

    keys, offsets = rows([b"K%05d" % i for i in range(50)])
    values, value_offsets = rows([b"v" * 100] * 50)
    guard = np.full(4096, 0xAB, dtype=np.uint8)
    out = guard[:1024]  # the rest of guard must stay as it is
    size = compiled(sstfile.table_kernel)(keys, offsets, 50, values, value_offsets[:-1],
                                          value_offsets[1:], out, sstfile.BLOCK_SIZE,
                                          sstfile.RESTART_INTERVAL, np.zeros(8, dtype=np.int64),
                                          np.empty(51, dtype=np.int64),
                                          np.empty(51, dtype=np.int64))
    assert size == sstfile._OVERFLOW
    assert (guard[1024:] == 0xAB).all()


def test_reused_buffers_write_the_same_bytes_and_their_digest(tmp_path: Path,
                                                              monkeypatch: Any) -> None:
    # A thread's writer reuses its buffers from one file to the next: a smaller file after a
    # larger one, in buffers holding another file's bytes (and garbage), must come out byte
    # for byte as from fresh buffers, and the digest, size and tail handed to the commit must
    # be the file's. Kills: a byte the kernel leaves unwritten (stale bytes of the file
    # before), a digest that misses the tail, a wrong size, a tail that is not the file's end.
    sstfile.output_buffer(1 << 16).fill(0xAB)
    for name in ("block_first", "block_length"):
        sstfile.reused_buffer(name, 1 << 13, np.int64).fill(-1)
    for number, count in enumerate((6000, 4000, 200, 5000)):
        records = {b"K%06d" % i: b"value %d" % (i * (number + 1)) for i in range(count)}
        gone = [b"K%06dx" % i for i in range(0, count, 11)]
        keys = sorted(records)
        key_data, key_offsets = rows(keys + sorted(gone))
        value_data, value_offsets = rows([records[k] for k in keys])
        written = sstfile.write_table(tmp_path / f"ours{number}.sst", key_data, key_offsets,
                                      len(keys), value_data, value_offsets[:-1],
                                      value_offsets[1:], session_id="S" * 20, file_number=1)
        with monkeypatch.context() as fresh:  # every buffer a fresh one
            fresh.setattr(sstfile, "OUTPUT_BUFFER_REUSE_BYTES", 0)
            sstfile.write_table(tmp_path / f"fresh{number}.sst", key_data, key_offsets,
                                len(keys), value_data, value_offsets[:-1], value_offsets[1:],
                                session_id="S" * 20, file_number=1)
        write_rocksdicts(tmp_path / f"theirs{number}.sst", records, gone)
        data = (tmp_path / f"ours{number}.sst").read_bytes()
        assert data == (tmp_path / f"fresh{number}.sst").read_bytes()
        assert written.entries == count + len(gone)
        assert written.size == len(data)
        assert written.sha256 == hashlib.sha256(data).digest()
        assert data.endswith(written.tail) and 1000 < len(written.tail) < 2000
        assert b"S" * 20 in written.tail  # the file's own session id tells it apart
        for name in ("ours", "theirs"):
            db = open_db(tmp_path / f"db-{name}{number}")
            try:
                ingest(db, tmp_path / f"{name}{number}.sst")
                contents = list(db.items())
            finally:
                db.close()
            assert contents == sorted(records.items())


def test_named_buffers_are_reused_apart_and_huge_ones_not_kept(monkeypatch: Any) -> None:
    # kills: two names sharing memory (the keys overwritten by the output), a buffer of
    # another dtype handed out, a buffer shorter than asked, regrowth on every slightly larger
    # file (no room to spare), a huge buffer held for the life of the thread
    monkeypatch.setattr(sstfile, "OUTPUT_BUFFER_REUSE_BYTES", 1 << 20)
    first = sstfile.reused_buffer("t-keys", 1000, np.uint8)
    assert len(first) == 1000 and first.dtype == np.uint8 and first.ctypes.data % 8 == 0
    offsets = sstfile.reused_buffer("t-offsets", 1000, np.int64)
    assert offsets.dtype == np.int64 and not np.shares_memory(first, offsets)
    assert np.shares_memory(first, sstfile.reused_buffer("t-keys", 1200, np.uint8))
    grown = sstfile.reused_buffer("t-keys", 5000, np.uint8)
    assert len(grown) == 5000 and not np.shares_memory(first, grown)
    assert np.shares_memory(grown, sstfile.reused_buffer("t-keys", 6000, np.uint8))
    retyped = sstfile.reused_buffer("t-keys", 100, np.int64)
    assert retyped.dtype == np.int64 and len(retyped) == 100
    huge = sstfile.reused_buffer("t-keys", 2 << 20, np.uint8)
    assert len(huge) == 2 << 20
    assert not np.shares_memory(huge, sstfile.reused_buffer("t-keys", 100, np.uint8))


def _varint_at(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, at


def _first_blocks(data: bytes, count: int) -> list[tuple[bytes, int]]:
    """The first ``count`` entries of a table's index block: (internal key, block size)."""
    footer = data[-53:]
    at = 1  # the checksum type
    _meta_offset, at = _varint_at(footer, at)
    _meta_size, at = _varint_at(footer, at)
    index_offset, at = _varint_at(footer, at)
    at = index_offset
    entries = []
    for _ in range(count):
        shared, at = _varint_at(data, at)
        unshared, at = _varint_at(data, at)
        _value_length, at = _varint_at(data, at)
        assert shared == 0  # a restart point per entry
        key = data[at:at + unshared]
        at += unshared
        _offset, at = _varint_at(data, at)
        size, at = _varint_at(data, at)
        entries.append((key, size))
    return entries


def test_an_ingested_files_first_block_is_small_and_holds_no_record(tmp_path: Path) -> None:
    # RocksDB reads a file's first data block at ingestion (for its smallest key); the store
    # puts a deletion of a key no one writes there, alone in its block, so that this is not the
    # index block's record (about 1 MB for 40k sessions). Kills: the pad left out (the first
    # block is the record's), a pad too short to fill a block alone (it shares the record's
    # block), a pad that is a record (it would be read as data).
    n = 20_000
    with SessionStore(tmp_path / "s", retention_ms=10**9) as store:
        ends = np.arange(n, dtype=np.int64) % 900 + 10
        store.put_many([f"key-{i}" for i in range(n)], ends - 5, ends, list(range(n)))
        store.remove_many([f"key-{i}" for i in range(0, n, 9)], (ends - 5)[::9], ends[::9])
        store.put_many([f"key-{i}" for i in range(1, n, 2)], ends[1::2] - 5, ends[1::2],
                       [-1] * (n // 2))
        files = store.live_files()  # nothing flushed yet: the two files ingested
        assert len(files) == 2
        for path in files:
            (pad, pad_block), (block_key, record_block) = _first_blocks(path.read_bytes(), 2)
            assert pad[:-8] == bytes(len(pad) - 8) and pad[-8] == 0  # a deletion
            assert pad_block < 2 * sstfile.BLOCK_SIZE
            assert block_key[:1] == keyschema.INDEX_BLOCK and record_block > 100_000
        assert [v for _, v in store.fetch("key-18")] == []  # removed
        assert [v for _, v in store.fetch("key-9")] == [-1]  # removed, then written again
        assert [v for _, v in store.fetch("key-12")] == [12]
        gone = set(range(0, n, 9)) - set(range(1, n, 2))
        assert len(list(store.find_sessions(0, 10**6))) == n - len(gone)
