"""Writing RocksDB's block-based table files (SST files) for ingestion, from byte buffers.

rocksdict's ``SstFileWriter`` takes one Python call per record (about 180 ns each, most of a
large bulk write on RocksDB). This module writes the same kind of file from whole buffers, in
one compiled pass: the records' keys and values as byte buffers with offsets, and the keys to
delete as another sorted buffer. The file is what RocksDB's own ``SstFileWriter`` makes, in
the table format RocksDB documents ("Rocksdb BlockBasedTable Format" in its wiki):

* data blocks of about ``BLOCK_SIZE`` bytes, each entry ``varint32 shared | varint32
  unshared | varint32 value length | key bytes after the shared prefix | value``, a restart
  point every ``RESTART_INTERVAL`` entries (the offsets as u32, then their count as u32); an
  entry's key is the internal key: the user key, then 8 bytes little-endian of
  ``sequence << 8 | type`` with sequence 0 (ingestion assigns one) and type 1 (a value) or 0
  (a deletion);
* each block followed by a 5-byte trailer: the compression type (0, none) and the masked
  CRC-32C of the block and that byte;
* an index block (a restart point per entry) mapping each data block's last internal key to
  its handle (varint64 offset, varint64 size);
* a properties block, a metaindex block naming it, and the 53-byte footer of format version
  5: checksum type (1, CRC-32C), the metaindex and index handles padded to 40 bytes, the
  format version (u32) and the table magic number (u64).

The properties are those RocksDB's ``SstFileWriter`` records (``rocksdb.external_sst_file
.version`` 2 and a global sequence number 0 among them: ingestion refuses a file without
them). Blocks are not compressed: compressing took longer than the per-record calls this
saves (see docs/operations.md), and the files are rewritten compressed by RocksDB's
compaction. Pinned to rocksdict's writer by ``tests/store/test_rocks_sst_file.py``.
"""

from __future__ import annotations

import hashlib
import os
import platform
import struct
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from ..jit import register_helpers

__all__ = ["BLOCK_SIZE", "RESTART_INTERVAL", "WrittenTable", "crc32c", "reused_buffer",
           "write_sst", "write_table"]

BLOCK_SIZE = 4096  # RocksDB's default data block size
RESTART_INTERVAL = 16  # RocksDB's default restart interval of data blocks
FORMAT_VERSION = 5  # the last format version with block handles in the footer
_MAGIC = 0x88E241B785F4CFF7  # kBlockBasedTableMagicNumber
_CHECKSUM_CRC32C = 1
_NO_COMPRESSION = 0
_TYPE_DELETION = 0
_TYPE_VALUE = 1
_CRC_MASK_DELTA = 0xA282EAD8
_CRC_POLY = 0x82F63B78  # CRC-32C (Castagnoli), reflected
_OVERFLOW = -(1 << 62)  # table_kernel: the output buffer is too small


def _crc_tables() -> npt.NDArray[np.uint32]:
    """Slicing-by-8 tables of CRC-32C."""
    tables = np.zeros((8, 256), dtype=np.uint32)
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ (_CRC_POLY if crc & 1 else 0)
        tables[0, byte] = crc
    for byte in range(256):
        crc = int(tables[0, byte])
        for k in range(1, 8):
            crc = int(tables[0, crc & 0xFF]) ^ (crc >> 8)
            tables[k, byte] = crc
    return tables


_TABLES = _crc_tables()


def crc32c_kernel(data: npt.NDArray[np.uint8], first: int, stop: int,
                  tables: npt.NDArray[np.uint32]) -> int:
    """CRC-32C of ``data[first:stop]`` (slicing by 8). (Compiled.)"""
    crc = np.uint32(0xFFFFFFFF)
    at = first
    while at + 8 <= stop:
        low = crc ^ (np.uint32(data[at]) | (np.uint32(data[at + 1]) << np.uint32(8))
                     | (np.uint32(data[at + 2]) << np.uint32(16))
                     | (np.uint32(data[at + 3]) << np.uint32(24)))
        crc = (tables[7, low & np.uint32(0xFF)] ^ tables[6, (low >> np.uint32(8)) & np.uint32(0xFF)]
               ^ tables[5, (low >> np.uint32(16)) & np.uint32(0xFF)]
               ^ tables[4, low >> np.uint32(24)]
               ^ tables[3, data[at + 4]] ^ tables[2, data[at + 5]]
               ^ tables[1, data[at + 6]] ^ tables[0, data[at + 7]])
        at += 8
    while at < stop:
        crc = tables[0, (crc ^ np.uint32(data[at])) & np.uint32(0xFF)] ^ (crc >> np.uint32(8))
        at += 1
    return int(crc ^ np.uint32(0xFFFFFFFF))


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli) of ``data``, as RocksDB's ``crc32c::Value``."""
    from ..jit import compiled  # numba, on first use only

    buffer = np.frombuffer(data, dtype=np.uint8)
    return int(compiled(crc32c_kernel)(buffer, 0, len(buffer), _TABLES))


