"""sessionize() on a real local SparkSession: oracle, streaming, restarts and failures."""

from __future__ import annotations

import datetime as dt
import random
import warnings
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark import TaskContext
from pyspark.sql import functions as F

from sessionstore import aggregations
from spark_adapter import read_state_metrics, sessionize
from tests.spark.streams import EPOCH, StreamRun, make_files

AGGS = {"n": "count", "total": ("sum", "amount"), "low": ("min", "amount"),
        "high": ("max", "amount")}


def as_rows(frame) -> list[tuple]:
    return sorted(tuple(r) for r in frame.collect())


def static_frame(spark, rows):
    data = [(u, EPOCH + dt.timedelta(seconds=s), a) for u, s, a in rows]
    return spark.createDataFrame(data, "user string, ts timestamp, amount long")


@pytest.mark.parametrize("engine", ["arrow", "processor"])
def test_static_equals_native_session_window(spark, engine):
    rng = random.Random(3)
    rows = [(f"k{rng.randrange(5)}", rng.randrange(600), rng.randrange(50)) for _ in range(400)]
    rows += [("edge", 0, 1), ("edge", 10, 2), ("edge", 20, 3), ("edge", 31, 4)]
    df = static_frame(spark, rows)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # PySpark warns about functions whose kind it cannot read
        sessions = sessionize(df, key="user", timestamp="ts", gap="10 seconds",
                              aggregations=AGGS, engine=engine)
    ours = as_rows(sessions)
    native = as_rows(
        df.groupBy("user", F.session_window("ts", "10 seconds").alias("w"))
        .agg(F.count("*"), F.sum("amount"), F.min("amount"), F.max("amount"))
        .select("user", "w.start", "w.end", "count(1)", "sum(amount)", "min(amount)",
                "max(amount)")
    )
    assert ours == native
    edge = [r for r in ours if r[0] == "edge"]
    assert [(r[1].second, r[2].second, r[3]) for r in edge] == [(0, 30, 3), (31, 41, 1)]


def test_static_collect_first_last_and_custom(spark):
    rows = [("a", 5, 2), ("a", 1, 1), ("a", 9, 3), ("b", 0, 7)]
    longest = aggregations.aggregate(lambda: 0, lambda key, row, acc: max(acc, row["amount"]),
                                     lambda key, a, b: max(a, b))
    out = sessionize(static_frame(spark, rows), key=["user"], timestamp="ts", gap=10_000,
                     aggregations={"items": ("collect", "amount"), "first": ("first", "amount"),
                                   "last": ("last", "amount"), "custom": longest})
    got = {r["user"]: (r["items"], r["first"], r["last"], r["custom"]) for r in out.collect()}
    assert got == {"a": ([1, 2, 3], 1, 3, "3"), "b": ([7], 7, 7, "7")}


def streaming_query(state: Path, local: Path, aggs=None, delay: str = "60 seconds",
                    state_version: str | None = None):
    def build(stream):
        return sessionize(stream, key="user", timestamp="ts", gap="10 seconds",
                          aggregations=aggs or AGGS, watermark_delay=delay,
                          state_location=str(state), local_dir=str(local),
                          state_version=state_version)

    return build


FILES = make_files(6, 40)
FINAL_WATERMARK_S = max(s for rows in FILES for _, s, _ in rows) - 60


def closed_static(spark) -> list[tuple]:
    """The static result, restricted to sessions the final watermark has closed."""
    df = static_frame(spark, [row for rows in FILES for row in rows])
    limit = EPOCH + dt.timedelta(seconds=FINAL_WATERMARK_S)
    return as_rows(sessionize(df, key="user", timestamp="ts", gap="10 seconds",
                              aggregations=AGGS).filter(F.col("session_end") <= F.lit(limit)))


@pytest.fixture(scope="module")
def reference(spark, tmp_path_factory) -> list[tuple]:
    root = tmp_path_factory.mktemp("reference")
    run = StreamRun(spark, root, streaming_query(root / "state", root / "local"))
    run.start()
    for i, rows in enumerate(FILES):
        run.feed(i, rows)
    run.stop()
    return run.rows()


