"""Input columns as the engine reads them: event times and per-event gaps as int64 milliseconds,
keys and values in the engine's representation."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..aggspec import ColumnarPlan, to_engine
from .readers import InputError, first_line

_TIME_UNIT_PER_MS = {"s": None, "ms": 1, "us": 1_000, "ns": 1_000_000}
INT64_MAX_VALUE = (1 << 63) - 1


@dataclass
class TimeColumn:
    """Event times of a batch as int64 ms, and how many of them had a sub-ms part floored."""

    millis: pa.Array
    floored: int


#: The units ``--time-unit`` names for an integer time column (and ``--gap-unit`` for gaps).
TIME_UNITS = tuple(_TIME_UNIT_PER_MS)
#: Integer times with no declared unit are milliseconds, unless every one of a batch lies in a
#: band where milliseconds are implausible and another unit is not: epoch seconds from 1973 to
#: 5138 (as milliseconds, two days to three years after 1970), or epoch microseconds or
#: nanoseconds from 1973 on (as milliseconds, past the year 5138). Such input is refused,
#: never reinterpreted: ``--time-unit`` says what it is.
_LOOKS_LIKE = ((10**8, 10**11, "epoch seconds", "--time-unit s"),
               (10**14, None, "epoch microseconds or nanoseconds",
                "--time-unit us or --time-unit ns"))


def time_column_ms(batch: pa.RecordBatch, name: str, first_row: int = 0,
                   unit: str | None = None) -> TimeColumn:
    """Event times as int64 milliseconds.

    Integers are in ``unit`` (``s``, ``ms``, ``us`` or ``ns``). Without one they are
    milliseconds, and a batch whose every time looks like epoch seconds, microseconds or
    nanoseconds (see :data:`_LOOKS_LIKE`) is refused. Timestamps of any unit, ISO-8601
    strings, and dates (as their midnight, UTC) are converted. Times finer than ms (µs, ns), are floored to the millisecond they
    fall in (towards the past, also before 1970), and the count of such rows is returned.

    Args:
        first_row: the input row number of the batch's first row, for error messages.
        unit: the unit of an integer time column (``--time-unit``); refused for other types.

    Raises:
        InputError: a missing column, a null (naming its input row), another type, a ``unit``
            for a column that is not integer, integers that look like another unit than
            milliseconds with no ``unit``, or seconds that overflow int64 as milliseconds.
    """
    index = batch.schema.get_field_index(name)
    if index < 0:
        raise InputError(f"input has no column {name!r} (columns: {batch.schema.names})")
    values = batch.column(index)
    if values.null_count:
        row = _first(values.is_null())
        raise InputError(f"time column {name!r} is null at input row {first_row + row}: every "
                         f"event needs a time")
    kind = values.type
    if unit is not None and not pa.types.is_integer(kind):
        raise InputError(f"--time-unit {unit} applies to integer time columns; time column "
                         f"{name!r} holds {kind}, whose unit is known")
    try:
        if pa.types.is_integer(kind):
            raw = pc.cast(values, pa.int64())
            if unit is None:
                _check_plausible_ms(raw, name)
                return TimeColumn(raw, 0)
            return _ticks_to_ms(raw, unit)
        if pa.types.is_string(kind) or pa.types.is_large_string(kind):
            values = pc.cast(values, pa.timestamp("ns"))
            kind = values.type
        elif pa.types.is_date(kind):  # ISO dates in CSV are read as dates: their midnight
            values = pc.cast(values, pa.timestamp("ms"))
            kind = values.type
        if pa.types.is_timestamp(kind):
            return _ticks_to_ms(pc.cast(values, pa.int64()), kind.unit)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise InputError(f"time column {name!r}: {first_line(exc)}") from None
    raise InputError(f"time column {name!r} must hold integers (milliseconds, or the unit "
                     f"--time-unit names), timestamps, dates or ISO-8601 strings, not {kind}")


def _ticks_to_ms(raw: pa.Array, unit: str) -> TimeColumn:
    """Integer ticks of ``unit`` as ms, floored; raises ArrowInvalid when seconds overflow."""
    per_ms = _TIME_UNIT_PER_MS[unit]
    if per_ms is None:
        return TimeColumn(pc.multiply_checked(raw, 1000), 0)
    if per_ms == 1:
        return TimeColumn(raw, 0)
    ticks = raw.to_numpy()
    millis = np.floor_divide(ticks, per_ms)
    floored = int(np.count_nonzero(ticks - millis * per_ms))
    return TimeColumn(pa.array(millis, pa.int64()), floored)


def _check_plausible_ms(raw: pa.Array, name: str) -> None:
    if not len(raw):
        return
    bounds = pc.min_max(raw)
    low, high = bounds["min"].as_py(), bounds["max"].as_py()
    for floor, ceiling, looks, flag in _LOOKS_LIKE:
        if low >= floor and (ceiling is None or high < ceiling):
            raise InputError(f"time column {name!r} holds integers from {low} to {high}, which "
                             f"look like {looks}, not milliseconds: give {flag} "
                             f"(or --time-unit ms if they are milliseconds)")


def engine_columns(batch: pa.RecordBatch, keys: Sequence[str], value_columns: Sequence[str]
                   ) -> tuple[Any, Any]:
    """Keys and values of a batch in the form ``process_batch`` takes, column by column, in
    their engine representation (:func:`aggspec.to_engine`).

    One key or value column is handed over as its Arrow array when it needs no conversion;
    several become tuples, which is how the engine keys composite keys and how
    :mod:`aggspec` pickers read several values.
    """
    def of(names: Sequence[str]) -> Any:
        converted = [to_engine(batch.column(batch.schema.get_field_index(n))) for n in names]
        if len(names) == 1:
            return converted[0]
        lists = [c.to_pylist() if isinstance(c, pa.Array) else c for c in converted]
        return list(zip(*lists, strict=True))

    values = of(value_columns) if value_columns else [None] * batch.num_rows
    return of(keys), values


@dataclass
class EngineBatch:
    """One input batch in the engine's representation, for ``process_table``.

    Attributes:
        table: the key columns (their input names), the time column as int64 ms (its input
            name) and the value columns under the plan's names, plus the plan's presence
            columns (int64, 1 where the summed value is not null).
        columnar: every column is an Arrow array and no aggregated value is null, so
            ``process_table`` takes it; otherwise :meth:`rows` feeds ``process_batch``.
        gap_name: the column of each event's gap (int64 ms, nulls kept), or None.
    """

    table: pa.Table
    columnar: bool
    key_names: list[str]
    time_name: str
    _lists: dict[str, list[Any]]
    gap_name: str | None = None

    def rows(self) -> tuple[list[Any], list[dict[str, Any]], pa.Array]:
        """Keys, values (a dict per row, as the plan's aggregation reads them) and times, for
        ``process_batch`` (the exact path: decimals, or nulls in an aggregated column)."""
        def column(name: str) -> list[Any]:
            if name in self._lists:
                return self._lists[name]
            return self.table.column(name).to_pylist()  # type: ignore[no-any-return]

        keys = [column(k) for k in self.key_names]
        key_values = keys[0] if len(keys) == 1 else list(zip(*keys, strict=True))
        names = [n for n in self.table.column_names
                 if n not in self.key_names and n not in (self.time_name, self.gap_name)]
        values = [dict(zip(names, row, strict=True))
                  for row in zip(*[column(n) for n in names], strict=True)] \
            if names else [{} for _ in range(self.table.num_rows)]
        return key_values, values, self.table.column(self.time_name)


def engine_batch(batch: pa.RecordBatch, keys: Sequence[str], time_name: str,
                 times_ms: pa.Array, plan: ColumnarPlan, gaps_ms: pa.Array | None = None
                 ) -> EngineBatch:
    """The columns of ``batch`` as the engine's ``process_table`` reads them (see
    :class:`EngineBatch`): no per-row conversion unless a column needs one (decimals).
    ``gaps_ms`` is each event's gap (from :func:`gap_column_ms`), or None for a fixed gap."""
    arrays: dict[str, Any] = {}
    lists: dict[str, list[Any]] = {}
    columnar = True

    def put(name: str, converted: Any) -> None:
        nonlocal columnar
        if isinstance(converted, pa.Array | pa.ChunkedArray):
            arrays[name] = converted
            return
        lists[name] = converted
        columnar = False
        arrays[name] = pa.nulls(len(converted))  # a placeholder: rows() reads the list

    for key in keys:
        put(key, to_engine(batch.column(batch.schema.get_field_index(key))))
    arrays[time_name] = times_ms
    for column, name in plan.value_names.items():
        data = batch.column(batch.schema.get_field_index(column))
        if data.null_count:
            columnar = False
        put(name, to_engine(data))
    for name, column in plan.presence.values():
        valid = pc.is_valid(batch.column(batch.schema.get_field_index(column)))
        arrays[name] = pc.cast(valid, pa.int64())
    gap_name = None
    if gaps_ms is not None:
        gap_name = "__gap_ms"
        while gap_name in arrays:
            gap_name = "_" + gap_name
        arrays[gap_name] = gaps_ms
    return EngineBatch(pa.table(arrays), columnar, list(keys), time_name, lists, gap_name)


