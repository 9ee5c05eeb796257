"""Key codes and the (key, time) order of a table's rows.

Each key column is dictionary-encoded (a hash pass) and its dictionary sorted, so that codes
follow the values' own order; several key columns combine into one code in lexicographic order.
Rows are then ordered by (code, time), ties by arrival (row order) when the caller needs it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from ..errors import FLOAT_KEY_HINT
from .frame import Frame, arrow_of, as_numpy, first_null

Int64Array = npt.NDArray[np.int64]


def _column_codes(column: Any, data_type: pa.DataType, name: str) -> tuple[Int64Array, int]:
    """Codes of one key column in the order of its values, and how many codes there may be
    (codes need not all be used).

    Integers whose range is small are their own codes (minus the smallest); other columns are
    dictionary-encoded (a hash pass) and the dictionary sorted.
    """
    if len(column) == 0:  # also an untyped (null) column of no rows: an empty frame's
        return np.zeros(0, dtype=np.int64), 0  # object column, which has no key to refuse
    if isinstance(column, np.ndarray):
        if column.dtype.kind in "iu":
            low = column.min()
            span = int(column.max()) - int(low)
            if span < 2**31:
                # signed: widen first, as (column - low) wraps in int8/int16 past half the range
                codes = column.astype(np.int64, copy=False) - np.int64(low) \
                    if column.dtype.kind == "i" else (column - low).astype(np.int64, copy=False)
                return codes, span + 1
        column = arrow_of(column, data_type)
    row = first_null(column)
    if row is not None:
        raise ValueError(f"key column {name!r} is null at row {row}: every event needs a key "
                         f"(as in the CLI and the engine, a null key is refused, not dropped)")
    check_key_type(data_type, name)
    column = sortable(column)
    import pyarrow.compute as pc  # here: its import costs ~70 ms, integer keys need none

    encoded = pc.dictionary_encode(column)
    dictionary = encoded.dictionary
    rank = np.empty(len(dictionary), dtype=np.int64)
    rank[as_numpy(pc.sort_indices(dictionary))] = np.arange(len(dictionary), dtype=np.int64)
    indices = as_numpy(encoded.indices)
    return rank[indices], len(dictionary)


def sortable(column: Any) -> Any:
    """A key column in a type Arrow sorts: a dictionary column's values (``sort_indices`` has
    no kernel for dictionaries)."""
    data_type = column.type
    return column.cast(data_type.value_type) if pa.types.is_dictionary(data_type) else column


def check_key_type(data_type: pa.DataType, name: str) -> None:
    """The key types of the bounded path: integers, strings, binary, dates, timestamps,
    decimals and booleans, or a dictionary of them. Floats are refused, as the engine and the
    Spark adapter refuse them: grouping by a float's bits would keep -0.0 apart from 0.0, which
    Spark groups together (docs/semantics.md).

    Raises:
        ValueError: naming the column and its type.
    """
    value_type = data_type.value_type if pa.types.is_dictionary(data_type) else data_type
    if pa.types.is_floating(value_type):
        raise ValueError(f"key column {name!r} has type {data_type}; {FLOAT_KEY_HINT}")
    if not _orderable(data_type):
        raise ValueError(f"key column {name!r} has type {data_type}, which cannot be a key "
                         f"(use atomic columns: integers, strings, binary, dates, timestamps, "
                         f"decimals, booleans)")


def _orderable(data_type: pa.DataType) -> bool:
    t = pa.types
    if t.is_dictionary(data_type):
        return _orderable(data_type.value_type)
    return bool(t.is_integer(data_type) or t.is_decimal(data_type)
                or t.is_string(data_type) or t.is_large_string(data_type)
                or t.is_binary(data_type) or t.is_large_binary(data_type)
                or t.is_boolean(data_type) or t.is_date(data_type)
                or t.is_timestamp(data_type) or t.is_fixed_size_binary(data_type))


def key_codes(frame: Frame, keys: Sequence[str]) -> tuple[Int64Array, int]:
    """One int64 code per row for the key columns, ``0 <= code < count``, ordered as the key
    tuples are (column by column, each by its values' order).

    Raises:
        ValueError: a null key (naming the column and the row), or a column type that cannot
            be a key.
    """
    codes, count = _column_codes(frame.columns[keys[0]], frame.types[keys[0]], keys[0])
    for name in keys[1:]:
        more, more_count = _column_codes(frame.columns[name], frame.types[name], name)
        codes = codes * np.int64(more_count) + more  # count < 2**31 here: this fits
        count *= more_count
        if count >= 2**31:  # keep codes small: they are packed with times for sorting
            unique, inverse = np.unique(codes, return_inverse=True)
            codes, count = inverse.astype(np.int64), len(unique)
    return codes, count


def buckets(codes: Int64Array, count: int, rows_per_bucket: int
            ) -> Iterator[Int64Array] | None:
    """The rows of each range of codes, ranges in code order, about ``rows_per_bucket`` rows
    each (row order kept within a bucket), one bucket at a time; None when one would do.

    Sessionizing bucket by bucket keeps the working set (and the sorts) small and
    cache-friendly. Only a one- or two-byte bucket number per row is held for all rows; each
    bucket's rows are found when its turn comes.
    """
    n = len(codes)
    parts = min(n // max(rows_per_bucket, 1), count, 4096)
    if parts < 2:
        return None
    bucket = np.empty(n, dtype=np.uint8 if parts <= 256 else np.uint16)
    step = 1 << 20  # in slices, so that no int64 temporary spans the input
    for at in range(0, n, step):
        bucket[at:at + step] = (codes[at:at + step] * np.int64(parts)) // np.int64(count)
    return (np.flatnonzero(bucket == b) for b in range(parts))


def sort_rows(codes: Int64Array, times: Int64Array, *, stable: bool) -> Int64Array | None:
    """The permutation that orders rows by (code, time), ties by row order when ``stable``;
    None when the rows are in that order already.

    When codes and times fit in 63 bits together they are packed into one int64 and sorted
    once; otherwise ``np.lexsort`` sorts by both.
    """
    n = len(codes)
    if n == 0:
        return None
    low = int(times.min())
    span = int(times.max()) - low
    code_low = int(codes.min())
    code_bits = (int(codes.max()) - code_low).bit_length()
    time_bits = span.bit_length()
    if code_bits + time_bits <= 63:
        packed = (times - np.int64(low)) if time_bits else np.zeros(n, dtype=np.int64)
        if code_bits:
            packed |= (codes - np.int64(code_low)) << np.int64(time_bits)
        if n < 2 or bool((packed[1:] >= packed[:-1]).all()):
            return None
        return np.argsort(packed, kind="stable" if stable else "quicksort").astype(
            np.int64, copy=False)
    ordered = (codes[1:] > codes[:-1]) | ((codes[1:] == codes[:-1]) & (times[1:] >= times[:-1]))
    if bool(ordered.all()):
        return None
    return np.lexsort((times, codes)).astype(np.int64, copy=False)