def test_streaming_final_equals_static_without_duplicates(spark, reference):
    assert len(reference) == len(set(reference))
    assert sorted(reference) == closed_static(spark)
    assert len(reference) > 20


def test_restart_from_checkpoint_equals_uninterrupted(spark, reference, tmp_path):
    build = streaming_query(tmp_path / "state", tmp_path / "local")
    first = StreamRun(spark, tmp_path, build)
    first.start()
    for i in range(3):
        first.feed(i, FILES[i])
    first.stop()
    second = StreamRun(spark, tmp_path, build)
    second.batches = first.batches  # same sink table, keyed by batch id
    second.start()
    for i in range(3, len(FILES)):
        second.feed(i, FILES[i])
    second.stop()
    assert sorted(second.rows()) == sorted(reference)


def test_executor_move_restores_from_snapshots(spark, reference, tmp_path):
    local = tmp_path / "local"
    run = StreamRun(spark, tmp_path, streaming_query(tmp_path / "state", local))
    run.start()
    for i, rows in enumerate(FILES):
        run.feed(i, rows, between=lambda: __import__("shutil").rmtree(local, ignore_errors=True))
    run.stop()
    assert sorted(run.rows()) == sorted(reference)


def _fail_first_attempt(key, row, acc):
    context = TaskContext.get()
    if (context is not None and context.attemptNumber() == 0 and context.partitionId() == 0
            and context.getLocalProperty("streaming.sql.batchId") == "4"):
        raise RuntimeError("injected failure on attempt 0")
    return acc + 1


def test_task_failure_is_retried_without_double_counting(spark, reference, tmp_path):
    flaky = aggregations.aggregate(lambda: 0, _fail_first_attempt, lambda key, a, b: a + b)
    run = StreamRun(spark, tmp_path, streaming_query(tmp_path / "state", tmp_path / "local",
                                                     aggs={**AGGS, "flaky": flaky},
                                                     state_version="1"))
    run.start()
    for i, rows in enumerate(FILES):
        run.feed(i, rows)
    run.stop()
    rows = run.rows()
    assert sorted(r[:-1] for r in rows) == sorted(reference)
    assert all(int(r[-1]) == r[3] for r in rows)  # the flaky count equals the count
    totals = read_state_metrics(run.state_location(tmp_path / "state"))
    assert totals["records_in"] == sum(len(f) for f in FILES)


@pytest.mark.parametrize("engine", ["arrow", "processor"])
def test_late_rows_are_dropped_and_counted(spark, tmp_path, engine):
    state = tmp_path / "state"

    def build(stream):
        return sessionize(stream, key="user", timestamp="ts", gap="10 seconds",
                          aggregations=AGGS, watermark_delay="5 seconds", engine=engine,
                          state_location=str(state), local_dir=str(tmp_path / "local"))

    run = StreamRun(spark, tmp_path, build)
    run.start()
    run.feed(0, [("a", 0, 1), ("a", 100, 1)])            # W becomes 95 s
    run.feed(1, [("a", 5, 1), ("a", 50, 1), ("a", 101, 1)])  # 5 s and 50 s: windows closed
    run.feed(2, [("a", 300, 1)])
    run.stop()
    got = sorted((r[1].second + 60 * r[1].minute, r[3]) for r in run.rows())
    assert got == [(0, 1), (100, 2)]
    totals = read_state_metrics(run.state_location(state))
    if engine == "arrow":  # the engine itself judges lateness, and counts what it drops
        assert run.dropped_by_watermark() == 0
        assert totals["records_in"] == 6 and totals["dropped_records"] == 2
    else:  # Spark drops native's late rows before the processor sees them, and counts them
        assert run.dropped_by_watermark() == 2
        assert totals["records_in"] == 4 and totals["dropped_records"] == 0