def check_gap_column(schema: pa.Schema, name: str, keys: Sequence[str], time: str,
                     time_unit: str | None = None, gap_unit: str | None = None) -> str | None:
    """Refuse a ``--gap-column`` the input lacks, that is a key or the time column, or whose
    type is neither integer nor a duration; return the unit its integers are in.

    An integer gap is in the unit of the integer time column it goes with: ``time_unit``
    (``--time-unit``), or milliseconds, the unit of integer times without it; ``gap_unit``
    (``--gap-unit``) says otherwise. Beside a time column of timestamps, dates or strings,
    integers have no unit to share, and one is never guessed: ``gap_unit`` is then required.

    Returns:
        The unit (``s``, ``ms``, ``us`` or ``ns``) of an integer gap column, for
        :func:`gap_column_ms`; None for a column of durations (or of nulls only).

    Raises:
        InputError: naming the flag, the column and its type: also an integer gap column
            beside a time column that is not integer, without ``gap_unit``, and a
            ``gap_unit`` for a column of durations, whose unit is known.
    """
    if name not in schema.names:
        raise InputError(f"--gap-column {name!r}: the input has no such column (columns: "
                         f"{schema.names})")
    if name in keys or name == time:
        raise InputError(f"--gap-column {name!r} is a key or the time column; the gap needs its "
                         f"own column")
    kind = schema.field(name).type
    if pa.types.is_null(kind):
        return gap_unit
    if pa.types.is_duration(kind):
        if gap_unit is not None:
            raise InputError(f"--gap-unit {gap_unit} applies to integer gap columns; "
                             f"--gap-column {name!r} holds {kind}, whose unit is known")
        return None
    if not pa.types.is_integer(kind):
        raise InputError(f"--gap-column {name!r} must hold integers or durations, not {kind}")
    if gap_unit is not None:
        return gap_unit
    time_kind = schema.field(time).type
    if not pa.types.is_integer(time_kind):
        raise InputError(f"--gap-column {name!r} holds integers, but the time column {time!r} "
                         f"holds {time_kind}, which gives them no unit: give --gap-unit "
                         f"({', '.join(TIME_UNITS)}), or the gaps as durations")
    return time_unit or "ms"


