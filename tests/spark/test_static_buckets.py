"""The static input reduced by Spark to one row per key and gap-wide time bucket before the
shuffle (``static_columnar.bucketed_frame`` and ``bucketed_partition``): the same sessions as
native ``session_window`` and as the row path, sums exact past int64 partials, and the
configurations it must not take.
"""

from __future__ import annotations

import datetime as dt
import gc
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark_adapter import sessionize, static_columnar
from tests.spark.test_static_columnar import config_for
from tests.strategies import bucket_events, text_key_bucket_events

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
INT64_MAX = 2**63 - 1
SCHEMA = "user string, ts timestamp, l long, i int, b byte"
AGGS: dict[str, Any] = {"n": "count", "sum_l": ("sum", "l"), "min_l": ("min", "l"),
                        "max_l": ("max", "l"), "sum_i": ("sum", "i"), "min_b": ("min", "b"),
                        "max_i": ("max", "i")}


def _frame(spark: Any, rows: list[tuple[Any, int, Any]]) -> Any:
    """(key, time in us since the epoch, long value) rows; the int and byte columns derive
    from the value."""
    return spark.createDataFrame(
        [(key, EPOCH + dt.timedelta(microseconds=t), v,
          None if v is None else v % 100_000 - 50_000, None if v is None else v % 256 - 128)
         for key, t, v in rows], SCHEMA)


def _native(df: Any, gap: str) -> list[tuple[Any, ...]]:
    parts = []
    for name, item in AGGS.items():
        parts.append((F.count("*") if item == "count" else getattr(F, item[0])(item[1]))
                     .alias(name))
    frame = df.groupBy("user", F.session_window("ts", gap).alias("w")).agg(*parts)
    return sorted(tuple(r) for r in frame.select("user", "w.start", "w.end", *AGGS).collect())


def _ours(df: Any, gap: str, **options: Any) -> list[tuple[Any, ...]]:
    frame = sessionize(df, key="user", timestamp="ts", gap=gap, aggregations=AGGS, **options)
    plan = frame._jdf.queryExecution().executedPlan().toString()
    assert "HashAggregate" in plan and "MapInArrow" in plan, plan  # the bucketed plan
    return sorted(tuple(r) for r in frame.collect())


@settings(max_examples=12)
@given(case=bucket_events())
def test_bucketed_sessions_equal_native(spark, case):
    gap_s, rows = case
    df = _frame(spark, rows)
    gap = f"{gap_s} seconds"
    assert _ours(df, gap) == _native(df, gap)


@settings(max_examples=6)
@given(rows=text_key_bucket_events())
def test_string_and_binary_keys_equal_native(spark, rows):
    """The tasks key the bounded path on each string or binary key column's dictionary codes
    and look the sessions' keys up afterwards (static_columnar.bucketed_partition): two string
    columns and a binary one, each with its own dictionary."""
    schema = "a string, b binary, c string, ts timestamp, l long"
    df = spark.createDataFrame([(a, bytearray(b), c, EPOCH + dt.timedelta(microseconds=t), v)
                                for a, b, c, t, v in rows], schema)
    aggs = {"n": "count", "s": ("sum", "l"), "m": ("max", "l")}
    frame = sessionize(df, key=["a", "b", "c"], timestamp="ts", gap="10 seconds",
                       aggregations=aggs)
    assert "HashAggregate" in frame._jdf.queryExecution().executedPlan().toString()
    native = df.groupBy("a", "b", "c", F.session_window("ts", "10 seconds").alias("w")).agg(
        F.count("*").alias("n"), F.sum("l").alias("s"), F.max("l").alias("m"))
    assert sorted(tuple(r) for r in frame.collect()) == sorted(
        tuple(r) for r in native.select("a", "b", "c", "w.start", "w.end", "n", "s", "m")
        .collect())


