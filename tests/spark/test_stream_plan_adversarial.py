"""Attacks on the streaming Arrow engine's plan (the stream partitioned by one hidden int column,
a hash of the key, and a never-true ``dropDuplicatesWithinWatermark`` ticker sharing its
shuffle), with native ``session_window`` as the oracle, micro-batch by micro-batch.

One scenario, run by native once and by ``sessionize`` under several shuffle partition counts,
a restart from the checkpoint and without exchange reuse: two keys whose Murmur3 hashes are
equal (the hidden column is then equal, so they share a partition and the ticker's state key),
a two-column key with a non-nullable boolean literal part, a null key, an empty file (a micro-batch with
no rows), a micro-batch of late rows only, sessions closed by no-data micro-batches in
partitions that got no rows, and a watermark that jumps years ahead, moved by a null key's row.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F

from spark_adapter import progress_counters, sessionize

EPOCH = dt.datetime(2024, 1, 1)
SCHEMA = "user string, ts timestamp, amount long"
GAP, DELAY = "10 seconds", "5 seconds"
# distinct strings with one Murmur3 hash, alone and followed by a boolean (found with Spark's
# own F.hash; the test checks it again)
C1, C2 = "u123324", "u128809"
FAR = 10**8  # about three years, in seconds
EMPTY: list[tuple[str | None, float, int]] = []  # an empty file: a micro-batch of no rows
BATCHES: list[list[tuple[str | None, float, int]]] = [
    # W = 0; then 45 s
    [(C1, 0, 1), (C2, 4, 2), (C1, 8, 3), (C2, 20, 4), ("b", 3, 5), (None, 5, 6), ("a", 50, 7)],
    EMPTY,
    # late only: every window ends at or before 45 s (35 s + 10 s exactly)
    [(C1, 1, 8), ("b", 30, 9), (C2, 35, 10)],
    # the watermark jumps by years, to FAR - 2 s: a row with a null key advances it, as it
    # advances Spark's (its watermark node takes every row with a time)
    [("z", FAR, 11), (C1, 46, 12), (None, FAR + 3, 17)],
    # z at FAR - 3 s is not late (its window ends after FAR - 2 s) and joins z's session; y's
    # window ends at FAR - 3 s, at or before the watermark: late
    [(C1, FAR + 1, 13), (C2, FAR + 2, 14), ("z", FAR - 3, 15), ("y", FAR - 13, 18)],
    [("end", FAR + 1000, 16)],
]


def _as_json(row: tuple[str | None, float, int]) -> str:
    ts = (EPOCH + dt.timedelta(seconds=row[1])).isoformat()
    return json.dumps({"user": row[0], "ts": ts, "amount": row[2]}) + "\n"


def prepared(stream: Any) -> Any:
    """The key's second column is a non-nullable boolean literal."""
    return stream.withColumn("src", F.lit(True))


def run_stream(spark: Any, root: Path, build: Any, restart_after: int | None = None,
               ) -> tuple[dict[int, list[tuple[Any, ...]]], list[dict[str, Any]]]:
    """Feed BATCHES, one JSON file each (an empty list an empty file), through
    ``build(stream)`` into a ``foreachBatch`` sink; with ``restart_after``, stop the query after
    that many files and start the same plan again from its checkpoint.

    Returns each micro-batch's sorted rows (batches without rows left out) and every progress.
    """
    source = root / "source"
    source.mkdir(parents=True)
    got: dict[int, list[tuple[Any, ...]]] = {}
    progress: list[dict[str, Any]] = []

    def sink(frame: Any, batch_id: int) -> None:
        got[batch_id] = sorted((tuple(r) for r in frame.collect()), key=repr)

    def start() -> Any:
        stream = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1) \
            .json(str(source))
        return (build(stream).writeStream.foreachBatch(sink).outputMode("append")
                .option("checkpointLocation", str(root / "checkpoint")).start())

    query = start()
    try:
        for i, rows in enumerate(BATCHES):
            if i == restart_after:
                query.processAllAvailable()
                progress += query.recentProgress
                query.stop()
                query = start()
            tmp = source / f".b{i}.tmp"
            tmp.write_text("".join(_as_json(row) for row in rows))
            tmp.rename(source / f"b{i:03d}.json")
            query.processAllAvailable()
        progress += query.recentProgress
    finally:
        query.stop()
    return {b: rows for b, rows in got.items() if rows}, progress


