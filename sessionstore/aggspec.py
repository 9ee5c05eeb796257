"""The aggregation language shared by every front end: one table of kinds and their output types.

The CLI writes ``--agg NAME=KIND:COLUMN`` (or ``NAME=count``); ``spark_adapter.sessionize`` takes a
mapping ``{NAME: "count" | (KIND, COLUMN) | Aggregation}``. Both are parsed here into
:class:`AggSpec` items, and :func:`plan` turns them, with the input's Arrow schema, into one engine
aggregation, the value columns it reads, and the Arrow type of every output. Front ends with
another type system (Spark) convert the Arrow types at their edge.
"""

from __future__ import annotations

import decimal
import itertools
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from . import aggregations
from .aggregations import Aggregation

#: The output name used when no aggregation is given on the command line.
DEFAULT_SPEC = "events=count"
CUSTOM = "custom"


MAX_DECIMAL_PRECISION = 38
#: Decimal arithmetic without rounding for every Arrow decimal (decimal256 holds 76 digits, and
#: a sum a few more): Python's default context keeps 28 significant digits and would round.
EXACT_DECIMALS = decimal.Context(prec=100, Emax=decimal.MAX_EMAX, Emin=decimal.MIN_EMIN)


def is_simple(data_type: pa.DataType) -> bool:
    """An atomic type the engine can hold (see :func:`to_engine`)."""
    t = pa.types
    return bool(t.is_integer(data_type) or t.is_floating(data_type) or t.is_decimal(data_type)
                or t.is_string(data_type) or t.is_large_string(data_type)
                or t.is_binary(data_type) or t.is_large_binary(data_type)
                or t.is_boolean(data_type) or t.is_date(data_type)
                or t.is_timestamp(data_type))


def _refuse(name: str, kind: str, column: str, shown: str, why: str) -> ValueError:
    return ValueError(f"aggregation {name!r}: {kind} cannot run over column {column!r} of type "
                      f"{shown}: {why}")


def _sum_type(name: str, kind: str, column: str, data_type: pa.DataType,
              shown: str) -> pa.DataType:
    if pa.types.is_integer(data_type):
        return pa.int64()
    if pa.types.is_floating(data_type):
        return pa.float64()
    if pa.types.is_decimal(data_type):  # widened by 10 digits, as Spark's sum does
        return pa.decimal128(min(MAX_DECIMAL_PRECISION, data_type.precision + 10),
                             data_type.scale)
    raise _refuse(name, kind, column, shown, "sum needs a numeric column")


def _extreme_type(name: str, kind: str, column: str, data_type: pa.DataType,
                  shown: str) -> pa.DataType:
    if is_simple(data_type):
        return data_type
    raise _refuse(name, kind, column, shown,
                  "min and max need an atomic (non-nested) column")


def _any_type(name: str, kind: str, column: str, data_type: pa.DataType,
              shown: str) -> pa.DataType:
    if is_simple(data_type) or (pa.types.is_list(data_type)
                                and is_simple(data_type.value_type)):
        return data_type
    raise _refuse(name, kind, column, shown,
                  "only atomic columns and lists of them are supported")


def _list_type(name: str, kind: str, column: str, data_type: pa.DataType,
               shown: str) -> pa.DataType:
    return pa.list_(_any_type(name, kind, column, data_type, shown))


class SkipNulls(Aggregation):
    """Spark's (and SQL's) rule for sum, min, max and collect: a null value is no input at all,
    so a session of nulls sums to null. ``first`` and ``last`` keep nulls."""

    def __init__(self, inner: Aggregation, pick: Callable[[Any], Any]) -> None:
        self.inner = inner
        self.pick = pick
        self.name = inner.name

    def initial(self) -> Any:
        return self.inner.initial()

    def add(self, key: Any, value: Any, timestamp_ms: int, seq: int, acc: Any) -> Any:
        item = self.pick(value)
        return acc if item is None else self.inner.add(key, item, timestamp_ms, seq, acc)

    def add_run(self, key: Any, values: list[Any], times_ms: list[int], seqs: list[int],
                acc: Any) -> Any:
        kept = [(item, t, s) for item, t, s in zip(map(self.pick, values), times_ms, seqs,
                                                    strict=True) if item is not None]
        if not kept:
            return acc
        items, times, kept_seqs = (list(part) for part in zip(*kept, strict=True))
        return self.inner.add_run(key, items, times, kept_seqs, acc)

    def merge(self, key: Any, acc1: Any, acc2: Any) -> Any:
        return self.inner.merge(key, acc1, acc2)

    def result(self, acc: Any) -> Any:
        return self.inner.result(acc)


