"""Column names Spark's SQL parser would misread (a backtick, a dot, spaces) and a key column
that is also the time column: ``sessionize`` gives native ``session_window``'s sessions on the
static paths (the bucketed one and the row path) as on native."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from pyspark.sql import functions as F

from spark_adapter import sessionize

EPOCH = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
# (key, seconds, value): sessions of gap 10 s per key
ROWS = [("a", 0, 1), ("a", 5, 2), ("a", 30, 3), ("b", 1, 4), ("b", 40, None), ("a", 36, 5)]
NAMES = ["k`ey", "k.ey", "a b.c", "`"]


def _frame(spark: Any, key: str, ts: str, value: str) -> Any:
    rows = [(k, EPOCH + dt.timedelta(seconds=s), v) for k, s, v in ROWS]
    return spark.createDataFrame(rows, "k string, t timestamp, v long").toDF(key, ts, value)


def _q(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _native(df: Any, key: str, ts: str, value: str) -> list[tuple[Any, ...]]:
    frame = df.groupBy(F.col(_q(key)), F.session_window(F.col(_q(ts)), "10 seconds").alias("w"))
    frame = frame.agg(F.count("*").alias("n"), F.sum(F.col(_q(value))).alias("s"))
    return sorted(tuple(r) for r in frame.select(_q(key), "w.start", "w.end", "n", "s").collect())


def _ours(df: Any, key: str, ts: str, value: str, aggs: dict[str, Any]) -> list[tuple[Any, ...]]:
    frame = sessionize(df, key=key, timestamp=ts, gap="10 seconds", aggregations=aggs)
    return sorted(tuple(r) for r in frame.collect())


@pytest.mark.parametrize("path", ["bucketed", "rows"])
@pytest.mark.parametrize("role", ["key", "time", "value"])
@pytest.mark.parametrize("name", NAMES)
def test_odd_column_names_equal_native(spark, path, role, name):
    names = {"key": "k", "time": "t", "value": "v"} | {role: name}
    df = _frame(spark, names["key"], names["time"], names["value"])
    # count + sum take the bucketed path; a first value takes the row path
    aggs: dict[str, Any] = {"n": "count", "s": ("sum", names["value"])}
    if path == "rows":
        aggs["f"] = ("first", names["value"])
    got = _ours(df, names["key"], names["time"], names["value"], aggs)
    want = _native(df, names["key"], names["time"], names["value"])
    assert [r[:5] for r in got] == want
    assert list(sessionize(df, key=names["key"], timestamp=names["time"], gap="10 seconds",
                           aggregations=aggs).columns[:1]) == [names["key"]]


@pytest.mark.parametrize(("path", "engine"), [("bucketed", "arrow"), ("rows", "arrow"),
                                             ("rows", "processor")])
def test_key_that_is_the_time_column_equals_native(spark, path, engine):
    df = _frame(spark, "k", "ts", "v")
    aggs: dict[str, Any] = {"n": "count", "s": ("sum", "v")}
    if path == "rows":
        aggs["f"] = ("first", "v")
    frame = sessionize(df, key="ts", timestamp="ts", gap="10 seconds", aggregations=aggs,
                       engine=engine)
    got = sorted(tuple(r)[:5] for r in frame.collect())
    native = df.groupBy("ts", F.session_window("ts", "10 seconds").alias("w")).agg(
        F.count("*").alias("n"), F.sum("v").alias("s"))
    want = sorted(tuple(r) for r in native.select("ts", "w.start", "w.end", "n", "s").collect())
    assert got == want
    assert frame.columns[0] == "ts"
    assert frame.schema["ts"].dataType == df.schema["ts"].dataType


def _stream_rows(spark: Any, tmp_path: Any, build: Any, df: Any) -> list[tuple[Any, ...]]:
    """Every row ``build`` emits over ``df`` fed as one file of a stream, then the watermark
    moved past every session by a far-later row (its own session stays open)."""
    source = tmp_path / "in"
    df.write.json(str(source / "0"))
    stream = spark.readStream.schema(df.schema).json(str(source / "*"))
    out: list[tuple[Any, ...]] = []
    query = (build(stream).writeStream
             .foreachBatch(lambda frame, _: out.extend(tuple(r) for r in frame.collect()))
             .option("checkpointLocation", str(tmp_path / "checkpoint")).start())
    try:
        query.processAllAvailable()
        later = df.limit(1).withColumn(df.columns[1], F.lit(EPOCH + dt.timedelta(days=1)))
        later.write.json(str(source / "1"))
        query.processAllAvailable()
        query.processAllAvailable()  # the no-data batch at the advanced watermark
    finally:
        query.stop()
    return sorted(out)


@pytest.mark.parametrize("engine", ["arrow", "processor"])
def test_odd_column_names_in_a_stream_equal_native(spark, tmp_path, engine):
    key, ts, value = "k`e y", "k`e y.t", "`k.e"
    df = _frame(spark, key, ts, value)

    def ours(stream: Any) -> Any:
        return sessionize(stream, key=key, timestamp=ts, gap="10 seconds",
                          aggregations={"n": "count", "s": ("sum", value)}, engine=engine,
                          watermark_delay="0 seconds", state_location=str(tmp_path / "state"),
                          local_dir=str(tmp_path / "local"))

    def native(stream: Any) -> Any:
        frame = stream.withWatermark(_q(ts), "0 seconds").groupBy(
            F.col(_q(key)), F.session_window(F.col(_q(ts)), "10 seconds").alias("w"))
        frame = frame.agg(F.count("*").alias("n"), F.sum(F.col(_q(value))).alias("s"))
        return frame.select(_q(key), "w.start", "w.end", "n", "s")

    got = [r[:5] for r in _stream_rows(spark, tmp_path / "ours", ours, df)]
    want = _stream_rows(spark, tmp_path / "native", native, df)
    assert len(want) == 4 and got == want


@pytest.mark.parametrize("engine", ["arrow", "processor"])
def test_every_column_oddly_named_at_once_equals_native_on_both_engines(spark, engine):
    key, ts, value = "k`e.y", "t s.`", "`v.`"
    df = _frame(spark, key, ts, value)
    frame = sessionize(df, key=key, timestamp=ts, gap="10 seconds", engine=engine,
                       aggregations={"n": "count", "s": ("sum", value)})
    assert frame.columns[0] == key
    assert sorted(tuple(r)[:5] for r in frame.collect()) == _native(df, key, ts, value)


@pytest.mark.parametrize("engine", ["arrow", "processor"])
def test_key_that_is_the_time_column_in_a_stream_equals_native_static(spark, tmp_path, engine):
    """Native streaming refuses this grouping (the key carries the watermark as well as the
    session window); the closed sessions equal native's static ones."""
    df = _frame(spark, "k", "ts", "v")

    def ours(stream: Any) -> Any:
        return sessionize(stream, key="ts", timestamp="ts", gap="10 seconds",
                          aggregations={"n": "count", "s": ("sum", "v")}, engine=engine,
                          watermark_delay="0 seconds", state_location=str(tmp_path / "state"),
                          local_dir=str(tmp_path / "local"))

    def native(frame: Any) -> Any:
        frame = frame.groupBy("ts", F.session_window("ts", "10 seconds").alias("w"))
        frame = frame.agg(F.count("*").alias("n"), F.sum("v").alias("s"))
        return frame.select("ts", "w.start", "w.end", "n", "s")

    with pytest.raises(Exception, match="MULTIPLE_EVENT_TIME_COLUMNS"):
        _stream_rows(spark, tmp_path / "native", lambda s: native(
            s.withWatermark("ts", "0 seconds")), df)
    got = [r[:5] for r in _stream_rows(spark, tmp_path / "ours", ours, df)]
    # every session closed but the far-later row's, which the watermark has not passed
    want = sorted(tuple(r) for r in native(df).collect())
    assert len(want) == len(ROWS) and got == want
