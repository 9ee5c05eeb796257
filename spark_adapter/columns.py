"""Spark column types at the engine's edge: what each aggregation accepts, and the codecs.

The engine keeps accumulators in the session store, so every value it holds must be
msgpack-encodable. Each supported Spark type therefore has one *engine representation*, chosen so
that the engine's comparisons and additions give Spark's answers:

=================================  ==============================================================
Spark type                         engine value
=================================  ==============================================================
byte, short, int, long             int
float, double                      float
decimal(p, s)                      int, the unscaled value (value x 10^s): exact, ordered, summable
string, binary, boolean            str, bytes, bool
date                               int, days since 1970-01-01
timestamp, timestamp_ntz           int, microseconds since the epoch
array<one of the above>            list (first, last and collect only)
=================================  ==============================================================

What no representation can serve (a sum of strings, min over an array, any aggregation over a
struct or a map) is refused on the driver, naming the column and its type, before a task runs.
Null values follow Spark: sum, min, max and collect skip them (a session of nulls sums to null),
first and last do not.
"""

from __future__ import annotations

import decimal
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sessionstore import aggspec

# decimals are converted exactly (the default context rounds to 28 digits; Spark keeps 38)
_EXACT = aggspec.EXACT_DECIMALS

INTEGRAL = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)
FRACTIONAL = (T.FloatType, T.DoubleType)
TIMES = (T.TimestampType, T.TimestampNTZType)
SIMPLE = (*INTEGRAL, *FRACTIONAL, T.DecimalType, T.StringType, T.BinaryType, T.BooleanType,
          T.DateType, *TIMES)


def is_simple(data_type: T.DataType) -> bool:
    return isinstance(data_type, SIMPLE)


def check_key_type(column: str, data_type: T.DataType) -> None:
    """Key columns must have an engine representation. Floating keys have none: the engine
    refuses them (native Spark merges -0.0 with 0.0 and every NaN into one key, which an
    encoding of the float's bits would not), so they are refused here, before any task runs.

    Raises:
        ValueError: naming the column and its type.
    """
    if isinstance(data_type, FRACTIONAL):
        raise ValueError(f"key column {column!r} has type {data_type.simpleString()}; floating "
                         f"keys are not accepted (-0.0 and NaN would not group as Spark groups "
                         f"them): cast the column to a decimal or a string before sessionize")
    if not is_simple(data_type):
        raise ValueError(f"key column {column!r} has type {data_type.simpleString()}; keys must "
                         f"be integers, decimals, strings, binary, booleans, dates or timestamps")


#: Hidden: a static date time column cast to a timestamp (the date column itself stays a date).
EVENT_TIME_COLUMN = "sessionstore_event_time"


def event_time_column(df: DataFrame, column: str) -> tuple[DataFrame, str]:
    """``df`` and the name of its event-time column as sessionize takes it: for a date
    ``column`` of a static DataFrame, a hidden timestamp column beside it, cast as native
    ``session_window`` casts a date (midnight in the session time zone), so that the date column
    stays a date for the keys and aggregations that name it (native's ``max`` of it is a
    date); for every other column type, ``column`` itself, for the caller's check.

    Raises:
        ValueError: ``column`` is a date on a streaming DataFrame, naming it (Spark refuses a
            watermark on a date, so native streaming ``session_window`` cannot take one), or
            the DataFrame has a column named like the hidden one.
    """
    if not isinstance(df.schema[column].dataType, T.DateType):
        return df, column
    if df.isStreaming:
        raise ValueError(f"timestamp column {column!r} is a date: a stream's event time must be "
                         f"a timestamp (Spark refuses a watermark on a date); cast it, "
                         f"F.col({column!r}).cast('timestamp'), before sessionize")
    if EVENT_TIME_COLUMN in df.columns:
        raise ValueError(f"the DataFrame has a column named {EVENT_TIME_COLUMN!r}, which "
                         f"sessionize uses for a date time column; rename it")
    return (df.withColumn(EVENT_TIME_COLUMN, F.col(quote(column)).cast(T.TimestampType())),
            EVENT_TIME_COLUMN)


def quote(name: str) -> str:
    """``name`` as Spark reads one column of that exact name: in backticks, each backtick
    inside doubled, so that dots, spaces and backticks are part of the name (unquoted, Spark
    reads a dot as a struct field and refuses a lone backtick)."""
    return "`" + name.replace("`", "``") + "`"


def output_type(name: str, kind: str, column: str, data_type: T.DataType) -> T.DataType:
    """The Spark type of ``kind`` over ``column``, as Spark's own aggregate function gives it.

    The table of kinds and output types is :func:`sessionstore.aggspec.output_type`'s, over
    Arrow types; this maps the Spark type to Arrow and the answer back.

    Raises:
        ValueError: the aggregation cannot run over that type (naming column and Spark type).
    """
    try:
        arrow = arrow_type(data_type, "UTC")
    except ValueError:  # a struct or map: no kind takes it, and the table says so
        arrow = pa.struct([])
    out = aggspec.output_type(name, kind, column, arrow, data_type.simpleString())
    if out == arrow:
        return data_type
    if out == pa.list_(arrow):
        return T.ArrayType(data_type)
    if out == pa.int64():
        return T.LongType()
    if out == pa.float64():
        return T.DoubleType()
    if pa.types.is_decimal(out):
        return T.DecimalType(out.precision, out.scale)
    raise ValueError(f"aggregation {name!r}: no Spark type for {kind} output {out}")


