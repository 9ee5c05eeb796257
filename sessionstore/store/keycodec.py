"""Vectorised record-key encoding for bulk writes: many keys in a few numpy operations.

:func:`sessionstore.keyschema.encode_key` costs a Python call (and a cache lookup) per key, and
its cache holds 65,536 keys: a bulk write over 100,000 distinct keys missed it on every key.
:func:`encode_keys` encodes a column of keys at once. A column of plain ints, of strings (Arrow
turns the strings into one UTF-8 buffer) or of bytes is encoded as msgpack does, with numpy,
into byte matrices cut into rows; any other key (tuples, mixed columns) falls back to
:func:`~sessionstore.keyschema.encode_key`, so the bytes are always exactly the same (checked against :mod:`msgpack` in
``tests/store/test_keycodec.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from .. import keyschema
from ..arrays import ByteRows, LazyBytesList, factorize
from ..jit import compiled

__all__ = ["EncodedKeys", "KeyEncodings", "encode_int_keys", "encode_key_column",
           "encode_key_rows", "encode_keys"]

# Below this many keys the per-key encoder (with its cache) is as fast.
_VECTOR_MIN = 64


def encode_keys(keys: Sequence[Any], rows: Sequence[int] | None = None) -> list[bytes]:
    """``[keyschema.encode_key(k) for k in keys]``, vectorised for a column of plain ints, of
    strings or of bytes (tuples, and mixed columns, go key by key).

    Args:
        keys: the keys.
        rows: the row of each key in the caller's argument, for error messages (default: its
            position in ``keys``).

    Raises:
        TypeError / ValueError: as :func:`~sessionstore.keyschema.encode_key`, naming the row
            (``keys[3]: ...``).
    """
    return encode_key_column(keys, rows)[0]


class EncodedKeys(LazyBytesList):
    """Key encodings held as their :class:`~sessionstore.keyschema.KeyMatrix`, cut into bytes
    objects only when read as a sequence (see :func:`encode_key_rows`)."""

    __slots__ = ("matrix", "identities")

    def __init__(self, matrix: keyschema.KeyMatrix,
                 identities: npt.NDArray[np.int64] | None = None) -> None:
        super().__init__()
        self.matrix = matrix
        #: when known, a label per row, equal for equal encodings and only for them
        #: (:meth:`KeyEncodings.identities`); None: compare the bytes
        self.identities = identities

    def rows(self) -> ByteRows:
        """The encodings as byte rows (no bytes object per key)."""
        return ByteRows.of_matrix_rows(self.matrix.rows, self.matrix.lengths)

    def __len__(self) -> int:
        return len(self.matrix.lengths)


class KeyEncodings:
    """The distinct keys of a bulk store call, already encoded by this module: what a caller
    that encodes its keys once passes as the ``keys`` of both bulk calls of a batch
    (``put_many`` and ``remove_many``), so that neither encodes them again. Built only by
    :func:`encode_int_keys`, so every row holds exactly what
    :func:`~sessionstore.keyschema.encode_key` gives for its key. Not a sequence of keys: a
    list of bytes keys stays a list of keys.

    Args:
        matrix: the encodings (row ``i`` is key ``i``'s).
    """

    __slots__ = ("matrix", "_pieces", "_cut", "_values", "_labels", "_distinct")

    def __init__(self, matrix: keyschema.KeyMatrix, pieces: _Pieces | None,
                 values: npt.NDArray[np.int64], distinct: bool = False) -> None:
        self.matrix = matrix
        self._pieces = pieces  # the rows of each width (see _encode_int64), once needed
        self._cut: npt.NDArray[Any] | None = None  # the encodings as bytes, once needed
        self._values = values  # the int keys encoded (row i is encode_key(int(values[i])))
        self._labels: npt.NDArray[np.int64] | None = None
        self._distinct = distinct  # no two rows encode the same int

    def identities(self, rows: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """A label for each of ``rows``, equal for equal encodings and only for them: the
        position of its int key among the distinct keys (msgpack encodes distinct ints
        distinctly), from a hash pass over the int64 values, once for the calls that share
        these encodings, rather than one over the encodings' bytes per call. Keys encoded as
        distinct (:func:`encode_int_keys`) are their own rows: no pass at all."""
        if self._distinct:
            return np.asarray(rows, dtype=np.int64)
        if self._labels is None:
            self._labels = factorize(self._values)[0]
        labels: npt.NDArray[np.int64] = self._labels[rows]
        return labels

    def __len__(self) -> int:
        return len(self.matrix.lengths)

    def cut(self, rows: npt.NDArray[np.int64]) -> list[bytes]:
        """The encodings of ``rows`` (in that order) as bytes objects (every key is cut once,
        on the first call, for the calls that share these encodings)."""
        if self._cut is None:
            if self._pieces is None:
                self._pieces = _pieces_of(self.matrix)
            self._cut = np.empty(len(self), dtype=object)
            self._cut[:] = _cut(len(self), self._pieces)
        picked: list[bytes] = self._cut[rows].tolist()
        return picked

    def take(self, rows: npt.NDArray[np.int64]) -> keyschema.KeyMatrix:
        """The encodings of ``rows`` (in that order) as a matrix no wider than they are."""
        lengths = self.matrix.lengths[rows]
        width = int(lengths.max()) if len(lengths) else 0
        picked = np.take(self.matrix.rows, rows, axis=0)
        if width < picked.shape[1]:
            picked = np.ascontiguousarray(picked[:, :width])
        return keyschema.KeyMatrix(picked, lengths)


def encode_int_keys(values: npt.NDArray[np.int64], *, distinct: bool = False) -> KeyEncodings:
    """The encodings of int keys given as int64 values (``encode_key(int(v))`` for each).

    Args:
        values: the keys.
        distinct: the caller vouches that no value repeats (a factorisation's distinct
            keys): their identities (:meth:`KeyEncodings.identities`) are then their rows,
            with no hash pass. Repeats under it would make equal keys two keys to the store.

    Raises:
        ValueError: ``values`` is not a one-dimensional int64 array.
    """
    if not isinstance(values, np.ndarray) or values.dtype != np.int64 or values.ndim != 1:
        raise ValueError(f"values must be a one-dimensional int64 array, got "
                         f"{getattr(values, 'dtype', type(values).__name__)}")
    return KeyEncodings(_int64_matrix(values), None, values.copy(), distinct)


def _int64_matrix(values: npt.NDArray[np.int64]) -> keyschema.KeyMatrix:
    """The key encodings of int64 values as a matrix, in two compiled passes."""
    values = np.ascontiguousarray(values, dtype=np.int64)
    lengths = np.empty(len(values), dtype=np.int64)
    width = compiled(int_key_lengths_kernel)(values, lengths)
    rows = np.zeros((len(values), width), dtype=np.uint8)
    compiled(int_key_rows_kernel)(values, lengths, rows)
    return keyschema.KeyMatrix(rows, lengths)


def int_key_lengths_kernel(values: npt.NDArray[np.int64], lengths: npt.NDArray[np.int64]
                           ) -> int:
    """Set ``lengths[i]`` to the length of ``values[i]``'s key encoding; return the largest
    (0 for none). (Compiled.)

    The encoding is a 4-byte big-endian length, then the int in the msgpack format that
    msgpack-python chooses: a fixint (one byte) from -32 to 127; else a header byte and a
    big-endian payload, of 1 byte for uint8 (to 255) and int8 (from -128), 2 for uint16 and
    int16, 4 for uint32 and int32, 8 for uint64 and int64 beyond."""
    widest = 0
    for i in range(len(values)):
        v = values[i]
        if -32 <= v <= 0x7F:
            size = 1  # a fixint: the whole encoding is one byte
        elif 0 <= v <= 0xFF or -0x80 <= v < 0:
            size = 2
        elif 0 <= v <= 0xFFFF or -0x8000 <= v < 0:
            size = 3
        elif 0 <= v <= 0xFFFF_FFFF or -0x8000_0000 <= v < 0:
            size = 5
        else:
            size = 9
        lengths[i] = 4 + size
        if 4 + size > widest:
            widest = 4 + size
    return widest


def int_key_rows_kernel(values: npt.NDArray[np.int64], lengths: npt.NDArray[np.int64],
                        rows: npt.NDArray[np.uint8]) -> None:
    """Write each of ``values``' key encoding, ``lengths[i]`` bytes long
    (:func:`int_key_lengths_kernel`), into its row of ``rows`` (zeroed on entry, as wide as
    the widest): the 4-byte big-endian length, then msgpack's encoding of the int, the payload
    big-endian. (Compiled.)"""
    for i in range(len(values)):
        v = values[i]
        packed = lengths[i] - 4
        rows[i, 3] = packed
        if packed == 1:  # a fixint
            rows[i, 4] = v & 0xFF
            continue
        size = packed - 1
        if v >= 0:
            header = 0xCC if size == 1 else 0xCD if size == 2 else 0xCE if size == 4 else 0xCF
        else:
            header = 0xD0 if size == 1 else 0xD1 if size == 2 else 0xD2 if size == 4 else 0xD3
        rows[i, 4] = header
        for b in range(size):
            rows[i, 4 + size - b] = (v >> (8 * b)) & 0xFF


def encode_key_column(keys: Sequence[Any], rows: Sequence[int] | None = None
                      ) -> tuple[list[bytes], keyschema.KeyMatrix | None]:
    """:func:`encode_keys`, and the encodings' :class:`~sessionstore.keyschema.KeyMatrix`
    when the vectorised encoders built it on the way (equal to ``keyschema.key_matrix`` of the
    encodings; None otherwise: the caller builds it if it needs it).

    Raises:
        TypeError / ValueError: as :func:`encode_keys`.
    """
    encoded, matrix = _encode_key_column(keys, rows, cut=True)
    assert isinstance(encoded, list)
    return encoded, matrix


def encode_key_rows(keys: Sequence[Any], rows: Sequence[int] | None = None
                    ) -> tuple[list[bytes] | EncodedKeys, keyschema.KeyMatrix | None]:
    """:func:`encode_key_column`, except that keys the vectorised encoders take come back as
    :class:`EncodedKeys` (their matrix, not cut into bytes objects until read): for a caller
    that keeps the encodings as byte rows.

    Raises:
        TypeError / ValueError: as :func:`encode_keys`.
    """
    return _encode_key_column(keys, rows, cut=False)


def _encode_key_column(keys: Sequence[Any], rows: Sequence[int] | None, *, cut: bool
                       ) -> tuple[list[bytes] | EncodedKeys, keyschema.KeyMatrix | None]:
    n = len(keys)
    kinds = set(map(type, keys)) if n >= _VECTOR_MIN else set()
    if kinds == {int}:  # bool is its own type: never taken here
        try:
            values = np.array(keys, dtype=np.int64)
        except OverflowError:
            pass  # an int beyond int64: the per-key path names its row
        else:
            return _assemble(n, _encode_int64(values), cut)
    elif kinds == {str} or kinds == {bytes}:
        pieces = _encode_str(keys, binary=kinds == {bytes})
        if pieces is not None:
            return _assemble(n, pieces, cut)
    try:
        return list(map(keyschema.encode_key, keys)), None
    except (TypeError, ValueError):
        for row, key in enumerate(keys):
            try:
                keyschema.encode_key(key)
            except (TypeError, ValueError) as exc:
                name = row if rows is None else rows[row]
                raise type(exc)(f"keys[{name}]: {exc}") from None
        raise


# The rows of one width, and their encodings as a byte matrix.
_Pieces = list[tuple[npt.NDArray[np.int64], npt.NDArray[np.uint8]]]


def _assemble(n: int, pieces: _Pieces, cut: bool = True
              ) -> tuple[list[bytes] | EncodedKeys, keyschema.KeyMatrix | None]:
    """The encodings of ``n`` keys as bytes (or, unless ``cut``, as :class:`EncodedKeys`),
    and as a KeyMatrix unless one is too wide (then always as bytes)."""
    width = max((matrix.shape[1] for _, matrix in pieces), default=0)
    if n == 0 or width > keyschema.KEY_MATRIX_MAX_WIDTH:
        return _cut(n, pieces), None
    if len(pieces) == 1:  # one width: the rows in order, and the matrix as it is
        whole = keyschema.KeyMatrix(pieces[0][1], np.full(n, width, dtype=np.int64))
        return (_cut(n, pieces) if cut else EncodedKeys(whole)), whole
    padded = np.zeros((n, width), dtype=np.uint8)
    lengths = np.empty(n, dtype=np.int64)
    for rows, matrix in pieces:
        padded[rows, :matrix.shape[1]] = matrix
        lengths[rows] = matrix.shape[1]
    if not cut:
        padded_matrix = keyschema.KeyMatrix(padded, lengths)
        return EncodedKeys(padded_matrix), padded_matrix
    narrow = [(rows, matrix) for rows, matrix in pieces if matrix.shape[1] < width]
    if sum(len(rows) for rows, _ in narrow) * 4 >= n:
        return _cut(n, pieces), keyschema.KeyMatrix(padded, lengths)
    # few narrower keys: every row cut at the widest width (right for the widest keys), and
    # the narrower ones replaced one by one
    encoded: list[bytes] = padded.view(f"V{width}").ravel().tolist()
    for rows, matrix in narrow:
        for row, key in zip(rows.tolist(), matrix.view(f"V{matrix.shape[1]}").ravel().tolist(),
                            strict=True):
            encoded[row] = key
    return encoded, keyschema.KeyMatrix(padded, lengths)


def _pieces_of(matrix: keyschema.KeyMatrix) -> _Pieces:
    """A key matrix's rows grouped by their width, each group cut to it (what
    :func:`_encode_int64` gives)."""
    lengths = matrix.lengths
    pieces: _Pieces = []
    for width in np.unique(lengths).tolist():
        rows = np.flatnonzero(lengths == width)
        pieces.append((rows, np.ascontiguousarray(matrix.rows[rows, :width])))
    return pieces


def _cut(n: int, pieces: _Pieces) -> list[bytes]:
    """The encodings of ``n`` keys as bytes, each piece's rows cut at its width."""
    # a void view cuts rows into bytes without dropping trailing zero bytes
    if len(pieces) == 1:  # one width: the rows in order
        cut: list[bytes] = pieces[0][1].view(f"V{pieces[0][1].shape[1]}").ravel().tolist()
        return cut
    out = np.empty(n, dtype=object)
    for rows, matrix in pieces:
        out[rows] = matrix.view(f"V{matrix.shape[1]}").ravel().tolist()
    encoded: list[bytes] = out.tolist()
    return encoded


