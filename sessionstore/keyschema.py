"""The on-disk byte layout of session records: the one module that touches key bytes.

Every segment holds two layouts of the same session, distinguished by a one-byte tag:

* key-first ``K | len(key) | key | end | start`` holds the value; it serves ``fetch`` and
  ``find_sessions_to_merge`` with one seek per segment;
* time-first ``T | end | len(key) | key | start`` holds nothing; it serves the cross-key
  ``find_sessions(end range)`` that emit-on-close needs, and the value is read back from the
  key-first record.

The record key is msgpack, prefixed by its 4-byte big-endian length so that no key is a prefix of
another. Times are 8 bytes big-endian with the sign bit flipped, so that byte order is numeric
order for negative times too.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any, NamedTuple

import msgpack
import numpy as np
import numpy.typing as npt

from .errors import FLOAT_KEY_HINT
from .timeutil import INT64_MAX, INT64_MIN

KEY_FIRST = b"K"
TIME_FIRST = b"T"
MAX_KEY_BYTES = 1 << 20

_SIGN = 1 << 63
_TIME = struct.Struct(">Q")
_TIMES = struct.Struct(">QQ")
_LEN = struct.Struct(">I")
_MAX_NESTING = 32
_PACK = msgpack.Packer(use_bin_type=True).pack


def _check_key_part(part: Any, depth: int) -> None:
    kind = type(part)
    if kind is str or kind is bytes:
        return
    if kind is int:
        if not INT64_MIN <= part <= INT64_MAX:
            raise ValueError(f"key integer {part} does not fit in int64")
        return
    if kind is tuple:
        if depth >= _MAX_NESTING:
            raise ValueError(f"key tuples may nest at most {_MAX_NESTING} deep")
        for item in part:
            _check_key_part(item, depth + 1)
        return
    if part is None:
        raise ValueError("key must not be None (nor contain None)")
    hint = ""
    if isinstance(part, float):
        # floats are not grouping keys here: NaN != NaN and -0.0 == 0.0 would need a
        # normalisation (Spark's) that silently merges or splits keys; see docs/semantics.md
        hint = f"; {FLOAT_KEY_HINT}"
    raise TypeError(
        f"key must be str, bytes, int or a tuple of them, got {type(part).__name__}: "
        f"{part!r:.80}{hint}"
    )


_STR_CACHE: dict[str, bytes] = {}
_INT_CACHE: dict[int, bytes] = {}  # separate from str keys, and never holding a bool
_STR_CACHE_LIMIT = 1 << 16


def encode_key(key: Any) -> bytes:
    """Return the length-prefixed msgpack encoding of a record key.

    Raises:
        ValueError: the key is None, holds an out-of-range int, or encodes to over 1 MiB.
        TypeError: the key is not a str, bytes, int or tuple of them.
    """
    kind = type(key)
    if kind is str or kind is int:  # bool is excluded: type(True) is bool
        cached = _STR_CACHE.get(key) if kind is str else _INT_CACHE.get(key)
        if cached is not None:
            return cached
        if kind is int:
            _check_key_part(key, 0)
        encoded = _encode_checked(key)
        cache = _STR_CACHE if kind is str else _INT_CACHE
        if len(cache) >= _STR_CACHE_LIMIT:
            cache.clear()
        cache[key] = encoded
        return encoded
    _check_key_part(key, 0)
    return _encode_checked(key)


def _encode_checked(key: Any) -> bytes:
    try:
        packed: bytes = _PACK(key)
    except UnicodeEncodeError as exc:
        raise ValueError(f"key holds a string that is not valid UTF-8: {exc}") from None
    if len(packed) > MAX_KEY_BYTES:
        raise ValueError(f"key encodes to {len(packed)} bytes; the limit is {MAX_KEY_BYTES}")
    return _LEN.pack(len(packed)) + packed


def decode_key(encoded: bytes) -> Any:
    """Invert :func:`encode_key` (tuples come back as tuples)."""
    return msgpack.unpackb(encoded[4:], raw=False, use_list=False)


def store_order(end_ms: int, encoded_key: bytes, start_ms: int) -> tuple[int, bytes, int]:
    """The sort key of a session in the store's cross-key order, ``(end, encoded key,
    start)``: the order of the time-first records (:func:`time_first`), in which
    ``find_sessions`` returns sessions and the engine emits and writes them.

    Every path that sorts sessions this way calls it or :func:`session_order`;
    ``tests/engine/test_rules.py`` pins it to the byte order of :func:`time_first`.
    """
    return end_ms, encoded_key, start_ms


def session_order(session: Any) -> tuple[int, bytes, int]:
    """:func:`store_order` of a session (anything with ``key``, ``start`` and ``end``), for
    ``sorted(..., key=session_order)``."""
    return store_order(session.end, encode_key(session.key), session.start)


def key_first(encoded_key: bytes, end_ms: int, start_ms: int) -> bytes:
    """The key-first record key for a session."""
    return KEY_FIRST + encoded_key + _TIMES.pack(end_ms + _SIGN, start_ms + _SIGN)


def time_first(encoded_key: bytes, end_ms: int, start_ms: int) -> bytes:
    """The time-first index key for a session."""
    return TIME_FIRST + _TIME.pack(end_ms + _SIGN) + encoded_key + _TIME.pack(start_ms + _SIGN)


def key_first_seek(encoded_key: bytes, earliest_end_ms: int) -> bytes:
    """Lowest key-first record of ``encoded_key`` whose end is ``>= earliest_end_ms``."""
    return KEY_FIRST + encoded_key + _TIME.pack(earliest_end_ms + _SIGN)


def key_first_prefix(encoded_key: bytes) -> bytes:
    """The prefix shared by every key-first record of ``encoded_key``."""
    return KEY_FIRST + encoded_key


def time_first_seek(earliest_end_ms: int) -> bytes:
    """Lowest time-first index key whose end is ``>= earliest_end_ms``."""
    return TIME_FIRST + _TIME.pack(earliest_end_ms + _SIGN)


def split_key_first(record: bytes, prefix_len: int) -> tuple[int, int]:
    """Return ``(end_ms, start_ms)`` of a key-first record whose tag and key take ``prefix_len``."""
    end, start = _TIMES.unpack_from(record, prefix_len)
    return end - _SIGN, start - _SIGN


def split_key_first_record(record: bytes) -> tuple[int, bytes, int]:
    """Return ``(end_ms, encoded_key, start_ms)`` of a key-first record (the ``time_first``
    order of its parts)."""
    end, start = _TIMES.unpack_from(record, len(record) - 16)
    return end - _SIGN, record[1:-16], start - _SIGN


def split_time_first(record: bytes) -> tuple[int, bytes, int]:
    """Return ``(end_ms, encoded_key, start_ms)`` of a time-first index key."""
    end = _TIME.unpack_from(record, 1)[0] - _SIGN
    start = _TIME.unpack_from(record, len(record) - 8)[0] - _SIGN
    return end, record[9:-8], start


def time_first_to_key_first(record: bytes) -> bytes:
    """The key-first record that a time-first index key points to."""
    return KEY_FIRST + record[9:-8] + record[1:9] + record[-8:]


# -- vectorised encoders for bulk writes -----------------------------------------------------
#
# One Python call per record is what made a put cost microseconds, so the bulk encoders lay the
# records of a batch out as rows of a byte matrix (one matrix per encoded-key length, since rows
# must have one width) and cut it into bytes objects in one C-level step.


KEY_MATRIX_MAX_WIDTH = 256  # the widest encoded key a KeyMatrix holds


class KeyMatrix(NamedTuple):
    """Encoded keys as one zero-padded byte matrix: row ``i`` starts with key ``i``'s
    ``lengths[i]`` bytes. Built once per bulk call and shared by the sort and the record
    builders (see :func:`key_matrix`)."""

    rows: npt.NDArray[np.uint8]
    lengths: npt.NDArray[np.int64]


def key_matrix(encoded_keys: Sequence[bytes]) -> KeyMatrix | None:
    """The keys as a :class:`KeyMatrix`, or None when one is longer than 256 bytes (a matrix
    that wide would be huge: the callers fall back to per-key work)."""
    n = len(encoded_keys)
    lengths = np.fromiter(map(len, encoded_keys), dtype=np.int64, count=n)
    if n == 0 or int(lengths.max()) > KEY_MATRIX_MAX_WIDTH:
        return None
    # numpy's fixed-width bytes pad with zeros; the raw buffer keeps a key's own trailing zeros
    fixed = np.array(encoded_keys, dtype=bytes)
    return KeyMatrix(fixed.view(np.uint8).reshape(n, fixed.dtype.itemsize), lengths)


def key_order(encoded_keys: Sequence[bytes], matrix: KeyMatrix | None = None
              ) -> npt.NDArray[np.int64]:
    """The rank of each encoded key in byte order; equal encodings get equal ranks.

    Sorting records by ``(rank, end, start)`` puts key-first records in their on-disk order, and
    by ``(end, rank, start)`` time-first ones. ``matrix``: :func:`key_matrix` of the same keys,
    when the caller has it.
    """
    n = len(encoded_keys)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    if matrix is None:
        matrix = key_matrix(encoded_keys)
    if matrix is None:  # a key too long for a fixed-width copy
        distinct = sorted(set(encoded_keys))
        position = {key: rank for rank, key in enumerate(distinct)}
        return np.fromiter((position[key] for key in encoded_keys), dtype=np.int64, count=n)
    # The zero-padded rows as big-endian 8-byte words, sorted word by word (several times
    # faster than sorting numpy's fixed-width bytes). Two encodings of different lengths
    # already differ in their length prefix, so the padding never ties or reorders them.
    width = matrix.rows.shape[1]
    padded = np.zeros((n, (width + 7) // 8 * 8), dtype=np.uint8)
    padded[:, :width] = matrix.rows
    words = padded.view(">u8").astype(np.uint64)
    varying = [words[:, j] for j in range(words.shape[1])
               if words[0, j] != words[:, j].min() or words[0, j] != words[:, j].max()]
    if not varying:
        return np.zeros(n, dtype=np.int64)
    # ties get one rank whatever their order: a single word needs no stable sort
    order = np.argsort(varying[0]) if len(varying) == 1 else np.lexsort(varying[::-1])
    ordered = words[order]
    ranks = np.empty(n, dtype=np.int64)
    ranks[order] = np.concatenate(
        ([0], np.cumsum((ordered[1:] != ordered[:-1]).any(axis=1))))
    return ranks


def _times_matrix(first_ms: npt.NDArray[np.int64],
                  second_ms: npt.NDArray[np.int64]) -> npt.NDArray[np.uint8]:
    times = np.empty((len(first_ms), 2), dtype=">u8")
    times[:, 0] = first_ms.astype(np.uint64) ^ np.uint64(_SIGN)
    times[:, 1] = second_ms.astype(np.uint64) ^ np.uint64(_SIGN)
    return times.view(np.uint8).reshape(len(first_ms), 16)


def records_many(
    tag: bytes,
    encoded_keys: Sequence[bytes],
    key_index: npt.NDArray[np.int64],
    ends_ms: npt.NDArray[np.int64],
    starts_ms: npt.NDArray[np.int64],
    matrix: KeyMatrix | None = None,
) -> list[bytes]:
    """:func:`key_first` (``tag=KEY_FIRST``) or :func:`time_first` (``TIME_FIRST``) for many
    sessions: record ``i`` is for ``encoded_keys[key_index[i]]``, ``ends_ms[i]``, ``starts_ms[i]``.

    The arrays must be int64 and of one length; the caller has validated the times.
    ``matrix``: :func:`key_matrix` of ``encoded_keys``, when the caller has it.

    Raises:
        ValueError: ``tag`` is neither layout.
    """
    if tag not in (KEY_FIRST, TIME_FIRST):
        raise ValueError(f"tag must be KEY_FIRST or TIME_FIRST, got {tag!r}")
    if matrix is None and len(key_index):
        matrix = key_matrix(encoded_keys)
    if matrix is None:
        return _records_by_join(tag, encoded_keys, key_index, ends_ms, starts_ms)
    time_first_layout = tag == TIME_FIRST
    n = len(key_index)
    record_lengths = matrix.lengths[key_index]
    times = _times_matrix(ends_ms, starts_ms)
    # Records in key order come grouped by width already (the length prefix leads): each group
    # is a slice, and the groups are simply concatenated; otherwise scattered back into place.
    grouped = bool((record_lengths[1:] >= record_lengths[:-1]).all())
    out: npt.NDArray[Any] | None = None if grouped else np.empty(n, object)
    pieces: list[bytes] = []
    # widths are at most 256 (a KeyMatrix): counted rather than sorted
    for width in np.flatnonzero(np.bincount(record_lengths)).tolist():
        if grouped:
            first = int(np.searchsorted(record_lengths, width, side="left"))
            stop = int(np.searchsorted(record_lengths, width, side="right"))
            rows: Any = slice(first, stop)
            count = stop - first
        else:
            rows = np.flatnonzero(record_lengths == width)
            count = len(rows)
        row_keys = matrix.rows[key_index[rows], :width]
        row_times = times[rows]
        records_matrix = np.empty((count, 1 + width + 16), dtype=np.uint8)
        records_matrix[:, 0] = tag[0]
        if time_first_layout:
            records_matrix[:, 1:9] = row_times[:, :8]
            records_matrix[:, 9:9 + width] = row_keys
            records_matrix[:, 9 + width:] = row_times[:, 8:]
        else:
            records_matrix[:, 1:1 + width] = row_keys
            records_matrix[:, 1 + width:] = row_times
        # A void view cuts rows into bytes without dropping trailing zero bytes (an "S" view
        # would drop them).
        records: list[bytes] = records_matrix.view(
            f"V{records_matrix.shape[1]}").ravel().tolist()
        if out is None:
            pieces += records
        else:
            out[rows] = records
    return pieces if out is None else list(out.tolist())


def key_first_rows(encoded_keys: Sequence[bytes], key_index: npt.NDArray[np.int64],
                   ends_ms: npt.NDArray[np.int64], starts_ms: npt.NDArray[np.int64],
                   matrix: KeyMatrix | None = None
                   ) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]:
    """:func:`key_first` of many sessions, as one buffer and ``n + 1`` offsets (record ``i`` is
    ``data[offsets[i]:offsets[i + 1]]``) instead of ``n`` bytes objects: what a writer that
    takes whole buffers wants. Arguments as :func:`records_many`."""
    n = len(key_index)
    if matrix is None and n:
        matrix = key_matrix(encoded_keys)
    offsets = np.zeros(n + 1, dtype=np.int64)
    if matrix is None:
        records = records_many(KEY_FIRST, encoded_keys, key_index, ends_ms, starts_ms)
        np.cumsum(np.fromiter(map(len, records), dtype=np.int64, count=n), out=offsets[1:])
        return np.frombuffer(b"".join(records), dtype=np.uint8), offsets
    from .jit import compiled  # numba, on first use only

    np.cumsum(matrix.lengths[key_index] + 17, out=offsets[1:])
    data = np.empty(int(offsets[-1]), dtype=np.uint8)
    compiled(key_first_rows_kernel)(matrix.rows, matrix.lengths, key_index, ends_ms, starts_ms,
                                    KEY_FIRST[0], offsets, data)
    return data, offsets


def key_first_rows_kernel(rows: Any, lengths: Any, key_index: Any, ends: Any, starts: Any,
                          tag: int, offsets: Any, out: Any) -> None:
    """Write the key-first record of each session at its offset: the tag, the key's bytes
    (its row of the matrix), then the end and the start, big-endian with the sign bit
    flipped. (Compiled; positions are unsigned, so that numba leaves out its negative-index
    wraparound, which keeps LLVM from merging the byte stores.)"""
    for i in range(len(key_index)):
        at = offsets[i]
        out[np.uint64(at)] = tag
        key = np.uint64(key_index[i])
        width = lengths[key]
        for j in range(width):
            out[np.uint64(at + 1 + j)] = rows[key, np.uint64(j)]
        at += 1 + width
        for half in range(2):
            value = ends[i] if half == 0 else starts[i]
            for k in range(8):
                byte = (value >> (8 * (7 - k))) & 0xFF
                out[np.uint64(at + k)] = byte ^ 0x80 if k == 0 else byte
            at += 8


def _records_by_join(
    tag: bytes,
    encoded_keys: Sequence[bytes],
    key_index: npt.NDArray[np.int64],
    ends_ms: npt.NDArray[np.int64],
    starts_ms: npt.NDArray[np.int64],
) -> list[bytes]:
    """:func:`records_many` for keys too long for a :class:`KeyMatrix`: one join per record."""
    if tag == TIME_FIRST:
        return [time_first(encoded_keys[k], end, start) for k, end, start in
                zip(key_index.tolist(), ends_ms.tolist(), starts_ms.tolist(), strict=True)]
    return [key_first(encoded_keys[k], end, start) for k, end, start in
            zip(key_index.tolist(), ends_ms.tolist(), starts_ms.tolist(), strict=True)]


# -- index blocks: the time-first layout of a bulk write -------------------------------------
#
# A large bulk write does not write one time-first record per session: it writes one *index
# block* per segment, ``I | min end | max end | block id`` (8-byte sign-flipped big-endian each),
# whose value lists the block's sessions ``(end, key, start)`` in time-first order. The block is
# only an index: a reader takes each session's value from its key-first record, and skips an entry
# whose key-first record is gone (the session was removed or merged away since), so entries never
# need deleting; they go when their segment expires. See docs/operations.md.

INDEX_BLOCK = b"I"
_BLOCK_KEY = struct.Struct(">QQQ")
_BLOCK_MAGIC = b"SSIB"
_BLOCK_VERSION = 1
# magic, version, 3 pad bytes, then row count, key count and key bytes (little-endian u64 each)
_BLOCK_HEADER = struct.Struct("<4sB3xQQQ")


def index_block_key(min_end_ms: int, max_end_ms: int, block_id: int) -> bytes:
    """The record key of an index block (``block_id`` unique within its segment, >= 0)."""
    return INDEX_BLOCK + _BLOCK_KEY.pack(min_end_ms + _SIGN, max_end_ms + _SIGN, block_id)


def split_index_block_key(record: bytes) -> tuple[int, int, int]:
    """Return ``(min_end_ms, max_end_ms, block_id)`` of an index block's record key.

    Raises:
        ValueError: the record is not an index block key.
    """
    if len(record) != 1 + _BLOCK_KEY.size or record[:1] != INDEX_BLOCK:
        raise ValueError(f"not an index block key ({len(record)} bytes)")
    low, high, block_id = _BLOCK_KEY.unpack_from(record, 1)
    return low - _SIGN, high - _SIGN, block_id


class IndexBlock:
    """The decoded sessions of one index block, in time-first order (end, key bytes, start).

    ``ends_ms``/``starts_ms`` are int64 arrays and ``key_of_row`` indexes the block's distinct
    encoded keys, held as one byte string ``key_bytes`` cut at ``key_offsets``; they become
    ``bytes`` objects on the first :meth:`rows` call (a writer caches the blocks it writes, and
    most are never read).
    """

    __slots__ = ("ends_ms", "starts_ms", "key_of_row", "key_bytes", "key_offsets", "_keys")

    def __init__(self, ends_ms: npt.NDArray[np.int64], starts_ms: npt.NDArray[np.int64],
                 key_of_row: npt.NDArray[Any], key_bytes: bytes,
                 key_offsets: npt.NDArray[Any]) -> None:
        self.ends_ms = ends_ms
        self.starts_ms = starts_ms
        self.key_of_row = key_of_row
        self.key_bytes = key_bytes
        self.key_offsets = key_offsets
        self._keys: npt.NDArray[Any] | None = None

    def __len__(self) -> int:
        return len(self.ends_ms)

    def keys(self) -> npt.NDArray[Any]:
        """The distinct encoded keys, an object array of bytes."""
        if self._keys is None:
            blob = self.key_bytes
            bounds = self.key_offsets.tolist()
            keys = np.empty(len(bounds) - 1, dtype=object)
            keys[:] = [blob[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
            self._keys = keys
        return self._keys

    def rows(self, earliest_end_ms: int, latest_end_ms: int) -> list[tuple[int, bytes, int]]:
        """The sessions with ``earliest_end_ms <= end <= latest_end_ms``, as
        ``(end, encoded_key, start)`` in time-first order."""
        ends = self.ends_ms
        first = int(np.searchsorted(ends, earliest_end_ms, side="left"))
        stop = int(np.searchsorted(ends, latest_end_ms, side="right"))
        if first >= stop:
            return []
        return list(zip(ends[first:stop].tolist(),
                        self.keys()[self.key_of_row[first:stop]].tolist(),
                        self.starts_ms[first:stop].tolist(), strict=True))


def encode_index_block(encoded_keys: Sequence[bytes], key_index: npt.NDArray[np.int64],
                       ends_ms: npt.NDArray[np.int64], starts_ms: npt.NDArray[np.int64],
                       matrix: KeyMatrix | None = None) -> tuple[bytes, IndexBlock]:
    """The value of an index block for sessions already in time-first order, and its decoded
    form (what a reader would decode from those bytes).

    Session ``i`` is ``(encoded_keys[key_index[i]], starts_ms[i], ends_ms[i])``; ``matrix``:
    :func:`key_matrix` of ``encoded_keys``, when the caller has it. Layout, all little-endian: a
    32-byte header (``SSIB``, version 1, 3 zero bytes, then the row count ``n``, the distinct
    key count ``k`` and the key bytes ``b`` as u64), ``ends`` int64[n], ``starts`` int64[n],
    key offsets u64[k + 1], the key of each row u32[n], and the ``k`` distinct encoded keys
    concatenated (``b`` bytes), in the order of ``encoded_keys``.

    Raises:
        ValueError: an entry of ``key_index`` is not the index of one of ``encoded_keys``.
    """
    from .jit import compiled  # numba, on first use only

    if len(key_index) and (int(key_index.min()) < 0
                           or int(key_index.max()) >= len(encoded_keys)):
        raise ValueError(f"key_index holds {int(key_index.min())}..{int(key_index.max())}, "
                         f"not all indexes of the {len(encoded_keys)} encoded keys")
    if matrix is not None:  # key j: the first lengths[j] bytes of the matrix's row j
        width = matrix.rows.shape[1]
        key_data = matrix.rows.reshape(-1)
        key_at = np.arange(0, len(encoded_keys) * width, width, dtype=np.int64)
        lengths = matrix.lengths
    else:
        lengths = np.fromiter(map(len, encoded_keys), dtype=np.int64, count=len(encoded_keys))
        key_at = np.zeros(len(encoded_keys), dtype=np.int64)
        np.cumsum(lengths[:-1], out=key_at[1:])
        key_data = np.frombuffer(b"".join(encoded_keys), dtype=np.uint8)
    slot = np.empty(len(encoded_keys), dtype=np.int64)
    sizes = np.zeros(2, dtype=np.int64)
    compiled(index_block_slots_kernel)(key_index, lengths, slot, sizes)
    n = len(key_index)
    k, blob_length = int(sizes[0]), int(sizes[1])
    # one buffer, cut into typed views that the block decodes to (every part is aligned)
    ends_at = _BLOCK_HEADER.size
    offsets_at = ends_at + 16 * n
    rows_at = offsets_at + 8 * (k + 1)
    blob_at = rows_at + 4 * n
    out = np.empty(blob_at + blob_length, dtype=np.uint8)
    out[:ends_at] = np.frombuffer(_BLOCK_HEADER.pack(_BLOCK_MAGIC, _BLOCK_VERSION, n, k,
                                                     blob_length), dtype=np.uint8)
    ends = out[ends_at:ends_at + 8 * n].view("<i8")
    ends[:] = ends_ms
    starts = out[ends_at + 8 * n:offsets_at].view("<i8")
    starts[:] = starts_ms
    offsets = out[offsets_at:rows_at].view("<u8")
    rows = out[rows_at:blob_at].view("<u4")
    compiled(index_block_kernel)(key_data, key_at, lengths, key_index, slot, offsets, rows,
                                 out[blob_at:])
    return out.tobytes(), IndexBlock(ends.astype(np.int64, copy=False),
                                     starts.astype(np.int64, copy=False), rows,
                                     out[blob_at:].tobytes(), offsets)


def index_block_slots_kernel(key_index: Any, lengths: Any, slot: Any, sizes: Any) -> None:
    """Number the keys that ``key_index`` uses in key order: ``slot[j]`` is key ``j``'s place
    among them, -1 for a key it does not use; ``sizes`` receives how many it uses and their
    total length. (Compiled.)"""
    for j in range(len(slot)):
        slot[j] = -1
    for i in range(len(key_index)):
        slot[key_index[i]] = 0
    used = 0
    total = 0
    for j in range(len(slot)):
        if slot[j] == 0:
            slot[j] = used
            used += 1
            total += lengths[j]
    sizes[0] = used
    sizes[1] = total


def index_block_kernel(key_data: Any, key_at: Any, lengths: Any, key_index: Any, slot: Any,
                       offsets: Any, rows: Any, blob: Any) -> None:
    """Write the used keys' bytes (key ``j`` is ``key_data[key_at[j]:key_at[j] +
    lengths[j]]``) into ``blob`` in key order, their offsets, and each row's key place
    (:func:`index_block_slots_kernel`). (Compiled; unsigned positions, as in
    :func:`key_first_rows_kernel`.)"""
    at = 0
    offsets[0] = 0
    for j in range(len(slot)):
        if slot[j] >= 0:
            first = key_at[j]
            for b in range(lengths[j]):
                blob[np.uint64(at + b)] = key_data[np.uint64(first + b)]
            at += lengths[j]
            offsets[slot[j] + 1] = at
    for i in range(len(key_index)):
        rows[i] = slot[key_index[i]]


def decode_index_block(data: bytes, min_end_ms: int, max_end_ms: int) -> IndexBlock:
    """Check and decode an index block's value (its key said ``min_end_ms``..``max_end_ms``).

    Raises:
        ValueError: anything inconsistent: magic, version, sizes, offsets, key prefixes, row
            keys, unsorted ends, ends outside the key's range, a start after its end. The caller
            names the file.
    """
    size = _BLOCK_HEADER.size
    if len(data) < size:
        raise ValueError(f"index block of {len(data)} bytes is shorter than its header")
    magic, version, n, k, blob_len = _BLOCK_HEADER.unpack_from(data, 0)
    if magic != _BLOCK_MAGIC:
        raise ValueError("index block with bad magic bytes")
    if version != _BLOCK_VERSION:
        raise ValueError(f"index block of version {version}; this sessionstore reads version "
                         f"{_BLOCK_VERSION}")
    expected = size + 16 * n + 8 * (k + 1) + 4 * n + blob_len
    if len(data) != expected:
        raise ValueError(f"index block of {len(data)} bytes where its header implies {expected}")
    ends = np.frombuffer(data, dtype="<i8", count=n, offset=size).astype(np.int64)
    starts = np.frombuffer(data, dtype="<i8", count=n, offset=size + 8 * n).astype(np.int64)
    offsets = np.frombuffer(data, dtype="<u8", count=k + 1, offset=size + 16 * n)
    rows = np.frombuffer(data, dtype="<u4", count=n, offset=size + 16 * n + 8 * (k + 1))
    blob_at = size + 16 * n + 8 * (k + 1) + 4 * n
    lengths = np.diff(offsets.astype(np.int64))
    if offsets[0] != 0 or int(offsets[-1]) != blob_len or (lengths < 5).any():
        raise ValueError("index block with bad key offsets")
    if n and (int(rows.max()) >= k or (np.diff(ends) < 0).any() or (starts > ends).any()
              or int(ends[0]) < min_end_ms or int(ends[-1]) > max_end_ms):
        raise ValueError("index block with rows out of order or out of range")
    blob = data[blob_at:]
    if k:  # each key's 4-byte big-endian length prefix must say the rest of its length
        raw = np.frombuffer(blob, dtype=np.uint8)
        at = offsets[:-1].astype(np.int64)
        prefixes = ((raw[at].astype(np.int64) << 24) | (raw[at + 1].astype(np.int64) << 16)
                    | (raw[at + 2].astype(np.int64) << 8) | raw[at + 3].astype(np.int64))
        if (prefixes != lengths - 4).any():
            raise ValueError("index block with a key whose length prefix is wrong")
    return IndexBlock(ends, starts, rows.astype(np.int64), blob, offsets)


# -- bulk decoding: every open session read back at once (a cold start) ----------------------
#
# A cold start reads every key-first record of the open segments. The records are concatenated
# into one buffer and cut here with numpy and compiled loops (built with
# :func:`sessionstore.jit.compiled` on first use), so that no session becomes a Python
# object: only each distinct key does, once. Anything that does not decode as the encoders
# above would have written it gives None, and the caller reads row by row (which names the
# damage exactly as a plain read does).

_KEY_FIRST_MIN = 1 + 4 + 1 + 16  # tag, length prefix, one msgpack byte, end and start


def split_key_first_records(data: npt.NDArray[np.uint8], offsets: npt.NDArray[np.int64]
                            ) -> tuple[npt.NDArray[np.int64], ...] | None:
    """Cut concatenated key-first records (record ``i`` is ``data[offsets[i]:offsets[i + 1]]``)
    into ``(key_first, key_stop, ends_ms, starts_ms)``: record ``i``'s encoded key is
    ``data[key_first[i]:key_stop[i]]``.

    Returns None when a record is not a key-first record long enough to hold a key and two
    times.
    """
    n = len(offsets) - 1
    firsts, stops = offsets[:-1], offsets[1:]
    if n and ((stops - firsts < _KEY_FIRST_MIN).any() or (data[firsts] != KEY_FIRST[0]).any()):
        return None
    from .jit import compiled  # numba, on first use only

    ends = np.empty(n, dtype=np.int64)
    starts = np.empty(n, dtype=np.int64)
    compiled(record_times_kernel)(data, stops - 16, ends, starts)
    return firsts + 1, stops - 16, ends, starts


def record_times_kernel(data: Any, at: Any, ends: Any, starts: Any) -> None:
    """Decode the two sign-flipped big-endian times at each of ``at`` (end, then start).
    (Compiled; the sign-extended first byte keeps every step inside int64.)"""
    for i in range(len(at)):
        for half in range(2):
            p = at[i] + 8 * half
            top = int(data[p]) ^ 0x80  # the flipped sign bit, back
            value = top - 256 if top >= 0x80 else top
            for k in range(1, 8):
                value = value * 256 + int(data[p + k])
            if half == 0:
                ends[i] = value
            else:
                starts[i] = value


def int_keys_kernel(data: Any, first: Any, stop: Any, rows: Any, out: Any) -> bool:
    """Decode the encoded keys of ``rows`` as ints into ``out``; False unless every one is an
    int key exactly as :func:`encode_key` writes it (length prefix, msgpack's smallest int
    format, nothing after it); the length prefixes are checked already
    (:func:`classify_key_rows`). (Compiled.)"""
    for i in range(len(rows)):
        a = first[rows[i]]
        size = stop[rows[i]] - a
        head = int(data[a + 4])
        p = a + 5
        signed = head >= 0xD0
        if head <= 0x7F or head >= 0xE0:
            width = 0
            value = head if head <= 0x7F else head - 256
        elif 0xCC <= head <= 0xD3:  # uint8 .. uint64, int8 .. int64
            width = 1 << ((head - 0xCC) & 3)
            if size != 5 + width:
                return False
            first_byte = int(data[p])
            if not signed and width == 8 and first_byte >= 0x80:
                return False  # beyond int64: no key
            value = first_byte - 256 if signed and first_byte >= 0x80 else first_byte
            for k in range(1, width):  # sign-extended from the first byte: stays in int64
                value = value * 256 + int(data[p + k])
        else:
            return False
        if size != 5 + width:
            return False
        # msgpack's smallest format for the value, as the encoder chooses it
        if value >= 0:
            smallest = 0 if value <= 0x7F else 1 if value <= 0xFF else 2 \
                if value <= 0xFFFF else 4 if value <= 0xFFFFFFFF else 8
            canonical = head <= 0x7F if smallest == 0 else not signed and width == smallest
        else:
            smallest = 0 if value >= -32 else 1 if value >= -0x80 else 2 \
                if value >= -0x8000 else 4 if value >= -0x80000000 else 8
            canonical = head >= 0xE0 if smallest == 0 else \
                signed and head < 0xE0 and width == smallest
        if not canonical:
            return False
        out[i] = value
    return True


def text_keys_kernel(data: Any, first: Any, stop: Any, rows: Any, binary: bool,
                     payload_first: Any, payload_stop: Any) -> bool:
    """Locate the payloads of the encoded keys of ``rows`` (str keys, or bytes keys when
    ``binary``); False unless every one is such a key exactly as :func:`encode_key` writes it
    (msgpack's smallest header for its length). The length prefixes are checked already
    (:func:`classify_key_rows`), the UTF-8 of str keys is not checked here. (Compiled.)"""
    for i in range(len(rows)):
        a = first[rows[i]]
        size = stop[rows[i]] - a
        head = int(data[a + 4])
        p = a + 5
        if not binary and 0xA0 <= head <= 0xBF:
            length = head & 0x1F
            low = 0
        elif (not binary and 0xD9 <= head <= 0xDB) or (binary and 0xC4 <= head <= 0xC6):
            width = 1 << (head - (0xC4 if binary else 0xD9))
            if size < 5 + width:
                return False
            length = 0
            for k in range(width):
                length = length * 256 + int(data[p + k])
            p += width
            # the smallest header for the length (str8 only from 32 bytes on; bin8 from 0)
            low = (0 if binary else 32) if width == 1 else 256 if width == 2 else 65536
        else:
            return False
        if length < low or p + length != a + size:
            return False
        payload_first[i] = p
        payload_stop[i] = p + length
    return True


def utf8_rows_kernel(data: Any, first: Any, stop: Any) -> bool:
    """Whether every ``data[first[i]:stop[i]]`` is valid UTF-8 as Python's strict decoder
    (and so msgpack's) takes it: no overlong forms, no surrogates, nothing above U+10FFFF.
    (Compiled.)"""
    for row in range(len(first)):
        i = first[row]
        end = stop[row]
        while i < end:
            b = int(data[i])
            if b < 0x80:
                i += 1
                continue
            low, high = 0x80, 0xBF  # the range of the second byte
            if 0xC2 <= b <= 0xDF:
                more = 1
            elif 0xE0 <= b <= 0xEF:
                more = 2
                if b == 0xE0:
                    low = 0xA0
                elif b == 0xED:
                    high = 0x9F
            elif 0xF0 <= b <= 0xF4:
                more = 3
                if b == 0xF0:
                    low = 0x90
                elif b == 0xF4:
                    high = 0x8F
            else:
                return False
            if i + more >= end:  # the sequence runs past the key
                return False
            second = int(data[i + 1])
            if second < low or second > high:
                return False
            for k in range(2, more + 1):
                c = int(data[i + k])
                if c < 0x80 or c > 0xBF:
                    return False
            i += more + 1
    return True


def classify_key_rows(data: npt.NDArray[np.uint8], first: npt.NDArray[np.int64],
                      stop: npt.NDArray[np.int64]) -> tuple[str, Any] | None:
    """What the encoded keys ``data[first[i]:stop[i]]`` (distinct encodings) are.

    Returns:
        ``("int", values)`` (int64) when they are all int keys; ``("str", None)`` or
        ``("bytes", None)`` when they are all str (valid UTF-8) or all bytes keys; otherwise
        ``("other", keys)``, the keys decoded one by one. Every encoding must be exactly what
        :func:`encode_key` writes (so that distinct encodings are distinct keys); None when one
        is not (a damaged or foreign store: the caller reads row by row, which names the
        damage).
    """
    from .jit import compiled  # numba, on first use only

    n = len(first)
    if not n:
        return "int", np.zeros(0, dtype=np.int64)
    rows = np.arange(n, dtype=np.int64)
    sizes = stop - first
    head = -1  # a prefix that does not say the rest of the encoding's length: key by key
    if (sizes >= 5).all():
        said = np.zeros(n, dtype=np.int64)
        for k in range(4):
            said = said * 256 + data[first + k]
        if (said == sizes - 4).all():
            head = int(data[first[0] + 4])
    if head < 0:
        pass
    elif head <= 0x7F or head >= 0xE0 or 0xCC <= head <= 0xD3:
        ints = np.empty(n, dtype=np.int64)
        if compiled(int_keys_kernel)(data, first, stop, rows, ints):
            return "int", ints
    elif 0xA0 <= head <= 0xBF or 0xD9 <= head <= 0xDB or 0xC4 <= head <= 0xC6:
        binary = 0xC4 <= head <= 0xC6
        pfirst = np.empty(n, dtype=np.int64)
        pstop = np.empty(n, dtype=np.int64)
        if compiled(text_keys_kernel)(data, first, stop, rows, binary, pfirst, pstop) and (
                binary or compiled(utf8_rows_kernel)(data, pfirst, pstop)):
            return ("bytes" if binary else "str"), None
    # tuples, mixed types, or keys the kernels refused: key by key, each checked to encode
    # back to its own bytes
    keys = []
    try:
        for a, b in zip(first.tolist(), stop.tolist(), strict=True):
            encoded = data[a:b].tobytes()
            key = decode_key(encoded)
            if encode_key(key) != encoded:
                return None
            keys.append(key)
    except Exception:  # noqa: BLE001 - any failure: the caller's row-by-row read reports it
        return None
    return "other", keys


def text_key_column(data: npt.NDArray[np.uint8], first: npt.NDArray[np.int64],
                    stop: npt.NDArray[np.int64], binary: bool) -> Any:
    """The str (or, ``binary``, bytes) keys encoded at ``data[first[i]:stop[i]]`` (checked by
    :func:`classify_key_rows`) as an Arrow string (binary) array."""
    from .jit import compiled

    n = len(first)
    pfirst = np.empty(n, dtype=np.int64)
    pstop = np.empty(n, dtype=np.int64)
    ok = compiled(text_keys_kernel)(data, first, stop, np.arange(n, dtype=np.int64), binary,
                                    pfirst, pstop)
    assert ok, "text_key_column of keys that are not all str (bytes)"
    return _text_column(data, pfirst, pstop, binary)


def _text_column(data: npt.NDArray[np.uint8], pfirst: npt.NDArray[np.int64],
                 pstop: npt.NDArray[np.int64], binary: bool) -> Any:
    """The payloads as an Arrow string (binary) array."""
    import pyarrow as pa

    lengths = pstop - pfirst
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    gathered = data[np.arange(offsets[-1], dtype=np.int64)
                    + np.repeat(pfirst - offsets[:-1], lengths)]
    array = pa.Array.from_buffers(pa.large_binary() if binary else pa.large_string(),
                                  len(lengths), [None, pa.py_buffer(offsets),
                                                 pa.py_buffer(gathered)])
    return array.cast(pa.binary() if binary else pa.string())
