"""The arguments of :func:`sessionstore.sessionize`, checked and in the time column's units.

Times are handled as int64 counts of the time column's own unit ("ticks"): a timestamp column's
unit (microseconds stay microseconds), seconds for a date32, milliseconds for a date64, and for an
integer column the unit ``time_unit`` names (or, without it, whatever the column counts: a gap is
then an integer in the same unit).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from .. import aggspec
from ..timeutil import duration_fraction, duration_ms
from .frame import as_numpy

Int64Array = npt.NDArray[np.int64]
INT64_MAX = 2**63 - 1
TICKS_PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}
SESSION_COLUMNS = ("session_start", "session_end")
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgt]i?b?|b)?\s*$", re.I)
_SIZE_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9,
               "gb": 10**9, "t": 10**12, "tb": 10**12, "ki": 2**10, "kib": 2**10,
               "mi": 2**20, "mib": 2**20, "gi": 2**30, "gib": 2**30, "ti": 2**40,
               "tib": 2**40}


def default_memory_limit() -> int:
    """A quarter of physical memory, at most 2 GiB and at least 256 MiB (1 GiB when the
    machine does not say)."""
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 2**30
    return max(256 * 2**20, min(2 * 2**30, physical // 4))


def memory_limit_bytes(value: Any) -> int:
    """``memory_limit`` in bytes: None (the default), an int, or a string such as ``"1GB"``,
    ``"512 MiB"`` (KB/MB/GB are powers of 1000, KiB/MiB/GiB of 1024).

    Raises:
        ValueError / TypeError: naming ``memory_limit``.
    """
    if value is None:
        return default_memory_limit()
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TypeError(f"memory_limit must be a number of bytes or a string like '1GB', got "
                        f"{value!r}")
    if isinstance(value, int):
        size = value
    else:
        match = _SIZE.match(value)
        if match is None or (match.group(2) or "").lower() not in _SIZE_UNITS:
            raise ValueError(f"memory_limit {value!r} is not a size such as '512MB' or '1GiB'")
        size = int(float(match.group(1)) * _SIZE_UNITS[(match.group(2) or "").lower()])
    if size <= 0:
        raise ValueError(f"memory_limit must be > 0 bytes, got {value!r}")
    return size


@dataclass(frozen=True)
class TimeKind:
    """How the time column is read.

    Attributes:
        unit: "s", "ms", "us" or "ns" (the ticks' unit), or None for integers without
            ``time_unit`` (ticks are whatever the column counts).
        out_type: the type of ``session_start``/``session_end``.
        dates: the column holds dates, whose ticks (seconds or milliseconds) are not the unit
            a reader of the column counts in, a day: a duration must then say its unit.
    """

    unit: str | None
    out_type: pa.DataType
    dates: bool = False


def time_kind(data_type: pa.DataType, name: str, time_unit: str | None) -> TimeKind:
    """The :class:`TimeKind` of a time column of ``data_type``.

    Raises:
        ValueError: an unknown ``time_unit``, or one that contradicts a timestamp's own unit.
        TypeError: a column that is neither timestamp, date nor integer (naming ``time``).
    """
    if time_unit is not None and time_unit not in TICKS_PER_SECOND:
        raise ValueError(f"time_unit must be one of {', '.join(TICKS_PER_SECOND)}, got "
                         f"{time_unit!r}")
    t = pa.types
    if t.is_timestamp(data_type):
        if time_unit is not None and time_unit != data_type.unit:
            raise ValueError(f"time_unit {time_unit!r} contradicts the time column {name!r}, "
                             f"a {data_type} (leave time_unit out for timestamps)")
        return TimeKind(data_type.unit, data_type)
    if t.is_date32(data_type) or t.is_date64(data_type):
        unit = "s" if t.is_date32(data_type) else "ms"
        if time_unit is not None:
            raise ValueError(f"time_unit {time_unit!r} does not apply to the time column "
                             f"{name!r}, a {data_type} (leave time_unit out for dates)")
        return TimeKind(unit, pa.timestamp(unit), dates=True)
    if t.is_integer(data_type):
        return TimeKind(time_unit, pa.int64())
    raise TypeError(f"time column {name!r} has type {data_type}: it must hold timestamps, "
                    f"dates or integers (cast floats or strings first)")


def time_ticks(column: Any, name: str, first_row: int = 0) -> Int64Array:
    """The time column as int64 ticks (see the module docstring).

    Raises:
        ValueError: a null time (naming the column and the row: every event needs a time, as
            in the CLI and the engine), or an unsigned value beyond int64.
    """
    if isinstance(column, np.ndarray):  # integers without nulls (see Frame)
        values = column
    elif column.null_count:
        row = int(np.argmax(column.is_null().to_numpy(zero_copy_only=False)))
        raise ValueError(f"time column {name!r} is null at row {first_row + row}: every event "
                         f"needs a time")
    else:
        values = None
    if values is not None:
        return _checked_int64(values, name, first_row)
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    data_type = column.type
    if pa.types.is_date32(data_type):
        return as_numpy(column.view(pa.int32())).astype(np.int64) * np.int64(86_400)
    if pa.types.is_timestamp(data_type) or pa.types.is_date64(data_type):
        return cast(Int64Array, as_numpy(column.view(pa.int64())))
    return _checked_int64(as_numpy(column), name, first_row)


def _checked_int64(values: Any, name: str, first_row: int) -> Int64Array:
    if values.dtype.kind == "f":
        raise TypeError(f"time column {name!r} has type {values.dtype}: it must hold "
                        f"timestamps, dates or integers (cast floats or strings first)")
    if values.dtype == np.uint64 and len(values) and values.max() > INT64_MAX:
        row = int(np.argmax(values > INT64_MAX))
        raise ValueError(f"time column {name!r} holds {values[row]} at row {first_row + row}, "
                         f"beyond int64")
    return cast(Int64Array, values.astype(np.int64, copy=False))


def duration_ticks(value: Any, name: str, kind: TimeKind, time_name: str) -> int:
    """A duration argument (``gap``, ``max_gap``, ``max_duration``) in ticks of a time column
    of ``kind``, > 0.

    An int is taken in ticks (refused for dates: see :attr:`TimeKind.dates`); a ``timedelta``
    (pandas' included), a numpy ``timedelta64`` or a duration string ("30m", "10 minutes") is
    converted to the ticks' unit exactly.

    Raises:
        ValueError: naming ``name``: not > 0, not a whole number of ticks, a timedelta/string
            for an integer time column without ``time_unit``, or an int for a date column.
        TypeError: another type.
    """
    unit = kind.unit
    # before the int check: numpy makes timedelta64 an integer type
    exact = duration_fraction(value, name)
    if exact is None and isinstance(value, (bool, float)):
        raise TypeError(f"{name} must be an int (in the time column's units), a timedelta or "
                        f"a duration string such as '30m', got {value!r}")
    if exact is None and isinstance(value, (int, np.integer)):
        if kind.dates:
            raise ValueError(f"{name} {value!r} is an int, but the time column {time_name!r} "
                             f"holds dates, which are read as {unit}, not days: give a "
                             f"duration such as '1d' or timedelta(days=1)")
        ticks = int(value)
    elif exact is not None or isinstance(value, str):
        if unit is None:
            raise ValueError(f"{name} {value!r} is a duration, but the time column "
                             f"{time_name!r} holds plain integers: give time_unit ('s', 'ms', "
                             f"'us' or 'ns'), or give {name} as an integer in the column's units")
        if exact is not None:
            amount, per_second = exact
        else:
            amount, per_second = duration_ms(value, name), 1_000  # (ms here)
        wanted = TICKS_PER_SECOND[unit]
        if wanted >= per_second:
            ticks = amount * (wanted // per_second)
        else:
            ticks, rest = divmod(amount, per_second // wanted)
            if rest:
                raise ValueError(f"{name} {value!r} is not a whole number of {unit}, the time "
                                 f"column's unit")
    else:
        raise TypeError(f"{name} must be an int (in the time column's units), a timedelta or "
                        f"a duration string such as '30m', got {type(value).__name__}")
    if ticks <= 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    if ticks > INT64_MAX:
        raise ValueError(f"{name} {value!r} does not fit in int64 {unit or 'ticks'}")
    return ticks


def is_duration_text(text: str) -> bool:
    """Whether ``text`` parses as a duration string."""
    try:
        duration_ms(text, "gap")
    except (TypeError, ValueError):
        return False
    return True


@dataclass(frozen=True)
class Options:
    """Checked arguments of one sessionize call (in ticks of the time column)."""

    keys: list[str]
    time: str
    time_kind: TimeKind
    gap_ticks: int | None  # None: a gap column
    gap_column: str | None
    max_gap_ticks: int | None
    max_duration_ticks: int | None
    inclusive: bool
    specs: list[aggspec.AggSpec]
    planned: aggspec.AggPlan
    memory_limit: int

    @property
    def columns(self) -> list[str]:
        """The input columns the call reads."""
        wanted = [*self.keys, self.time, *([self.gap_column] if self.gap_column else []),
                  *self.planned.value_columns]
        return list(dict.fromkeys(wanted))

    @property
    def order_free(self) -> bool:
        """No output depends on the order of events with equal (key, time)."""
        # a float sum is a fold in order. Float min/max no longer depend on order (NaN is
        # greatest, -0.0 below 0.0); they stay on the ordered side, which costs only speed
        return all(s.kind == "count" or
                   (s.kind in ("sum", "min", "max") and not _floating(self.planned, s.name))
                   for s in self.specs)


def _floating(planned: aggspec.AggPlan, name: str) -> bool:
    field = planned.output_fields[planned.output_names.index(name)]
    return bool(pa.types.is_floating(field.type))


def key_list(key: Any) -> list[str]:
    """``key`` as a non-empty list of distinct column names.

    Raises:
        ValueError / TypeError: naming ``key``.
    """
    names = [key] if isinstance(key, str) else list(key) if isinstance(key, Sequence) else None
    if not names or not all(isinstance(k, str) and k for k in names):
        raise TypeError(f"key must be a column name or a list of them, got {key!r}")
    twice = [k for i, k in enumerate(names) if k in names[:i]]
    if twice:
        raise ValueError(f"key names the column {twice[0]!r} twice")
    return names


def parse_aggregations(aggregations: Any) -> list[aggspec.AggSpec]:
    """The CLI's ``"NAME=KIND:COLUMN"`` strings (one or a list) or the Spark adapter's mapping.

    Raises:
        ValueError: naming ``aggregations``.
    """
    if isinstance(aggregations, str):
        return aggspec.parse_specs([aggregations], "aggregations")
    if isinstance(aggregations, Sequence) and aggregations and \
            all(isinstance(a, str) for a in aggregations):
        return aggspec.parse_specs(list(aggregations), "aggregations")
    return aggspec.from_mapping(aggregations, "aggregations")
