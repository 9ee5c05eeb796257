"""Array utilities shared by the store and the engine: checked int64 columns, a fast stable
multi-column sort, and compiled hash-table passes (each row's last occurrence, each byte row's
first equal) for deduplicating without a sort. Nothing here knows about sessions."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, TypeVar, overload

import numpy as np
import numpy.typing as npt

from .jit import register_helpers

Int64Array = npt.NDArray[np.int64]


def int64_column(name: str, values: Any, rows: int | None = None) -> Int64Array:
    """``values`` as a one-dimensional int64 array, or an error naming ``name``.

    Args:
        name: the argument's name, for messages.
        values: any integer array-like (an empty list is fine).
        rows: the length it must have, if any.

    Raises:
        TypeError: the values are not integers (floats and bools included).
        ValueError: the shape is wrong, or an unsigned value does not fit in int64 (naming
            the row).
    """
    array = np.asarray(values)
    if array.ndim != 1 or (rows is not None and len(array) != rows):
        wanted = "" if rows is None else f" with {rows} rows"
        raise ValueError(f"{name} must be one-dimensional{wanted}, got shape {array.shape}")
    if array.dtype.kind not in "iu":
        if array.size == 0 and array.dtype.kind == "f":  # np.asarray([]) is float64
            return np.empty(0, dtype=np.int64)
        raise TypeError(f"{name} must hold integers (int64), got dtype {array.dtype}")
    if array.dtype.kind == "u" and array.size and array.max() > np.iinfo(np.int64).max:
        row = int(np.argmax(array > np.iinfo(np.int64).max))
        raise ValueError(f"{name}[{row}] = {array[row]} does not fit in int64")
    return np.ascontiguousarray(array, dtype=np.int64)


def first_row(mask: npt.NDArray[np.bool_]) -> int:
    return int(np.argmax(mask))


def sort_order(columns: list[Int64Array], *, distinct: bool = False) -> Int64Array:
    """A stable permutation sorting rows by ``columns``, the most significant first.

    The same permutation as ``np.lexsort(columns[::-1])``, usually many times faster. When the
    columns' value ranges fit in 63 bits together, they are packed into one int64 (what bulk
    writes sort by, key rank, end and start within one batch, nearly always fits); otherwise it
    falls back to ``np.lexsort``. The row numbers are packed below the values, so that every
    value is distinct and numpy's sort of plain values (several times faster than a stable
    ``argsort``, a merge sort) gives the stable order, read back from the low bits; when they
    do not fit, the packed values are first replaced by their dense ranks (an unstable
    ``argsort``, which is the answer already when no two rows are equal), which always leave
    room. ``distinct=True`` promises that no two rows are
    equal in every column: an unstable ``argsort`` of the packed values is then enough.
    """
    if not columns or len(columns[0]) == 0:
        return np.zeros(0, dtype=np.int64)
    if len(columns) == 3:  # (end, key, start): what the engine and the stores sort by
        order = _sort_order3(columns)
        if order is not None:
            return order
    packing = _packed(columns)
    if packing is None:
        return np.lexsort(columns[::-1]).astype(np.int64)
    packed, width = packing
    n = len(packed)
    row_bits = (n - 1).bit_length()
    if width + row_bits > 63:
        order = np.argsort(packed, kind="quicksort").astype(np.int64)
        if distinct:
            return order
        ordered = packed[order]
        steps = ordered[1:] != ordered[:-1]
        if steps.all():  # no two rows equal: any sorting order is the stable one
            return order
        packed[order] = np.concatenate(([0], np.cumsum(steps)))
    packed <<= row_bits
    packed |= np.arange(n, dtype=np.int64)
    packed.sort()
    packed &= (1 << row_bits) - 1
    return packed


def _sort_order3(columns: list[Int64Array]) -> Int64Array | None:
    """:func:`sort_order` of three columns whose values and row numbers pack into 63 bits
    (the usual case), with the rows packed in one compiled pass (:func:`pack3_kernel`) rather
    than a numpy pass and a temporary per column; None when they do not fit (the caller then
    takes the general path). The same packed values, so the same permutation."""
    from .jit import compiled  # numba, on first use only

    a, b, c = columns
    lows = [int(column.min()) for column in columns]
    widths = [(int(column.max()) - low).bit_length()
              for column, low in zip(columns, lows, strict=True)]
    n = len(a)
    row_bits = (n - 1).bit_length()
    if sum(widths) + row_bits > 63:
        return None
    packed = np.empty(n, dtype=np.int64)
    compiled(pack3_kernel)(a, b, c, lows[0], lows[1], lows[2], widths[1], widths[2], row_bits,
                           packed)
    packed.sort()
    packed &= (1 << row_bits) - 1
    return packed


def pack3_kernel(a: Int64Array, b: Int64Array, c: Int64Array, low_a: int, low_b: int,
                 low_c: int, width_b: int, width_c: int, row_bits: int,
                 out: Int64Array) -> None:
    """Set ``out[i]`` to row ``i`` packed as :func:`_packed` packs it (each value less its
    column's low, in its column's width), shifted up by ``row_bits`` with ``i`` below. The
    caller checks that the widths and ``row_bits`` fit in 63 bits, so no step overflows.
    (Compiled.)"""
    for i in range(len(a)):
        row = ((a[i] - low_a) << width_b) | (b[i] - low_b)
        out[i] = ((((row << width_c) | (c[i] - low_c)) << row_bits) | i)


def _packed(columns: list[Int64Array]) -> tuple[Int64Array, int] | None:
    """The rows as one int64 each, ordered as the rows are (column by column), and the bits
    that takes; None when that is more than 63. The result is a new array."""
    lows = [int(column.min()) for column in columns]
    spans = [int(column.max()) - low for column, low in zip(columns, lows, strict=True)]
    widths = [span.bit_length() for span in spans]
    if sum(widths) > 63:
        return None
    packed = np.zeros(len(columns[0]), dtype=np.int64)
    for column, low, width in zip(columns, lows, widths, strict=True):
        if width:
            # column - low fits in `width` bits, but may not fit in int64 on the way: subtract
            # as unsigned (two's complement wraps to the right value). Views, not casts: the
            # bits are the same, and numpy's uint64 -> int64 cast is ten times slower.
            offset = (column.view(np.uint64) - np.uint64(low % 2**64)).view(np.int64)
            packed = (packed << width) | offset
    return packed, sum(widths)


def last_of_each(columns: list[Int64Array]) -> Int64Array:
    """The row of the last occurrence of each distinct row of ``columns`` (rows equal in every
    column are one), ordered by the columns as :func:`sort_order` orders them."""
    order = sort_order(columns)
    n = len(order)
    if n < 2:
        return order
    last = np.ones(n, dtype=np.bool_)
    differs = np.zeros(n - 1, dtype=np.bool_)
    for column in columns:
        ordered = column[order]
        differs |= ordered[1:] != ordered[:-1]
    last[:-1] = differs
    return order[last]


# -- hash-table kernels (compiled on first use by sessionstore.jit.compiled) --------------
#
# Open addressing over a table of twice the rows, rounded up to a power of two (the callers
# allocate it: _empty_table); the hash is kept to 63 bits so that numba's wrapping int64
# arithmetic and Python's ints (NUMBA_DISABLE_JIT=1) compute the same slots.

_LOW63 = (1 << 63) - 1
_MIX1 = 0x1E3779B97F4A7C15  # odd constants below 2**63
_MIX2 = 0x3F58476D1CE4E5B9


def _empty_table(rows: int) -> Int64Array:
    """The slots of a hash table for ``rows`` rows, all empty (-1): twice the rows, rounded
    up to a power of two."""
    return np.full(1 << (2 * rows - 1).bit_length() if rows else 1, -1, dtype=np.int64)


def last_rows_kernel(a: Int64Array, b: Int64Array, c: Int64Array, table: Int64Array,
                     out: npt.NDArray[np.bool_]) -> None:
    """Set ``out[i]`` for each row ``i`` that no later row equals in ``a``, ``b`` and ``c``
    (``out`` all False, ``table`` an :func:`_empty_table`, on entry). (Compiled.)"""
    mask = len(table) - 1
    for i in range(len(a) - 1, -1, -1):  # from the end: the first seen of each is the last
        x = a[i]
        y = b[i]
        z = c[i]
        h = ((int(x) * _MIX1 + int(y)) & _LOW63) * _MIX2 & _LOW63
        h = ((h + int(z)) & _LOW63) * _MIX1 & _LOW63
        h = (h ^ (h >> 29)) & mask
        while True:
            j = table[h]
            if j < 0:
                table[h] = i
                out[i] = True
                break
            if a[j] == x and b[j] == y and c[j] == z:
                break
            h = (h + 1) & mask


def byte_row_hashes_kernel(data: npt.NDArray[np.uint8], first: Int64Array, stop: Int64Array,
                           out: Int64Array) -> None:
    """Set ``out[i]`` to a hash of the bytes ``data[first[i]:stop[i]]`` and their number, in
    its low 63 bits: equal byte strings hash equal. The bytes are taken seven at a time (one
    multiply per seven bytes, not per byte). (Compiled.)"""
    for i in range(len(first)):
        low = first[i]
        high = stop[i]
        h = int(high - low) ^ _MIX1
        while low < high:
            top = min(low + 7, high)
            word = 0
            for p in range(low, top):
                word = (word << 8) | int(data[p])  # at most 56 bits: no overflow
            h = ((h ^ word) * _MIX2) & _LOW63
            low = top
        out[i] = h


def first_equal_kernel(data: npt.NDArray[np.uint8], first: Int64Array, stop: Int64Array,
                       hashes: Int64Array, table: Int64Array, out: Int64Array) -> None:
    """Set ``out[i]`` to the first row ``j`` whose bytes ``data[first[j]:stop[j]]`` equal row
    ``i``'s (``hashes`` the rows' :func:`byte_row_hashes_kernel`, ``table`` an
    :func:`_empty_table`, on entry). (Compiled.)"""
    mask = len(table) - 1
    for i in range(len(first)):
        low = first[i]
        width = stop[i] - low
        h = hashes[i]
        h = (h ^ (h >> 29)) & mask
        while True:
            j = table[h]
            if j < 0:
                table[h] = i
                out[i] = i
                break
            other = first[j]
            if stop[j] - other == width and hashes[j] == hashes[i]:
                same = True
                for p in range(width):
                    if data[other + p] != data[low + p]:
                        same = False
                        break
                if same:
                    out[i] = j
                    break
            h = (h + 1) & mask


def rows_increase_kernel(a: Int64Array, b: Int64Array, c: Int64Array) -> bool:
    """Whether the rows ``(a[i], b[i], c[i])`` strictly increase (so are all distinct).
    (Compiled.)"""
    for i in range(1, len(a)):
        if a[i] != a[i - 1]:
            if a[i] < a[i - 1]:
                return False
        elif b[i] != b[i - 1]:
            if b[i] < b[i - 1]:
                return False
        elif c[i] <= c[i - 1]:
            return False
    return True


def last_rows(a: Int64Array, b: Int64Array, c: Int64Array) -> npt.NDArray[np.bool_]:
    """Whether each row is the last of the rows equal to it in all three columns: the rows of
    :func:`last_of_each` ``([a, b, c])``, as a mask (in row order, with no sort). Rows that
    strictly increase (a bulk write built in order, as the engine's are) are all last, found
    in one pass without the hash table."""
    from .jit import compiled  # numba, on first use only

    if compiled(rows_increase_kernel)(a, b, c):
        return np.ones(len(a), dtype=np.bool_)
    out = np.zeros(len(a), dtype=np.bool_)
    compiled(last_rows_kernel)(a, b, c, _empty_table(len(a)), out)
    return out


def first_equal_rows(data: npt.NDArray[np.uint8], first: Int64Array,
                     stop: Int64Array) -> Int64Array:
    """For each byte row ``data[first[i]:stop[i]]``, the first row with the same bytes (equal
    rows get equal numbers; a row new so far gets its own)."""
    from .jit import compiled  # numba, on first use only

    hashes = np.empty(len(first), dtype=np.int64)
    compiled(byte_row_hashes_kernel)(data, first, stop, hashes)
    out = np.empty(len(first), dtype=np.int64)
    compiled(first_equal_kernel)(data, first, stop, hashes, _empty_table(len(first)), out)
    return out


def keyed_row_hashes_kernel(key_hashes: Int64Array, key_index: Int64Array, a: Int64Array,
                            b: Int64Array, out: Int64Array) -> None:
    """Set ``out[i]`` to a hash of row ``i`` in its low 63 bits: its key's hash
    ``key_hashes[key_index[i]]`` (:func:`byte_row_hashes_kernel`), ``a[i]`` and ``b[i]``.
    (Compiled; the compiled form may leave the top bit set, which :func:`keyed_row_hashes`
    clears.)"""
    for i in range(len(a)):
        out[i] = _row_hash(key_hashes[key_index[i]], a[i], b[i])


def _row_hash(key_hash: int, a: int, b: int) -> int:
    """The hash of a row ``(key, a, b)`` from its key's hash, before the caller clears the
    top bit and folds it (:func:`keyed_row_hashes`)."""
    h = ((key_hash * _MIX1 + int(a)) & _LOW63) * _MIX2 & _LOW63
    return ((h + int(b)) & _LOW63) * _MIX1 & _LOW63


def _mark_seen(bits: npt.NDArray[np.uint8], mask: int, value: int) -> int:
    """Set the bit ``value & mask`` of ``bits``; 1 if it was set already, else 0."""
    at = value & mask  # never negative: mask is
    flag = 1 << (at & 7)
    byte = at >> 3
    if bits[byte] & flag:
        return 1
    bits[byte] = bits[byte] | flag
    return 0


def mark_seen_kernel(bits: npt.NDArray[np.uint8], hashes: Int64Array) -> int:
    """Set the bit of each of ``hashes`` (non-negative; its low bits pick one of the
    ``8 * len(bits)`` bits, a power of two) in ``bits``; return how many found theirs set
    already. (Compiled.)"""
    mask = 8 * len(bits) - 1
    known = 0
    for i in range(len(hashes)):
        known += _mark_seen(bits, mask, hashes[i])
    return known


def mark_seen_rows_kernel(bits: npt.NDArray[np.uint8], key_hashes: Int64Array,
                          key_index: Int64Array, a: Int64Array, b: Int64Array) -> int:
    """:func:`mark_seen_kernel` of the rows' :func:`keyed_row_hashes`, each hashed, folded
    and marked in one pass (no array of hashes). (Compiled.)"""
    mask = 8 * len(bits) - 1
    known = 0
    for i in range(len(a)):
        h = _row_hash(key_hashes[key_index[i]], a[i], b[i]) & _LOW63
        known += _mark_seen(bits, mask, h ^ (h >> 29))
    return known


register_helpers({"keyed_row_hashes_kernel": (_row_hash,),
                  "mark_seen_kernel": (_mark_seen,),
                  "mark_seen_rows_kernel": (_row_hash, _mark_seen)})


class SeenBits:
    """A bitmap that counts repeated hashes: :meth:`add` tells how many of the hashes it adds
    it had seen already, an upper bound, never below the true repeats. A hash is one of 32
    bits per ``expected`` hash (at least 4,096), picked by its low bits, so that distinct
    hashes sharing a bit also count: about one in 64 of ``expected`` distinct hashes, more
    when more are added. Costs a bit, not a table slot, per hash: a few hundred kilobytes
    for a log of 100,000 rows, which stay in the processor's cache."""

    __slots__ = ("_bits",)

    def __init__(self, expected: int) -> None:
        self._bits = np.zeros(max(1 << (4 * expected - 1).bit_length(), 512), dtype=np.uint8)

    def add(self, hashes: Int64Array) -> int:
        """Add ``hashes`` (non-negative); return how many were seen already (or came earlier
        in ``hashes``), counting those that share a bit with an earlier one."""
        from .jit import compiled  # numba, on first use only

        return int(compiled(mark_seen_kernel)(self._bits, hashes))

    def add_rows(self, keys: ByteRows, key_index: Int64Array, a: Int64Array,
                 b: Int64Array) -> int:
        """:meth:`add` of the rows' :func:`keyed_row_hashes`, in one compiled pass."""
        from .jit import compiled  # numba, on first use only

        key_hashes = np.empty(len(keys), dtype=np.int64)
        compiled(byte_row_hashes_kernel)(keys.data, keys.first, keys.stop, key_hashes)
        return int(compiled(mark_seen_rows_kernel)(self._bits, key_hashes, key_index, a, b))


def keyed_row_hashes(keys: ByteRows, key_index: Int64Array, a: Int64Array,
                     b: Int64Array) -> Int64Array:
    """A 63-bit hash of each row ``(keys[key_index[i]], a[i], b[i])``: equal rows hash equal."""
    from .jit import compiled  # numba, on first use only

    key_hashes = np.empty(len(keys), dtype=np.int64)
    compiled(byte_row_hashes_kernel)(keys.data, keys.first, keys.stop, key_hashes)
    out = np.empty(len(a), dtype=np.int64)
    compiled(keyed_row_hashes_kernel)(key_hashes, key_index, a, b, out)
    out &= _LOW63
    out ^= out >> 29
    return out


def factorize_kernel(values: Int64Array, table: Int64Array, codes: Int64Array,
                     uniques: Int64Array) -> int:
    """Set ``codes[i]`` to the position of ``values[i]`` among the distinct values in
    first-seen order, which it writes to ``uniques``; return how many there are (``table``
    an :func:`_empty_table` on entry). (Compiled.)"""
    mask = len(table) - 1
    size = 0
    for i in range(len(values)):
        v = values[i]
        h = (int(v) * _MIX1) & _LOW63
        h = (h ^ (h >> 29)) & mask
        while True:
            j = table[h]
            if j < 0:
                table[h] = size
                uniques[size] = v
                codes[i] = size
                size += 1
                break
            if uniques[j] == v:
                codes[i] = j
                break
            h = (h + 1) & mask
    return size


def factorize_dense_kernel(values: Int64Array, low: int, table: Int64Array, codes: Int64Array,
                           uniques: Int64Array) -> int:
    """:func:`factorize_kernel` for values within ``low .. low + len(table) - 1``: each value's
    slot is its offset from ``low`` (``table`` all -1 on entry), no hash. (Compiled.)"""
    size = 0
    for i in range(len(values)):
        s = values[i] - low
        if table[s] < 0:  # first seen
            table[s] = size
            uniques[size] = values[i]
            size += 1
        codes[i] = table[s]
    return size


def factorize(values: Int64Array) -> tuple[Int64Array, Int64Array]:
    """``(codes, uniques)``: the distinct values in first-seen order and each value's position
    among them (what Arrow's ``dictionary_encode`` gives), with one compiled pass: indexed by
    the value's offset when the values span fewer than twice their count (keys numbered from
    a base: a table smaller than the hash table's), else hashed."""
    from .jit import compiled  # numba, on first use only

    n = len(values)
    codes = np.empty(n, dtype=np.int64)
    uniques = np.empty(n, dtype=np.int64)
    low = int(values.min()) if n else 0
    span = int(values.max()) - low + 1 if n else 0  # Python ints: no int64 overflow
    if n and span <= 2 * n:
        table = np.full(span, -1, dtype=np.int64)
        size = compiled(factorize_dense_kernel)(values, low, table, codes, uniques)
    else:
        size = compiled(factorize_kernel)(values, _empty_table(n), codes, uniques)
    return codes, uniques[:size].copy()


def length_prefixed_rows(pieces: list[bytes]
                         ) -> tuple[npt.NDArray[np.uint8], Int64Array, Int64Array]:
    """Byte strings that each begin with the length of the rest (4 bytes, big-endian: the
    store's key encodings) joined into one buffer, and where each starts and stops in it.

    The buffer is cut by reading those lengths (compiled) rather than by taking each piece's
    ``len`` in Python.

    Raises:
        ValueError: the buffer is not ``len(pieces)`` such strings.
    """
    from .jit import compiled  # numba, on first use only

    n = len(pieces)
    data = np.frombuffer(b"".join(pieces), dtype=np.uint8)
    first = np.empty(n, dtype=np.int64)
    stop = np.empty(n, dtype=np.int64)
    if not compiled(length_prefixed_kernel)(data, first, stop):
        raise ValueError(f"the {n} byte strings are not length-prefixed")
    return data, first, stop


def length_prefixed_kernel(data: npt.NDArray[np.uint8], first: Int64Array,
                           stop: Int64Array) -> bool:
    """Cut ``data`` into ``len(first)`` length-prefixed strings, writing where each starts
    and stops; False when ``data`` is not exactly that many of them. (Compiled.)"""
    at = 0
    size = len(data)
    for i in range(len(first)):
        if at + 4 > size:
            return False
        length = ((int(data[at]) << 24) | (int(data[at + 1]) << 16)
                  | (int(data[at + 2]) << 8) | int(data[at + 3]))
        first[i] = at
        at += 4 + length
        if at > size:
            return False
        stop[i] = at
    return at == size


# -- byte rows: many byte strings in one buffer --------------------------------------------


class ByteRows:
    """Byte strings held as rows of one buffer, with no Python object per string: row ``i`` is
    ``data[first[i]:stop[i]]``. ``stride`` is set when row ``i`` starts at ``i * stride`` and
    has at most ``stride`` bytes (a zero-padded byte matrix, flattened): gathering such rows is
    a matrix row gather, and cutting them a matrix view per distinct length.

    Build them with :meth:`of_list`, :meth:`of_matrix` or :meth:`of_matrix_rows`; the
    constructor takes the columns as they are. Never changed once built (logs share them).
    """

    __slots__ = ("data", "first", "stop", "stride")

    def __init__(self, data: npt.NDArray[np.uint8], first: Int64Array, stop: Int64Array,
                 stride: int | None = None) -> None:
        self.data = data
        self.first = first
        self.stop = stop
        self.stride = stride

    def __len__(self) -> int:
        return len(self.first)

    #: :meth:`of_list` pads pieces up to this long into a matrix (longer ones: one buffer)
    MAX_STRIDE = 256

    @classmethod
    def of_list(cls, pieces: list[bytes]) -> ByteRows:
        """The rows of ``pieces``, in order."""
        n = len(pieces)
        lengths = np.fromiter(map(len, pieces), dtype=np.int64, count=n)
        longest = int(lengths.max()) if n else 0
        if 0 < longest <= cls.MAX_STRIDE:
            # numpy's fixed-width bytes pad with zeros, and the raw buffer keeps a piece's own
            # trailing zeros (the lengths say where each ends)
            fixed = np.array(pieces, dtype=f"S{longest}")
            return cls.of_matrix_rows(fixed.view(np.uint8).reshape(n, longest), lengths)
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        data = np.frombuffer(b"".join(pieces), dtype=np.uint8)
        return cls(data, offsets[:-1], offsets[1:], 0 if n and not longest else None)

    @classmethod
    def of_matrix(cls, matrix: npt.NDArray[np.uint8]) -> ByteRows:
        """Each row of the two-dimensional ``matrix`` as one byte string."""
        return cls.of_matrix_rows(matrix, np.full(len(matrix), matrix.shape[1], dtype=np.int64))

    @classmethod
    def of_matrix_rows(cls, matrix: npt.NDArray[np.uint8], lengths: Int64Array) -> ByteRows:
        """Row ``i`` of the zero-padded ``matrix`` cut at ``lengths[i]`` bytes."""
        n, width = matrix.shape
        first = np.arange(n, dtype=np.int64) * width
        return cls(np.ascontiguousarray(matrix).reshape(-1), first, first + lengths, width)

    def _matrix(self) -> npt.NDArray[np.uint8]:
        assert self.stride is not None
        return self.data.reshape(len(self.first), self.stride)

    def take(self, rows: Int64Array) -> ByteRows:
        """The rows ``rows``, in that order, in a buffer of their own."""
        if self.stride is not None:
            # np.take gathers whole rows several times faster than fancy indexing
            return ByteRows.of_matrix_rows(np.take(self._matrix(), rows, axis=0),
                                           np.take(self.stop - self.first, rows))
        first = self.first[rows]
        lengths = self.stop[rows] - first
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        where = (np.arange(int(offsets[-1]), dtype=np.int64)
                 + np.repeat(first - offsets[:-1], lengths))
        return ByteRows(self.data[where], offsets[:-1], offsets[1:])

    @staticmethod
    def concat(parts: list[ByteRows]) -> ByteRows:
        """The rows of ``parts``, one after another, in one buffer."""
        if len(parts) == 1:
            return parts[0]
        if not parts:
            return ByteRows.of_list([])
        lengths = np.concatenate([part.stop - part.first for part in parts])
        strides = [part.stride for part in parts]
        if None not in strides:
            widest = max(stride for stride in strides if stride is not None)
            if all(stride == widest for stride in strides):  # one width: the buffers as they are
                return ByteRows.of_matrix_rows(
                    np.concatenate([part.data for part in parts]).reshape(len(lengths), widest),
                    lengths)
            matrix = np.zeros((len(lengths), widest), dtype=np.uint8)
            at = 0
            for part in parts:
                rows = part._matrix()
                matrix[at:at + len(rows), :rows.shape[1]] = rows
                at += len(rows)
            return ByteRows.of_matrix_rows(matrix, lengths)
        data = np.concatenate([part.data for part in parts])
        shifts = np.cumsum([0] + [len(part.data) for part in parts[:-1]])
        first = np.concatenate([part.first + shift
                                for part, shift in zip(parts, shifts, strict=True)])
        return ByteRows(data, first, first + lengths)

    def tolist(self, rows: Int64Array | None = None) -> list[bytes]:
        """The rows (those of ``rows``, in that order) as bytes objects: one numpy cut per
        distinct row length, not a slice per row."""
        first, stop = (self.first, self.stop) if rows is None \
            else (self.first[rows], self.stop[rows])
        n = len(first)
        if n == 0:
            return []
        lengths = stop - first
        stride = self.stride
        matrix = None
        if stride is not None:
            matrix = self._matrix() if rows is None else np.take(self._matrix(), rows, axis=0)
        low, high = int(lengths.min()), int(lengths.max())
        if low == high:
            return _cut_rows(self.data, first, low, matrix)
        out = np.empty(n, dtype=object)
        for length in np.flatnonzero(np.bincount(lengths - low)).tolist():
            at = np.flatnonzero(lengths == length + low)
            out[at] = _cut_rows(self.data, first[at], length + low,
                                None if matrix is None else np.take(matrix, at, axis=0))
        listed: list[bytes] = out.tolist()
        return listed


def _cut_rows(data: npt.NDArray[np.uint8], first: Int64Array, width: int,
              matrix: npt.NDArray[np.uint8] | None) -> list[bytes]:
    """Rows of ``width`` bytes as bytes objects: ``data[first[i]:first[i] + width]``, or, when
    given, the first ``width`` bytes of each row of ``matrix`` (the same rows, padded)."""
    if width == 0:
        return [b""] * len(first)
    if matrix is None:
        matrix = data[first[:, None] + np.arange(width, dtype=np.int64)]
    elif matrix.shape[1] != width:
        matrix = np.ascontiguousarray(matrix[:, :width])
    cut: list[bytes] = np.ascontiguousarray(matrix).view(f"V{width}").ravel().tolist()
    return cut


_T = TypeVar("_T")


class ListBacked(Sequence[_T]):
    """A sequence held in another form, read through the list :meth:`as_list` builds (once,
    in a subclass) when an item is first read."""

    __slots__ = ()

    def as_list(self) -> list[_T]:
        """The items as a list."""
        raise NotImplementedError

    @overload
    def __getitem__(self, index: int) -> _T: ...

    @overload
    def __getitem__(self, index: slice) -> list[_T]: ...

    def __getitem__(self, index: int | slice) -> _T | list[_T]:
        return self.as_list()[index]

    def __iter__(self) -> Iterator[_T]:
        return iter(self.as_list())


class LazyBytesList(ListBacked[bytes]):
    """A sequence of byte strings held as :class:`ByteRows` (:meth:`rows`) and cut into bytes
    objects only when first read as a sequence (then kept): for values a consumer may take as
    rows, with no Python object per string, or as a list."""

    __slots__ = ("_cut",)

    def __init__(self, cut: list[bytes] | None = None) -> None:
        self._cut = cut

    def rows(self) -> ByteRows:
        """The strings as byte rows."""
        raise NotImplementedError

    def as_list(self) -> list[bytes]:
        """The strings as bytes objects (cut once, then kept)."""
        if self._cut is None:
            self._cut = self.rows().tolist()
        return self._cut

    def __len__(self) -> int:
        return len(self._cut) if self._cut is not None else len(self.rows())