def check_custom_input(name: str, column: str, data_type: T.DataType) -> None:
    """A custom aggregation sees every value column in its engine representation.

    Raises:
        ValueError: the column has none (naming the aggregation, column and type).
    """
    if not (is_simple(data_type) or (isinstance(data_type, T.ArrayType)
                                     and is_simple(data_type.elementType))):
        raise ValueError(
            f"aggregation {name!r} (a custom aggregation) receives column {column!r} of type "
            f"{data_type.simpleString()}, which has no engine representation; drop or cast the "
            f"column before sessionize"
        )


# -- codecs --------------------------------------------------------------------------------------

def to_engine(array: pa.Array | pa.ChunkedArray, data_type: T.DataType) -> list[Any]:
    """The engine values of one Arrow column of Spark type ``data_type`` (None for nulls)."""
    if isinstance(data_type, TIMES):
        return list(array.cast(pa.int64()).to_pylist())
    if isinstance(data_type, T.DateType):
        return list(array.cast(pa.int32()).to_pylist())
    if isinstance(data_type, T.DecimalType):
        scale = data_type.scale
        return [None if v is None else int(v.scaleb(scale, _EXACT)) for v in array.to_pylist()]
    if isinstance(data_type, T.ArrayType):
        element = data_type.elementType
        if isinstance(element, TIMES):
            return list(array.cast(pa.list_(pa.int64())).to_pylist())
        if isinstance(element, T.DateType):
            return list(array.cast(pa.list_(pa.int32())).to_pylist())
        if isinstance(element, T.DecimalType):
            scale = element.scale
            return [None if row is None else
                    [None if v is None else int(v.scaleb(scale, _EXACT)) for v in row]
                    for row in array.to_pylist()]
    return list(array.to_pylist())


def arrow_type(data_type: T.DataType, timezone: str) -> pa.DataType:
    """The Arrow type Spark exchanges for ``data_type`` with Python workers."""
    if isinstance(data_type, T.TimestampType):
        return pa.timestamp("us", tz=timezone)
    if isinstance(data_type, T.TimestampNTZType):
        return pa.timestamp("us")
    if isinstance(data_type, T.DateType):
        return pa.date32()
    if isinstance(data_type, T.DecimalType):
        return pa.decimal128(data_type.precision, data_type.scale)
    if isinstance(data_type, T.ArrayType):
        return pa.list_(arrow_type(data_type.elementType, timezone))
    simple = {T.ByteType: pa.int8(), T.ShortType: pa.int16(), T.IntegerType: pa.int32(),
              T.LongType: pa.int64(), T.FloatType: pa.float32(), T.DoubleType: pa.float64(),
              T.StringType: pa.string(), T.BinaryType: pa.binary(), T.BooleanType: pa.bool_()}
    for spark_type, arrow in simple.items():
        if isinstance(data_type, spark_type):
            return arrow
    raise ValueError(f"no Arrow type for {data_type.simpleString()}")


def key_to_engine(array: pa.Array | pa.ChunkedArray, data_type: T.DataType) -> list[Any]:
    """The engine keys of one Arrow key column: :func:`to_engine`'s values, but a boolean as
    the int 0 or 1 (the engine keys on str, bytes and int; a bool is refused there)."""
    if isinstance(data_type, T.BooleanType):
        return list(array.cast(pa.int8()).to_pylist())
    return to_engine(array, data_type)


def key_from_engine(values: list[Any], data_type: T.DataType, timezone: str) -> pa.Array:
    """An Arrow key column of Spark type ``data_type`` from engine keys (see
    :func:`key_to_engine`)."""
    if isinstance(data_type, T.BooleanType):
        return pa.array(values, pa.int8()).cast(pa.bool_())
    return from_engine(values, data_type, timezone)


def from_engine(values: list[Any], data_type: T.DataType, timezone: str) -> pa.Array:
    """An Arrow column of Spark type ``data_type`` from engine values."""
    target = arrow_type(data_type, timezone)
    if isinstance(data_type, TIMES):
        return pa.array(values, pa.int64()).cast(target)
    if isinstance(data_type, T.DateType):
        return pa.array(values, pa.int32()).cast(target)
    if isinstance(data_type, T.DecimalType):
        scale = data_type.scale
        return pa.array([None if v is None else decimal.Decimal(v).scaleb(-scale, _EXACT)
                         for v in values], target)
    if isinstance(data_type, T.ArrayType):
        element = data_type.elementType
        if isinstance(element, (*TIMES, T.DateType, T.DecimalType)):
            flat = [v for row in values if row is not None for v in row]
            offsets = [0]
            for row in values:
                offsets.append(offsets[-1] + (len(row) if row is not None else 0))
            inner = from_engine(flat, element, timezone)
            mask = pa.array([row is None for row in values], pa.bool_())
            return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), inner, mask=mask)
        return pa.array(values, target)
    if isinstance(data_type, T.LongType):
        return pa.array(values, pa.int64())
    return pa.array(values, target)


def micros_to_millis_java(micros: int) -> int:
    """Spark's event-time statistic: microseconds / 1000 with Java's truncation toward zero."""
    quotient = abs(micros) // 1000
    return quotient if micros >= 0 else -quotient


def null_count(array: pa.Array | pa.ChunkedArray) -> int:
    return int(array.null_count)


def not_null_mask(array: pa.Array | pa.ChunkedArray) -> pa.Array:
    return pc.is_valid(array)
