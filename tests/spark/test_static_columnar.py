"""The static columnar path (``spark_adapter.static_columnar``): count, sum, min and max over
numeric columns reach the engine's ``process_table`` as Arrow columns.

Checked against native ``session_window`` in Spark, and, on the same Arrow batches, against the
row path it replaces (nulls, all-null sessions, several keys of several types, chunking).
"""

from __future__ import annotations

import datetime as dt
import random
import sys
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import functions as F

from spark_adapter import arrow, sessionize, static_columnar
from spark_adapter.config import SessionizeConfig

EPOCH = dt.datetime(2024, 1, 1)
SCHEMA = ("user string, day date, at timestamp, ts timestamp, i int, l long, b byte, "
          "d double, f float")
AGGS: dict[str, Any] = {
    "n": "count", "sum_i": ("sum", "i"), "min_i": ("min", "i"), "max_i": ("max", "i"),
    "sum_l": ("sum", "l"), "max_b": ("max", "b"), "min_b": ("min", "b"),
    "sum_d": ("sum", "d"), "min_d": ("min", "d"), "max_d": ("max", "d"), "max_f": ("max", "f"),
}


def make_rows(n: int, seed: int) -> list[tuple]:
    """Rows over 4 users x 2 days x 2 'at' values, 10 s gaps at random; ~25% nulls per value
    column; floats are multiples of 1/4, so every order of addition gives the same sum."""
    rng = random.Random(seed)
    rows = []
    clock = {k: 0.0 for k in range(16)}
    for _ in range(n):
        k = rng.randrange(16)
        clock[k] += rng.choice([0.5, 3, 9.999999, 10, 10.000001, 25])
        def maybe(value: Any) -> Any:
            return None if rng.random() < 0.25 else value
        rows.append((f"u{k % 4}", dt.date(2024, 1, 1 + k // 8), EPOCH + dt.timedelta(hours=k % 2),
                     EPOCH + dt.timedelta(seconds=clock[k]),
                     maybe(rng.randrange(-1000, 1000)), maybe(rng.randrange(-2**40, 2**40)),
                     maybe(rng.randrange(-128, 128)), maybe(rng.randrange(-400, 400) / 4),
                     maybe(rng.randrange(-400, 400) / 4)))
    # a session of nulls only: sum, min and max are null, count is 1
    rows.append(("lonely", dt.date(2024, 1, 1), EPOCH, EPOCH, None, None, None, None, None))
    return rows


def native_aggs() -> list[Any]:
    out = []
    for name, item in AGGS.items():
        column = F.count("*") if item == "count" else getattr(F, item[0])(item[1])
        out.append(column.alias(name))
    return out


@pytest.mark.parametrize("keys", [["user"], ["user", "day", "at"]])
def test_numeric_aggregations_with_nulls_equal_native(spark, keys):
    df = spark.createDataFrame(make_rows(600, seed=len(keys)), SCHEMA)
    ours = sessionize(df, key=keys, timestamp="ts", gap="10 seconds", aggregations=AGGS)
    native = df.groupBy(*keys, F.session_window("ts", "10 seconds").alias("w")) \
        .agg(*native_aggs()).select(*keys, "w.start", "w.end", *AGGS)
    assert [f.dataType for f in ours.schema.fields] == [f.dataType for f in native.schema.fields]
    got = sorted(tuple(r) for r in ours.collect())
    assert got == sorted(tuple(r) for r in native.collect())
    assert any(r[0] == "lonely" and r[len(keys) + 2] == 1 and r[len(keys) + 3] is None
               for r in got)


def config_for(spark: Any, keys: list[str], aggs: dict[str, Any], **options: Any
               ) -> SessionizeConfig:
    """The config ``sessionize`` hands a static partition, built the way it builds it."""
    plan = sys.modules["spark_adapter.sessionize"]
    df = spark.createDataFrame([], SCHEMA)
    schema = {f.name: f.dataType for f in df.schema.fields}
    agg, values, names, fields, json_outputs = plan._plan_aggregations(df, aggs, keys, "ts")
    config = SessionizeConfig(
        key_columns=keys, key_types=[schema[k] for k in keys], time_column="ts",
        time_type=schema["ts"], value_columns=values, value_types=[schema[c] for c in values],
        gap_us=10_000_000, inclusive_gap=True, emit=options.get("emit", "final"),
        aggregation=agg, output_names=names, output_fields=fields, json_outputs=json_outputs,
    )
    config.extra[static_columnar.PARTS_KEY] = [
        (name, *(("count", None) if item == "count" else item)) for name, item in aggs.items()]
    return config


def arrow_batches(spark: Any, config: SessionizeConfig, rows: list[tuple], size: int
                  ) -> list[pa.RecordBatch]:
    names = [f.name for f in spark.createDataFrame([], SCHEMA).schema.fields]
    table = pa.Table.from_pylist([dict(zip(names, r, strict=True)) for r in rows])
    columns = config.arrow_input_schema().names
    return table.select(columns).cast(config.arrow_input_schema()).to_batches(size)


def rows_of(batches: Any) -> list[tuple]:
    out: list[tuple] = []
    for batch in batches:
        out += [tuple(r.values()) for r in batch.to_pylist()]
    return sorted(out, key=repr)


@pytest.mark.parametrize("keys", [["user"], ["day", "at", "user"]])
def test_columnar_path_equals_row_path_on_the_same_batches(spark, keys):
    config = config_for(spark, keys, AGGS)
    assert static_columnar.static_partition(config, iter([])) is not None  # columnar here
    rows = make_rows(3000, seed=7)
    columnar = rows_of(arrow.static_partition(config, iter(arrow_batches(spark, config, rows,
                                                                          256))))
    del config.extra[static_columnar.PARTS_KEY]  # the row path
    assert static_columnar.static_partition(config, iter([])) is None
    row_path = rows_of(arrow.static_partition(config, iter(arrow_batches(spark, config, rows,
                                                                          256))))
    assert columnar == row_path and len(columnar) > 30


@pytest.mark.parametrize(("aggs", "options"), [
    ({"x": ("first", "i")}, {}),
    ({"x": ("collect", "d")}, {}),
    ({"n": "count", "x": ("min", "user")}, {}),
    ({"n": "count"}, {"emit": "update"}),
])
def test_other_aggregations_take_the_row_path(spark, aggs, options):
    config = config_for(spark, ["user"], aggs, **options)
    assert static_columnar.static_partition(config, iter([])) is None


@pytest.mark.parametrize("null_in", [0, 1, 2])
def test_columnar_runner_drops_rows_with_a_null_in_any_key_column(spark, null_in):
    """The columnar path drops and counts a row whose key has a null in any of its columns,
    the first included, as the row path does (a stream's rows are not checked on the driver)."""
    keys = ["user", "day", "at"]
    config = config_for(spark, keys, AGGS)
    parts = static_columnar.columnar_parts(config)
    assert parts is not None
    rows = make_rows(200, seed=3)
    position = {"user": 0, "day": 1, "at": 2}[keys[null_in]]
    holes = [tuple(None if i == position else v for i, v in enumerate(row))
             for row in rows[::9]]
    batches = arrow_batches(spark, config, rows + holes, 64)
    table = pa.Table.from_batches(batches)
    engine = arrow.SessionAggregator(
        arrow.InMemorySessionStore(retention_ms=1 << 60), config.windows(),
        static_columnar.columnar_aggregation(parts), watermark="external",
        **config.engine_options())
    runner = static_columnar.ColumnarRunner(config, parts, engine)
    counts, _ = runner.feed(table)
    assert counts == {"null_times_dropped": 0, "null_keys_dropped": len(holes)}
    got = rows_of([runner.rows(engine.advance_watermark(1 << 62))])
    row_engine = arrow.SessionAggregator(
        arrow.InMemorySessionStore(retention_ms=1 << 60), config.windows(), config.aggregation,
        watermark="external", **config.engine_options())
    out, row_counts, _ = arrow.sessionize_rows(row_engine, config, table, sort=False)
    closing = arrow.emits_batch(config, row_engine.advance_watermark(1 << 62))
    assert row_counts["null_keys_dropped"] == len(holes)
    assert got == rows_of([out, closing]) and got


@pytest.mark.parametrize(("keys", "gap_us", "inclusive", "max_duration_us"), [
    (["user"], 10_000_000, True, None),
    (["day", "at", "user"], 10_000_000, False, None),
    (["user"], 25_000_000, True, 40_000_000),
    (["at"], 9_999_999, False, 30_000_000),
])
def test_bounded_path_equals_the_engine_on_the_same_rows(spark, keys, gap_us, inclusive,
                                                         max_duration_us):
    """A static partition's rows take the bounded path (``sessionstore.sessionize``), a
    specialisation of the streaming engine for rows that are all there: on the same prepared
    columns it must give the engine's sessions (null rule, inclusive gap, max_duration)."""
    config = config_for(spark, keys, AGGS)
    config.gap_us = config.max_gap_us = gap_us
    config.inclusive_gap = inclusive
    config.max_duration_us = max_duration_us
    parts = static_columnar.columnar_parts(config)
    assert parts is not None
    rows = make_rows(2500, seed=gap_us % 97)
    runner = static_columnar._engine_runner(config, parts)
    prepared, counts = runner.engine_input(pa.Table.from_batches(arrow_batches(spark, config,
                                                                               rows, 500)))
    assert prepared is not None and counts["null_keys_dropped"] == 0
    bounded = static_columnar._bounded_rows(config, parts, runner.key_names, prepared)
    assert bounded.schema == config.arrow_output_schema()
    runner.feed_prepared(prepared)
    engine = runner.rows(runner.engine.advance_watermark(1 << 62))
    assert rows_of([bounded]) == rows_of([engine]) and bounded.num_rows > 30


def test_a_static_partition_takes_the_bounded_path(spark, monkeypatch):
    """The engine is only the fallback (a refused sum): with it disabled, a
    static partition still gives its sessions."""
    config = config_for(spark, ["user", "day"], AGGS)
    rows = make_rows(400, seed=5)
    expected = rows_of(arrow.static_partition(config, iter(arrow_batches(spark, config, rows,
                                                                         100))))

    def refuse(*args: Any) -> None:
        raise AssertionError("the engine fed a static partition")

    monkeypatch.setattr(static_columnar.ColumnarRunner, "feed_prepared", refuse)
    got = rows_of(arrow.static_partition(config, iter(arrow_batches(spark, config, rows, 100))))
    assert got == expected and len(got) > 10


def test_a_null_key_in_a_static_partition_is_refused_naming_the_key(spark):
    config = config_for(spark, ["user", "day"], AGGS)
    rows = make_rows(50, seed=2)
    rows[7] = (rows[7][0], None, *rows[7][2:])
    with pytest.raises(ValueError, match=r"key column\(s\) \['user', 'day'\] hold nulls"):
        list(arrow.static_partition(config, iter(arrow_batches(spark, config, rows, 16))))
