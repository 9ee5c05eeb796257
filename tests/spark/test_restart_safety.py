"""A restart from a checkpoint under settings that change what the stored state means is refused,
naming each changed setting with its old and new value; the state is left as it was.

One short streaming query runs once; each case restarts a copy of it (source, checkpoint, state)
with one argument changed. Also pinned, but refused by Spark itself before a task runs, so not
restarted here: the time column's type (a stream's watermark needs a timestamp) and the engine
(the two engines' plans read their source a different number of times).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F

from sessionstore import AfterCount, AfterWatermark, aggregations
from spark_adapter import sessionize
from tests.spark.streams import StreamRun, make_files

FILES = make_files(3, 8, seed=11)
BASE: dict[str, Any] = {"key": "user", "timestamp": "ts", "gap": "10 seconds",
                        "watermark_delay": "5 seconds",
                        "aggregations": {"n": "count", "s": ("sum", "amount")}}
Prep = Callable[[Any], Any]


def start(spark: Any, root: Path, options: dict[str, Any], prep: Prep | None = None) -> StreamRun:
    """A StreamRun of ``sessionize`` with ``options`` over ``root``, started (in update mode for
    ``emit="update"``)."""
    def build(stream: Any) -> Any:
        return sessionize(prep(stream) if prep else stream, state_location=str(root / "state"),
                          local_dir=str(root / "local"), **options)

    run = StreamRun(spark, root, build)
    if options.get("emit") != "update":
        run.start()
        return run
    stream = spark.readStream.schema("user string, ts timestamp, amount long") \
        .option("maxFilesPerTrigger", 1).json(str(run.source))
    run.query = (build(stream).writeStream
                 .foreachBatch(lambda frame, b: run.batches.__setitem__(
                     b, [tuple(r) for r in frame.collect()]))
                 .option("checkpointLocation", str(run.checkpoint)).outputMode("update").start())
    return run


def refused(spark: Any, root: Path, options: dict[str, Any], prep: Prep | None = None,
            rows: list[tuple[str, int, int]] = FILES[1]) -> str:
    """Restart the query in ``root`` with ``options`` and feed it ``rows``; the message of its
    failure, after checking that the state location is as it was."""
    state = root / "state"
    before = {p: p.read_bytes() for p in state.rglob("*") if p.is_file()
              and "progress" not in p.parts}
    run = start(spark, root, options, prep)
    try:
        with pytest.raises(Exception) as caught:  # noqa: PT011 (Spark wraps the task's error)
            run.feed(1, rows)
    finally:
        run.query.stop()
    after = {p: p.read_bytes() for p in state.rglob("*") if p.is_file()
             and "progress" not in p.parts}
    assert after == before
    return str(caught.value)


@pytest.fixture(scope="module")
def first_run(spark: Any, tmp_path_factory: Any) -> Path:
    """The query with BASE options, after one micro-batch (sessions still open)."""
    root = tmp_path_factory.mktemp("first")
    run = start(spark, root, BASE)
    run.feed(0, FILES[0])
    run.stop()
    return root


def copy_of(first_run: Path, tmp_path: Path) -> Path:
    root = tmp_path / "copy"
    # not the working copies: the restart restores from the snapshots (and a copy's wake-up
    # pipe, held open by the worker that keeps it, is no file to copy)
    shutil.copytree(first_run, root, ignore=shutil.ignore_patterns("local"))
    return root


@pytest.mark.parametrize(
    ("change", "prep", "named"),
    [
        ({"gap": "20 seconds"}, None,
         "gap_us: the state location was created with 10000000, this run uses 20000000"),
        ({"inclusive_gap": False}, None,
         "inclusive_gap: the state location was created with true, this run uses false"),
        ({"max_duration": "1 minute"}, None,
         'max_duration_us: the state location was created with "(not set)", this run uses '
         '60000000'),
        ({"gap": "concat('10', ' seconds')", "max_gap": "10 seconds"}, None,
         "gap_us: the state location was created with 10000000, this run uses null"),
        ({"emit": "update"}, None,
         'emit: the state location was created with "final", this run uses "update"'),
        ({"trigger": AfterWatermark(early=AfterCount(2))}, None,
         'trigger: the state location was created with "None", this run uses "AfterWatermark('),
        ({"aggregations": {"n": "count", "s": ("max", "amount")}}, None,
         'aggregations: the state location was created with {"n": "count", "s": ["sum", '
         '"amount"]}, this run uses {"n": "count", "s": ["max", "amount"]}'),
        ({"aggregations": {"n": "count", "s": aggregations.sum_of(column="amount")}}, None,
         'aggregation_state: the state location was created with "(not set)", this run uses '
         '{"s": {"sum": "amount"}}'),
        ({"key": ["user", "amount"]}, None,
         'key: the state location was created with [["user", "string"]], this run uses '
         '[["user", "string"], ["amount", "bigint"]]'),
        ({}, lambda s: s.withColumn("amount", F.col("amount").cast("int")),
         'values: the state location was created with [["amount", "bigint"]], this run uses '
         '[["amount", "int"]]'),
    ],
    ids=["gap", "inclusive_gap", "max_duration", "per-row-gap", "emit", "trigger",
         "aggregation-kind", "aggregation-object", "key-columns", "value-type"],
)
def test_restart_with_a_changed_meaning_is_refused_naming_old_and_new(
        spark, first_run, tmp_path, change, prep, named):
    root = copy_of(first_run, tmp_path)
    message = refused(spark, root, {**BASE, **change}, prep)
    assert "StateLayoutMismatchError" in message
    assert named in message


def test_restart_with_another_watermark_delay_goes_on(spark, first_run, tmp_path):
    """The delay is not pinned (Spark lets a restart change it): stored sessions mean the same
    under any delay, and the watermark never goes back."""
    root = copy_of(first_run, tmp_path)
    run = start(spark, root, {**BASE, "watermark_delay": "7 seconds"})
    for i in (1, 2):
        run.feed(i, FILES[i])
    run.stop()
    assert run.rows()  # sessions of the first file closed under the new delay


# -- aggregation objects (defect: a changed object kept the digest and misread the state) ------


def rows_for(seconds: list[int]) -> list[tuple[str, int, int]]:
    return [("a", s, 25) for s in seconds]


def test_restart_under_another_aggregation_object_is_refused(spark, tmp_path):
    """combine({"n": count()}) then combine({"n": sum_of(lambda ...)}) from the same checkpoint
    once gave the same digest, and the restarted query read the stored count as a sum."""
    counted = {"x": aggregations.combine({"n": aggregations.count()})}
    run = start(spark, tmp_path, {**BASE, "aggregations": counted})
    run.feed(0, rows_for([0, 1, 2, 3]))
    run.stop()
    summed = {"x": aggregations.combine(
        {"n": aggregations.sum_of(lambda r: r["amount"])})}
    with pytest.raises(ValueError, match=r"aggregations \['x'\] are built on Python functions.*"
                                         r"give state_version="):
        start(spark, tmp_path, {**BASE, "aggregations": summed})
    message = refused(spark, tmp_path, {**BASE, "aggregations": summed, "state_version": "1"})
    assert ('aggregation_state: the state location was created with {"x": {"combine": {"n": '
            '"count"}}}, this run uses {"x": {"combine": {"n": {"sum": "a Python function"}}}}'
            ) in message
    assert 'state_version: the state location was created with "(not set)", this run uses ' \
           '"1"' in message


def test_restart_under_another_state_version_is_refused_and_the_same_goes_on(spark, tmp_path):
    summed = {"x": aggregations.combine({"n": aggregations.sum_of(lambda r: r["amount"])})}
    run = start(spark, tmp_path, {**BASE, "aggregations": summed, "state_version": "v1"})
    run.feed(0, rows_for([0, 1, 2, 3]))
    run.stop()
    message = refused(spark, tmp_path, {**BASE, "aggregations": summed, "state_version": "v2"},
                      rows=rows_for([4]))
    assert 'state_version: the state location was created with "v1", this run uses "v2"' \
        in message
    again = start(spark, tmp_path, {**BASE, "aggregations": summed, "state_version": "v1"})
    again.feed(2, rows_for([100]))  # the retried batch 1 (a at 4 s), then 100 s: W = 95 s
    again.feed(3, [("z", 300, 1)])
    again.stop()
    assert [(r[1].second, r[3]) for r in again.rows() if r[0] == "a"][:1] == [(0, '{"n": 125}')]