def test_rows_without_a_time_are_dropped_before_null_keys_are_refused(spark, monkeypatch):
    """Rows without a time share the bucketed frame's null bucket, which the task drops before
    it refuses null keys: a row with neither a key nor a time is dropped, as the row path and
    native drop it, and a key whose rows have no time has no session."""
    df = _frame(spark, [("a", 0, 1), ("a", 5_000_000, 2)]).union(spark.createDataFrame(
        [(None, None, 3, 3, 3), ("a", None, 4, 4, 4), ("b", None, None, None, None)], SCHEMA))
    ours = _ours(df, "10 seconds")
    assert ours == _native(df, "10 seconds")
    with monkeypatch.context() as patched:  # the row path, on the same input
        patched.setattr(static_columnar, "bucketed_parts", lambda config: None)
        assert ours == sorted(tuple(r) for r in sessionize(
            df, key="user", timestamp="ts", gap="10 seconds", aggregations=AGGS).collect())
    assert [(r[0], r[3]) for r in ours] == [("a", 2)]


def test_the_bucketed_plan_shuffles_twice_after_a_partial_aggregate(spark):
    """The plan as measured (docs/spark.md, *Static: what changed*): the buckets reduced
    before the shuffle, one exchange for the buckets and one by key, nothing more."""
    frame = sessionize(_frame(spark, [("a", 0, 1)]), key="user", timestamp="ts",
                       gap="10 seconds", aggregations=AGGS)
    plan = frame._jdf.queryExecution().executedPlan().toString()
    assert plan.count("Exchange ") == 2 and "partial_min" in plan, plan


def _worker_freeze_counts(spark: Any, unfreeze: bool) -> list[int]:
    """gc.get_freeze_count() in the Python workers of 8 tasks, after gc.unfreeze() there if
    ``unfreeze``."""
    def counts(batches: Any) -> Any:
        import gc as worker_gc

        for _ in batches:
            pass
        if unfreeze:
            worker_gc.unfreeze()
        yield pa.RecordBatch.from_arrays([pa.array([worker_gc.get_freeze_count()])], ["n"])

    return [r.n for r in spark.range(0, 8, 1, 8).mapInArrow(counts, "n long").collect()]


def test_a_static_task_freezes_its_python_workers_heap_and_a_direct_call_does_not(spark):
    """A bucketed static task freezes its Python worker's heap (kept.freeze_heap, in
    arrow.task_entry, which every mapInArrow task of sessionize runs through), so that the
    collector's full passes skip what every task shares; the partition function itself, called
    outside it (here, in the test process), leaves the caller's collector as it was."""
    config = config_for(spark, ["user"], {"n": "count"})
    frozen = gc.get_freeze_count()
    batch = pa.RecordBatch.from_arrays(
        [pa.array(["a"]), pa.array([EPOCH], pa.timestamp("us", tz="UTC")),
         pa.array([EPOCH], pa.timestamp("us", tz="UTC")), pa.array([3], pa.int64())],
        names=["__sessionstore_key0", "__sessionstore_first", "__sessionstore_last",
               "__sessionstore_v0"])
    out = list(static_columnar.bucketed_partition(config, iter([batch])))
    assert out[0].column(3).to_pylist() == [3]
    assert gc.get_freeze_count() == frozen
    # the workers' earlier tasks froze them already: start from nothing frozen
    assert set(_worker_freeze_counts(spark, unfreeze=True)) == {0}
    _ours(_frame(spark, [("a", 0, 1), ("b", 0, 2), ("c", 0, 3), ("d", 0, 4)]), "10 seconds")
    counts = _worker_freeze_counts(spark, unfreeze=False)
    assert max(counts) > 0, counts