def _skipping(make: Callable[[], Aggregation]) -> Callable[[Callable[[Any], Any]], Aggregation]:
    def build(pick: Callable[[Any], Any]) -> Aggregation:
        return SkipNulls(make(), pick)

    return build


class _NullableSum(Aggregation):
    """Spark's ``sum`` behind :class:`SkipNulls`: None until a value comes (a session of nulls
    sums to null), then the sum from 0, as Spark adds (so a session of -0.0 sums to 0.0), with
    the one int64 check of every integer sum."""

    name = "sum"

    def initial(self) -> Any:
        return None

    def add(self, key: Any, value: Any, timestamp_ms: int, seq: int, acc: Any) -> Any:
        if acc is None:
            return 0 + value  # Spark's coalesce(sum, 0) + value: -0.0 becomes 0.0
        return aggregations.int64_sum(acc + value, key, timestamp_ms, self)

    def merge(self, key: Any, acc1: Any, acc2: Any) -> Any:
        if acc1 is None:
            return acc2
        if acc2 is None:
            return acc1
        return aggregations.int64_sum(acc1 + acc2, key, None, self)


@dataclass(frozen=True)
class Kind:
    """One aggregation kind: how to build it over ``pick(value)``, and the Arrow type it outputs
    for an input column (raising ValueError for a type it cannot take)."""

    build: Callable[[Callable[[Any], Any]], Aggregation]
    output_type: Callable[[str, str, str, pa.DataType, str], pa.DataType]


#: Every kind that reads a column, with Spark's null rule and output types (``count`` reads no
#: column and outputs int64).
KINDS: dict[str, Kind] = {
    "sum": Kind(_skipping(_NullableSum), _sum_type),
    "min": Kind(_skipping(aggregations.min_of), _extreme_type),
    "max": Kind(_skipping(aggregations.max_of), _extreme_type),
    "first": Kind(aggregations.first_of, _any_type),
    "last": Kind(aggregations.last_of, _any_type),
    "collect": Kind(_skipping(aggregations.collect), _list_type),
}


def output_type(name: str, kind: str, column: str, data_type: pa.DataType,
                shown_type: str | None = None) -> pa.DataType:
    """The Arrow type ``kind`` outputs over ``column`` of ``data_type`` (count: int64).

    This is the one table of kinds and output types: front ends with another type system (the
    Spark adapter) map their types to Arrow, ask here, and map the answer back.

    Args:
        shown_type: how error messages name the column's type (default: the Arrow type), so a
            front end can show its own type names.

    Raises:
        ValueError: the kind cannot run over that type, naming the output, kind, column and type.
    """
    if kind == "count":
        return pa.int64()
    if kind not in KINDS:
        raise ValueError(f"aggregation {name!r}: unknown kind {kind!r}")
    shown = str(data_type) if shown_type is None else shown_type
    return KINDS[kind].output_type(name, kind, column, data_type, shown)


@dataclass(frozen=True)
class AggSpec:
    """One named output: ``kind`` is ``"count"``, a key of :data:`KINDS`, or ``"custom"``.

    ``column`` is set for the kinds of :data:`KINDS`; ``custom`` carries a user
    :class:`Aggregation` that sees each row as a dict of the value columns.
    """

    name: str
    kind: str
    column: str | None = None
    custom: Aggregation | None = None


def parse_spec(text: str, option: str = "--agg") -> AggSpec:
    """Parse ``NAME=count`` or ``NAME=KIND:COLUMN``.

    Raises:
        ValueError: the text is not of that form or names an unknown kind; the message names
            ``option`` and the text.
    """
    name, sep, rest = text.partition("=")
    name = name.strip()
    if not sep or not name:
        raise ValueError(f"{option} {text!r}: expected NAME=count or NAME=KIND:COLUMN")
    if rest.strip() == "count":
        return AggSpec(name, "count")
    kind, sep, column = rest.partition(":")
    if not sep or kind not in KINDS or not column:
        raise ValueError(f"{option} {text!r}: KIND must be count or one of "
                         f"{', '.join(KINDS)}, as NAME=KIND:COLUMN")
    return AggSpec(name, kind, column)


def parse_specs(texts: Sequence[str], option: str = "--agg") -> list[AggSpec]:
    """Parse several ``--agg`` values (``events=count`` when there are none).

    Raises:
        ValueError: a bad spec, or a name given twice.
    """
    specs = [parse_spec(t, option) for t in (texts or [DEFAULT_SPEC])]
    _check_unique(specs, option)
    return specs


