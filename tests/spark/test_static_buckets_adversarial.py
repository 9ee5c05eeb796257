"""An adversarial review of the bucketed static path (``static_columnar.bucketed_frame`` and
``bucketed_partition``) against native ``session_window`` and the row path: times before the
epoch and off whole milliseconds, gaps off whole milliseconds, either gap rule, every integer
width at its extremes, nulls, keys of several types (one never null), duplicate rows, one and
five shuffle partitions, and the errors it raises in place of the row path's.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from pyspark.sql import functions as F

from sessionstore.aggregations import SumOverflowError
from spark_adapter import sessionize, static_columnar
from tests.spark.test_static_columnar import config_for
from tests.strategies import adversarial_bucket_cases

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
INT64_MAX = 2**63 - 1


def _at(us: int) -> dt.datetime:
    return EPOCH + dt.timedelta(microseconds=us)


_TS = pa.timestamp("us", tz="UTC")
_BUCKET_COLUMNS = ["__sessionstore_key0", "__sessionstore_first", "__sessionstore_last", "__sessionstore_v0",
                   "__sessionstore_l0", "__sessionstore_n0", "__sessionstore_v1"]
_BUCKET_TYPES = [pa.string(), _TS, _TS, pa.int64(), pa.int64(), pa.int64(), pa.int64()]


def _buckets(config: Any, rows: list[tuple[Any, ...]]) -> list[pa.RecordBatch]:
    """The sessions ``bucketed_partition`` makes of ``rows`` of ``bucketed_frame``'s columns
    for ``{"s": ("sum", "l"), "n": "count"}``: key, first and last time, the sums of the high
    and low halves, the values present, the row count."""
    batch = pa.RecordBatch.from_arrays(
        [pa.array(list(c), t) for c, t in zip(zip(*rows, strict=True), _BUCKET_TYPES,
                                               strict=True)], names=_BUCKET_COLUMNS)
    return list(static_columnar.bucketed_partition(config, iter([batch])))


def _named_time(error: BaseException) -> int:
    found = re.fullmatch(r"the sum 's' of key 'a' leaves int64 in the session holding its "
                         r"event at time (-?\d+): it would be (\d+);.*", str(error))
    assert found is not None, str(error)
    assert int(found.group(2)) == INT64_MAX + 1
    return int(found.group(1))


def test_a_sum_leaving_int64_names_an_event_time_in_the_row_paths_unit(spark):
    """Both paths name an event of the session in the engine's unit, microseconds (the
    bucketed path named -1999: a floored millisecond, no event's time in either unit)."""
    config = config_for(spark, ["user"], {"s": ("sum", "l"), "n": "count"})
    # one session, times before the epoch and off whole ms: INT64_MAX, then 1
    times = [-2_000_001, -1_998_501]
    names = ["user", "day", "at", "ts", "i", "l", "b", "d", "f"]
    table = pa.Table.from_pylist(
        [dict(zip(names, ("a", None, None, _at(t), None, v, None, None, None), strict=True))
         for t, v in zip(times, [INT64_MAX, 1], strict=True)])
    batches = table.select(config.arrow_input_schema().names).cast(
        config.arrow_input_schema()).to_batches()
    with pytest.raises(SumOverflowError) as row_path:
        list(static_columnar.static_partition(config, iter(batches)) or [])
    assert _named_time(row_path.value) in times
    # the same events as Spark reduces them: one bucket, high halves 2**31 - 1 and 0, low
    # halves 2**32 - 1 and 1
    bucket = ("a", _at(times[0]), _at(times[1]), 2**31 - 1, 2**32, 2, 2)
    with pytest.raises(SumOverflowError) as bucketed:
        _buckets(config, [bucket])
    assert _named_time(bucketed.value) == times[1]


SCHEMA = "k string, day date, ts timestamp, b byte, s short, i int, x long, l long"
AGGS: dict[str, Any] = {
    "n": "count", "sum_b": ("sum", "b"), "min_b": ("min", "b"), "sum_s": ("sum", "s"),
    "max_s": ("max", "s"), "sum_i": ("sum", "i"), "min_i": ("min", "i"), "max_i": ("max", "i"),
    "min_x": ("min", "x"), "max_x": ("max", "x"), "sum_l": ("sum", "l"),
}


def _frame(spark: Any, rows: list[tuple[Any, ...]]) -> Any:
    """``rows`` of :func:`tests.strategies.adversarial_bucket_cases` with ``lit``, a key column
    that is never null (Spark sends it as a non-nullable Arrow field)."""
    days = (dt.date(1969, 12, 31), dt.date(2024, 2, 29))
    return spark.createDataFrame(
        [(k, days[d], None if t is None else _at(t), *values) for k, d, t, *values in rows],
        SCHEMA).withColumn("lit", F.lit("x"))


