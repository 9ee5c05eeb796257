"""A partition's micro-batch run by the worker process that keeps it (``spark_adapter.kept.relay``).

The oracle is the task loading its partition afresh in every micro-batch (the path that existed
before partitions were kept, as in ``test_kept.py``): a relayed micro-batch must emit the same
rows, report the same counters and commit the same values, and leave the partition kept where it
was. The keeper is another process (spawned) where the task goes through
``arrow.stream_partition``, and this process where the protocol's refusals are checked.
"""

from __future__ import annotations

import multiprocessing
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark import cloudpickle

from spark_adapter import arrow, kept
from tests.spark.test_kept import (
    QUERY_ID,
    committed,
    key_of,
    micro_batches,
    run_task,
    stream_config,
    watcher_asleep,
)
from tests.spark.test_static_columnar import AGGS

pytestmark = pytest.mark.skipif(not kept.RELAY_SUPPORTED, reason="relay sockets need Linux")


@pytest.fixture(autouse=True)
def nothing_kept() -> Any:
    kept.close_all()
    yield
    kept.close_all()


def _ipc(batches: list[pa.RecordBatch]) -> list[bytes]:
    return [kept._ipc(b) for b in batches]


def _keeper(config_bytes: bytes, batch0: list[bytes], ready: Any, report: Any, done: Any) -> None:
    """In another process: run batch 0 of the partition (so it keeps it), then stay idle while
    its watcher serves relays; report how many it served and whether it still keeps it."""
    config = cloudpickle.loads(config_bytes)
    rows = [b for payload in batch0 for b in kept._read_ipc(payload).to_batches()]
    report.put(("batch 0", run_task(config, 0, rows)))
    _offered(config)
    ready.set()
    done.wait(600)
    report.put(("served", kept.relay_counts()["served"], kept.holds(key_of(config))))
    kept.close_all()


def _oracle(spark: Any, root: Path, name: str, seed: int, n_batches: int
            ) -> tuple[Any, Any, list[list[pa.RecordBatch]], list[Any]]:
    """(the oracle's configuration, the tested one's, the micro-batches, the oracle's output and
    counters per micro-batch: loaded afresh every time)."""
    fresh = stream_config(spark, root / "fresh", AGGS, 5_000)
    config = stream_config(spark, root / name, AGGS, 5_000)
    batches = micro_batches(spark, fresh, seed, n_batches)
    expected = []
    for batch, rows in enumerate(batches):
        expected.append(run_task(fresh, batch, rows))
        kept.discard(key_of(fresh))  # the oracle always loads afresh
    return fresh, config, batches, expected


def test_a_task_whose_partition_another_worker_keeps_runs_there(spark, tmp_path):
    fresh, relayed, batches, expected = _oracle(spark, tmp_path, "relayed", 17, 5)
    context = multiprocessing.get_context("spawn")
    ready, done, report = context.Event(), context.Event(), context.Queue()
    keeper = context.Process(target=_keeper, args=(
        cloudpickle.dumps(relayed), _ipc(batches[0]), ready, report, done))
    keeper.start()
    try:
        assert ready.wait(120)
        assert report.get(timeout=60) == ("batch 0", expected[0])
        for batch in range(1, 4):
            assert run_task(relayed, batch, batches[batch]) == expected[batch], f"batch {batch}"
            assert committed(relayed, batch) == committed(fresh, batch)
            assert kept.kept_count() == 0  # it ran in the keeper, and stays kept there
        done.set()
        assert report.get(timeout=60) == ("served", 3, True)
    finally:
        done.set()
        keeper.join(60)
    # the keeper has gone: the next task loads the partition here, from what the keeper committed
    assert run_task(relayed, 4, batches[4]) == expected[4]
    assert committed(relayed, 4) == committed(fresh, 4)


def _offered(config: Any) -> None:
    """Return once this process's watcher offers the kept partition (it binds its socket just
    after the task kept it); the deadline bounds a failure only."""
    deadline = time.monotonic() + 60
    while not kept.offers(key_of(config)):
        assert time.monotonic() < deadline, "the kept partition is never offered"
        time.sleep(0.01)


def _table(config: Any, rows: list[pa.RecordBatch]) -> pa.Table:
    return config.input_table(iter(rows))


def _relay(config: Any, batch: int, table: pa.Table, fingerprint_of: Any = None
           ) -> list[Any] | None:
    """Relay ``batch`` to this process's own watcher; None if declined, else what came back."""
    location = f"{config.state_location}/query-{QUERY_ID}"
    provider = arrow._provider(config, location, 0)
    out = kept.relay(provider.local, key_of(config), fingerprint_of or config,
                     kept.Assignment(location, 0, batch), table)
    return None if out is None else list(out)


def _rows(items: list[Any]) -> tuple[list[tuple], dict[str, int]]:
    counters = [item for item in items if isinstance(item, dict)]
    assert len(counters) == 1 and isinstance(items[-1], dict)  # the counters come last, once
    rows = [tuple(r.values()) for b in items[:-1] for r in b.to_pylist()]
    return sorted(rows, key=repr), counters[0]


