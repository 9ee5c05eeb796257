"""The one aggregation language: the CLI's ``--agg`` text and Spark's mapping parse alike, and
one table decides every output type."""

from __future__ import annotations

import pyarrow as pa
import pytest

from sessionstore import aggregations, aggspec
from sessionstore.aggspec import AggSpec, SkipNullColumn

SCHEMA = pa.schema([("user", pa.string()), ("ts", pa.int64()), ("amount", pa.int32()),
                    ("price", pa.float32()), ("cost", pa.decimal128(10, 2)),
                    ("page", pa.string()), ("flag", pa.bool_())])


def test_cli_text_and_spark_mapping_parse_to_the_same_specs():
    texts = ["n=count", "total=sum:amount", "lo=min:price", "hi=max:price",
             "landing=first:page", "exit=last:page", "pages=collect:page"]
    mapping = {"n": "count", "total": ("sum", "amount"), "lo": ("min", "price"),
               "hi": ("max", "price"), "landing": ("first", "page"), "exit": ("last", "page"),
               "pages": ("collect", "page")}
    assert aggspec.parse_specs(texts) == aggspec.from_mapping(mapping)
    assert aggspec.parse_specs([]) == [AggSpec("events", "count")]


@pytest.mark.parametrize(("spec", "column_type", "output_type"), [
    ("x=count", None, pa.int64()),
    ("x=sum:amount", pa.int32(), pa.int64()),
    ("x=sum:price", pa.float32(), pa.float64()),
    ("x=sum:cost", pa.decimal128(10, 2), pa.decimal128(20, 2)),  # Spark widens by 10 digits
    ("x=min:price", pa.float32(), pa.float32()),
    ("x=max:page", pa.string(), pa.string()),
    ("x=first:amount", pa.int32(), pa.int32()),
    ("x=last:flag", pa.bool_(), pa.bool_()),
    ("x=collect:page", pa.string(), pa.list_(pa.string())),
])
def test_one_table_gives_every_output_type(spec, column_type, output_type):
    planned = aggspec.plan(aggspec.parse_specs([spec]), SCHEMA)
    assert planned.output_fields == [pa.field("x", output_type)]
    assert planned.value_columns == ([] if column_type is None else [spec.split(":")[1]])


@pytest.mark.parametrize(("texts", "message"), [
    (["x"], "expected NAME=count"),
    (["=count"], "expected NAME=count"),
    (["x=median:amount"], "KIND must be count or one of sum, min, max, first, last, collect"),
    (["x=sum:"], "KIND must be"),
    (["x=count", "x=sum:amount"], "'x' is given twice"),
])
def test_bad_text_names_the_option_and_the_spec(texts, message):
    with pytest.raises(ValueError, match=message) as info:
        aggspec.parse_specs(texts)
    assert "--agg" in str(info.value)


@pytest.mark.parametrize(("mapping", "message"), [
    ({}, "non-empty dict"),
    ([("n", "count")], "non-empty dict"),
    ({"": "count"}, "non-empty strings"),
    ({"x": ("median", "amount")}, "must be 'count'"),
    ({"x": ("sum", 3)}, "is not a column name"),
])
def test_bad_mappings_are_refused(mapping, message):
    with pytest.raises(ValueError, match=message):
        aggspec.from_mapping(mapping)


def test_plan_refuses_missing_columns_and_sums_of_non_numbers():
    with pytest.raises(ValueError, match="names column 'nope'"):
        aggspec.plan(aggspec.parse_specs(["x=sum:nope"]), SCHEMA)
    for column in ("page", "flag"):
        with pytest.raises(ValueError, match="sum needs a numeric column"):
            aggspec.plan(aggspec.parse_specs([f"x=sum:{column}"]), SCHEMA)


def fold(aggregation: aggregations.Aggregation, values: list) -> object:
    acc = aggregation.initial()
    for seq, value in enumerate(values):
        acc = aggregation.add("k", value, seq, seq, acc)
    return aggregation.result(acc)