def test_update_mode_emits_changes_and_retractions(spark, tmp_path):
    def build(stream):
        return sessionize(stream, key="user", timestamp="ts", gap="10 seconds",
                          aggregations={"n": "count"}, emit="update",
                          watermark_delay="1 minute", state_location=str(tmp_path / "state"),
                          local_dir=str(tmp_path / "local"))

    run = StreamRun(spark, tmp_path, build)
    run.query = (build(spark.readStream.schema(
        "user string, ts timestamp, amount long").json(str(run.source)))
        .writeStream.foreachBatch(lambda frame, b: run.batches.__setitem__(
            b, [tuple(r) for r in frame.collect()]))
        .option("checkpointLocation", str(run.checkpoint)).outputMode("update").start())
    run.feed(0, [("a", 0, 1), ("a", 20, 1)])
    run.feed(1, [("a", 10, 1)])
    run.stop()
    got = [(r[1].second, r[2].second, r[3], r[4]) for r in run.rows()]
    assert got[:2] == [(0, 10, 1, False), (20, 30, 1, False)] or \
        sorted(got[:2]) == [(0, 10, 1, False), (20, 30, 1, False)]
    assert sorted(got[2:]) == [(0, 10, 1, True), (0, 30, 3, False), (20, 30, 1, True)]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"key": "nope"}, "column 'nope' is not in the DataFrame"),
        ({"timestamp": "amount"}, "timestamp column 'amount' must be a timestamp"),
        ({"gap": "0 seconds"}, "gap must be > 0"),
        ({"gap": "soon"}, "gap is not a duration"),
        ({"aggregations": {"x": ("sum", "missing")}}, "names column 'missing'"),
        ({"aggregations": {"x": ("sum", "user")}}, "sum needs a numeric column"),
        ({"emit": "sometimes"}, "emit must be"),
    ],
)
def test_bad_arguments_fail_before_the_query_starts(spark, kwargs, match):
    df = static_frame(spark, [("a", 0, 1)])
    args = {"key": "user", "timestamp": "ts", "gap": "10 seconds", "aggregations": {"n": "count"},
            **kwargs}
    with pytest.raises(ValueError, match=match):
        sessionize(df, **args)


DAYS_1E8 = dt.timedelta(days=10**8)  # 8.64e18 us: fits int64, with anything added it may not


