"""A real cluster: ``local-cluster[2,1,1024]`` (a driver and two executor JVMs, each its own
process) with sessionize's state on S3 (moto's server on loopback).

Each run is its own driver process (``tests.spark_cluster.cluster_driver``). The crash runs
SIGKILL an executor JVM while a micro-batch's tasks run, and, separately, the driver between the
sink's commit and Spark's ``commits/N``; after a restart the output must equal native
``session_window`` and the crash-free run: nothing lost, nothing duplicated.

``SESSIONSTORE_CLUSTER_LOOPS=n`` (``make cluster-test``) repeats both crash runs n times with
kill points drawn from a seeded generator.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.spark.s3_server import free_port
from tests.spark.streams import driver_outputs, final_rows, prepare_source, run_driver

DRIVER = "tests.spark_cluster.cluster_driver"
RNG = random.Random(17)
# file i holds events in [100 i, 100 i + 30): the watermark of batch i + 2 closes its sessions
FILES = [[(f"u{RNG.randrange(8)}", 100 * i + RNG.randrange(30), RNG.randrange(50))
          for _ in range(40)] for i in range(5)]
LOOPS = int(os.environ.get("SESSIONSTORE_CLUSTER_LOOPS", "1"))


@pytest.fixture(scope="module")
def s3_port() -> Iterator[int]:
    """moto's S3 server on a free loopback port, with the ``sessions`` bucket."""
    import pyarrow.fs as pafs
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        pafs.S3FileSystem(access_key="test", secret_key="test", region="us-east-1",
                          endpoint_override=f"127.0.0.1:{port}", scheme="http",
                          allow_bucket_creation=True).create_dir("sessions")
        yield port
    finally:
        server.stop()


def state_uri(port: int, name: str) -> str:
    return (f"s3://test:test@sessions/{name}?endpoint_override=127.0.0.1:{port}&scheme=http"
            f"&region=us-east-1")


def drive(root: Path, *args: str) -> int:
    done = run_driver(DRIVER, root, *args, timeout_s=900)
    if done.returncode not in (0, -9):
        print(done.stderr[-5000:])  # shown by pytest when the test fails
    return done.returncode


@pytest.fixture(scope="module")
def expected(tmp_path_factory, s3_port) -> list[tuple]:
    """The crash-free run's output, checked equal to native session_window's."""
    clean = prepare_source(tmp_path_factory.mktemp("clean"), FILES)
    assert drive(clean, "--state", state_uri(s3_port, "clean")) == 0
    native = prepare_source(tmp_path_factory.mktemp("native"), FILES)
    assert drive(native, "--native") == 0
    rows = final_rows(driver_outputs(clean))
    assert rows == final_rows(driver_outputs(native))
    assert len(rows) > 20 and len(set(rows)) == len(rows)
    return rows


def kill_points(first: int, last: int) -> list[int]:
    picker = random.Random(5)
    return [first, *[picker.randint(first, last) for _ in range(LOOPS - 1)]]


@pytest.mark.parametrize("kill_at", kill_points(2, len(FILES) - 1))
def test_executor_sigkill_mid_batch(tmp_path, s3_port, expected, kill_at):
    root = prepare_source(tmp_path, FILES)
    assert drive(root, "--state", state_uri(s3_port, f"executor-{kill_at}-{tmp_path.name}"),
                 "--kill-executor-at", str(kill_at)) == 0
    killed = json.loads((root / "killed-executors.json").read_text())
    assert len(killed) == 1 and killed[0]["active_tasks"] > 0  # it died with tasks running
    attempts = driver_outputs(root)
    assert all(len(a) == 1 for a in attempts.values())  # the driver lived: one attempt each
    rows = final_rows(attempts)
    assert rows == expected  # 0 lost, 0 duplicated, equal to native


@pytest.mark.parametrize("kill_at", kill_points(3, len(FILES) - 1))
def test_driver_sigkill_between_sink_and_commit_log(tmp_path, s3_port, expected, kill_at):
    root = prepare_source(tmp_path, FILES)
    state = state_uri(s3_port, f"driver-{kill_at}-{tmp_path.name}")
    assert drive(root, "--state", state, "--kill-driver-at", str(kill_at)) == -9
    assert not (root / "checkpoint" / "commits" / str(kill_at)).exists()
    assert drive(root, "--state", state) == 0
    attempts = driver_outputs(root)
    first, replay = attempts[kill_at]
    assert first == replay, "the replayed batch must repeat the first attempt exactly"
    assert final_rows(attempts) == expected