def _masked(crc: int) -> int:
    """RocksDB's ``crc32c::Mask``: what a block trailer stores."""
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _CRC_MASK_DELTA) & 0xFFFFFFFF


# The kernels index their byte buffers with unsigned positions: numba then leaves out its
# negative-index wraparound (a compare and select per access), which keeps LLVM from
# vectorising the byte loops; the copies ran about 5x slower with it.
_at = np.uint64


def put_varint_kernel(out: npt.NDArray[np.uint8], at: int, value: int) -> int:
    """Write ``value`` (>= 0) as a varint at ``out[at]``; return the position after it.
    (Compiled.)"""
    while value >= 0x80:
        out[_at(at)] = (value & 0x7F) | 0x80
        value >>= 7
        at += 1
    out[_at(at)] = value
    return at + 1


def seal_blocks_kernel(out: npt.NDArray[np.uint8], block_first: npt.NDArray[np.int64],
                       block_length: npt.NDArray[np.int64], blocks: int,
                       tables: npt.NDArray[np.uint32]) -> None:
    """Write the checksum of each block's trailer: block ``b`` is ``out[block_first[b]:
    block_first[b] + block_length[b]]``, followed by its compression type byte; the masked
    CRC-32C of both goes into the 4 bytes after that byte. (Compiled.)"""
    for b in range(blocks):
        first = block_first[b]
        at = first + block_length[b]
        crc = crc32c_kernel(out, first, at + 1, tables)
        masked = ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF
        for i in range(4):
            out[at + 1 + i] = (masked >> (8 * i)) & 0xFF