def from_mapping(mapping: Any, option: str = "aggregations") -> list[AggSpec]:
    """Parse ``{NAME: "count" | (KIND, COLUMN) | Aggregation}`` (the Spark adapter's form).

    Raises:
        ValueError: not a non-empty mapping, a bad name, or a bad item; the message names it.
    """
    if not isinstance(mapping, Mapping) or not mapping:
        raise ValueError(f"{option} must be a non-empty dict of output name -> aggregation")
    specs: list[AggSpec] = []
    for name, item in mapping.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"aggregation names must be non-empty strings, got {name!r}")
        if isinstance(item, str) and item == "count":
            specs.append(AggSpec(name, "count"))
        elif isinstance(item, tuple) and len(item) == 2 and item[0] in KINDS:
            if not isinstance(item[1], str) or not item[1]:
                raise ValueError(f"aggregation {name!r} names column {item[1]!r}, which is not "
                                 f"a column name")
            specs.append(AggSpec(name, item[0], item[1]))
        elif isinstance(item, Aggregation):
            specs.append(AggSpec(name, CUSTOM, custom=item))
        else:
            raise ValueError(
                f"aggregation {name!r} must be 'count', ({'|'.join(map(repr, KINDS))}, column) "
                f"or a sessionstore.aggregations object, got {item!r}"
            )
    _check_unique(specs, option)
    return specs


def _check_unique(specs: Sequence[AggSpec], option: str) -> None:
    seen: set[str] = set()
    for spec in specs:
        if spec.name in seen:
            raise ValueError(f"{option}: output name {spec.name!r} is given twice")
        seen.add(spec.name)


@dataclass
class AggPlan:
    """What :func:`plan` decided.

    Attributes:
        aggregation: the combined engine aggregation; its result is ``{name: value}``.
        value_columns: the input columns each event's value is made of, in order.
        output_names: the output names, in order.
        output_fields: one Arrow field per output.
        custom_outputs: the outputs of user aggregations (front ends may encode them, e.g. as
            JSON strings).
    """

    aggregation: Aggregation
    value_columns: list[str]
    output_names: list[str]
    output_fields: list[pa.Field]
    custom_outputs: list[str]


def plan(specs: Sequence[AggSpec], schema: pa.Schema, *, exclude: Sequence[str] = (),
         scalar_single_column: bool = False) -> AggPlan:
    """Resolve ``specs`` against the input ``schema``.

    Args:
        specs: from :func:`parse_specs` or :func:`from_mapping`.
        schema: the input's columns and types.
        exclude: columns a custom aggregation never sees (the key and time columns).
        scalar_single_column: the front end passes each event's value as a bare scalar when there
            is exactly one value column (the CLI), rather than as a 1-tuple (Spark).

    Returns:
        The :class:`AggPlan`.

    Raises:
        ValueError: a spec names a column the schema lacks, or a kind cannot apply to its
            column's type (sum of a string column).
    """
    names = list(schema.names)
    value_columns: list[str] = []
    if any(s.kind == CUSTOM for s in specs):
        value_columns = [c for c in names if c not in exclude]
    for spec in specs:
        if spec.column is None:
            continue
        if spec.column not in names:
            raise ValueError(f"aggregation {spec.name!r} names column {spec.column!r}, which the "
                             f"input does not have (columns: {sorted(names)})")
        if spec.column not in value_columns:
            value_columns.append(spec.column)
    scalar = scalar_single_column and len(value_columns) == 1
    parts: dict[str, Aggregation] = {}
    fields: list[pa.Field] = []
    custom_outputs: list[str] = []
    for spec in specs:
        if spec.kind == "count":
            parts[spec.name] = aggregations.count()
            fields.append(pa.field(spec.name, pa.int64()))
        elif spec.kind == CUSTOM:
            assert spec.custom is not None
            parts[spec.name] = WholeRow(spec.custom, value_columns, scalar)
            fields.append(pa.field(spec.name, pa.string()))
            custom_outputs.append(spec.name)
        else:
            assert spec.column is not None
            data_type = schema.field(spec.column).type
            fields.append(pa.field(spec.name, output_type(spec.name, spec.kind, spec.column,
                                                          data_type)))
            parts[spec.name] = KINDS[spec.kind].build(_picker(value_columns.index(spec.column),
                                                              scalar))
    return AggPlan(aggregations.combine(parts), value_columns, list(parts), fields,
                   custom_outputs)


