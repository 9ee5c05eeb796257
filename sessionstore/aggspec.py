"""The aggregation language shared by every front end: one table of kinds and their output types.

The CLI writes ``--agg NAME=KIND:COLUMN`` (or ``NAME=count``); ``spark_adapter.sessionize`` takes a
mapping ``{NAME: "count" | (KIND, COLUMN) | Aggregation}``. Both are parsed here into
:class:`AggSpec` items, and :func:`plan` turns them, with the input's Arrow schema, into one engine
aggregation, the value columns it reads, and the Arrow type of every output. Front ends with
another type system (Spark) convert the Arrow types at their edge.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from . import aggregations
from .aggregations import Aggregation

#: The output name used when no aggregation is given on the command line.
DEFAULT_SPEC = "events=count"
CUSTOM = "custom"


def _sum_type(name: str, column: str, data_type: pa.DataType) -> pa.DataType:
    if pa.types.is_integer(data_type):
        return pa.int64()
    if pa.types.is_floating(data_type) or pa.types.is_decimal(data_type):
        return pa.float64()
    raise ValueError(f"aggregation {name!r}: sum needs a numeric column, {column!r} is "
                     f"{data_type}")


def _same_type(name: str, column: str, data_type: pa.DataType) -> pa.DataType:
    return data_type


def _list_type(name: str, column: str, data_type: pa.DataType) -> pa.DataType:
    return pa.list_(data_type)


@dataclass(frozen=True)
class Kind:
    """One aggregation kind: how to build it and the Arrow type it outputs for an input type."""

    build: Callable[[Callable[[Any], Any]], Aggregation]
    output_type: Callable[[str, str, pa.DataType], pa.DataType]


#: Every kind that reads a column. ``count`` reads none and outputs int64.
KINDS: dict[str, Kind] = {
    "sum": Kind(aggregations.sum_of, _sum_type),
    "min": Kind(aggregations.min_of, _same_type),
    "max": Kind(aggregations.max_of, _same_type),
    "first": Kind(aggregations.first_of, _same_type),
    "last": Kind(aggregations.last_of, _same_type),
    "collect": Kind(aggregations.collect, _list_type),
}


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
            kind = KINDS[spec.kind]
            data_type = schema.field(spec.column).type
            fields.append(pa.field(spec.name, kind.output_type(spec.name, spec.column,
                                                                data_type)))
            parts[spec.name] = kind.build(_picker(value_columns.index(spec.column), scalar))
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