def block_sealer() -> Callable[[npt.NDArray[np.uint8], npt.NDArray[np.int64],
                                npt.NDArray[np.int64], int], None]:
    """The fastest :func:`seal_blocks_kernel` this host runs: the SSE 4.2 ``crc32``
    instruction where the CPU has it and numba compiles (:mod:`.crc32c_sse42`), else the
    table-driven kernel. The checksums are the same (pinned by a test)."""
    global _SEALER
    if _SEALER is None:
        from ..jit import compiled  # numba, on first use only

        if _has_sse42():
            from .crc32c_sse42 import seal_blocks_sse42_kernel

            def seal(out: npt.NDArray[np.uint8], block_first: npt.NDArray[np.int64],
                     block_length: npt.NDArray[np.int64], blocks: int) -> None:
                # a u64 view of out from its (aligned) start: the kernel reads whole words
                words = out[:len(out) // 8 * 8].view(np.uint64)
                seal_blocks_sse42_kernel(out, words, block_first, block_length, blocks)
        else:
            kernel = compiled(seal_blocks_kernel)

            def seal(out: npt.NDArray[np.uint8], block_first: npt.NDArray[np.int64],
                     block_length: npt.NDArray[np.int64], blocks: int) -> None:
                kernel(out, block_first, block_length, blocks, _TABLES)
        _SEALER = seal
    return _SEALER


_SEALER: Callable[[npt.NDArray[np.uint8], npt.NDArray[np.int64], npt.NDArray[np.int64], int],
                  None] | None = None


def _has_sse42() -> bool:
    """Whether the compiled kernels run on an x86 CPU with SSE 4.2: numba compiles at all
    (``NUMBA_DISABLE_JIT=1`` runs plain Python, where the instruction does not exist), and for
    the host CPU when it has the instruction, or for a CPU named by ``NUMBA_CPU_NAME`` only
    when ``NUMBA_CPU_FEATURES`` grants it (a generic target cannot build it)."""
    import numba
    from llvmlite import binding  # type: ignore[import-untyped]

    config = numba.config
    if getattr(config, "DISABLE_JIT", False) \
            or platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    if getattr(config, "CPU_NAME", None) not in (None, "host"):
        return "+sse4.2" in str(getattr(config, "CPU_FEATURES", None) or "")
    return bool(binding.get_host_cpu_features().get("sse4.2", False))


def _key_byte(data: npt.NDArray[np.uint8], first: int, length: int, kind: int, j: int) -> int:
    """Byte ``j`` of the internal key of the user key ``data[first:first + length]``."""
    if j < length:
        return int(data[_at(first + j)])
    if j == length:
        return kind
    return 0


def _load_word(data: npt.NDArray[np.uint8], at: int) -> np.uint64:
    """The 8 bytes at ``data[at]`` as a little-endian u64 (compiled: one unaligned load)."""
    p = _at(at)
    return (_at(data[p]) | (_at(data[p + _at(1)]) << _at(8)) | (_at(data[p + _at(2)]) << _at(16))
            | (_at(data[p + _at(3)]) << _at(24)) | (_at(data[p + _at(4)]) << _at(32))
            | (_at(data[p + _at(5)]) << _at(40)) | (_at(data[p + _at(6)]) << _at(48))
            | (_at(data[p + _at(7)]) << _at(56)))


def _store_word(out: npt.NDArray[np.uint8], at: int, word: np.uint64) -> None:
    """Write ``word`` as 8 bytes little-endian at ``out[at]`` (compiled: one store)."""
    p = _at(at)
    for b in range(8):
        out[p + _at(b)] = (word >> _at(8 * b)) & _at(0xFF)


def _lowest_byte(word: np.uint64) -> int:
    """The index of the lowest nonzero byte of ``word`` (not 0)."""
    n = 0
    if word & _at(0xFFFFFFFF) == 0:
        n += 4
        word >>= _at(32)
    if word & _at(0xFFFF) == 0:
        n += 2
        word >>= _at(16)
    if word & _at(0xFF) == 0:
        n += 1
    return n


def _equal_bytes(data: npt.NDArray[np.uint8], a: int, b: int) -> int:
    """How many of the 8 bytes at ``data[a]`` and ``data[b]`` are equal before the first that
    differs (8 when none does)."""
    diff = _load_word(data, a) ^ _load_word(data, b)
    return _lowest_byte(diff) if diff else 8


def _copy_word(out: npt.NDArray[np.uint8], at: int, data: npt.NDArray[np.uint8],
               first: int) -> None:
    """Copy the 8 bytes at ``data[first]`` to ``out[at]``."""
    _store_word(out, at, _load_word(data, first))


# The byte loops (common prefixes, copies) are written out in the kernels' loops, 8 bytes at
# a time: numba compiles a helper with a loop as a call that is not inlined, and that call
# (its arrays passed field by field, their reference counts taken and dropped) cost more than
# the loop.


def merge_kernel(keys: npt.NDArray[np.uint8], offsets: npt.NDArray[np.int64], n_put: int,
                 order: npt.NDArray[np.int64]) -> int:
    """Merge the sorted records ``0..n_put - 1`` and the sorted deletions ``n_put..`` (key
    ``e`` is ``keys[offsets[e]:offsets[e + 1]]``) into ``order``, dropping a deletion of a key a
    record holds. Returns how many entries ``order`` holds. (Compiled.)"""
    total = len(offsets) - 1
    i = 0
    g = n_put
    count = 0
    while i < n_put or g < total:
        if i >= n_put:
            order[count] = g
            g += 1
        elif g >= total:
            order[count] = i
            i += 1
        else:
            a0, a1 = offsets[i], offsets[i + 1]
            b0, b1 = offsets[g], offsets[g + 1]
            m = min(a1 - a0, b1 - b0)
            k = 0
            same = 8
            while same == 8 and k + 8 <= m:
                same = _equal_bytes(keys, a0 + k, b0 + k)
                k += same
            if same == 8 and k < m:  # a last word ending at m: the bytes before k are equal
                if m >= 8:
                    k = m - 8 + _equal_bytes(keys, a0 + m - 8, b0 + m - 8)
                else:
                    while k < m and keys[_at(a0 + k)] == keys[_at(b0 + k)]:
                        k += 1
            if k < m:
                smaller = keys[_at(a0 + k)] < keys[_at(b0 + k)]
            elif a1 - a0 == b1 - b0:
                g += 1  # deleted, then written again: the write is later
                continue
            else:
                smaller = a1 - a0 < b1 - b0
            if smaller:
                order[count] = i
                i += 1
            else:
                order[count] = g
                g += 1
        count += 1
    return count


def _end_block(out: npt.NDArray[np.uint8], at: int, restarts: npt.NDArray[np.int64],
               restart_count: int) -> int:
    """Append the restart points and their count to a block ending at ``at``; returns the
    position after them. (Compiled.)"""
    for r in range(restart_count):
        at = _put_u32(out, at, restarts[r])
    return _put_u32(out, at, restart_count)


def _put_u32(out: npt.NDArray[np.uint8], at: int, value: int) -> int:
    """Write ``value`` as 4 bytes little-endian at ``out[at]``; return the position after
    them. (Compiled.)"""
    for b in range(4):
        out[_at(at + b)] = (value >> (8 * b)) & 0xFF
    return at + 4


def _put_internal_key_tail(out: npt.NDArray[np.uint8], at: int, kind: int) -> int:
    """Write the 8 bytes after an internal key's user key (``sequence 0 << 8 | kind``,
    little-endian) at ``out[at]``; return the position after them. (Compiled.)"""
    out[_at(at)] = kind
    for j in range(1, 8):
        out[_at(at + j)] = 0
    return at + 8


def _close_data_block(out: npt.NDArray[np.uint8], first: int, at: int,
                      restarts: npt.NDArray[np.int64], restart_count: int, block: int,
                      last: int, last_entry: npt.NDArray[np.int64],
                      block_first: npt.NDArray[np.int64],
                      block_length: npt.NDArray[np.int64]) -> int:
    """End the data block ``block`` (``out[first:at]``, ``last`` its last entry): its restart
    points and trailer (its checksum left to :func:`seal_blocks_kernel`), and its index
    entry's parts. Returns the position after it. (Compiled.)"""
    at = _end_block(out, at, restarts, restart_count)
    last_entry[block] = last
    block_first[block] = first
    block_length[block] = at - first
    out[_at(at)] = 0  # kNoCompression
    return at + 5


def table_kernel(keys: npt.NDArray[np.uint8], offsets: npt.NDArray[np.int64], n_put: int,
                 values: npt.NDArray[np.uint8], value_first: npt.NDArray[np.int64],
                 value_stop: npt.NDArray[np.int64], out: npt.NDArray[np.uint8],
                 block_size: int, restart_interval: int, stats: npt.NDArray[np.int64],
                 block_first: npt.NDArray[np.int64], block_length: npt.NDArray[np.int64]
                 ) -> int:
    """Write the data blocks and the index block of a table into ``out``, each block followed
    by its trailer without the checksum: :func:`seal_blocks_kernel` writes those.

    Key ``e`` is ``keys[offsets[e]:offsets[e + 1]]``: the records ``e < n_put`` (with the
    values ``values[value_first[e]:value_stop[e]]``) and the deletions ``e >= n_put``,
    each run sorted by key bytes; they are merged, and a deletion of a key that a record holds
    is dropped (the record wins). ``stats`` receives: data size, index block offset, index
    block size, data blocks, entries, deletions, internal key bytes, value bytes.
    ``block_first`` and ``block_length`` (at least one more than the keys) receive where each
    block starts and its length without trailer: the data blocks, then the index block.

    Returns:
        The size written, or ``-(i + 1)`` when the merged entry ``i`` does not sort after the
        one before it, or ``_OVERFLOW`` when ``out`` is too small (nothing usable was written
        then). (Compiled.)
    """
    total = len(offsets) - 1
    merged = total > n_put  # without deletions, the records are the entries in order
    order = np.empty(total if merged else 0, dtype=np.int64)
    count = merge_kernel(keys, offsets, n_put, order) if merged else total
    restarts = np.empty(count + 1, dtype=np.int64)
    last_entry = np.empty(count + 1, dtype=np.int64)  # each data block's last entry
    size = len(out)
    blocks = 0
    at = 0
    block_start = 0
    restart_count = 0
    in_block = 0  # entries in the block
    since_restart = 0  # entries since its last restart point
    prev = -1
    deletions = 0
    key_bytes = 0
    value_bytes = 0
    for n in range(count):
        e = order[n] if merged else n
        first = offsets[e]
        length = offsets[e + 1] - first
        kind = 1 if e < n_put else 0
        shared = 0
        if prev >= 0:
            p_first = offsets[prev]
            p_length = offsets[prev + 1] - p_first
            m = min(p_length, length)
            k = 0
            same = 8
            while same == 8 and k + 8 <= m:
                same = _equal_bytes(keys, p_first + k, first + k)
                k += same
            if same == 8 and k < m:  # a last word ending at m: the bytes before k are equal
                if m >= 8:
                    k = m - 8 + _equal_bytes(keys, p_first + m - 8, first + m - 8)
                else:
                    while k < m and keys[_at(p_first + k)] == keys[_at(first + k)]:
                        k += 1
            # the user keys must rise strictly
            if k == m and p_length >= length:
                return -(n + 1)
            if k < m and keys[_at(p_first + k)] > keys[_at(first + k)]:
                return -(n + 1)
            if in_block and (at - block_start) + 4 * restart_count + 4 >= block_size:
                at = _close_data_block(out, block_start, at, restarts, restart_count, blocks,
                                       prev, last_entry, block_first, block_length)
                blocks += 1
                block_start = at
                restart_count = 0
                in_block = 0
            shared = k
            if k == m:
                # the earlier user key is a prefix of this one: its internal key's type byte
                # and zeros may share more
                p_kind = 1 if prev < n_put else 0
                while shared < p_length + 8 and _key_byte(
                        keys, p_first, p_length, p_kind, shared) == _key_byte(
                        keys, first, length, kind, shared):
                    shared += 1
        if in_block == 0 or since_restart == restart_interval:
            since_restart = 0
            restarts[restart_count] = at - block_start
            restart_count += 1
            shared = 0
        internal_length = length + 8
        v_first = value_first[e] if kind else 0
        v_length = value_stop[e] - v_first if kind else 0
        if at + 15 + internal_length + v_length + 4 * (restart_count + 3) + 5 > size:
            return _OVERFLOW
        at = put_varint_kernel(out, at, shared)
        at = put_varint_kernel(out, at, internal_length - shared)
        at = put_varint_kernel(out, at, v_length)
        if shared < length:
            unshared = length - shared
            if unshared < 8:
                for j in range(unshared):
                    out[_at(at + j)] = keys[_at(first + shared + j)]
            else:
                for j in range(0, unshared - 8, 8):
                    _copy_word(out, at + j, keys, first + shared + j)
                _copy_word(out, at + unshared - 8, keys, first + length - 8)
            at = _put_internal_key_tail(out, at + unshared, kind)
        else:
            for j in range(shared, internal_length):
                out[_at(at)] = _key_byte(keys, first, length, kind, j)
                at += 1
        if v_length < 8:
            for j in range(v_length):
                out[_at(at + j)] = values[_at(v_first + j)]
        else:
            for j in range(0, v_length - 8, 8):
                _copy_word(out, at + j, values, v_first + j)
            _copy_word(out, at + v_length - 8, values, v_first + v_length - 8)
        at += v_length
        in_block += 1
        since_restart += 1
        deletions += 1 - kind
        key_bytes += internal_length
        value_bytes += v_length
        prev = e
    if in_block:
        at = _close_data_block(out, block_start, at, restarts, restart_count, blocks, prev,
                               last_entry, block_first, block_length)
        blocks += 1
    data_size = at
    # the index block: each block's last internal key -> its handle, a restart point each
    index_start = at
    for b in range(blocks):
        if at + 15 + (offsets[last_entry[b] + 1] - offsets[last_entry[b]]) + 8 + 20 \
                + 4 * (blocks + 1) + 5 > size:
            return _OVERFLOW
        restarts[b] = at - index_start
        e = last_entry[b]
        first = offsets[e]
        length = offsets[e + 1] - first
        kind = 1 if e < n_put else 0
        handle_length = 0
        for value in (block_first[b], block_length[b]):
            while True:
                handle_length += 1
                if value < 0x80:
                    break
                value >>= 7
        at = put_varint_kernel(out, at, 0)
        at = put_varint_kernel(out, at, length + 8)
        at = put_varint_kernel(out, at, handle_length)
        for j in range(length):
            out[_at(at + j)] = keys[_at(first + j)]
        at += length
        at = _put_internal_key_tail(out, at, kind)
        at = put_varint_kernel(out, at, block_first[b])
        at = put_varint_kernel(out, at, block_length[b])
    at = _end_block(out, at, restarts, blocks)
    index_size = at - index_start
    block_first[blocks] = index_start
    block_length[blocks] = index_size
    out[_at(at)] = 0  # kNoCompression
    at += 5
    stats[0] = data_size
    stats[1] = index_start
    stats[2] = index_size
    stats[3] = blocks
    stats[4] = count
    stats[5] = deletions
    stats[6] = key_bytes
    stats[7] = value_bytes
    return at


register_helpers({
    "seal_blocks_kernel": (crc32c_kernel,),
    "_equal_bytes": (_load_word, _lowest_byte),
    "_copy_word": (_load_word, _store_word),
    "_end_block": (_put_u32,),
    "_close_data_block": (_end_block,),
    "merge_kernel": (_equal_bytes,),
    "table_kernel": (put_varint_kernel, _key_byte, _equal_bytes, _copy_word, merge_kernel,
                     _end_block, _put_internal_key_tail, _close_data_block),
})


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _small_block(entries: list[tuple[bytes, bytes]]) -> bytes:
    """A block of sorted ``(key, value)`` entries, a restart point each (the properties and
    metaindex blocks), without its trailer."""
    body = bytearray()
    restarts = []
    for key, value in entries:
        restarts.append(len(body))
        body += _varint(0) + _varint(len(key)) + _varint(len(value)) + key + value
    for restart in restarts:
        body += struct.pack("<I", restart)
    body += struct.pack("<I", len(restarts))
    return bytes(body)


def _trailer(block: bytes) -> bytes:
    return bytes([_NO_COMPRESSION]) + struct.pack(
        "<I", _masked(crc32c(block + bytes([_NO_COMPRESSION]))))


def _handle(offset: int, size: int) -> bytes:
    return _varint(offset) + _varint(size)


def _properties(stats: npt.NDArray[np.int64], session_id: str, file_number: int) -> bytes:
    """The properties block of a table with ``stats`` (see :func:`table_kernel`)."""
    data_size, _index_start, index_size, blocks, entries, deletions, key_bytes, value_bytes = (
        int(x) for x in stats)
    numbers = {
        "rocksdb.column.family.id": 0x7FFFFFFF,  # kUnknownColumnFamily, as SstFileWriter's
        "rocksdb.creation.time": 0,
        "rocksdb.data.size": data_size,
        "rocksdb.deleted.keys": deletions,
        "rocksdb.filter.size": 0,
        "rocksdb.fixed.key.length": 0,
        "rocksdb.format.version": FORMAT_VERSION,
        "rocksdb.index.key.is.user.key": 0,
        "rocksdb.index.size": index_size + 5,
        "rocksdb.index.value.is.delta.encoded": 0,
        "rocksdb.key.largest.seqno": 0,
        "rocksdb.merge.operands": 0,
        "rocksdb.num.data.blocks": blocks,
        "rocksdb.num.entries": entries,
        "rocksdb.num.filter_entries": 0,
        "rocksdb.num.range-deletions": 0,
        "rocksdb.oldest.key.time": 0,
        "rocksdb.original.file.number": file_number,
        "rocksdb.raw.key.size": key_bytes,
        "rocksdb.raw.value.size": value_bytes,
        "rocksdb.tail.start.offset": data_size,
    }
    texts = {
        "rocksdb.block.based.table.index.type": struct.pack("<I", 0),  # binary search
        "rocksdb.block.based.table.prefix.filtering": b"0",
        "rocksdb.block.based.table.whole.key.filtering": b"1",
        "rocksdb.comparator": b"leveldb.BytewiseComparator",
        "rocksdb.compression": b"NoCompression",
        "rocksdb.creating.db.identity": b"SST Writer",
        "rocksdb.creating.session.identity": session_id.encode(),
        # ingestion looks these two up (an SstFileWriter file, version 2, global seqno 0)
        "rocksdb.external_sst_file.global_seqno": struct.pack("<Q", 0),
        "rocksdb.external_sst_file.version": struct.pack("<I", 2),
        "rocksdb.merge.operator": b"nullptr",
        "rocksdb.prefix.extractor.name": b"nullptr",
        "rocksdb.property.collectors": b"[]",
    }
    entries_list = [(name.encode(), _varint(value)) for name, value in numbers.items()]
    entries_list += [(name.encode(), value) for name, value in texts.items()]
    entries_list.sort()
    return _small_block(entries_list)


OUTPUT_BUFFER_REUSE_BYTES = 32 << 20
"""The largest buffer (:func:`reused_buffer`) a thread keeps for its next file."""

_REUSED_BUFFERS = threading.local()


def reused_buffer(name: str, size: int, dtype: type[np.generic]) -> npt.NDArray[Any]:
    """A buffer of ``size`` items of ``dtype`` for writing a file, its contents undefined (as
    ``np.empty``'s), starting where an allocation starts (aligned).

    The calling thread gets the same memory again on its next call with ``name`` while the
    size stays within :data:`OUTPUT_BUFFER_REUSE_BYTES`: a fresh buffer of megabytes costs its
    first writes' page faults and cache misses (the output buffer's took about 1.4 ms of the
    4.3 the table kernel took for the four files of a q11 run, the store's other buffers about
    as much again). So the buffer is valid only until the thread's next call with ``name``.
    A buffer grows with a quarter to spare (the files of a stream grow a little from batch to
    batch; untouched pages cost nothing).
    """
    nbytes = size * np.dtype(dtype).itemsize
    if nbytes > OUTPUT_BUFFER_REUSE_BYTES:
        return np.empty(size, dtype=dtype)
    held: dict[str, npt.NDArray[Any]] | None = getattr(_REUSED_BUFFERS, "buffers", None)
    if held is None:
        held = _REUSED_BUFFERS.buffers = {}
    buffer = held.get(name)
    if buffer is None or buffer.dtype != dtype or len(buffer) < size:
        spare = min(size // 4, (OUTPUT_BUFFER_REUSE_BYTES - nbytes) // np.dtype(dtype).itemsize)
        buffer = held[name] = np.empty(size + spare, dtype=dtype)
    return buffer[:size]


def output_buffer(size: int) -> npt.NDArray[np.uint8]:
    """A byte buffer of ``size`` bytes for :func:`table_kernel` to write a file into: the
    calling thread's :func:`reused_buffer` ``"out"``."""
    return reused_buffer("out", size, np.uint8)


def new_session_id() -> str:
    """A RocksDB session id: 20 characters of base 36, as ``rocksdb.creating.session
    .identity`` holds (it goes into the file's unique id)."""
    digits = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    value = int.from_bytes(os.urandom(13), "little")
    return "".join(digits[(value // 36 ** i) % 36] for i in range(20))


def write_sst(path: str | os.PathLike[str], keys: npt.NDArray[np.uint8],
              key_offsets: npt.NDArray[np.int64], values: npt.NDArray[np.uint8],
              value_first: npt.NDArray[np.int64], value_stop: npt.NDArray[np.int64],
              gone: npt.NDArray[np.uint8], gone_offsets: npt.NDArray[np.int64], *,
              session_id: str, file_number: int) -> int:
    """Write an SST file for ``ingest_external_file``: the records ``keys[key_offsets[i]:
    key_offsets[i + 1]] -> values[value_first[i]:value_stop[i]]`` and deletions of the keys
    ``gone[gone_offsets[j]:gone_offsets[j + 1]]``, both sorted by key bytes, each key once (a
    deletion of a key the records hold is dropped). Offsets start at 0.

    Args:
        path: the file to create (overwritten).
        keys, key_offsets: the records' keys, one buffer and ``n + 1`` offsets.
        values, value_first, value_stop: their values: where each starts and stops.
        gone, gone_offsets: the keys to delete, one buffer and ``m + 1`` offsets.
        session_id: a :func:`new_session_id` of this file alone, and ``file_number``: the
            file's unique id, which RocksDB's block cache keys come from.

    Returns:
        The number of entries written.

    Raises:
        ValueError: the keys are not sorted, or repeat, or the offsets do not match (nothing
            is left at ``path``).
        OSError: the file cannot be written (nothing is left at ``path``).
    """
    if not len(gone_offsets) or not len(key_offsets):
        raise ValueError(f"key_offsets ({len(key_offsets)}) and gone_offsets "
                         f"({len(gone_offsets)}) must hold n + 1 and m + 1 offsets")
    n_put = len(key_offsets) - 1
    if len(gone_offsets) > 1:
        keys = np.concatenate([keys[:key_offsets[-1]], gone])
        key_offsets = np.concatenate([key_offsets, gone_offsets[1:] + key_offsets[-1]])
    return write_table(path, keys, key_offsets, n_put, values, value_first, value_stop,
                       session_id=session_id, file_number=file_number).entries


class WrittenTable(NamedTuple):
    """What :func:`write_table` wrote.

    Attributes:
        entries: the entries the file holds (records and deletions).
        size: the file's size in bytes.
        sha256: the SHA-256 of the file's bytes, computed from the buffer they were written
            from (a commit's manifest records it without reading the file back).
        tail: the file's last bytes (its properties block, which holds the file's own session
            id, then the metaindex block and the footer): what tells this file apart from any
            other of the same size (see :func:`~sessionstore.store.checkpoint.describe_files`).
    """

    entries: int
    size: int
    sha256: bytes
    tail: bytes


def write_table(path: str | os.PathLike[str], keys: npt.NDArray[np.uint8],
                key_offsets: npt.NDArray[np.int64], n_put: int, values: npt.NDArray[np.uint8],
                value_first: npt.NDArray[np.int64], value_stop: npt.NDArray[np.int64], *,
                session_id: str, file_number: int) -> WrittenTable:
    """:func:`write_sst` with the records and the deletions in one buffer, as
    :func:`table_kernel` takes them: entry ``e`` is ``keys[key_offsets[e]:key_offsets[e +
    1]]``, a record for ``e < n_put`` (its value ``values[value_first[e]:value_stop[e]]``),
    else a deletion; each run sorted by key bytes.

    The output buffers are the calling thread's (:func:`reused_buffer`): ``keys`` and the
    value buffers may be that thread's other reused buffers.

    Returns:
        The entries, size, SHA-256 and last bytes of the file written.

    Raises:
        ValueError, OSError: as :func:`write_sst` (nothing is left at ``path``).
    """
    from ..jit import compiled  # numba, on first use only

    n = len(key_offsets) - 1
    if n < 0 or not 0 <= n_put <= n or len(value_first) != n_put \
            or len(value_stop) != n_put:
        raise ValueError(f"key_offsets ({len(key_offsets)}), n_put ({n_put}), value_first "
                         f"({len(value_first)}) and value_stop ({len(value_stop)}) do not "
                         "describe n_put keys and values and the deletions after them (n + 1 "
                         "offsets)")
    if n == 0:
        raise ValueError("an SST file needs at least one record or deletion")
    # The most an entry takes: 3 varints (15 bytes), its internal key (its key and 8 bytes), its
    # value and a restart point (4); when it is a block of its own (a long value), the block's
    # restart count and trailer (9) and an index entry: 3 varints, the internal key again, a
    # handle (20) and a restart point. The kernel does not check bounds: this must hold.
    bound = 2 * int(key_offsets[-1]) + int((value_stop - value_first).sum()) + n * 96 + 1024
    out = output_buffer(bound)
    stats = np.zeros(8, dtype=np.int64)
    block_first = reused_buffer("block_first", n + 1, np.int64)
    block_length = reused_buffer("block_length", n + 1, np.int64)
    size = int(compiled(table_kernel)(keys, key_offsets, n_put, values, value_first,
                                      value_stop, out, BLOCK_SIZE, RESTART_INTERVAL, stats,
                                      block_first, block_length))
    if size == _OVERFLOW:  # the bound above is wrong
        raise RuntimeError(f"the SST file {path} outgrew its buffer of {bound} bytes")
    if size < 0:
        raise ValueError(f"the keys of an SST file must be sorted and distinct: entry "
                         f"{-size - 1} does not sort after the one before it")
    block_sealer()(out, block_first, block_length, int(stats[3]) + 1)
    properties = _properties(stats, session_id, file_number)
    properties_at = size
    tail = bytearray(properties + _trailer(properties))
    metaindex = _small_block([(b"rocksdb.properties",
                               _handle(properties_at, len(properties)))])
    metaindex_at = size + len(tail)
    tail += metaindex + _trailer(metaindex)
    handles = _handle(metaindex_at, len(metaindex)) + _handle(int(stats[1]), int(stats[2]))
    tail += bytes([_CHECKSUM_CRC32C]) + handles + bytes(40 - len(handles))
    tail += struct.pack("<IQ", FORMAT_VERSION, _MAGIC)
    body = out[:size]
    digest = hashlib.sha256(body.data)
    digest.update(tail)
    target = Path(path)
    try:
        # one write each, straight from the buffers (an unbuffered file copies nothing)
        with open(target, "wb", buffering=0) as file:
            _write_all(file, body.data)
            _write_all(file, tail)
    except BaseException:
        target.unlink(missing_ok=True)
        raise
    return WrittenTable(int(stats[4]), size + len(tail), digest.digest(), bytes(tail))


def _write_all(file: Any, data: Any) -> None:
    """Write all of ``data`` to an unbuffered file (a raw write may write less)."""
    view = memoryview(data).cast("B")
    while len(view):
        view = view[file.write(view):]