@pytest.mark.parametrize(
    ("kwargs", "streaming", "named"),
    [
        ({"gap": DAYS_1E8}, False, "gap=datetime.timedelta(days=100000000)"),
        ({"gap": "1 second", "max_duration": DAYS_1E8}, False, "max_duration="),
        ({"gap": "dur", "max_duration": DAYS_1E8 // 2 + DAYS_1E8 // 10}, False,
         "max_duration="),
        ({"gap": DAYS_1E8 // 2, "max_duration": DAYS_1E8 // 2}, False, "gap="),
        ({"gap": DAYS_1E8, "watermark_delay": DAYS_1E8 // 10}, True, "watermark_delay="),
        ({"gap": "1 second", "watermark_delay": dt.timedelta(days=110_000_000)}, True, "watermark_delay="),
        ({"gap": "dur", "max_gap": DAYS_1E8, "max_duration": DAYS_1E8,
          "watermark_delay": "1 second"}, True, "max_gap=datetime.timedelta(days=100000000)"),
        ({"gap": dt.timedelta(days=999_999_999)}, False, "gap"),
    ],
)
def test_retention_beyond_int64_is_refused_in_the_call(spark, tmp_path, kwargs, streaming,
                                                       named):
    """Whatever the state's retention is made of (the gap or max_gap, max_duration and, on a
    stream, watermark_delay), a sum the store cannot hold is refused by sessionize itself,
    naming the arguments, instead of every task failing later."""
    schema = "user string, ts timestamp, dur string, amount long"
    df = spark.readStream.schema(schema).json(str(tmp_path)) if streaming else \
        spark.createDataFrame([("a", EPOCH, "1 second", 1)], schema)
    extra = {"state_location": str(tmp_path / "state"),
             "watermark_delay": kwargs.get("watermark_delay", "1 second")} if streaming else {}
    with pytest.raises(ValueError, match="need state kept|outside|int64") as caught:
        sessionize(df, key="user", timestamp="ts", aggregations={"n": "count"},
                   **{**kwargs, **extra})
    assert named in str(caught.value)


def test_a_large_gap_that_fits_equals_native(spark):
    """The bound refuses only what does not fit: a gap of 100,000 days is still native's."""
    df = spark.createDataFrame([("a", EPOCH, 1), ("a", EPOCH + dt.timedelta(days=90_000), 2)],
                               "user string, ts timestamp, amount long")
    got = sorted(tuple(r) for r in sessionize(
        df, key="user", timestamp="ts", gap=dt.timedelta(days=100_000),
        aggregations={"n": "count"}).collect())
    expected = sorted(tuple(r) for r in df.groupBy(
        "user", F.session_window("ts", "100000 days").alias("w")).count()
        .select("user", "w.start", "w.end", "count").collect())
    assert got == expected and got[0][3] == 2


def test_null_keys_and_missing_watermark_delay(spark, tmp_path):
    df = spark.createDataFrame([("a", EPOCH, 1), (None, EPOCH, 1)],
                               "user string, ts timestamp, amount long")
    # the Arrow engine's tasks refuse it, on the columnar path and on the row path: the job
    # fails naming the key column (sessionize reads no extra pass of the input to check it)
    for aggs in ({"n": "count"}, {"n": "count", "f": ("first", "amount")}):
        lazy = sessionize(df, key="user", timestamp="ts", gap="10 seconds", aggregations=aggs)
        with pytest.raises(Exception, match=r"key column\(s\) \['user'\] hold nulls"):
            lazy.collect()
    with pytest.raises(ValueError, match="hold nulls"):  # the processor engine checks at once
        sessionize(df, key="user", timestamp="ts", gap="10 seconds", aggregations={"n": "count"},
                   engine="processor")
    stream = spark.readStream.schema("user string, ts timestamp, amount long").json(str(tmp_path))
    with pytest.raises(ValueError, match="watermark_delay is required"):
        sessionize(stream, key="user", timestamp="ts", gap="10 seconds",
                   aggregations={"n": "count"}, state_location=str(tmp_path / "s"))
    with pytest.raises(ValueError, match="state_location is required"):
        sessionize(stream, key="user", timestamp="ts", gap="10 seconds",
                   aggregations={"n": "count"}, watermark_delay="1 minute")



JUNK_ARGS = st.one_of(st.none(), st.integers(-5, 5), st.text(max_size=8), st.floats(),
                      st.lists(st.text(max_size=3), max_size=2),
                      st.dictionaries(st.text(max_size=3), st.text(max_size=5), max_size=2))


@settings(max_examples=40, deadline=None)
@given(key=JUNK_ARGS, gap=JUNK_ARGS, aggs=JUNK_ARGS, emit=JUNK_ARGS, n_buckets=JUNK_ARGS)
def test_hostile_sessionize_arguments_fail_cleanly(spark, key, gap, aggs, emit, n_buckets):
    df = static_frame(spark, [("a", 0, 1)])
    try:
        sessionize(df, key=key, timestamp="ts", gap=gap, aggregations=aggs, emit=emit,
                   n_buckets=n_buckets)
    except (ValueError, TypeError) as exc:
        assert any(name in str(exc) for name in (
            "key", "gap", "aggregation", "emit", "n_buckets", "column")), exc


def test_triggers_add_pane_columns(spark, tmp_path):
    from sessionstore import AccumulationMode, AfterCount, AfterWatermark

    def build(stream):
        return sessionize(stream, key="user", timestamp="ts", gap="10 seconds",
                          aggregations={"n": "count"}, watermark_delay="5 seconds",
                          trigger=AfterWatermark(early=AfterCount(2)),
                          accumulation=AccumulationMode.ACCUMULATING,
                          state_location=str(tmp_path / "state"), local_dir=str(tmp_path / "l"))

    run = StreamRun(spark, tmp_path, build)
    run.start()
    run.feed(0, [("a", 0, 1), ("a", 5, 1)])     # two elements: an EARLY pane
    run.feed(1, [("a", 100, 1)])                # W = 95 s: the ON_TIME pane, also the last
    run.stop()
    got = [(r[1].second, r[2].second, r[3], r[4], r[5], r[6], r[7]) for r in run.rows()]
    assert got == [(0, 15, 2, "EARLY", 0, True, False), (0, 15, 2, "ON_TIME", 1, False, True)]