def _picker(index: int, scalar: bool) -> Callable[[Any], Any]:
    if scalar:
        return _whole

    def pick(row: Any) -> Any:
        return row[index]

    return pick


def _whole(value: Any) -> Any:
    return value


class WholeRow(Aggregation):
    """Wraps a user aggregation so that it sees each event's value as a dict of the columns."""

    def __init__(self, inner: Aggregation, columns: list[str], scalar: bool = False) -> None:
        self.inner = inner
        self.columns = columns
        self.scalar = scalar
        self.name = getattr(inner, "name", "aggregation")

    def _row(self, value: Any) -> Any:
        if self.scalar:
            return {self.columns[0]: value}
        return dict(zip(self.columns, value, strict=True))

    def initial(self) -> Any:
        return self.inner.initial()

    def add(self, key: Any, value: Any, timestamp_ms: int, seq: int, acc: Any) -> Any:
        return self.inner.add(key, self._row(value), timestamp_ms, seq, acc)

    def merge(self, key: Any, acc1: Any, acc2: Any) -> Any:
        return self.inner.merge(key, acc1, acc2)

    def result(self, acc: Any) -> Any:
        return self.inner.result(acc)


# -- engine representation ---------------------------------------------------------------------
#
# The engine keeps keys and accumulators in the store as msgpack, so each Arrow type has one
# engine representation, chosen so that the engine's comparisons and additions give the same
# answers as on the original values: decimals as their unscaled integer (value x 10^scale: exact,
# ordered, summable), timestamps as integers in their own unit, dates as integers in theirs.
# Everything else is held as its Python value.


def needs_codec(data_type: pa.DataType) -> bool:
    """Values of ``data_type`` have an engine representation other than their Python value."""
    t = pa.types
    if t.is_list(data_type) or t.is_large_list(data_type):
        return needs_codec(data_type.value_type)
    return bool(t.is_decimal(data_type) or t.is_timestamp(data_type) or t.is_date(data_type))


def _int_type(data_type: pa.DataType) -> pa.DataType:
    return pa.int32() if pa.types.is_date32(data_type) else pa.int64()


def to_engine(array: pa.Array | pa.ChunkedArray) -> Any:
    """The engine representation of an Arrow column: the array itself when its values need no
    conversion (``process_batch`` takes Arrow arrays), else a list."""
    data_type = array.type
    if not needs_codec(data_type):
        return array
    if pa.types.is_decimal(data_type):
        scale = data_type.scale
        return [None if v is None else int(v.scaleb(scale, EXACT_DECIMALS))
                for v in array.to_pylist()]
    if pa.types.is_timestamp(data_type) or pa.types.is_date(data_type):
        return array.cast(_int_type(data_type))
    inner = data_type.value_type
    if pa.types.is_decimal(inner):
        scale = inner.scale
        return [None if row is None else [None if v is None
                                          else int(v.scaleb(scale, EXACT_DECIMALS))
                                          for v in row] for row in array.to_pylist()]
    return array.cast(pa.list_(_int_type(inner))).to_pylist()


def from_engine(values: list[Any], data_type: pa.DataType) -> pa.Array:
    """An Arrow column of ``data_type`` from engine values (the inverse of :func:`to_engine`)."""
    if pa.types.is_decimal(data_type):
        return pa.array([None if v is None
                         else decimal.Decimal(v).scaleb(-data_type.scale, EXACT_DECIMALS)
                         for v in values], data_type)
    if pa.types.is_timestamp(data_type) or pa.types.is_date(data_type):
        return pa.array(values, _int_type(data_type)).cast(data_type)
    if (pa.types.is_list(data_type) or pa.types.is_large_list(data_type)) \
            and needs_codec(data_type.value_type):
        flat = [v for row in values if row is not None for v in row]
        offsets = [0]
        for row in values:
            offsets.append(offsets[-1] + (len(row) if row is not None else 0))
        inner = from_engine(flat, data_type.value_type)
        mask = pa.array([row is None for row in values], pa.bool_())
        return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), inner, mask=mask)
    return pa.array(values, data_type)


# -- the columnar plan (``SessionAggregator.process_table``) -------------------------------------

