"""The compiled table builder of ``sessionstore.store.sstfile`` (its word-at-a-time prefixes
and copies, its merge of records and deletions, its blocks and index), pinned byte for byte to
a plain reference written here from RocksDB's block-based table format, compiled and as its
Python source (what ``NUMBA_DISABLE_JIT=1`` runs), over block sizes and restart intervals.
``tests/store/test_rocks_sst_file.py`` pins the whole file to rocksdict's writer."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionstore import jit
from sessionstore.store import sstfile

PROFILE_SCALE = settings.default.max_examples / 100

# -- the reference ------------------------------------------------------------------------------


def _crc_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


CRC_TABLE = _crc_table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc = CRC_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def common_prefix(a: bytes, b: bytes) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def sealed(body: bytes) -> bytes:
    """A block with its trailer: no compression, the masked CRC-32C of the block and that
    byte."""
    crc = crc32c(body + b"\0")
    masked = ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF
    return body + b"\0" + struct.pack("<I", masked)


def reference_table(records: dict[bytes, bytes], gone: set[bytes], block_size: int,
                    restart_interval: int) -> tuple[bytes, list[int], list[tuple[int, int]]]:
    """The data blocks and index block of a table of ``records`` and deletions of ``gone``
    (those of a key a record holds dropped), with the kernel's statistics and the block
    handles (the data blocks', then the index block's)."""
    entries = sorted([(key, 1, value) for key, value in records.items()]
                     + [(key, 0, b"") for key in gone if key not in records])
    out = bytearray()
    handles: list[tuple[int, int]] = []
    last_keys: list[bytes] = []
    block = bytearray()
    restarts: list[int] = []
    in_block = 0
    previous = b""

    def close() -> None:
        body = bytes(block) + b"".join(struct.pack("<I", r) for r in restarts) \
            + struct.pack("<I", len(restarts))
        handles.append((len(out), len(body)))
        last_keys.append(previous)
        out.extend(sealed(body))

    for key, kind, value in entries:
        internal = key + bytes([kind]) + bytes(7)  # sequence 0, the type, little-endian
        if in_block and len(block) + 4 * len(restarts) + 4 >= block_size:
            close()
            block, restarts, in_block = bytearray(), [], 0
        if in_block % restart_interval == 0:
            restarts.append(len(block))
            shared = 0
        else:
            shared = common_prefix(previous, internal)
        block += varint(shared) + varint(len(internal) - shared) + varint(len(value))
        block += internal[shared:] + value
        in_block += 1
        previous = internal
    if in_block:
        close()
    data_size = len(out)
    index = bytearray()
    index_restarts = []
    for (offset, size), last in zip(handles, last_keys, strict=True):
        index_restarts.append(len(index))
        handle = varint(offset) + varint(size)
        index += varint(0) + varint(len(last)) + varint(len(handle)) + last + handle
    index += b"".join(struct.pack("<I", r) for r in index_restarts)
    index += struct.pack("<I", len(index_restarts))
    handles.append((len(out), len(index)))
    out += sealed(bytes(index))
    stats = [data_size, data_size, len(index), len(handles) - 1, len(entries),
             sum(1 for _key, kind, _value in entries if not kind),
             sum(len(key) + 8 for key, _kind, _value in entries),
             sum(len(value) for _key, _kind, value in entries)]
    return bytes(out), stats, handles


# -- running the kernel -------------------------------------------------------------------------


@contextmanager
def python_source(enabled: bool) -> Iterator[None]:
    """Run the table kernel's Python source, calling the Python helpers (as under
    ``NUMBA_DISABLE_JIT=1``), instead of its compiled form."""
    if not enabled:
        yield
        return
    saved = dict(jit.COMPILED)
    jit.COMPILED["table_kernel"] = sstfile.table_kernel
    try:
        yield
    finally:
        jit.COMPILED.clear()
        jit.COMPILED.update(saved)


def rows(pieces: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.zeros(len(pieces) + 1, dtype=np.int64)
    np.cumsum([len(p) for p in pieces], out=offsets[1:])
    return np.frombuffer(b"".join(pieces), dtype=np.uint8).copy(), offsets


def kernel_inputs(puts: list[bytes], values: list[bytes], gone: list[bytes], shuffle: Any
                  ) -> tuple[Any, ...]:
    """The kernel's arguments: the records' keys then the deletions' in one buffer, and the
    values scattered in another, out of order and with bytes between them (as the store
    passes its value rows)."""
    keys, offsets = rows(puts + gone)
    buffer = bytearray()
    first = np.zeros(len(values), dtype=np.int64)
    stop = np.zeros(len(values), dtype=np.int64)
    for i in shuffle(list(range(len(values)))):
        buffer += b"\xee" * (i % 3)
        first[i] = len(buffer)
        buffer += values[i]
        stop[i] = len(buffer)
    return keys, offsets, len(puts), np.frombuffer(bytes(buffer), dtype=np.uint8), first, stop


def run_kernel(inputs: tuple[Any, ...], block_size: int, restart_interval: int
               ) -> tuple[int, bytes, list[int], list[tuple[int, int]]]:
    keys, offsets, n_put, values, first, stop = inputs
    n = len(offsets) - 1
    out = np.full(2 * len(keys) + len(values) + 200 * n + 1024, 0xAB, dtype=np.uint8)
    stats = np.zeros(8, dtype=np.int64)
    block_first = np.full(n + 1, -1, dtype=np.int64)
    block_length = np.full(n + 1, -1, dtype=np.int64)
    size = int(jit.compiled(sstfile.table_kernel)(
        keys, offsets, n_put, values, first, stop, out, block_size, restart_interval, stats,
        block_first, block_length))
    if size < 0:
        return size, b"", [], []
    blocks = int(stats[3]) + 1
    sstfile.block_sealer()(out, block_first, block_length, blocks)
    handles = list(zip(block_first[:blocks].tolist(), block_length[:blocks].tolist(),
                       strict=True))
    return size, out[:size].tobytes(), stats.tolist(), handles


# keys over few byte values, so that they share long prefixes (past a word, ending inside
# one) and one is often a prefix of another; values short, one word long or several blocks
KEY = st.binary(max_size=40).map(lambda b: bytes(x % 3 for x in b))
VALUE = st.one_of(st.binary(max_size=9), st.binary(min_size=8, max_size=40),
                  st.binary(min_size=300, max_size=20_000))


@settings(max_examples=round(150 * PROFILE_SCALE), deadline=None)
@given(records=st.dictionaries(KEY, VALUE, max_size=120),
       gone=st.sets(KEY, max_size=40), many=st.integers(0, 600),
       block_size=st.sampled_from([1, 64, 300, sstfile.BLOCK_SIZE]),
       restart_interval=st.sampled_from([1, 2, 3, sstfile.RESTART_INTERVAL]),
       python=st.booleans(), random=st.randoms(use_true_random=False))
def test_the_table_kernel_writes_the_reference_blocks(
        records: dict[bytes, bytes], gone: set[bytes], many: int, block_size: int,
        restart_interval: int, python: bool, random: Any) -> None:
    # kills: a prefix word compared past the shorter key or ending before it, a wrong byte
    # picked from the differing word, a copy's last word misplaced or a tail byte lost, a
    # deletion of a written key kept (or a deletion lost), a restart point or block cut off by
    # one, the internal key's type byte, the index entries' handles, the statistics
    records = dict(records)
    records.update({b"\x01\x01\x00%06d" % i: b"v%d" % (i % 11) for i in range(many)})
    if not records and not gone:
        gone = {b""}
    puts = sorted(records)
    deletions = sorted(gone)
    inputs = kernel_inputs(puts, [records[k] for k in puts], deletions,
                           lambda xs: random.sample(xs, len(xs)))
    expected, stats, handles = reference_table(records, gone, block_size, restart_interval)
    with python_source(python):
        got = run_kernel(inputs, block_size, restart_interval)
    assert got == (len(expected), expected, stats, handles)


@settings(max_examples=round(60 * PROFILE_SCALE), deadline=None)
@given(keys=st.lists(KEY, min_size=2, max_size=60, unique=True), data=st.data(),
       python=st.booleans())
def test_the_first_key_out_of_order_is_named(keys: list[bytes], data: st.DataObject,
                                            python: bool) -> None:
    # kills: an order check that misses a difference inside a compared word (or in the last,
    # overlapping one), or takes a repeated key (or one that is a prefix of the key before
    # it) for a rising one
    keys = sorted(keys)
    at = data.draw(st.integers(1, len(keys) - 1))
    if data.draw(st.booleans()):
        keys[at] = keys[at - 1]  # repeated
    else:
        keys[at - 1], keys[at] = keys[at], keys[at - 1]  # swapped: falls
    first_bad = next(i for i in range(1, len(keys)) if keys[i] <= keys[i - 1])
    inputs = kernel_inputs(keys, [b"v"] * len(keys), [], lambda xs: xs)
    with python_source(python):
        size = run_kernel(inputs, sstfile.BLOCK_SIZE, sstfile.RESTART_INTERVAL)[0]
    assert size == -(first_bad + 1)


@settings(max_examples=round(20 * PROFILE_SCALE), deadline=None)
@given(records=st.dictionaries(KEY, VALUE, max_size=60), gone=st.sets(KEY, max_size=20),
       python=st.booleans())
def test_write_sst_starts_with_the_reference_blocks(tmp_path_factory: Any,
                                                    records: dict[bytes, bytes],
                                                    gone: set[bytes], python: bool) -> None:
    # the public writer (its deletions joined to the records' keys, its buffer bound) around
    # the kernel; kills: the kernel's output cut short or the deletions' offsets shifted
    if not records and not gone:
        gone = {b"\x02"}
    puts = sorted(records)
    keys, offsets = rows(puts)
    values, value_offsets = rows([records[k] for k in puts])
    gone_keys, gone_offsets = rows(sorted(gone))
    path: Path = tmp_path_factory.mktemp("sst") / "x.sst"
    with python_source(python):
        sstfile.write_sst(path, keys, offsets, values, value_offsets[:-1], value_offsets[1:],
                          gone_keys, gone_offsets, session_id="S" * 20, file_number=1)
    expected, _stats, handles = reference_table(records, gone, sstfile.BLOCK_SIZE,
                                                sstfile.RESTART_INTERVAL)
    written = path.read_bytes()
    assert written[:len(expected)] == expected
    # the footer: the checksum type, the metaindex handle, then the index block's handle
    footer = written[-53:]
    assert footer[0] == 1 and footer[-12:] == struct.pack("<IQ", 5, 0x88E241B785F4CFF7)
    numbers = []
    at = 1
    for _ in range(4):
        value = shift = 0
        while True:
            value |= (footer[at] & 0x7F) << shift
            shift += 7
            at += 1
            if footer[at - 1] < 0x80:
                break
        numbers.append(value)
    assert tuple(numbers[2:]) == handles[-1]


def test_keys_that_extend_the_key_before_them_at_every_length() -> None:
    # Each key a prefix of the next, the shorter one ending at every position of a word (the
    # bytes after it in the key buffer equal to its own): kills a word compared past the
    # shorter key (its next byte read as if it were the key's), in the order check and in the
    # shared prefix, and a deletion merged in at such a key
    for python in (False, True):
        for base in range(0, 20):
            for byte in (0, 1, 2):
                stem = bytes([byte]) * base
                puts = [stem + bytes([byte]) * extra for extra in range(0, 10)]
                records = {key: b"v" * (len(key) % 9) for key in puts}
                gone = {stem + bytes([byte, 3]), stem[:-1] + bytes([3])} if base else {b"\x03"}
                keys = sorted(records)
                inputs = kernel_inputs(keys, [records[k] for k in keys], sorted(gone),
                                       lambda xs: xs)
                expected, stats, handles = reference_table(records, gone, 64, 2)
                with python_source(python):
                    assert run_kernel(inputs, 64, 2) == (len(expected), expected, stats,
                                                         handles), (python, base, byte)


def test_an_output_buffer_is_reused_by_its_thread_alone(monkeypatch: Any) -> None:
    # kills: one buffer shared by threads (two files written at once into the same memory),
    # a buffer shorter than asked for, a buffer over the limit kept for ever
    import threading

    monkeypatch.setattr(sstfile, "OUTPUT_BUFFER_REUSE_BYTES", 4096)
    first = sstfile.output_buffer(1000)
    again = sstfile.output_buffer(3000)
    assert len(first) == 1000 and len(again) == 3000
    smaller = sstfile.output_buffer(10)
    assert len(smaller) == 10 and np.shares_memory(smaller, again)
    huge = sstfile.output_buffer(5000)
    assert len(huge) == 5000 and not np.shares_memory(huge, again)
    assert np.shares_memory(sstfile.output_buffer(100), again)  # the huge one was not kept
    other: list[np.ndarray] = []
    thread = threading.Thread(target=lambda: other.append(sstfile.output_buffer(100)))
    thread.start()
    thread.join()
    assert len(other[0]) == 100 and not np.shares_memory(other[0], again)