@pytest.fixture(scope="module")
def native(spark: Any, tmp_path_factory: Any) -> dict[int, list[tuple[Any, ...]]]:
    """Native's micro-batches, null-key sessions left out (native keeps a null key as a
    group; ``sessionize`` drops a stream's null keys and counts them)."""
    def build(stream: Any) -> Any:
        return (prepared(stream).withWatermark("ts", DELAY)
                .groupBy("user", "src", F.session_window("ts", GAP).alias("w"))
                .agg(F.count("*").alias("n"), F.sum("amount").alias("total"))
                .select("user", "src", "w.start", "w.end", "n", "total"))
    batches = run_stream(spark, tmp_path_factory.mktemp("native"), build)[0]
    return {b: kept for b, rows in batches.items()
            if (kept := [r for r in rows if r[0] is not None])}


def test_the_colliding_keys_collide(spark):
    hashes = spark.createDataFrame([(C1,), (C2,)], "user string").select(
        F.hash("user").alias("one"), F.hash("user", F.lit(True)).alias("two")).collect()
    assert C1 != C2 and hashes[0] == hashes[1]


@pytest.mark.parametrize(
    ("partitions", "restart_after", "reuse"),
    [(1, None, "true"), (5, None, "true"), (2, 3, "true"), (2, None, "false")],
    ids=["1-partition", "5-partitions", "restart", "no-exchange-reuse"])
def test_stream_equals_native_batch_by_batch(spark, tmp_path, native, partitions,
                                             restart_after, reuse):
    """Kills a task partition taken as ``partitionId - n`` alone (with one shuffle partition,
    Spark unions the ticker and the engine partition by partition: the task found no
    partition), a watermark that leaves out the times of rows with a null key (sessions
    closed later than native's, a late row taken in) and a boolean key handed to the engine
    as a bool (which it refuses)."""
    def build(stream: Any) -> Any:
        return sessionize(prepared(stream), key=["user", "src"], timestamp="ts",
                          gap=GAP, watermark_delay=DELAY,
                          aggregations={"n": "count", "total": ("sum", "amount")},
                          state_location=str(tmp_path / "state"),
                          local_dir=str(tmp_path / "local"))

    settings = {"spark.sql.shuffle.partitions": str(partitions),
                "spark.sql.exchange.reuse": reuse}
    before = {name: spark.conf.get(name) for name in settings}
    try:
        for name, value in settings.items():
            spark.conf.set(name, value)
        got, progress = run_stream(spark, tmp_path, build, restart_after)
    finally:
        for name, value in before.items():
            spark.conf.set(name, value)
    assert got == native
    sessions = [r for rows in got.values() for r in rows]
    # the colliding keys kept their own sessions
    assert sorted(r[4:] for r in sessions if r[0] == C1) == [(1, 12), (1, 13), (2, 4)]
    assert sorted(r[4:] for r in sessions if r[0] == C2) == [(1, 2), (1, 4), (1, 14)]
    assert [r[4:] for r in sessions if r[0] == "z"] == [(2, 26)]
    # the counters: each micro-batch's rows counted once, in Spark's count and in ours
    files = [len(rows) for rows in BATCHES]
    with_rows = [p for p in progress if p["numInputRows"]]
    # without exchange reuse the ticker reads its own copy of the input (as docs/spark.md says)
    copies = 1 if reuse == "true" else 2
    assert [p["numInputRows"] for p in with_rows] == [copies * n for n in files if n]
    counters = [progress_counters(p) for p in progress]
    assert all(c for c in counters), "every micro-batch reports its counters"
    assert sum(c["rows_in"] for c in counters) == sum(files)
    assert [c["rows_in"] for c in counters if c["rows_in"]] == [n for n in files if n]
    assert sum(c["null_key_rows_dropped"] for c in counters) == 2
    assert sum(c["late_rows_dropped"] for c in counters) == 4
    by_batch = {p["batchId"]: progress_counters(p)["sessions_emitted"] for p in progress}
    assert by_batch == {b: len(got.get(b, [])) for b in by_batch}