def test_bucket_edges_and_gap_steps_equal_native(spark):
    gap_us = 10_000_000
    # a bucket edge at 0, -gap and +gap; steps of gap - 1, gap and gap + 1 across them; two
    # events 1.5 gaps apart inside one 2-gap-wide span; a session of nulls only
    rows = [("a", -gap_us - 1, 1), ("a", -1, 2), ("a", 0, 3), ("a", gap_us - 1, 4),
            ("a", 2 * gap_us, 5), ("a", 3 * gap_us + 1, 6),
            ("b", 4 * gap_us, 7), ("b", 4 * gap_us + 3 * gap_us // 2, 8),
            ("c", 7 * gap_us + 5, None), ("c", 7 * gap_us + 6, None)]
    df = _frame(spark, rows)
    got = _ours(df, "10 seconds")
    assert got == _native(df, "10 seconds")
    # events of a session: a gap apart join (-gap - 1 and -1), gap + 1 apart do not, nor do
    # 1.5 gaps apart inside one 2-gap-wide span
    assert [r[3] for r in got] == [4, 1, 1, 1, 1, 2]


def test_partial_sums_past_int64_join_exactly(spark, monkeypatch):
    big = INT64_MAX
    # one bucket sums to 2 * big, the next (within the gap) to -2 * big: the session's sum is
    # 0 and fits, as in the row path; the other key's sum is exactly int64's largest
    rows = [("a", 0, big), ("a", 1, big), ("a", 10_000_000, -big), ("a", 10_000_001, -big),
            ("b", 0, big - 5), ("b", 3, 5), ("b", 9, None)]
    df = _frame(spark, rows)
    ours = _ours(df, "10 seconds")
    assert [(r[0], r[4]) for r in ours] == [("a", 0), ("b", big)]
    with monkeypatch.context() as patched:  # the row path, on the same input
        patched.setattr(static_columnar, "bucketed_parts", lambda config: None)
        frame = sessionize(df, key="user", timestamp="ts", gap="10 seconds", aggregations=AGGS)
        assert "HashAggregate" not in frame._jdf.queryExecution().executedPlan().toString()
        assert sorted(tuple(r) for r in frame.collect()) == ours


def test_a_sum_leaving_int64_names_output_key_and_exact_total(spark):
    rows = [("a", 0, INT64_MAX), ("a", 10_000_000, 1), ("b", 0, 1)]
    with pytest.raises(Exception) as exc:  # Spark wraps the worker's error
        _ours(_frame(spark, rows), "10 seconds")
    text = str(exc.value)
    assert "SumOverflowError" in text and "'sum_l'" in text and "'a'" in text, text[-2000:]
    assert f"it would be {INT64_MAX + 1}" in text, text[-2000:]


def test_a_null_key_is_refused_naming_the_key(spark):
    df = spark.createDataFrame([(None, EPOCH, 1, 1, 1)], SCHEMA)
    with pytest.raises(Exception, match="user") as exc:
        _ours(df, "10 seconds")
    assert "null" in str(exc.value)


@pytest.mark.parametrize("change", ["float sum", "gap column", "max_duration", "timestamp_ntz"])
def test_configurations_the_buckets_cannot_serve_take_the_row_path(spark, change):
    aggs = {"n": "count", "s": ("sum", "l"), "m": ("min", "i")}
    config = config_for(spark, ["user"], aggs)
    assert static_columnar.bucketed_parts(config) is not None
    if change == "float sum":  # partial float sums would round in another order
        config = config_for(spark, ["user"], {**aggs, "d": ("sum", "d")})
    elif change == "gap column":
        config.gap_column = "__gap"
    elif change == "max_duration":
        config.max_duration_us = 60_000_000
    else:
        config.time_type = T.TimestampNTZType()
    assert static_columnar.bucketed_parts(config) is None


@pytest.mark.parametrize("inclusive_gap", [True, False])
def test_either_gap_rule_equals_the_row_path(spark, monkeypatch, inclusive_gap):
    gap_us = 10_000_000
    # steps of exactly a gap: one session under Spark's rule, separate under the other
    rows = [("a", t, i) for i, t in enumerate([-gap_us, 0, gap_us, 2 * gap_us + 1,
                                               3 * gap_us + 1, 3 * gap_us + 2])]
    rows += [("b", -1, 2**40), ("b", gap_us - 1, -(2**41)), ("b", 2 * gap_us - 1, None)]
    df = _frame(spark, rows)
    ours = _ours(df, "10 seconds", inclusive_gap=inclusive_gap)
    with monkeypatch.context() as patched:  # the row path, on the same input
        patched.setattr(static_columnar, "bucketed_parts", lambda config: None)
        rows_path = sorted(tuple(r) for r in sessionize(
            df, key="user", timestamp="ts", gap="10 seconds", aggregations=AGGS,
            inclusive_gap=inclusive_gap).collect())
    assert ours == rows_path
    assert len(ours) == (3 if inclusive_gap else 8)
