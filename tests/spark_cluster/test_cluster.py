"""A real cluster: ``local-cluster[2,1,1024]`` (a driver and two executor JVMs, each its own
process) with sessionize's state on S3 (moto's server on loopback).

The runs share as few cluster start-ups as they can (``tests.spark_cluster.cluster_driver``
runs a list of queries in one driver process). The first driver runs native
``session_window``, the crash-free sessionize run, the run that SIGKILLs an executor JVM while a
micro-batch's tasks run, and then the first run that SIGKILLs the driver between the sink's
commit and Spark's ``commits/N``, which ends the process. Each later driver restarts the killed
run from its checkpoint, to the end, then starts the next driver-kill run. Every run's output
must equal native ``session_window``'s and the crash-free run's: nothing lost, nothing
duplicated, and the replayed batch repeats its first attempt exactly.

``SESSIONSTORE_CLUSTER_LOOPS=n`` (``make cluster-test``) makes it n executor kills and n driver
kills, at kill points drawn from a seeded generator (one more driver process per driver kill).
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.spark.s3_server import free_port
from tests.spark.streams import driver_outputs, final_rows, prepare_source, run_driver

DRIVER = "tests.spark_cluster.cluster_driver"
RNG = random.Random(17)
# file i holds events in [100 i, 100 i + 30): the watermark of batch i + 2 closes its sessions
FILES = [[(f"u{RNG.randrange(8)}", 100 * i + RNG.randrange(30), RNG.randrange(50))
          for _ in range(40)] for i in range(4)]
LOOPS = int(os.environ.get("SESSIONSTORE_CLUSTER_LOOPS", "1"))


def kill_points(first: int, last: int) -> list[int]:
    picker = random.Random(5)
    return [first, *[picker.randint(first, last) for _ in range(LOOPS - 1)]]


# an executor dies in a batch after the first (state to restore); the driver in a data batch
# that also closes sessions of an earlier file
EXECUTOR_KILLS = kill_points(2, len(FILES) - 1)
DRIVER_KILLS = kill_points(3, len(FILES) - 1)


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


class Cluster:
    """The runs' roots, and what the test saw of each driver-kill run between its processes."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.roots: dict[str, Path] = {}
        self.return_codes: list[int] = []
        self.committed_at_crash: dict[str, bool] = {}

    def run(self, name: str, **options: Any) -> dict[str, Any]:
        root = prepare_source(self.base / name, FILES)
        self.roots[name] = root
        return {"root": str(root), **options}

    def drive(self, plan: list[dict[str, Any]]) -> int:
        path = self.base / f"plan-{len(self.return_codes)}.json"
        path.write_text(json.dumps(plan))
        done = run_driver(DRIVER, path, timeout_s=1200)
        if done.returncode not in (0, -9):
            print(done.stderr[-5000:])  # shown by pytest when a test fails
        self.return_codes.append(done.returncode)
        return done.returncode


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, s3_port: int) -> Cluster:
    """Every run, in 1 + len(DRIVER_KILLS) driver processes (see the module docstring)."""
    cluster = Cluster(tmp_path_factory.mktemp("cluster"))
    first = [cluster.run("native", native=True),
             cluster.run("clean", state=state_uri(s3_port, "clean"))]
    first += [cluster.run(f"executor-{i}", state=state_uri(s3_port, f"executor-{i}"),
                          kill_executor_at=at) for i, at in enumerate(EXECUTOR_KILLS)]
    crashes = [cluster.run(f"driver-{i}", state=state_uri(s3_port, f"driver-{i}"),
                           kill_driver_at=at) for i, at in enumerate(DRIVER_KILLS)]
    plans = [[*first, crashes[0]]]
    for i, crash in enumerate(crashes):
        restart = {k: v for k, v in crash.items() if k != "kill_driver_at"}
        plans.append([restart, *crashes[i + 1:i + 2]])
    for i, plan in enumerate(plans):
        cluster.drive(plan)
        if i < len(crashes):  # this process ended in crash i's sink
            at = DRIVER_KILLS[i]
            cluster.committed_at_crash[f"driver-{i}"] = \
                (cluster.roots[f"driver-{i}"] / "checkpoint" / "commits" / str(at)).exists()
    return cluster


@pytest.fixture(scope="module")
def expected(cluster: Cluster) -> list[tuple]:
    """Native session_window's output, checked equal to the crash-free sessionize run's."""
    rows = final_rows(driver_outputs(cluster.roots["native"]))
    assert len(rows) > 20 and len(set(rows)) == len(rows)
    assert final_rows(driver_outputs(cluster.roots["clean"])) == rows
    return rows


def test_every_driver_ended_as_planned(cluster: Cluster) -> None:
    # each driver but the last was SIGKILLed in a sink; the last ran its query to the end
    assert cluster.return_codes == [-9] * len(DRIVER_KILLS) + [0]


def test_crash_free_run_equals_native(expected: list[tuple]) -> None:
    assert expected  # the fixture compared them


@pytest.mark.parametrize(("index", "kill_at"), list(enumerate(EXECUTOR_KILLS)))
def test_executor_sigkill_mid_batch(cluster: Cluster, expected: list[tuple], index: int,
                                    kill_at: int) -> None:
    root = cluster.roots[f"executor-{index}"]
    killed = json.loads((root / "killed-executors.json").read_text())
    assert len(killed) == 1 and killed[0]["active_tasks"] > 0  # it died with tasks running
    attempts = driver_outputs(root)
    assert all(len(a) == 1 for a in attempts.values())  # the driver lived: one attempt each
    assert final_rows(attempts) == expected  # 0 lost, 0 duplicated, equal to native


@pytest.mark.parametrize(("index", "kill_at"), list(enumerate(DRIVER_KILLS)))
def test_driver_sigkill_between_sink_and_commit_log(cluster: Cluster, expected: list[tuple],
                                                    index: int, kill_at: int) -> None:
    name = f"driver-{index}"
    assert cluster.committed_at_crash[name] is False  # killed before Spark's commits/N
    attempts = driver_outputs(cluster.roots[name])
    assert len(attempts[kill_at]) == 2, "the killed batch must have run twice"
    first, replay = attempts[kill_at]
    assert first == replay, "the replayed batch must repeat the first attempt exactly"
    assert final_rows(attempts) == expected