def test_a_timestamp_ntz_stream_is_refused_as_natives_watermark_refuses_it(spark, tmp_path):
    stream = spark.readStream.schema(SCHEMA).json(str(tmp_path)) \
        .withColumn("ts", F.col("ts").cast("timestamp_ntz"))
    refusal = "EVENT_TIME_IS_NOT_ON_TIMESTAMP_TYPE"
    with pytest.raises(Exception, match=refusal):  # noqa: PT011 (Spark's AnalysisException)
        stream.withWatermark("ts", DELAY)
    with pytest.raises(Exception, match=refusal):  # noqa: PT011
        sessionize(stream, key="user", timestamp="ts", gap=GAP, watermark_delay=DELAY,
                   aggregations={"n": "count"}, state_location=str(tmp_path / "state"))


@pytest.mark.parametrize("streaming", [False, True], ids=["static", "stream"])
def test_a_floating_key_is_refused_in_the_call_naming_the_column(spark, tmp_path, streaming):
    """Kills accepting a float or double key, which every task then fails on (the engine
    refuses floating keys) with a TypeError naming an internal column."""
    if streaming:
        frame = spark.readStream.schema(SCHEMA).json(str(tmp_path))
    else:
        frame = spark.createDataFrame([("a", EPOCH, 1)], SCHEMA)
    frame = frame.withColumn("score", F.col("amount").cast("double")) \
        .withColumn("ratio", F.col("amount").cast("float"))
    for key, column, kind in [("score", "score", "double"), (["user", "ratio"], "ratio", "float")]:
        with pytest.raises(ValueError, match=f"key column '{column}' has type {kind}; floating "
                                             f"keys are not accepted .* cast the column"):
            sessionize(frame, key=key, timestamp="ts", gap=GAP, watermark_delay=DELAY,
                       aggregations={"n": "count"}, state_location=str(tmp_path / "state"))


def test_a_boolean_key_equals_native_on_both_engines_and_both_paths(spark):
    """Kills a boolean key handed to the engine as a bool (every task of the row path and of
    the processor engine failed: the engine keys on str, bytes and int)."""
    rows = [(i % 3 == 0, i % 2 == 0, EPOCH + dt.timedelta(seconds=3 * i), i) for i in range(12)]
    df = spark.createDataFrame(rows, "flag boolean, even boolean, ts timestamp, amount long")
    expected = sorted(tuple(r) for r in df.groupBy(
        "flag", "even", F.session_window("ts", "4 seconds").alias("w"))
        .agg(F.count("*"), F.sum("amount"), F.max("amount"))
        .select("flag", "even", "w.start", "w.end", "count(1)", "sum(amount)", "max(amount)")
        .collect())
    assert {r[:2] for r in expected} == {(f, e) for f in (True, False) for e in (True, False)}
    columnar = {"n": "count", "s": ("sum", "amount"), "m": ("max", "amount")}
    row_path = {**columnar, "first": ("first", "amount")}  # first takes the row path
    for engine in ("arrow", "processor"):
        for aggs in (columnar, row_path):
            got = sorted(tuple(r)[:7] for r in sessionize(
                df, key=["flag", "even"], timestamp="ts", gap="4 seconds", aggregations=aggs,
                engine=engine).collect())
            assert got == expected, (engine, list(aggs))


def test_a_partition_count_changed_after_the_call_fails_the_query_naming_it(spark, tmp_path):
    """``sessionize`` partitions the stream by the count it sees; Spark's ticker takes the count
    the query starts with. Kills a task partition that accepts any id below the count (with 3
    then 2, every task found a partition, each another shuffle partition's store)."""
    source = tmp_path / "source"
    source.mkdir()
    (source / "b0.json").write_text("".join(_as_json((f"u{i}", i, 1)) for i in range(8)))
    before = spark.conf.get("spark.sql.shuffle.partitions")
    try:
        spark.conf.set("spark.sql.shuffle.partitions", "3")
        out = sessionize(spark.readStream.schema(SCHEMA).json(str(source)), key="user",
                         timestamp="ts", gap=GAP, watermark_delay=DELAY,
                         aggregations={"n": "count"}, state_location=str(tmp_path / "state"),
                         local_dir=str(tmp_path / "local"))
        spark.conf.set("spark.sql.shuffle.partitions", "2")
        query = out.writeStream.format("noop").outputMode("append") \
            .option("checkpointLocation", str(tmp_path / "checkpoint")).start()
        try:
            with pytest.raises(Exception, match="spark.sql.shuffle.partitions change after "
                                                "sessionize was called"):  # noqa: PT011
                query.processAllAvailable()
        finally:
            query.stop()
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", before)