#: Built-ins that read one named column, so that ``process_table`` computes them with array
#: operations.
_COLUMN_BUILDERS: dict[str, Callable[[str], Aggregation]] = {
    "sum": lambda c: aggregations.sum_of(column=c),
    "min": lambda c: aggregations.min_of(column=c),
    "max": lambda c: aggregations.max_of(column=c),
    "first": lambda c: aggregations.first_of(column=c),
    "last": lambda c: aggregations.last_of(column=c),
    "collect": lambda c: aggregations.collect(column=c),
}
_SKIPS_NULLS = ("sum", "min", "max", "collect")


class SkipNullColumn(Aggregation):
    """A column built-in with Spark's null rule (a null is no input), that ``process_table``
    still computes columnar: it keeps the built-in's ``column`` and ``columnar_kind``. The
    columnar path never sees a null (a batch with nulls in an aggregated column takes the exact
    path, where this wrapper skips them)."""

    def __init__(self, inner: Aggregation) -> None:
        self.inner = inner
        self.name = inner.name
        self.column = inner.column
        self.acc_always_encodable = inner.acc_always_encodable

    @property
    def columnar_kind(self) -> str | None:
        return self.inner.columnar_kind

    def initial(self) -> Any:
        return self.inner.initial()

    def add(self, key: Any, value: Any, timestamp_ms: int, seq: int, acc: Any) -> Any:
        if value[self.column] is None:
            return acc
        return self.inner.add(key, value, timestamp_ms, seq, acc)

    def add_run(self, key: Any, values: list[Any], times_ms: list[int], seqs: list[int],
                acc: Any) -> Any:
        column = self.column
        if values and not any(map(operator.is_, map(operator.itemgetter(column), values),
                                  itertools.repeat(None))):
            return self.inner.add_run(key, values, times_ms, seqs, acc)  # no null: all rows
        kept = [(v, t, s) for v, t, s in zip(values, times_ms, seqs, strict=True)
                if v[column] is not None]
        if not kept:
            return acc
        rows, times, kept_seqs = (list(part) for part in zip(*kept, strict=True))
        return self.inner.add_run(key, rows, times, kept_seqs, acc)

    def merge(self, key: Any, acc1: Any, acc2: Any) -> Any:
        return self.inner.merge(key, acc1, acc2)

    def result(self, acc: Any) -> Any:
        return self.inner.result(acc)


@dataclass
class ColumnarPlan:
    """An aggregation over named columns, for ``SessionAggregator.process_table``.

    Attributes:
        aggregation: the combined aggregation; part ``i`` reads ``value_names[column]``.
        value_names: input value column -> the name it has in the engine's table (distinct from
            the key and time columns).
        presence: sum output -> (the name of the hidden count of its non-null values, the
            input column summed); the name is both a column of the engine's table and an output
            of the aggregation, so that a session of nulls sums to null, as in Spark.
        hidden: the outputs that are not the user's (the presence counts).
    """

    aggregation: Aggregation
    value_names: dict[str, str]
    presence: dict[str, tuple[str, str]]
    hidden: list[str]


def columnar_plan(specs: Sequence[AggSpec], taken: Sequence[str]) -> ColumnarPlan:
    """The :class:`ColumnarPlan` of built-in ``specs``; engine column names avoid ``taken``.

    Each value has the same semantics as :func:`plan`'s aggregation (Spark's null rule), and
    the batches ``process_table`` computes columnar give what :func:`plan`'s would.

    Raises:
        ValueError: a custom aggregation (it has no columnar form).
    """
    used = set(taken) | {s.name for s in specs}

    def fresh(base: str) -> str:
        name = base
        while name in used:
            name = "_" + name
        used.add(name)
        return name

    value_names: dict[str, str] = {}
    presence: dict[str, tuple[str, str]] = {}
    parts: dict[str, Aggregation] = {}
    for spec in specs:
        if spec.kind == "count":
            parts[spec.name] = aggregations.count()
            continue
        if spec.kind not in _COLUMN_BUILDERS or spec.column is None:
            raise ValueError(f"aggregation {spec.name!r} ({spec.kind}) has no columnar form")
        if spec.column not in value_names:
            value_names[spec.column] = fresh(f"__value_{spec.column}")
        built = _COLUMN_BUILDERS[spec.kind](value_names[spec.column])
        parts[spec.name] = SkipNullColumn(built) if spec.kind in _SKIPS_NULLS else built
        if spec.kind == "sum":
            presence[spec.name] = (fresh(f"__present_{spec.name}"), spec.column)
    for hidden, _ in presence.values():
        parts[hidden] = aggregations.sum_of(column=hidden)
    return ColumnarPlan(aggregations.combine(parts), value_names, presence,
                        [hidden for hidden, _ in presence.values()])