def gap_column_ms(batch: pa.RecordBatch, name: str, max_gap_ms: int, first_row: int,
                  unit: str | None = None) -> pa.Array:
    """Each event's gap as int64 milliseconds, nulls kept (the engine drops and counts null and
    non-positive gaps).

    Args:
        name: the ``--gap-column``: integers are in ``unit``; durations in their own.
        max_gap_ms: ``--max-gap``: a larger gap is refused.
        first_row: the input row of the batch's first row, for messages.
        unit: the unit of integer gaps, as :func:`check_gap_column` returns it.

    Raises:
        InputError: a gap above ``max_gap_ms``, or one finer than a millisecond that is not a
            whole number of them; naming the flag, the input row and the values.
    """
    values = batch.column(batch.schema.get_field_index(name))
    kind = values.type
    if pa.types.is_null(kind):
        return pa.nulls(len(values), pa.int64())
    if pa.types.is_duration(kind):
        unit = kind.unit
    elif not pa.types.is_integer(kind):
        raise InputError(f"--gap-column {name!r} must hold integers or durations, not {kind}")
    elif unit is None:
        raise InputError(f"--gap-column {name!r} holds integers of no known unit: give "
                         f"--gap-unit ({', '.join(TIME_UNITS)})")

    def exceeds(row: int, shown: str) -> InputError:
        return InputError(f"--gap-column {name!r}: input row {first_row + row}: gap {shown} "
                          f"exceeds --max-gap {max_gap_ms} ms")

    if pa.types.is_unsigned_integer(kind) and len(values) \
            and (pc.max(values).as_py() or 0) > INT64_MAX_VALUE:
        row = _first(pc.greater(values, INT64_MAX_VALUE))
        raise exceeds(row, f"{values[row].as_py()} {unit}")
    ticks = pc.cast(values, pa.int64())
    per_ms = _TIME_UNIT_PER_MS[unit]
    if per_ms is None:
        # refused before the product, which a large gap would overflow; a very negative gap
        # only has to stay negative (a non-positive gap is dropped whatever its size)
        over = pc.greater(ticks, max_gap_ms // 1000)
        if pc.any(over).as_py():
            row = _first(over)
            raise exceeds(row, f"{ticks[row].as_py()} s")
        gaps = pc.multiply(pc.max_element_wise(ticks, -(INT64_MAX_VALUE // 1000),
                                               skip_nulls=False), 1000)
    elif per_ms == 1:
        gaps = ticks
    else:
        # a non-positive gap is dropped whatever its unit; a positive one must be whole ms
        rest = pc.and_(pc.greater(ticks, 0), pc.not_equal(
            pc.subtract(ticks, pc.multiply(pc.divide(ticks, per_ms), per_ms)), 0))
        if pc.any(rest).as_py():
            row = _first(rest)
            raise InputError(f"--gap-column {name!r}: input row {first_row + row}: gap "
                             f"{ticks[row].as_py()} {unit} is not a whole number of "
                             f"milliseconds")
        gaps = pc.divide(ticks, per_ms)
    over = pc.greater(gaps, max_gap_ms)
    if pc.any(over).as_py():
        row = _first(over)
        raise exceeds(row, f"{gaps[row].as_py()} ms")
    return gaps


def _first(mask: pa.Array) -> int:
    """The index of the first true of a boolean array (nulls are false)."""
    return int(np.argmax(pc.fill_null(mask, False).to_numpy(zero_copy_only=False)))
