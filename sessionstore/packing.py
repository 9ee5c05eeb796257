"""Session records serialised in bulk: the msgpack bytes of many numeric records at once.

The batch path writes one record per session, ``[acc, 0, 0, 0, None]`` (see
:mod:`sessionstore.engine.record`), where ``acc`` is a number (count, sum, min, max) or, for a
combined aggregation, a list of numbers. Packing those one by one with msgpack costs a Python
call per session, the largest single cost of a bulk write after the planning. Here the records
of int64 and float64 accumulator columns are built with numpy as one byte matrix, a row per
record, byte for byte what :class:`~sessionstore.serde.MsgpackSerde` writes for the same Python
record (``tests/kernels/test_packing.py`` checks it against msgpack). The rows become bytes
objects only for a store that needs them (RocksDB's writers take one per record); the in-memory
store logs the rows as they are (:class:`PackedValues`).

A store accepts such values only when its serde is :class:`~sessionstore.serde.MsgpackSerde`
(see ``SegmentedSessionStore._dumps_all``); the engine packs only for such a store.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import numpy.typing as npt

from .arrays import ByteRows, LazyBytesList
from .jit import register_helpers

__all__ = ["PackedValues", "pack_session_records"]

# msgpack's int formats, as msgpack-python chooses them for a Python int: (low, high, header
# byte or None for a fixint, payload bytes)
_INT_FORMATS: tuple[tuple[int, int, int | None, int], ...] = (
    (0, 0x7F, None, 1),
    (-32, -1, None, 1),
    (0x80, 0xFF, 0xCC, 1),
    (0x100, 0xFFFF, 0xCD, 2),
    (0x1_0000, 0xFFFF_FFFF, 0xCE, 4),
    (0x1_0000_0000, 2**63 - 1, 0xCF, 8),
    (-0x80, -33, 0xD0, 1),
    (-0x8000, -0x81, 0xD1, 2),
    (-0x8000_0000, -0x8001, 0xD2, 4),
    (-(2**63), -0x8000_0001, 0xD3, 8),
)
_RECORD_HEAD = 0x95  # fixarray of 5: [acc, 0, 0, 0, None]
_RECORD_NIL = 0xC0  # the record's tail: 0, 0, 0, nil
_FLOAT64 = 0xCB
_FLOAT = len(_INT_FORMATS)  # the format code of a float64


class PackedValues(LazyBytesList):
    """Values already serialised by :class:`~sessionstore.serde.MsgpackSerde`, one ``bytes``
    per value: a store whose serde is that serde writes them as they are.

    Built from bytes objects (``PackedValues([b"..."])``), from byte rows (:meth:`of_rows`),
    or, by :func:`pack_session_records`, from accumulator columns (:meth:`of_columns`), packed
    into rows only when first read (:meth:`rows`): rows become bytes objects only when the
    values are read as a sequence, so that a store that keeps byte rows (the in-memory one)
    never makes a Python object per value, and one that keeps the values unread never packs
    them (:meth:`is_packed`).
    """

    __slots__ = ("_rows", "_columns", "_combined")

    def __init__(self, values: Iterable[bytes] = (), *, rows: ByteRows | None = None,
                 columns: list[npt.NDArray[Any]] | None = None, combined: bool = False
                 ) -> None:
        super().__init__(None if rows is not None or columns is not None else list(values))
        self._rows: ByteRows | None = rows
        # copies: the caller may change its own columns
        self._columns = None if columns is None else [column.copy() for column in columns]
        self._combined = combined

    @classmethod
    def of_rows(cls, rows: ByteRows) -> PackedValues:
        """The values ``rows.tolist()``, kept as rows until read as a sequence."""
        return cls(rows=rows)

    @classmethod
    def of_columns(cls, columns: list[npt.NDArray[Any]], combined: bool) -> PackedValues:
        """The records :func:`pack_session_records` makes of ``columns`` (copied: the caller
        may change its own), packed when first read."""
        return cls(columns=columns, combined=combined)

    def is_packed(self) -> bool:
        """False while the values are columns not packed yet."""
        return self._columns is None

    def rows(self) -> ByteRows:
        if self._rows is None:
            if self._columns is not None:
                self._rows = (_pack_rows(self._columns, self._combined)
                              if len(self._columns[0]) else ByteRows.of_list([]))
                self._columns = None
            else:
                assert self._cut is not None
                self._rows = ByteRows.of_list(self._cut)
        return self._rows

    def __len__(self) -> int:
        if self._columns is not None:
            return len(self._columns[0])
        return super().__len__()

    def take(self, rows: npt.NDArray[np.int64]) -> PackedValues:
        """The values of ``rows``, in that order."""
        if self._columns is not None:
            return PackedValues.of_columns([column[rows] for column in self._columns],
                                           self._combined)
        if self._cut is None:
            return PackedValues.of_rows(self.rows().take(rows))
        boxed = np.empty(len(self._cut), dtype=object)  # gathers faster than a comprehension
        boxed[:] = self._cut
        return PackedValues(boxed[rows].tolist())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PackedValues):
            return self.as_list() == other.as_list()
        return isinstance(other, list) and self.as_list() == other

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"PackedValues({self.as_list()!r})"


def pack_session_records(columns: list[npt.NDArray[Any]], *, combined: bool
                         ) -> PackedValues | None:
    """The msgpack bytes of each row's session record ``[acc, 0, 0, 0, None]``.

    Args:
        columns: one accumulator column per aggregation part, int64 or float64, equal lengths.
        combined: ``acc`` is the list of the parts' values (a combined aggregation); otherwise
            ``acc`` is the single column's value.

    Returns:
        ``MsgpackSerde().dumps([acc, 0, 0, 0, None])`` per row, or None when a column is of
        another dtype (objects: mixed ints and floats) or there are more than 15 parts.
    """
    if not columns or (not combined and len(columns) != 1) or len(columns) > 15:
        return None
    if any(column.dtype not in (np.int64, np.float64) for column in columns):
        return None
    if len(columns[0]) == 0:
        return PackedValues()
    return PackedValues.of_columns(columns, combined)


def _pack_rows(columns: list[npt.NDArray[Any]], combined: bool) -> ByteRows:
    """The records of :func:`pack_session_records` (columns it takes, at least one row): a
    zero-padded byte matrix as wide as the longest record, a record per row, in one compiled
    pass (:func:`pack_records_kernel`)."""
    from .jit import compiled  # numba, on first use only

    n = len(columns[0])
    values = np.empty((n, len(columns)), dtype=np.int64)
    floats = np.zeros(len(columns), dtype=np.bool_)
    for part, column in enumerate(columns):
        floats[part] = column.dtype == np.float64
        values[:, part] = column.view(np.int64) if floats[part] else column
    lengths = np.empty(n, dtype=np.int64)
    width = int(compiled(record_lengths_kernel)(values, floats, combined, lengths))
    matrix = np.zeros((n, width), dtype=np.uint8)
    compiled(pack_records_kernel)(values, floats, combined, matrix)
    return ByteRows.of_matrix_rows(matrix, lengths)


def _int_size(value: int) -> int:
    """The bytes msgpack writes for the int ``value`` (its header and payload), as the first
    matching format of ``_INT_FORMATS``. (Compiled.)"""
    if -32 <= value <= 0x7F:
        return 1
    if value > 0:
        if value <= 0xFF:
            return 2
        if value <= 0xFFFF:
            return 3
        if value <= 0xFFFF_FFFF:
            return 5
        return 9
    if value >= -0x80:
        return 2
    if value >= -0x8000:
        return 3
    if value >= -0x8000_0000:
        return 5
    return 9


def record_lengths_kernel(values: npt.NDArray[np.int64], floats: npt.NDArray[np.bool_],
                          combined: bool, lengths: npt.NDArray[np.int64]) -> int:
    """Write the length of each row's record to ``lengths``; return the longest (0 for no
    rows). ``values[i, part]`` is the part's value, a float64's bits where ``floats[part]``.
    (Compiled.)"""
    n, parts = values.shape
    longest = 0
    for i in range(n):
        size = 1 + (1 if combined else 0) + 4  # head, the parts' fixarray, tail
        for part in range(parts):
            size += 9 if floats[part] else _int_size(values[i, part])
        lengths[i] = size
        longest = max(longest, size)
    return longest


def pack_records_kernel(values: npt.NDArray[np.int64], floats: npt.NDArray[np.bool_],
                        combined: bool, out: npt.NDArray[np.uint8]) -> None:
    """Write each row's record ``[acc, 0, 0, 0, None]`` (see :func:`record_lengths_kernel`
    for ``values``) at the start of its row of ``out`` (zeros, as wide as the longest): an int
    in the format msgpack-python picks for it (``_INT_FORMATS``), a float64 as ``0xcb`` and 8
    big-endian bytes. (Compiled.)"""
    n, parts = values.shape
    for i in range(n):
        out[i, 0] = _RECORD_HEAD
        at = 1
        if combined:
            out[i, 1] = 0x90 | parts
            at = 2
        for part in range(parts):
            value = values[i, part]
            if floats[part]:
                header = _FLOAT64
                size = 8
            else:
                size = _int_size(value) - 1
                if size == 0:  # a fixint: its low byte
                    header = value & 0xFF
                elif value > 0:
                    header = 0xCC if size == 1 else 0xCD if size == 2 else 0xCE if size == 4 \
                        else 0xCF
                else:
                    header = 0xD0 if size == 1 else 0xD1 if size == 2 else 0xD2 if size == 4 \
                        else 0xD3
            out[i, at] = header
            at += 1
            for b in range(size):  # big-endian
                out[i, at + b] = (value >> (8 * (size - 1 - b))) & 0xFF
            at += size
        out[i, at + 3] = _RECORD_NIL  # after 0, 0, 0: out holds zeros


register_helpers({
    "record_lengths_kernel": (_int_size,),
    "pack_records_kernel": (_int_size,),
})


# -- unpacking: the inverse of pack_session_records, for a cold start ------------------------

# the format codes of record_layout_kernel: _INT_FORMATS' order, then _FLOAT (a float64)
_UNSIGNED_WIDTHS = {2: 1, 3: 2, 4: 4, 5: 8}  # uint8 .. uint64
_SIGNED_WIDTHS = {6: 1, 7: 2, 8: 4, 9: 8}  # int8 .. int64


def record_layout_kernel(data: Any, first: Any, stop: Any, n_parts: int, combined: bool,
                         at: Any, formats: Any) -> int:
    """Parse the msgpack records ``data[first[i]:stop[i]]`` as :func:`pack_session_records`
    writes them (``[acc, 0, 0, 0, None]``, ``acc`` a number or, ``combined``, a list of
    ``n_parts`` numbers, each an int of any msgpack int format or a float64): per row and part,
    write where the number's payload starts to ``at`` and its format code to ``formats``
    (``_INT_FORMATS``' order; ``_FLOAT`` for a float64). Return -1, or the first row that is
    not such a record. (Compiled.)"""
    for i in range(len(first)):
        p = first[i]
        end = stop[i]
        if end - p < 1 + n_parts + 4 or int(data[p]) != 0x95:
            return i
        p += 1
        if combined:
            if int(data[p]) != 0x90 + n_parts:
                return i
            p += 1
        for part in range(n_parts):
            if p >= end:
                return i
            head = int(data[p])
            if head <= 0x7F:
                code, width = 0, 0
            elif head >= 0xE0:
                code, width = 1, 0
            elif 0xCC <= head <= 0xCF:  # uint8 .. uint64
                code, width = 2 + head - 0xCC, 1 << (head - 0xCC)
            elif 0xD0 <= head <= 0xD3:  # int8 .. int64
                code, width = 6 + head - 0xD0, 1 << (head - 0xD0)
            elif head == 0xCB:
                code, width = 10, 8
            else:
                return i
            if width:
                p += 1
            at[i, part] = p
            formats[i, part] = code
            p += max(width, 1)
        if end - p != 4 or int(data[p]) != 0 or int(data[p + 1]) != 0 \
                or int(data[p + 2]) != 0 or int(data[p + 3]) != 0xC0:
            return i
    return -1


def unpack_session_records(data: npt.NDArray[np.uint8], first: npt.NDArray[np.int64],
                           stop: npt.NDArray[np.int64], n_parts: int, *, combined: bool
                           ) -> list[npt.NDArray[Any]] | None:
    """The accumulator columns of records :func:`pack_session_records` (or msgpack, for the
    same Python record) wrote: record ``i`` is ``data[first[i]:stop[i]]``.

    Returns:
        One column per part: int64 where every row's number is an int, float64 where every
        one is a float; or None when a record is not of that layout, a part mixes ints and
        floats, or an int lies beyond int64 (the caller decodes those records one by one).
    """
    from .jit import compiled  # numba, on first use only

    if n_parts < 1 or n_parts > 15 or (not combined and n_parts != 1):
        return None
    n = len(first)
    at = np.zeros((n, n_parts), dtype=np.int64)
    formats = np.zeros((n, n_parts), dtype=np.int8)
    if compiled(record_layout_kernel)(data, first, stop, n_parts, combined, at, formats) >= 0:
        return None
    columns: list[npt.NDArray[Any]] = []
    for part in range(n_parts):
        where, code = at[:, part], formats[:, part]
        floats = code == _FLOAT
        if floats.all():
            columns.append(_gather(data, where, 8).view(">f8").astype(np.float64).reshape(n))
            continue
        if floats.any():
            return None
        column = np.empty(n, dtype=np.int64)
        for fmt in np.unique(code).tolist():
            rows = np.flatnonzero(code == fmt)
            if fmt in (0, 1):  # fixints: the header byte is the value
                column[rows] = data[where[rows]].astype(np.int64) - (256 if fmt == 1 else 0)
                continue
            width = _UNSIGNED_WIDTHS.get(fmt) or _SIGNED_WIDTHS[fmt]
            kind = "u" if fmt in _UNSIGNED_WIDTHS else "i"
            values = _gather(data, where[rows], width).view(f">{kind}{width}").reshape(len(rows))
            if kind == "u" and width == 8 and (values >= np.uint64(1 << 63)).any():
                return None  # beyond int64
            column[rows] = values.astype(np.int64)
        columns.append(column)
    return columns


def _gather(data: npt.NDArray[np.uint8], at: npt.NDArray[np.int64], width: int
            ) -> npt.NDArray[np.uint8]:
    """The ``width`` bytes at each of ``at``, one row each."""
    rows: npt.NDArray[np.uint8] = data[at[:, None] + np.arange(width, dtype=np.int64)]
    return rows