def _encode_int64(values: npt.NDArray[np.int64]) -> _Pieces:
    """The length-prefixed msgpack encodings of int64 values, as byte matrices of the rows of
    each width."""
    return _pieces_of(_int64_matrix(values))


def _encode_str(keys: Sequence[str] | Sequence[bytes], binary: bool = False
                ) -> _Pieces | None:
    """The length-prefixed msgpack encodings of strings (fixstr, str8, str16, str32) or, with
    ``binary``, of bytes (bin8, bin16, bin32), as byte matrices of the rows of each width, or
    None when a string is not valid UTF-8 or a key is too long (the per-key path raises for
    it)."""
    n = len(keys)
    raw: bytes | None = None
    if binary:
        raw = b"".join(cast("Sequence[bytes]", keys))
    else:
        joined = "".join(cast("Sequence[str]", keys))
        if joined.isascii():
            raw = joined.encode("ascii")
    if raw is not None:
        # bytes, or ASCII strings (one UTF-8 byte per character): the lengths are the keys'
        # own, with no Arrow (whose first call also imports pandas, about 0.2 s)
        data = np.frombuffer(raw, dtype=np.uint8)
        lengths = np.fromiter(map(len, keys), dtype=np.int64, count=n)
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
    else:
        try:
            array = pa.array(keys, type=pa.string())
        except Exception:  # noqa: BLE001 - surrogates and the like: let encode_key name the row
            return None
        if not isinstance(array, pa.StringArray) or array.null_count:
            return None
        offsets = np.frombuffer(array.buffers()[1], dtype=np.int32)[
            array.offset:array.offset + n + 1].astype(np.int64)
        data_buffer = array.buffers()[2]
        data = (np.zeros(0, dtype=np.uint8) if data_buffer is None
                else np.frombuffer(data_buffer, dtype=np.uint8))
        lengths = np.diff(offsets)
    if binary:  # msgpack has no fixbin: bin8 from length 0
        headers = np.where(lengths <= 0xFF, 2, np.where(lengths <= 0xFFFF, 3, 5))
    else:
        headers = np.where(lengths <= 31, 1, np.where(lengths <= 0xFF, 2,
                                                      np.where(lengths <= 0xFFFF, 3, 5)))
    packed = headers + lengths
    if len(packed) and int(packed.max()) > keyschema.MAX_KEY_BYTES:
        return None
    widths = 4 + packed
    pieces: _Pieces = []
    # counted rather than sorted, unless a key is long
    distinct = (np.flatnonzero(np.bincount(widths)) if n and int(widths.max()) <= 4096
                else np.unique(widths))
    for width in distinct.tolist():
        rows = np.flatnonzero(widths == width)
        size = int(lengths[rows[0]])
        header = int(headers[rows[0]])
        matrix = np.zeros((len(rows), width), dtype=np.uint8)
        matrix[:, :4] = np.frombuffer((header + size).to_bytes(4, "big"), dtype=np.uint8)
        if header == 1:
            matrix[:, 4] = 0xA0 | size
        else:
            matrix[:, 4] = ({2: 0xC4, 3: 0xC5, 5: 0xC6} if binary
                            else {2: 0xD9, 3: 0xDA, 5: 0xDB})[header]
            matrix[:, 5:4 + header] = np.frombuffer(
                size.to_bytes(header - 1, "big"), dtype=np.uint8)
        if size:
            matrix[:, 4 + header:] = data[offsets[rows][:, None] + np.arange(size)]
        pieces.append((rows, matrix))
    return pieces

