"""Isolation and pinning: two queries with identical arguments never share state, and a restart
with another n_buckets, partition count or configuration fails, naming both values."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F

from spark_adapter import query_state_location, read_state_metrics, sessionize
from tests.spark.streams import StreamRun, make_files, write_file

GAP, DELAY = "10 seconds", "5 seconds"


def ours(**options: Any) -> Callable[[Any], Any]:
    def build(stream: Any) -> Any:
        return sessionize(stream, key="user", timestamp="ts", gap=GAP, watermark_delay=DELAY,
                          aggregations={"n": "count", "total": ("sum", "amount")}, **options)

    return build


def native(stream: Any) -> Any:
    return (stream.withWatermark("ts", DELAY)
            .groupBy("user", F.session_window("ts", GAP).alias("w"))
            .agg(F.count("*").alias("n"), F.sum("amount").alias("total"))
            .select("user", "w.start", "w.end", "n", "total"))


def run_native(spark: Any, root: Path, files: list[list[tuple[str, int, int]]]) -> list[tuple]:
    run = StreamRun(spark, root, native)
    run.start()
    for i, rows in enumerate(files):
        run.feed(i, rows)
    run.stop()
    return sorted(run.rows())


@pytest.fixture
def checkpoint_root(spark: Any, tmp_path: Path) -> Iterator[Path]:
    """``spark.sql.streaming.checkpointLocation`` set for the test: the default state base."""
    root = tmp_path / "checkpoints"
    spark.conf.set("spark.sql.streaming.checkpointLocation", str(root))
    yield root
    spark.conf.unset("spark.sql.streaming.checkpointLocation")


def test_two_concurrent_queries_with_identical_arguments_keep_their_own_state(
        spark, tmp_path, checkpoint_root):
    # the same users in both inputs, different events: shared state would mix their sessions
    inputs = [make_files(4, 30, seed=21), make_files(4, 30, seed=22)]
    runs = [StreamRun(spark, tmp_path / f"q{i}", ours(local_dir=str(tmp_path / "local")))
            for i in range(2)]
    for run in runs:
        run.start()  # both running at once, from identical sessionize(...) calls
    for index in range(4):
        for run, files in zip(runs, inputs, strict=True):
            write_file(run.source, index, files[index])
        for run in runs:
            run.query.processAllAvailable()
    for run in runs:
        run.stop()
    base = checkpoint_root / "sessionstore"
    locations = [run.state_location(base) for run in runs]
    assert locations[0] != locations[1]
    assert sorted(p.name for p in base.iterdir()) == sorted(Path(x).name for x in locations)
    for i, (run, files) in enumerate(zip(runs, inputs, strict=True)):
        expected = run_native(spark, tmp_path / f"native{i}", files)
        assert sorted(run.rows()) == expected and expected
        assert read_state_metrics(locations[i])["records_in"] == sum(len(f) for f in files)
    assert sorted(runs[0].rows()) != sorted(runs[1].rows())


def restart(spark: Any, root: Path, first: dict[str, Any], second: dict[str, Any],
            conf: tuple[str, str] | None = None) -> str:
    """Run one batch with ``first`` options, restart from the same checkpoint with ``second``
    (and the session ``conf`` changed meanwhile); return the failure's message."""
    files = make_files(2, 10, seed=4)
    common = {"state_location": str(root / "state"), "local_dir": str(root / "local")}
    run = StreamRun(spark, root, ours(**common, **first))
    run.start()
    run.feed(0, files[0])
    run.stop()
    location = run.state_location(root / "state")
    layout = (Path(location) / "layout.json").read_bytes()
    manifests = sorted(p.relative_to(location) for p in Path(location).rglob("*.json"))
    previous = spark.conf.get(conf[0]) if conf else None
    if conf:
        spark.conf.set(*conf)
    try:
        again = StreamRun(spark, root, ours(**common, **second))
        again.start()
        with pytest.raises(Exception) as caught:  # noqa: PT011 (Spark wraps the task's error)
            again.feed(1, files[1])
        again.query.stop()
    finally:
        if conf:
            spark.conf.set(conf[0], previous)
    # nothing changed: the layout record and the published versions are the first run's
    assert (Path(location) / "layout.json").read_bytes() == layout
    assert sorted(p.relative_to(location) for p in Path(location).rglob("*.json")) == manifests
    assert location == query_state_location(str(root / "state"), str(again.query.id))
    return str(caught.value)


def test_restart_with_another_partition_count_fails_naming_both(spark, tmp_path):
    message = restart(spark, tmp_path, {}, {}, conf=("spark.sql.shuffle.partitions", "3"))
    assert "StateLayoutMismatchError" in message
    assert "num_partitions: the state location was created with 2, this run uses 3" in message


def test_restart_with_another_configuration_fails_naming_both(spark, tmp_path):
    message = restart(spark, tmp_path, {}, {"inclusive_gap": False})
    assert "StateLayoutMismatchError" in message
    assert "config_digest: the state location was created with '" in message


def test_restart_with_another_n_buckets_fails_naming_both(spark, tmp_path):
    message = restart(spark, tmp_path, {"engine": "processor", "n_buckets": 4},
                      {"engine": "processor", "n_buckets": 6})
    assert "n_buckets: the state location was created with 4, this run uses 6" in message


def test_query_location_keeps_uri_options_last():
    base = "s3://bucket/state?endpoint_override=127.0.0.1:9000&scheme=http"
    assert query_state_location(base, "q1") == \
        "s3://bucket/state/query-q1?endpoint_override=127.0.0.1:9000&scheme=http"
    assert query_state_location("/data/state?odd", "q1") == "/data/state?odd/query-q1"
