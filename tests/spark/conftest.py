"""One real local SparkSession for the whole test session."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    root = str(Path(__file__).resolve().parents[2])
    # workers import this project's modules (and test helpers) by reference
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [root, *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    # local[2, 3]: two threads, and a failed task is retried (up to 3 attempts), which the
    # task-failure test relies on; everything else runs as under local[2].
    session = (
        SparkSession.builder.master("local[2,3]")
        .appName("sessionstore-tests")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.streaming.stateStore.providerClass",
                "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.driver.memory", "2g")
        # a Python worker that crashes shows its stack in the task's error, not only "exited"
        .config("spark.python.worker.faulthandler.enabled", "true")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def new_york(spark: object) -> Iterator[object]:
    """The shared session with ``spark.sql.session.timeZone`` at America/New_York (daylight
    saving: 2024-03-10 lasts 23 hours, 2024-11-03 25), restored afterwards."""
    before = spark.conf.get("spark.sql.session.timeZone")  # type: ignore[attr-defined]
    spark.conf.set("spark.sql.session.timeZone", "America/New_York")  # type: ignore[attr-defined]
    try:
        yield spark
    finally:
        spark.conf.set("spark.sql.session.timeZone", before)  # type: ignore[attr-defined]
