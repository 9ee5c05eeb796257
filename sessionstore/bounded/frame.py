"""The columns one sessionize call reads, each in the form its work is fastest on.

Integer and float columns without nulls become numpy arrays (gathers and reductions are numpy
operations); every other column stays one Arrow array. Built from record batches, a frame drops
each column from the batches as soon as it has it, so the input is never held twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import pyarrow as pa

Column = "npt.NDArray[Any] | pa.Array"


def _numeric(data_type: pa.DataType) -> bool:
    return bool(pa.types.is_integer(data_type) or pa.types.is_floating(data_type)) \
        and not pa.types.is_float16(data_type)


def as_numpy(array: pa.Array | pa.ChunkedArray) -> npt.NDArray[Any]:
    """The values of an Arrow array as numpy: a view of an integer or float array without
    nulls (pyarrow's own ``to_numpy`` imports pandas, a third of a second, when it is
    installed), a conversion for anything else."""
    if isinstance(array, pa.ChunkedArray):
        array = array.chunk(0) if array.num_chunks == 1 else array.combine_chunks()
    data_type = array.type
    if array.null_count == 0 and _numeric(data_type):
        kind = "f" if pa.types.is_floating(data_type) else \
            "u" if pa.types.is_unsigned_integer(data_type) else "i"
        dtype = np.dtype(f"={kind}{data_type.bit_width // 8}")
        buffer = array.buffers()[1]
        if buffer is None:
            return np.zeros(0, dtype=dtype)
        return np.frombuffer(buffer, dtype=dtype, count=len(array),
                             offset=array.offset * dtype.itemsize)
    return cast(npt.NDArray[Any], array.to_numpy(zero_copy_only=False))


def first_null(column: pa.Array | pa.ChunkedArray) -> int | None:
    """The first row of ``column`` that is null, None when no row is. A null among a dictionary
    column's values counts: Arrow's ``null_count`` counts only null indices."""
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    if not column.null_count and not (pa.types.is_dictionary(column.type) and any(
            c.dictionary.null_count for c in chunks)):
        return None
    nulls = column.is_null().to_numpy(zero_copy_only=False)
    return int(np.argmax(nulls)) if nulls.any() else None  # (a dictionary's null unused)


def _numpy_dtype(data_type: pa.DataType) -> np.dtype[Any] | None:
    """The numpy type of a fixed-width Arrow type's values, None for other types."""
    t = pa.types
    if t.is_timestamp(data_type) or t.is_date64(data_type) or t.is_duration(data_type):
        return np.dtype(np.int64)
    if t.is_date32(data_type):
        return np.dtype(np.int32)
    if _numeric(data_type):
        kind = "f" if t.is_floating(data_type) else "u" if t.is_unsigned_integer(data_type) \
            else "i"
        return np.dtype(f"={kind}{data_type.bit_width // 8}")
    return None


def arrow_of(values: npt.NDArray[Any], data_type: pa.DataType) -> pa.Array:
    """An Arrow array of ``data_type`` over numpy ``values`` (converted to its width), without
    a copy when they are already contiguous of that width; ``pa.array`` would import pandas."""
    dtype = _numpy_dtype(data_type)
    if dtype is None or values.dtype.kind not in "iuf" or \
            (values.dtype.kind == "f") != (dtype.kind == "f"):
        return pa.array(values, data_type)
    values = np.ascontiguousarray(values, dtype=dtype)
    return pa.Array.from_buffers(data_type, len(values), [None, pa.py_buffer(values)])


def _piece(chunk: pa.Array) -> Any:
    """One batch's column as held while reading: a numpy array when it is numeric or a
    timestamp (its int64 ticks) without nulls, else the Arrow array."""
    data_type = chunk.type
    if chunk.null_count == 0:
        if pa.types.is_timestamp(data_type):
            return as_numpy(chunk.view(pa.int64()))
        if _numeric(data_type):
            return as_numpy(chunk)
    return chunk


