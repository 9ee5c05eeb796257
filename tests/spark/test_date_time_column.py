"""A ``date`` event-time column, against native ``session_window``.

Native casts a date time column to a timestamp, midnight in the session time zone, and gives
timestamp session bounds; a stream cannot take one (Spark refuses a watermark on a date). The
static cases run in a time zone with a daylight-saving change between the dates, where
midnight-to-midnight is 23 hours: a gap of 47 hours joins 2024-03-09 and 2024-03-11 in New
York (and would not at midnight UTC, 48 hours apart).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark_adapter import sessionize

SCHEMA = T.StructType([T.StructField("user", T.StringType()), T.StructField("day", T.DateType()),
                       T.StructField("v", T.IntegerType())])
ROWS = [("a", dt.date(2024, 3, 9), 1), ("a", dt.date(2024, 3, 11), 2),
        ("a", dt.date(2024, 3, 14), None), ("a", None, 5),  # a null time: dropped, as native
        ("b", dt.date(2024, 3, 10), 7), ("b", dt.date(2024, 3, 10), 8),
        ("b", dt.date(2024, 3, 12), None), ("c", dt.date(1969, 12, 31), -3)]
AGGS = {"n": "count", "total": ("sum", "v"), "top": ("max", "v")}


def native_rows(df: Any, gap: str) -> list[tuple[Any, ...]]:
    out = df.groupBy("user", F.session_window("day", gap).alias("w")).agg(
        F.count("*").alias("n"), F.sum("v").alias("total"), F.max("v").alias("top"))
    return sorted(tuple(r) for r in out.select("user", "w.start", "w.end", "n", "total", "top")
                  .collect())


@pytest.mark.parametrize("gap", ["47 hours", "46 hours"])
def test_a_static_date_time_column_equals_native(new_york, gap):
    """Kills the refusal of a date time column on a static DataFrame, and a date taken as
    midnight UTC (then 47 hours would not join 2024-03-09 and 2024-03-11)."""
    df = new_york.createDataFrame(ROWS, SCHEMA)
    expected = native_rows(df, gap)
    sessions_of_a = [r for r in expected if r[0] == "a"]
    assert len(sessions_of_a) == (2 if gap == "47 hours" else 3)  # the DST day decides
    # midnight in New York (a naive datetime in the driver's local time, as Spark returns it)
    assert expected[0][1].timestamp() == \
        dt.datetime(2024, 3, 9, 5, 0, tzinfo=dt.timezone.utc).timestamp()
    runs = [("arrow", AGGS), ("processor", AGGS),
            ("arrow", {"n": "count"})]  # the columnar path; the row path takes max
    for engine, aggs in runs:
        out = sessionize(df, key="user", timestamp="day", gap=gap, aggregations=aggs,
                         engine=engine)
        assert [f.dataType for f in out.schema.fields][1:3] == [T.TimestampType()] * 2
        width = 3 + len(aggs)
        assert sorted(tuple(r) for r in out.collect()) == \
            [r[:width] for r in expected], (engine, aggs)


def test_a_date_time_column_on_a_stream_is_refused_naming_it(spark, tmp_path):
    """Native streaming refuses a watermark on a date; so does sessionize, in the call."""
    stream = spark.readStream.schema(SCHEMA).json(str(tmp_path))
    with pytest.raises(Exception, match="EVENT_TIME_IS_NOT_ON_TIMESTAMP_TYPE"):  # noqa: PT011
        stream.withWatermark("day", "1 hour").groupBy(
            "user", F.session_window("day", "1 hour")).count().writeStream \
            .format("memory").queryName("date_stream").start()
    for engine in ("arrow", "processor"):
        with pytest.raises(ValueError, match=r"timestamp column 'day' is a date: a stream's "
                                             r"event time must be a timestamp .* cast it"):
            sessionize(stream, key="user", timestamp="day", gap="1 hour", watermark_delay="0s",
                       aggregations={"n": "count"}, engine=engine,
                       state_location=str(tmp_path / "state"))


def test_aggregations_and_keys_over_the_date_time_column_stay_dates(new_york):
    """Native aggregates and groups by the date column itself, not the timestamp it casts for
    the session bounds: min and max of it are dates, and so is the column as a key. Kills the
    cast column reaching aggregations and keys (they came out as timestamps). The gap is in
    calendar days, so the date's hidden timestamp takes the per-row calendar path too."""
    df = new_york.createDataFrame(ROWS, SCHEMA)
    gap = "2 days"
    aggs = {"n": "count", "first_day": ("min", "day"), "last_day": ("max", "day")}
    native = df.groupBy("user", F.session_window("day", gap).alias("w")).agg(
        F.count("*"), F.min("day"), F.max("day")).select("user", "w.start", "w.end", "count(1)",
                                                         "min(day)", "max(day)")
    expected = sorted(tuple(r) for r in native.collect())
    assert [r[3:] for r in expected if r[0] == "a"] == [  # midnight + 2 days: joins 03-11
        (2, dt.date(2024, 3, 9), dt.date(2024, 3, 11)),
        (1, dt.date(2024, 3, 14), dt.date(2024, 3, 14))]
    dated = df.where(F.col("day").isNotNull())  # a key must be set (sessionize refuses nulls)
    native_keyed = dated.groupBy("user", "day", F.session_window("day", gap).alias("w")).count()
    expected_keyed = sorted(tuple(r) for r in native_keyed.select(
        "user", "day", "w.start", "w.end", "count").collect())
    for engine in ("arrow", "processor"):
        out = sessionize(df, key="user", timestamp="day", gap=gap, aggregations=aggs,
                         engine=engine)
        assert [f.dataType for f in out.schema.fields][-2:] == [T.DateType()] * 2
        assert sorted(tuple(r) for r in out.collect()) == expected, engine
        keyed = sessionize(dated, key=["user", "day"], timestamp="day", gap=gap,
                           aggregations={"n": "count"}, engine=engine)
        assert keyed.schema["day"].dataType == T.DateType()
        assert sorted(tuple(r) for r in keyed.collect()) == expected_keyed, engine
