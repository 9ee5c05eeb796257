"""Cases ported from Spark's own ``DataFrameSessionWindowingSuite``, with native
``session_window`` on the same rows as the oracle.

The Scala suite builds its rows from tuples, so an ``Int`` column is non-nullable there, and a
grouping by ``session_window`` alone is a grouping by a constant: ``sessionize`` takes a key, so
the ports key on a literal (also non-nullable). Non-nullable columns reach a Python worker as
non-nullable Arrow fields, which the Arrow engine once refused in every task (``Schema at index
0 was different: k: string vs k: string not null``).
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark_adapter import sessionize
from tests.spark.streams import run_json_stream

SUITE_ROWS = [("2016-03-27 19:39:34", 1, "a"), ("2016-03-27 19:39:39", 1, "a"),
              ("2016-03-27 19:39:56", 2, "a"), ("2016-03-27 19:40:04", 2, "a"),
              ("2016-03-27 19:39:27", 4, "b")]
DURATION_ROWS = [("2016-03-27 19:39:34", 1, "10 seconds"), ("2016-03-27 19:39:56", 2, "20 seconds"),
                 ("2016-03-27 19:39:27", 4, "30 seconds")]


def suite_frame(spark: Any, rows: list[tuple], third: str) -> Any:
    """The suite's ``toDF("time", "value", third)``: ``value`` an Int, so not nullable."""
    schema = T.StructType([T.StructField("time", T.StringType()),
                           T.StructField("value", T.IntegerType(), nullable=False),
                           T.StructField(third, T.StringType())])
    frame = spark.createDataFrame(rows, schema).withColumn("ts", F.col("time").cast("timestamp"))
    assert not frame.schema["value"].nullable
    return frame


def native_rows(df: Any, keys: list[str], gap: Any, aggs: list[Any]) -> list[tuple]:
    grouped = df.groupBy(*keys, F.session_window("ts", gap).alias("w"))
    return sorted(tuple(r) for r in grouped.agg(*aggs).select(
        *keys, "w.start", "w.end", *[f"a{i}" for i in range(len(aggs))]).collect())


def ours(df: Any, keys: list[str], gap: Any, aggs: dict[str, Any], **kwargs: Any) -> list[tuple]:
    return sorted(tuple(r) for r in sessionize(
        df, key=keys, timestamp="ts", gap=gap, aggregations=aggs, **kwargs).collect())


@pytest.mark.parametrize("engine", ["arrow", "processor"])
def test_group_by_a_literal_key(spark, engine):
    """'session window groupBy statement': grouped by the session window alone."""
    df = suite_frame(spark, SUITE_ROWS[2:], "id").withColumn("k", F.lit("all"))
    expected = native_rows(df, ["k"], "10 seconds",
                           [F.count("*").alias("a0"), F.sum("value").alias("a1")])
    assert [r[3] for r in expected] == [1, 2]  # the suite's counts, by start
    got = ours(df, ["k"], "10 seconds", {"n": "count", "s": ("sum", "value")}, engine=engine)
    assert got == expected


@pytest.mark.parametrize("engine", ["arrow", "processor"])
def test_group_by_a_two_column_key(spark, engine):
    """'session window groupBy with multiple keys statement', keyed by id and a literal."""
    df = suite_frame(spark, SUITE_ROWS, "id").withColumn("src", F.lit(7))
    expected = native_rows(df, ["id", "src"], "10 seconds",
                           [F.count("*").alias("a0"), F.sum("value").alias("a1")])
    assert [(r[0], r[4], r[5]) for r in expected] == [("a", 2, 2), ("a", 2, 4), ("b", 1, 4)]
    got = ours(df, ["id", "src"], "10 seconds", {"n": "count", "s": ("sum", "value")},
               engine=engine)
    assert got == expected


@pytest.mark.parametrize("engine", ["arrow", "processor"])
def test_dynamic_gap_from_a_duration_column(spark, engine):
    """'SPARK-36465: time window in SQL with dynamic string expression'."""
    df = suite_frame(spark, DURATION_ROWS, "duration").withColumn("k", F.lit(0))
    expected = native_rows(df, ["k"], F.col("duration"),
                           [F.count("*").alias("a0"), F.max("value").alias("a1")])
    # one session: 19:39:27 + 30 s reaches 19:39:56, whose own 20 s gap ends it at 19:40:16
    assert [r[2:] for r in expected] == [(dt.datetime(2016, 3, 27, 19, 40, 16), 3, 4)]
    got = ours(df, ["k"], F.col("duration"), {"n": "count", "hi": ("max", "value")},
               max_gap="30 seconds", engine=engine)
    assert got == expected


@pytest.mark.parametrize("engine", ["arrow", "processor"])
def test_dynamic_gap_from_a_conditional_expression(spark, engine):
    """'SPARK-36465: time window in SQL with conditional expression as gap duration'."""
    df = suite_frame(spark, DURATION_ROWS, "duration").withColumn("k", F.lit(0))
    gap = ("case when value = 1 then '2 seconds' when value = 2 then '10 seconds' "
           "else '20 seconds' end")
    expected = native_rows(df, ["k"], F.expr(gap),
                           [F.count("*").alias("a0"), F.sum("value").alias("a1")])
    # 19:39:27 (20 s) takes in 19:39:34 (2 s); 19:39:56 (10 s) stands alone
    assert [r[3:] for r in expected] == [(2, 5), (1, 2)]
    got = ours(df, ["k"], gap, {"n": "count", "s": ("sum", "value")}, max_gap="20 seconds",
               engine=engine)
    assert got == expected


@pytest.mark.parametrize("engine", ["arrow", "processor"])
def test_streaming_literal_key_and_non_null_value(spark, tmp_path: Path, engine):
    """The streaming engines take non-nullable columns too (a literal key, a coalesced value)."""
    batches = [[("a", "2024-01-01 00:00:00", 1), ("a", "2024-01-01 00:00:05", None)],
               [("b", "2024-01-01 00:01:00", 3)], [("c", "2024-01-01 00:05:00", 1)], []]

    def prepared(stream: Any) -> Any:
        return stream.withColumn("k", F.lit("x")) \
            .withColumn("v", F.coalesce(F.col("amount"), F.lit(0)))

    def run(name: str, build: Any) -> dict[int, list[tuple]]:
        return run_json_stream(spark, tmp_path / name, "user string, ts timestamp, amount long",
                               batches, lambda r: {"user": r[0], "ts": r[1], "amount": r[2]},
                               lambda stream: build(prepared(stream)))[0]

    expected = run("native", lambda s: s.withWatermark("ts", "5 seconds")
                   .groupBy("k", F.session_window("ts", "10 seconds").alias("w"))
                   .agg(F.count("*"), F.sum("v")).select("k", "w.start", "w.end", "count(1)",
                                                         "sum(v)"))
    got = run(engine, lambda s: sessionize(
        s, key="k", timestamp="ts", gap="10 seconds", watermark_delay="5 seconds",
        aggregations={"n": "count", "s": ("sum", "v")}, engine=engine,
        state_location=str(tmp_path / "state"), local_dir=str(tmp_path / "local")))
    assert got == expected
    assert sorted(r[3:] for rows in got.values() for r in rows) == [(1, 3), (2, 1)]
