"""Columnar input for the batch path: validation, key factorisation, watermarks and runs.

Everything here is vectorised with numpy/pyarrow and free of engine state, so the engine's
``process_batch`` can check a whole batch before touching state, and cut it into *runs*: the
events of one key whose own windows chain together. See :meth:`SessionAggregator.process_batch`
for when runs may stand in for a loop of ``process`` calls.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import keyschema
from .gap_boundary import reaches
from .timeutil import timestamp_ms as to_timestamp_ms


def as_column(values: Any, name: str) -> Any:
    """Accept a sequence, numpy array, pandas Series or Arrow (chunked) array."""
    if isinstance(values, np.ndarray):
        return values
    if isinstance(values, pa.Array | pa.ChunkedArray):
        return values.to_numpy(zero_copy_only=False)
    if hasattr(values, "to_numpy"):
        return values.to_numpy()
    if isinstance(values, str | bytes) or not isinstance(values, Iterable):
        raise TypeError(f"{name} must be a sequence or array, got {type(values).__name__}")
    return list(values)


def as_list(values: Any, name: str) -> list[Any]:
    column = as_column(values, name)
    return column.tolist() if isinstance(column, np.ndarray) else list(column)


def timestamps(values: Any, n: int) -> np.ndarray:
    """Validate a column of event times; return int64 milliseconds.

    Raises:
        TypeError: a float, string, bool or other non-integer column (NaN and inf included).
        ValueError: a null, a length mismatch, or a value outside int64.
    """
    if isinstance(values, pa.Array | pa.ChunkedArray) and values.null_count:
        raise ValueError("timestamps_ms must not contain nulls")
    column = as_column(values, "timestamps_ms")
    if len(column) == 0:
        if n:
            raise ValueError(f"timestamps_ms has 0 rows, keys has {n}")
        return np.empty(0, dtype=np.int64)
    if isinstance(column, list):
        try:
            inferred = np.array(column)
        except (ValueError, OverflowError):
            inferred = None
        if inferred is not None and inferred.dtype.kind in "if":
            column = inferred
    if isinstance(column, np.ndarray) and column.ndim != 1:
        raise TypeError(f"timestamps_ms must be a flat column, got an array of shape "
                        f"{column.shape}")
    if isinstance(column, np.ndarray) and column.dtype.kind == "M":
        if np.isnat(column).any():
            raise ValueError("timestamps_ms must not contain nulls")
        out = column.astype("datetime64[ms]").astype(np.int64)
    elif isinstance(column, np.ndarray) and column.dtype.kind in "iu" and column.dtype != np.uint64:
        out = column.astype(np.int64)
    elif isinstance(column, np.ndarray) and column.dtype.kind == "f":
        sample = column[~np.isfinite(column)][:1].tolist() or column[:1].tolist()
        raise TypeError(
            f"timestamps_ms must be integers (int64 milliseconds), got a float column "
            f"(e.g. {sample[0]!r})"
        )
    else:
        items = column.tolist() if isinstance(column, np.ndarray) else column
        converted = []
        for item in items:
            if item is None:
                raise ValueError("timestamps_ms must not contain nulls")
            converted.append(to_timestamp_ms(item, "timestamps_ms"))
        out = np.array(converted, dtype=np.int64)
    if len(out) != n:
        raise ValueError(f"timestamps_ms has {len(out)} rows, keys has {n}")
    return out


def factorize_keys(keys: list[Any]) -> tuple[np.ndarray, list[Any]]:
    """Return (codes, uniques) with ``keys[i] == uniques[codes[i]]``, validating every key.

    Homogeneous str, bytes or int keys are factorised by Arrow; anything else row by row.

    Raises:
        ValueError / TypeError: a key the store refuses, naming its row: ``keys[3]: ...``.
    """
    codes, uniques, _ = factorize_keys_arrow(keys)
    return codes, uniques


def _inferred_exactly(arrow_type: Any, keys: Any) -> bool:
    """Whether Arrow's inferred type for Python objects ``keys`` keeps every key as the event
    path keys it: Arrow reads ``"a"`` and ``b"a"`` together as binary, and numpy scalars as
    plain values, where :meth:`process` keeps str apart from bytes and refuses numpy scalars."""
    kinds = set(map(type, keys))
    if pa.types.is_integer(arrow_type):
        return kinds <= {int}
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return kinds <= {str}
    if pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type):
        return kinds <= {bytes}
    return True


def factorize_keys_arrow(keys: Any, name: str = "keys") -> tuple[np.ndarray, list[Any], Any]:
    """:func:`factorize_keys`, also returning the uniques as an Arrow array (None when the keys
    are not homogeneous ints, str or bytes). ``keys`` may be a list or an Arrow array."""
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    if isinstance(keys, pa.Array):
        arr: Any = keys
        if arr.null_count:
            row = int(np.argmax(arr.is_null().to_numpy(zero_copy_only=False)))
            raise ValueError(f"{name}[{row}] is null: a key must not be None")
    else:
        try:
            arr = pa.array(keys)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError):
            arr = None
        if (arr is not None and str(getattr(keys, "dtype", "object")) == "object"
                and not _inferred_exactly(arr.type, keys)):
            arr = None  # e.g. str and bytes together, or numpy scalars: keyed one by one
    if arr is not None and arr.null_count == 0 and (
        pa.types.is_integer(arr.type) or pa.types.is_string(arr.type)
        or pa.types.is_binary(arr.type) or pa.types.is_large_string(arr.type)
        or pa.types.is_large_binary(arr.type)
    ):
        encoded = arr.dictionary_encode()
        arrow_codes = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        dictionary = encoded.dictionary
        arrow_uniques: list[Any] = dictionary.to_pylist()
        if _all_valid_keys(dictionary):
            return arrow_codes, arrow_uniques, dictionary
        for code, key in enumerate(arrow_uniques):
            try:
                keyschema.encode_key(key)
            except (TypeError, ValueError):
                _check_key(key, int(np.argmax(arrow_codes == code)), name)
        return arrow_codes, arrow_uniques, dictionary
    if isinstance(keys, pa.Array):
        keys = keys.to_pylist()
    mapping: dict[tuple[type, Any], int] = {}
    codes = np.empty(len(keys), dtype=np.int64)
    uniques: list[Any] = []
    for row, key in enumerate(keys):
        _check_key(key, row, name)
        marker = (type(key), key)
        found = mapping.get(marker)
        if found is None:
            found = mapping[marker] = len(uniques)
            uniques.append(key)
        codes[row] = found
    return codes, uniques, None


def _all_valid_keys(keys: pa.Array) -> bool:
    """True when every key of an Arrow int or string/binary array is one the store takes:
    ints that fit in int64, and strings short enough (checked in bulk, not key by key)."""
    if pa.types.is_integer(keys.type):
        return not pa.types.is_uint64(keys.type) or len(keys) == 0 \
            or pc.max(keys).as_py() <= np.iinfo(np.int64).max
    if len(keys) == 0:
        return True
    longest = pc.max(pc.binary_length(keys)).as_py()
    return longest is not None and longest < keyschema.MAX_KEY_BYTES // 2


def _check_key(key: Any, row: int, name: str = "keys") -> None:
    try:
        keyschema.encode_key(key)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{name}[{row}]: {exc}") from None


@dataclass
class Runs:
    """Runs of one batch segment, in (key code, first time) order.

    ``order`` sorts the segment's accepted events by (key code, time, arrival); run ``r`` covers
    ``order[bounds[r]:bounds[r + 1]]``.
    """

    order: np.ndarray
    bounds: np.ndarray
    codes: np.ndarray
    first_ms: np.ndarray
    last_ms: np.ndarray


def runs(codes: np.ndarray, times_ms: np.ndarray, seqs: np.ndarray, gap_ms: int,
         inclusive_gap: bool) -> Runs:
    """Split events into runs: same key, each event within reach of the previous one's window."""
    order = np.lexsort((seqs, times_ms, codes))
    sorted_codes = codes[order]
    sorted_times = times_ms[order]
    if len(order) == 0:
        empty = np.empty(0, dtype=np.int64)
        return Runs(order, np.zeros(1, dtype=np.int64), empty, empty, empty)
    apart = ~reaches(sorted_times[:-1] + gap_ms, sorted_times[1:], inclusive_gap)
    breaks = np.flatnonzero((sorted_codes[1:] != sorted_codes[:-1]) | apart) + 1
    starts = np.concatenate(([0], breaks))
    bounds = np.concatenate((starts, [len(order)]))
    return Runs(order, bounds, sorted_codes[starts], sorted_times[starts],
                sorted_times[bounds[1:] - 1])
