"""The streaming Arrow engine's plan does no per-micro-batch shuffle that native
``session_window`` does not: its no-data ticker shares the engine's shuffle instead of adding a
stage of its own, and Spark reads and counts the input once."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F

from spark_adapter import sessionize
from tests.spark.streams import EPOCH, SCHEMA, one_file_plan

ROWS = [("a", 0, 1), ("b", 3, 2), ("a", 8, 3), ("c", 30, 4)]


def _plan_and_rows(spark: Any, root: Path, build: Any, capsys: Any) -> tuple[str, int, list]:
    """Run ``build(stream)`` over one file of ROWS: the physical plan of its last micro-batch,
    the input rows Spark reported and the rows it wrote."""
    plan, reported, name = one_file_plan(spark, root, build, ROWS, capsys)
    return plan, reported, sorted(tuple(r) for r in spark.table(name).collect())


def _shuffles(plan: str) -> tuple[int, int]:
    """(exchanges Spark runs, exchanges it reuses) in an explained physical plan."""
    nodes = re.findall(r"(?m)^[ :|+-]*(\w+)", plan)  # each line's operator
    return nodes.count("Exchange"), nodes.count("ReusedExchange")


def test_the_stream_shuffles_once_as_native_does_and_closes_without_new_data(
        spark, tmp_path, capsys):
    """Kills a ticker with an exchange of its own (the window-keyed aggregation it replaced:
    two shuffles per micro-batch) and one that reads a pruned copy of the input (two shuffles,
    the input counted twice)."""
    native_plan, native_reported, native_rows = _plan_and_rows(
        spark, tmp_path / "native", lambda s: s.withWatermark("ts", "5 seconds")
        .groupBy("user", F.session_window("ts", "10 seconds").alias("w")).count()
        .select("user", "w.start", "w.end", "count"), capsys)
    plan, reported, rows = _plan_and_rows(
        spark, tmp_path / "ours", lambda s: sessionize(
            s, key="user", timestamp="ts", gap="10 seconds", aggregations={"n": "count"},
            watermark_delay="5 seconds", state_location=str(tmp_path / "state"),
            local_dir=str(tmp_path / "local")), capsys)
    assert _shuffles(native_plan) == (1, 0)
    assert _shuffles(plan) == (1, 1), plan  # the ticker's copy of the engine's shuffle
    assert "StreamingDeduplicateWithinWatermark" in plan
    assert reported == native_reported == len(ROWS)
    # the no-data batch the ticker makes Spark run closed the sessions the watermark (30 - 5 s)
    # passed, as native's did
    assert rows == native_rows == [
        ("a", EPOCH, EPOCH.replace(second=18), 2), ("b", EPOCH.replace(second=3),
                                                    EPOCH.replace(second=13), 1)]


def test_a_column_named_like_the_partition_column_is_refused(spark, tmp_path):
    stream = spark.readStream.schema(SCHEMA).json(str(tmp_path)) \
        .withColumnRenamed("amount", "sessionstore_partition_key")
    with pytest.raises(ValueError, match="'sessionstore_partition_key'.*rename it"):
        sessionize(stream, key="user", timestamp="ts", gap="10 seconds",
                   aggregations={"s": ("sum", "sessionstore_partition_key")},
                   watermark_delay="5 seconds", state_location=str(tmp_path / "state"))