def _join(pieces: list[Any], data_type: pa.DataType) -> Any:
    """One column from its pieces (numpy when every piece is)."""
    if pieces and all(isinstance(p, np.ndarray) for p in pieces):
        if len(pieces) == 1:
            return pieces[0]
        # filled piece by piece, each let go once copied: the input is never held twice
        out = np.empty(sum(len(p) for p in pieces), dtype=pieces[0].dtype)
        at = 0
        pieces.reverse()
        while pieces:
            piece = pieces.pop()
            out[at:at + len(piece)] = piece
            at += len(piece)
            del piece
            if len(pieces) % 8 == 0:
                pa.default_memory_pool().release_unused()
        return out
    arrays = [to_arrow(p, data_type) for p in pieces]
    if len(arrays) == 1:
        return _piece(arrays[0])
    return _piece(pa.chunked_array(arrays, data_type).combine_chunks())


class FrameBuilder:
    """Collects the batches of a stream column by column, as a :class:`Frame` holds them, so
    that each batch's Arrow memory can go as soon as it is read."""

    def __init__(self, schema: pa.Schema, names: Sequence[str]) -> None:
        self.names = list(names)
        self.types = {name: schema.field(name).type for name in names}
        self.pieces: dict[str, list[Any]] = {name: [] for name in names}
        self.rows = 0
        self.nbytes = 0

    def add(self, batch: pa.RecordBatch) -> None:
        for name in self.names:
            piece = _piece(batch.column(name))
            self.pieces[name].append(piece)
            self.nbytes += piece.nbytes
        self.rows += batch.num_rows

    def batches(self) -> list[pa.RecordBatch]:
        """What was collected, as record batches (emptying the builder)."""
        count = len(self.pieces[self.names[0]]) if self.names else 0
        out = []
        for i in range(count):
            arrays = [to_arrow(self.pieces[n][i], self.types[n]) for n in self.names]
            out.append(pa.RecordBatch.from_arrays(arrays, names=self.names))
        self.pieces = {name: [] for name in self.names}
        return out

    def finish(self) -> Frame:
        """The frame of everything added (emptying the builder, column by column)."""
        columns = {}
        for name in self.names:
            columns[name] = _join(self.pieces.pop(name), self.types[name])
            pa.default_memory_pool().release_unused()  # give the batches' memory back
        return Frame(columns, self.types, self.rows)


def to_arrow(piece: Any, data_type: pa.DataType) -> pa.Array:
    """A column piece as an Arrow array of ``data_type``."""
    if not isinstance(piece, np.ndarray):
        return piece
    if pa.types.is_timestamp(data_type):
        return arrow_of(piece, data_type)
    return arrow_of(piece, data_type)


def _gather(chunks: Sequence[pa.Array], data_type: pa.DataType) -> Any:
    return _join([_piece(c) for c in chunks], data_type)


class Frame:
    """Named columns of ``rows`` rows: numpy arrays or Arrow arrays (see the module)."""

    def __init__(self, columns: dict[str, Any], types: dict[str, pa.DataType], rows: int
                 ) -> None:
        self.columns = columns
        self.types = types
        self.rows = rows

    @classmethod
    def from_table(cls, table: pa.Table, names: Sequence[str]) -> Frame:
        columns = {}
        types = {}
        for name in names:
            column = table.column(name)
            columns[name] = _gather(column.chunks, column.type)
            types[name] = column.type
        return cls(columns, types, table.num_rows)

    def arrow(self, name: str) -> pa.Array:
        """The column as an Arrow array of its input type."""
        return to_arrow(self.columns[name], self.types[name])

    def arrow_at(self, name: str, indices: npt.NDArray[np.int64]) -> pa.Array:
        """The rows at ``indices`` of the column, as an Arrow array of its input type."""
        return to_arrow(self.take(name, indices), self.types[name])

    def take(self, name: str, indices: npt.NDArray[np.int64] | None) -> Any:
        """The column's rows at ``indices`` (all of it for None)."""
        column = self.columns[name]
        if indices is None:
            return column
        if isinstance(column, np.ndarray):
            return column[indices]
        return column.take(arrow_of(indices, pa.int64()))

    def filter(self, mask: npt.NDArray[np.bool_]) -> Frame:
        """The rows where ``mask`` is True."""
        arrow_mask = pa.array(mask)
        return Frame({name: column[mask] if isinstance(column, np.ndarray)
                      else column.filter(arrow_mask) for name, column in self.columns.items()},
                     self.types, int(np.count_nonzero(mask)))