def test_a_keeper_declines_while_it_runs_or_under_another_configuration(spark, tmp_path):
    fresh, config, batches, expected = _oracle(spark, tmp_path, "kept", 29, 3)
    assert run_task(config, 0, batches[0]) == expected[0]
    _offered(config)
    table = _table(config, batches[1])
    before = kept.relay_counts()
    with kept.running():  # the keeper runs a micro-batch itself: it declines
        assert _relay(config, 1, table) is None
    renamed = stream_config(spark, tmp_path / "kept", AGGS, 5_000)
    renamed.output_names = [*renamed.output_names[:-1], "renamed"]  # same key, other output
    assert kept.key_of(renamed, "x", 0) == kept.key_of(config, "x", 0)
    assert _relay(config, 1, table, fingerprint_of=renamed) is None
    assert kept.holds(key_of(config))  # declining changed nothing
    _offered(config)
    assert kept.relay_counts() == {"served": before["served"],
                                   "declined": before["declined"] + 2}
    # accepted: the micro-batch runs in the keeper's serving thread, output and counters come
    # back, and the partition stays kept at the new version
    assert _rows(_relay(config, 1, table) or []) == expected[1]
    assert committed(config, 1) == committed(fresh, 1)
    assert kept.holds(key_of(config))
    # a request for a version the kept partition is not at: declined, and the stale partition
    # is closed (a replay loads afresh, as in test_kept)
    assert _relay(config, 1, table) is None
    assert not kept.holds(key_of(config))
    assert kept.relay_counts() == {"served": before["served"] + 1,
                                   "declined": before["declined"] + 3}


def test_a_relayed_micro_batch_that_fails_fails_the_task_and_commits_nothing(spark, tmp_path):
    fresh, config, batches, expected = _oracle(spark, tmp_path, "kept", 41, 3)
    run_task(config, 0, batches[0])
    _offered(config)
    served = kept.relay_counts()["served"]
    broken = pa.table({"nope": [1]})  # not the input schema: the keeper's engine input fails
    with pytest.raises(RuntimeError, match="worker keeping the partition failed.*nope|"
                                           "worker keeping the partition failed"):
        _relay(config, 1, broken)
    assert kept.kept_count() == 0  # the keeper closed it, uncommitted
    assert kept.relay_counts()["served"] == served
    assert run_task(config, 1, batches[1]) == expected[1]
    assert committed(config, 1) == committed(fresh, 1)
    assert run_task(config, 2, batches[2]) == expected[2]


def test_the_fingerprint_covers_every_setting_but_the_aggregation_object(spark, tmp_path):
    config = stream_config(spark, Path(tmp_path), AGGS, 5_000)
    same = stream_config(spark, Path(tmp_path), AGGS, 5_000)
    assert kept.fingerprint(config) == kept.fingerprint(same)
    same.aggregation = None  # type: ignore[assignment]
    assert kept.fingerprint(config) == kept.fingerprint(same)
    for change in ({"timezone": "Europe/Paris"}, {"key_columns": ["other"]},
                   {"n_partitions": 3}, {"inclusive_gap": False}):
        other = stream_config(spark, Path(tmp_path), AGGS, 5_000)
        for name, value in change.items():
            setattr(other, name, value)
        assert kept.fingerprint(other) != kept.fingerprint(config), change


def test_an_offered_partition_costs_its_idle_watcher_no_polling(spark, tmp_path, monkeypatch):
    monkeypatch.setattr(kept, "WATCH_IDLE_S", 3600.0)
    config = stream_config(spark, tmp_path, AGGS, 5_000)
    run_task(config, 0, micro_batches(spark, config, 3, 2)[0])
    _offered(config)
    watcher_asleep()  # the wake-ups of the keep itself are behind it, however slow the machine
    looks = kept.watcher_looks()
    time.sleep(0.5)
    assert kept.watcher_looks() == looks  # it sleeps on its pipes and the socket: no timer
    assert kept.offers(key_of(config))


def test_neither_end_of_a_relay_trusts_another_users_process(spark, tmp_path, monkeypatch):
    """An abstract socket has no file permissions: a task must not send its rows to, and a
    keeper must not run rows from, a process of another user (``SO_PEERCRED``)."""
    fresh, config, batches, expected = _oracle(spark, tmp_path, "kept", 53, 2)
    assert run_task(config, 0, batches[0]) == expected[0]
    _offered(config)
    table = _table(config, batches[1])
    served = kept.relay_counts()["served"]
    real_uid = kept.os.getuid()
    monkeypatch.setattr(kept.os, "getuid", lambda: real_uid + 1)  # every peer is "another user"
    # the task's side: a keeper of another user gets no rows (here, a listener of ours that
    # holds the name of a working copy nobody keeps)
    impostor = kept._offer(tmp_path / "impostor")
    assert impostor is not None
    with impostor:
        location = f"{config.state_location}/query-{QUERY_ID}"
        out: list[Any] = []
        task = threading.Thread(target=lambda: out.append(kept.relay(
            tmp_path / "impostor", key_of(config), config, kept.Assignment(location, 0, 1),
            table)))
        task.start()
        impostor.setblocking(True)
        impostor.settimeout(10)
        connection, _ = impostor.accept()
        with connection:
            connection.settimeout(10)
            assert connection.recv(1) == b""  # closed unspoken: no request, no rows
        task.join(30)
        assert out == [None]  # and the task loads the partition itself
    # the keeper's side: a connection from another user is closed unanswered
    listener = kept._offer(tmp_path / "elsewhere")
    assert listener is not None
    with listener, socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.connect(kept._address(tmp_path / "elsewhere"))
        kept._accept(listener)
        client.settimeout(10)
        assert client.recv(1) == b""
    assert _relay(config, 1, table) is None  # nor the real keeper, seen as another user
    monkeypatch.undo()
    assert kept.relay_counts()["served"] == served
    assert kept.holds(key_of(config))  # untouched: the task then loads it as before
    assert _rows(_relay(config, 1, table) or []) == expected[1]
    assert committed(config, 1) == committed(fresh, 1)
