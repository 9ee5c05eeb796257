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
from typing import Any

import msgpack
import numpy as np
import numpy.typing as npt

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
    raise TypeError(
        f"key must be str, bytes, int or a tuple of them, got {type(part).__name__}: {part!r:.80}"
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


_FIXED_WIDTH_SORT_LIMIT = 256


def key_order(encoded_keys: Sequence[bytes]) -> npt.NDArray[np.int64]:
    """The rank of each encoded key in byte order; equal encodings get equal ranks.

    Sorting records by ``(rank, end, start)`` puts key-first records in their on-disk order, and
    by ``(end, rank, start)`` time-first ones.
    """
    n = len(encoded_keys)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    if max(map(len, encoded_keys)) > _FIXED_WIDTH_SORT_LIMIT:  # a fixed-width copy would be huge
        distinct = sorted(set(encoded_keys))
        position = {key: rank for rank, key in enumerate(distinct)}
        return np.fromiter((position[key] for key in encoded_keys), dtype=np.int64, count=n)
    # numpy's fixed-width bytes compare as padded with zeros; two encodings of different
    # lengths already differ in their length prefix, so this is plain byte order (about 6x
    # faster than sorting Python bytes).
    fixed = np.array(encoded_keys, dtype=bytes)
    order = np.argsort(fixed, kind="stable")
    ordered = fixed[order]
    ranks = np.empty(n, dtype=np.int64)
    ranks[order] = np.concatenate(([0], np.cumsum(ordered[1:] != ordered[:-1])))
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
) -> list[bytes]:
    """:func:`key_first` (``tag=KEY_FIRST``) or :func:`time_first` (``TIME_FIRST``) for many
    sessions: record ``i`` is for ``encoded_keys[key_index[i]]``, ``ends_ms[i]``, ``starts_ms[i]``.

    The arrays must be int64 and of one length; the caller has validated the times.

    Raises:
        ValueError: ``tag`` is neither layout.
    """
    if tag not in (KEY_FIRST, TIME_FIRST):
        raise ValueError(f"tag must be KEY_FIRST or TIME_FIRST, got {tag!r}")
    time_first_layout = tag == TIME_FIRST
    n = len(key_index)
    lengths = np.fromiter(map(len, encoded_keys), dtype=np.int64, count=len(encoded_keys))
    record_lengths = lengths[key_index]
    times = _times_matrix(ends_ms, starts_ms)
    distinct_lengths = np.unique(record_lengths).tolist()
    # Records in key order come grouped by width already (the length prefix leads), so the
    # groups can simply be concatenated; otherwise they are scattered back into place.
    grouped = bool((record_lengths[1:] >= record_lengths[:-1]).all())
    out: npt.NDArray[Any] | None = None if grouped else np.empty(n, object)
    pieces: list[bytes] = []
    for width in distinct_lengths:
        keys_of_width = np.flatnonzero(lengths == width)
        local = np.full(len(encoded_keys), -1, dtype=np.int64)
        local[keys_of_width] = np.arange(len(keys_of_width))
        key_bytes = np.frombuffer(
            b"".join([encoded_keys[k] for k in keys_of_width.tolist()]), dtype=np.uint8
        ).reshape(len(keys_of_width), width)
        rows = np.flatnonzero(record_lengths == width)
        row_keys = key_bytes[local[key_index[rows]]]
        row_times = times[rows]
        matrix = np.empty((len(row_keys), 1 + width + 16), dtype=np.uint8)
        matrix[:, 0] = tag[0]
        if time_first_layout:
            matrix[:, 1:9] = row_times[:, :8]
            matrix[:, 9:9 + width] = row_keys
            matrix[:, 9 + width:] = row_times[:, 8:]
        else:
            matrix[:, 1:1 + width] = row_keys
            matrix[:, 1 + width:] = row_times
        # A void view cuts rows into bytes without dropping trailing zero bytes (an "S" view
        # would drop them).
        records: list[bytes] = matrix.view(f"V{matrix.shape[1]}").ravel().tolist()
        if out is None:
            pieces += records
        else:
            out[rows] = records
    return pieces if out is None else list(out.tolist())