def _sessions(df: Any, case: dict[str, Any], bucketed: bool
              ) -> tuple[Any, list[tuple[Any, ...]]]:
    with pytest.MonkeyPatch.context() as patched:  # the row path: bucketed_parts refuses
        if not bucketed:
            patched.setattr(static_columnar, "bucketed_parts", lambda config: None)
        frame = sessionize(df, key=case["keys"], timestamp="ts",
                           gap=dt.timedelta(microseconds=case["gap_us"]), aggregations=AGGS,
                           inclusive_gap=case["inclusive_gap"])
        plan = frame._jdf.queryExecution().executedPlan().toString()
        assert ("HashAggregate" in plan) == bucketed, plan
        return frame.schema, sorted(tuple(r) for r in frame.collect())


def _native(df: Any, case: dict[str, Any]) -> list[tuple[Any, ...]]:
    parts = [(F.count("*") if item == "count" else getattr(F, item[0])(item[1])).alias(name)
             for name, item in AGGS.items()]
    window = F.session_window("ts", f"{case['gap_us']} microseconds").alias("w")
    frame = df.groupBy(*case["keys"], window).agg(*parts)
    return sorted(tuple(r) for r in frame.select(*case["keys"], "w.start", "w.end", *AGGS)
                  .collect())


@settings(max_examples=8)
@given(case=adversarial_bucket_cases())
def test_bucketed_equals_row_path_and_native(spark, case):
    before = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", str(case["partitions"]))
    try:
        df = _frame(spark, case["rows"])
        schema, ours = _sessions(df, case, True)
        row_schema, rows = _sessions(df, case, False)
        assert schema == row_schema  # names, types, nullability and order of the columns
        assert ours == rows
        if case["inclusive_gap"]:  # native session_window's rule
            assert ours == _native(df, case)
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", before)


def test_a_half_sum_lost_to_2_31_values_is_refused_naming_the_output(spark):
    """Spark's ``try_sum`` of a bucket's halves is null when it leaves int64 (2**31 values or
    more in a bucket): with values present that is an error naming the output, never a sum
    missing a part; a bucket of nulls only (null sums, no value present) is no error."""
    config = config_for(spark, ["user"], {"s": ("sum", "l"), "n": "count"})

    def run(rows: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
        out = pa.Table.from_batches(_buckets(config, rows)).select(["user", "s", "n"])
        return sorted(out.to_pylist(), key=lambda r: r["user"])

    quiet = [("b", 0, 5, None, None, 0, 2), ("c", 0, 0, 1, 7, 2, 2)]
    assert run(quiet) == [{"user": "b", "s": None, "n": 2},
                          {"user": "c", "s": 2**32 + 7, "n": 2}]
    with pytest.raises(ValueError, match=r"the sum 's' cannot be computed exactly"):
        run([*quiet, ("a", 0, 0, None, 3, 5, 5)])


def test_buckets_floor_before_the_epoch(spark):
    """Buckets start at multiples of the gap below the time, also before 1970 (a division that
    truncates toward zero would make one bucket of ``(-gap, gap)``, and two events in it more
    than a gap apart one session)."""
    gap_us = 1_234_567
    rows = [("a", 0, -(gap_us // 2), *[1] * 5), ("a", 0, gap_us // 2 + 2, *[2] * 5),  # gap + 1
            ("b", 1, -3 * gap_us - 7, *[3] * 5), ("b", 1, -2 * gap_us - 6, *[4] * 5)]
    case = {"gap_us": gap_us, "inclusive_gap": True, "keys": ["k", "day"]}
    df = _frame(spark, rows)
    schema, ours = _sessions(df, case, True)
    assert ours == _native(df, case)
    assert [r[-1] for r in ours] == [1, 2, 3, 4]  # four sessions of one event each


@pytest.mark.parametrize("name", ["__sessionstore_first", "__sessionstore_v0"])
def test_a_key_named_like_an_internal_column_equals_native(spark, name):
    """The bucketed frame names its columns ``__sessionstore_*`` beside the key columns: a key
    column of such a name must not be confused with them (the row path's engine never sees
    the user's names)."""
    rows = [("a", 0, 0, *[1] * 5), ("a", 0, 5, *[2] * 5), ("b", 0, 9, *[3] * 5)]
    df = _frame(spark, rows).withColumnRenamed("k", name)
    case = {"gap_us": 1_000_000, "inclusive_gap": True, "keys": [name, "day"]}
    frame = sessionize(df, key=case["keys"], timestamp="ts", gap="1 second", aggregations=AGGS)
    assert sorted(tuple(r) for r in frame.collect()) == _native(df, case)
