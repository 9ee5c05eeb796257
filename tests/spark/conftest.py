"""One real local SparkSession for the whole test session."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.spark.streams import jvm_temp_option


@contextmanager
def child_environment(**values: str) -> Iterator[None]:
    """``os.environ`` with ``values`` while the block runs (for the processes it starts, such
    as Spark's JVM and, through it, the Python workers), as it was afterwards."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    root = str(Path(__file__).resolve().parents[2])
    # everything Spark, its JVM and its Python workers write for themselves goes here, and is
    # removed when the session ends, even if a test fails (a JVM or worker that is killed
    # leaves its files behind, and pytest keeps a failed run's temporary directories)
    scratch = tmp_path_factory.mktemp("spark-scratch")
    (scratch / "jvm").mkdir()
    # workers import this project's modules (and test helpers) by reference
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [root, *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    # local[2, 3]: two threads, and a failed task is retried (up to 3 attempts), which the
    # task-failure test relies on; everything else runs as under local[2].
    builder = (
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
        .config("spark.driver.extraJavaOptions", jvm_temp_option(str(scratch / "jvm")))
    )
    # the workers' temporary files, and the working copies of queries that name no local_dir
    with child_environment(TMPDIR=str(scratch / "workers"),
                           SESSIONSTORE_SPARK_LOCAL_DIR=str(scratch / "working-copies")):
        (scratch / "workers").mkdir()
        session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()
        shutil.rmtree(scratch, ignore_errors=True)


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