def test_planned_aggregations_read_their_own_columns():
    specs = aggspec.parse_specs(["n=count", "total=sum:amount", "pages=collect:page",
                                 "exit=last:page"])
    planned = aggspec.plan(specs, SCHEMA)
    assert planned.value_columns == ["amount", "page"]
    rows = [(3, "/"), (4, "/cart"), (5, "/pay")]
    assert fold(planned.aggregation, rows) == {"n": 3, "total": 12,
                                               "pages": ["/", "/cart", "/pay"], "exit": "/pay"}
    scalar = aggspec.plan(aggspec.parse_specs(["total=sum:amount"]), SCHEMA,
                          scalar_single_column=True)
    assert fold(scalar.aggregation, [3, 4]) == {"total": 7}
    tupled = aggspec.plan(aggspec.parse_specs(["total=sum:amount"]), SCHEMA)
    assert fold(tupled.aggregation, [(3,), (4,)]) == {"total": 7}


def test_a_custom_aggregation_sees_every_other_column_as_a_dict():
    longest = aggregations.aggregate(lambda: 0, lambda key, row, acc: max(acc, row["amount"]),
                                     lambda key, a, b: max(a, b))
    planned = aggspec.plan(aggspec.from_mapping({"n": "count", "best": longest}), SCHEMA,
                           exclude=["user", "ts"])
    assert planned.value_columns == ["amount", "price", "cost", "page", "flag"]
    assert planned.custom_outputs == ["best"]
    assert planned.output_fields[1] == pa.field("best", pa.string())
    rows = [(2, 1.0, None, "/", True), (9, 1.0, None, "/", False)]
    assert fold(planned.aggregation, rows) == {"n": 2, "best": 9}


def test_sum_min_max_and_collect_skip_nulls_first_and_last_keep_them():
    planned = aggspec.plan(aggspec.parse_specs(
        ["s=sum:amount", "lo=min:amount", "hi=max:amount", "all=collect:amount",
         "f=first:amount", "l=last:amount"]), SCHEMA, scalar_single_column=True)
    assert fold(planned.aggregation, [None, 4, None, 2, None]) == {
        "s": 6, "lo": 2, "hi": 4, "all": [4, 2], "f": None, "l": None}
    assert fold(planned.aggregation, [None, None]) == {
        "s": None, "lo": None, "hi": None, "all": [], "f": None, "l": None}


def test_nested_columns_are_refused_naming_column_and_type():
    nested = pa.schema([("tags", pa.list_(pa.string())), ("meta", pa.struct([("a", pa.int8())]))])
    assert aggspec.plan(aggspec.parse_specs(["t=collect:tags"]), nested).output_fields == [
        pa.field("t", pa.list_(pa.list_(pa.string())))]
    for spec in ("x=min:tags", "x=first:meta", "x=sum:tags"):
        with pytest.raises(ValueError, match="cannot run over column"):
            aggspec.plan(aggspec.parse_specs([spec]), nested)


@pytest.mark.parametrize("rows", [[], [4], [None], [3, 1.5, 7], [None, 4, None, 2, None],
                                  [2, None, 2.0, -1]])
def test_a_column_run_skipping_nulls_equals_adding_each_row(rows):
    # SkipNullColumn.add_run passes a run without nulls straight to the built-in: it must
    # still give what adding row by row gives, nulls skipped
    values = [{"amount": v} for v in rows]
    times = [10 * i for i in range(len(rows))]
    for make in (aggregations.sum_of, aggregations.min_of, aggregations.max_of,
                 aggregations.collect):
        part = SkipNullColumn(make(column="amount"))
        one_by_one = part.initial()
        for i, value in enumerate(values):
            one_by_one = part.add("k", value, times[i], i, one_by_one)
        assert part.add_run("k", values, times, list(range(len(rows))),
                            part.initial()) == one_by_one
