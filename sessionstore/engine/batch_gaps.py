"""The per-event gaps of a batch (windows whose gap comes with each event): validated as a
column, before any change, by the batch paths (:mod:`.batch`, :mod:`.fast_batch`,
:mod:`.tables`)."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from .. import batch as columns
from ..timeutil import INT64_MAX, duration_ms
from ..windows import latest_event_time_ms

if TYPE_CHECKING:
    from .host import EngineHost


class EventGaps:
    """The validated dynamic gaps of a batch: ``gaps`` (int64, 0 where invalid) and ``kept``
    (the rows whose gap is valid, ascending); the other rows are dropped."""

    __slots__ = ("gaps", "kept", "dropped")

    def __init__(self, gaps: np.ndarray, kept: np.ndarray, n: int) -> None:
        self.gaps = gaps
        self.kept = kept
        self.dropped = n - len(kept)


def event_gaps(engine: EngineHost, values: Any, times: np.ndarray,
               name: str) -> EventGaps:
    """Validate a batch's per-event gaps (vectorised for integer columns).

    A null or ``<= 0`` gap marks its row dropped. Raises (naming ``name``, the row and both
    values) for a gap above ``max_gap_ms``, and for ``t + gap + grace`` beyond int64.

    Raises:
        TypeError: a column that is not integer durations (floats included), naming the row.
        ValueError: as above; a length mismatch.
    """
    n = len(times)
    gaps, valid = _gap_column(values, n, name)
    cfg = engine.config
    valid &= gaps > 0
    over = valid & (gaps > cfg.max_gap_ms)
    if over.any():
        row = int(np.argmax(over))
        raise ValueError(f"{name}[{row}] = {int(gaps[row])} exceeds max_gap_ms = "
                         f"{cfg.max_gap_ms} (event at {int(times[row])})")
    gaps = np.where(valid, gaps, 0)
    # t + gap + grace must fit int64; gap <= max_gap_ms, so INT64_MAX - gap - grace cannot wrap
    overflow = valid & (times > latest_event_time_ms(gaps, cfg.grace_ms))
    if overflow.any():
        row = int(np.argmax(overflow))
        raise ValueError(f"timestamps_ms[{row}] = {int(times[row])}: + {name}[{row}] "
                         f"({int(gaps[row])}) + grace_ms overflows int64")
    kept = np.flatnonzero(valid).astype(np.int64)
    return EventGaps(gaps.astype(np.int64), kept, n)


def _gap_column(values: Any, n: int, name: str) -> tuple[np.ndarray, np.ndarray]:
    """``(gaps, valid)``: int64 gaps (0 where null) and where they are not null."""
    arrow = values
    if isinstance(values, list) or (hasattr(values, "to_numpy")  # lists, pandas Series
                                    and not isinstance(values, np.ndarray | pa.Array
                                                       | pa.ChunkedArray)):
        with contextlib.suppress(pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError,
                                 ValueError):
            arrow = pa.array(values)
    if isinstance(arrow, pa.ChunkedArray):
        arrow = arrow.combine_chunks()
    if isinstance(arrow, pa.Array) and (pa.types.is_integer(arrow.type)
                                        or pa.types.is_null(arrow.type)):
        if len(arrow) != n:
            raise ValueError(f"{name} has {len(arrow)} rows, timestamps_ms has {n}")
        valid = arrow.is_valid().to_numpy(zero_copy_only=False).astype(np.bool_)
        if pa.types.is_null(arrow.type):
            return np.zeros(n, dtype=np.int64), valid
        raw = arrow.fill_null(0).to_numpy(zero_copy_only=False)
        if raw.dtype == np.uint64 and len(raw) and raw.max() > INT64_MAX:
            row = int(np.argmax(raw > INT64_MAX))
            raise ValueError(f"{name}[{row}] = {raw[row]} does not fit in int64")
        return raw.astype(np.int64), valid
    column = columns.as_column(values, name)
    if len(column) != n:
        raise ValueError(f"{name} has {len(column)} rows, timestamps_ms has {n}")
    if isinstance(column, np.ndarray) and column.dtype.kind in "iu" \
            and column.dtype != np.uint64:
        return column.astype(np.int64), np.ones(n, dtype=np.bool_)
    items = column.tolist() if isinstance(column, np.ndarray) else list(column)
    gaps = np.zeros(n, dtype=np.int64)
    valid = np.ones(n, dtype=np.bool_)
    for row, item in enumerate(items):  # durations one by one: the error names the row
        if item is None or _is_missing(item):
            valid[row] = False
        else:
            gaps[row] = duration_ms(item, f"{name}[{row}]")
    return gaps, valid


def _is_missing(item: Any) -> bool:
    """pandas' NA and NaT (a null in a pandas column), without importing pandas. A float NaN
    is not missing: floats are refused, as in the time column."""
    return type(item).__name__ in ("NAType", "NaTType")


def count_invalid_gaps(engine: EngineHost, gaps: EventGaps | None) -> None:
    """Count the batch's events dropped for an invalid gap (after the batch succeeded)."""
    if gaps is None or not gaps.dropped:
        return
    metrics = engine.metrics
    metrics.records_in += gaps.dropped
    metrics.dropped += gaps.dropped
    metrics.dropped_invalid_gap += gaps.dropped
