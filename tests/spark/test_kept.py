"""Partitions kept open between micro-batches (``spark_adapter.kept``).

The streaming Arrow engine's task runs here in-process, under a stand-in ``TaskContext`` that
carries what Spark sets (batch id, query id, partition), so that the test decides exactly when a
kept partition is resumed and when the next task must load afresh (a worker swap, a replay). The
oracle is the same task run with every partition closed after every micro-batch: the loading
path that existed before partitions were kept. Resuming must change nothing a user or the next
task can see: the emitted rows, the counters in the progress, and what is committed.
"""

from __future__ import annotations

import datetime as dt
import gc
import json
import multiprocessing
import random
import time
import weakref
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark import TaskContext

from sessionstore import SessionAggregator, aggregations
from sessionstore.windows import SessionWindows
from spark_adapter import arrow, kept, sessionize
from spark_adapter import provider as provider_module
from spark_adapter.config import SessionizeConfig
from spark_adapter.provider import (
    RELEASE_REQUEST,
    SessionStoreProvider,
    StateLockedError,
    wake_keeper,
)
from tests.spark.test_static_columnar import AGGS, arrow_batches, config_for, make_rows

QUERY_ID = "0f0e0d0c-0b0a-4909-8807-060504030201"


def stream_config(spark: Any, root: Path, aggs: dict[str, Any], delay_ms: int,
                  emit: str = "final", gap_s: int = 10, keep_versions: int = 100
                  ) -> SessionizeConfig:
    config = config_for(spark, ["user"], aggs, emit=emit)
    config.gap_us = config.max_gap_us = gap_s * 1_000_000
    config.keep_versions = keep_versions
    config.state_location = str(root / "state")
    config.local_dir = str(root / "local")
    config.delay_ms = delay_ms
    config.n_partitions = config.n_buckets = 1
    config.layout_digest = f"test-{sorted(aggs)}"
    return config


def run_task(config: SessionizeConfig, batch: int, rows: list[pa.RecordBatch]
             ) -> tuple[list[tuple], dict[str, int]]:
    """One micro-batch's task of partition 0, as Spark would run it: (rows out, counters)."""
    context = TaskContext._getOrCreate()
    context._partitionId = config.n_partitions  # the ticker's partitions come first
    context._attemptNumber = 0
    context._localProperties = {"streaming.sql.batchId": str(batch),
                                "sql.streaming.queryId": QUERY_ID}
    TaskContext._setTaskContext(context)
    try:
        observed: dict[str, int] = {}
        # through the wrapper every mapInArrow task of sessionize runs (arrow.map_in_arrow)
        task = arrow._renamed(partial(arrow.stream_partition, config, observed=observed),
                              config.arrow_input_schema().names, iter(rows))
        out = [tuple(r.values()) for b in task for r in b.to_pylist()]
    finally:
        TaskContext._setTaskContext(None)  # type: ignore[arg-type]
    return sorted(out, key=repr), observed


def key_of(config: SessionizeConfig) -> kept.Key:
    return kept.key_of(config, f"{config.state_location}/query-{QUERY_ID}", 0)


def committed(config: SessionizeConfig, batch: int) -> dict[str, Any]:
    """What the partition committed at ``batch``, minus the per-attempt unique ids."""
    assert config.state_location is not None
    location = f"{config.state_location}/query-{QUERY_ID}"
    provider = SessionStoreProvider(location, config.operator, 0, local_root=Path(
        str(config.local_dir)) / "reader", retention_ms=config.retention_us)
    try:
        manifest = provider.read_manifest(batch)
    finally:
        provider.close()
    return {k: v for k, v in manifest["spark"].items() if k not in ("id", "parent")}


def micro_batches(spark: Any, config: SessionizeConfig, seed: int, n_batches: int
                  ) -> list[list[pa.RecordBatch]]:
    """The rows in arrival order, cut into micro-batches; some arrive out of order, some later
    than the watermark allows."""
    rng = random.Random(seed)
    rows = make_rows(400, seed)
    rows.sort(key=lambda r: r[3] + dt.timedelta(seconds=rng.choice([0, 0, 0, 7, 40])))
    cuts = sorted(rng.sample(range(1, len(rows)), n_batches - 1))
    parts = [rows[a:b] for a, b in zip([0, *cuts], [*cuts, len(rows)], strict=True)]
    return [arrow_batches(spark, config, part, 64) if part else [] for part in parts]


@pytest.fixture(autouse=True)
def nothing_kept() -> Iterator[None]:
    kept.close_all()
    yield
    kept.close_all()
    gc.unfreeze()  # a task here froze the test process's objects (kept.freeze_heap)


@pytest.mark.parametrize("aggs", [AGGS, {"n": "count", "first_i": ("first", "i")}],
                         ids=["columnar", "rows"])
@settings(max_examples=5, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), swaps=st.sets(st.integers(0, 13)),
       delay_ms=st.sampled_from([0, 5_000, 60_000]), emit=st.sampled_from(["final", "update"]),
       gap_s=st.sampled_from([1, 10]), keep_versions=st.sampled_from([1, 3, 100]))
def test_resumed_partition_equals_a_fresh_load_every_batch(spark, tmp_path_factory, aggs, seed,
                                                           swaps, delay_ms, emit, gap_s,
                                                           keep_versions):
    # 12 micro-batches: the provider's maintenance (every 10th version) runs while a copy is kept,
    # and with keep_versions 1 deletes every older manifest
    root = tmp_path_factory.mktemp("kept")
    fresh, resumed = (stream_config(spark, root / name, aggs, delay_ms, emit, gap_s,
                                    keep_versions) for name in ("fresh", "resumed"))
    batches = micro_batches(spark, fresh, seed, 12)
    fresh_key, resumed_key = key_of(fresh), key_of(resumed)
    for batch, rows in enumerate([*batches, [], []]):  # then two batches without rows
        expected = run_task(fresh, batch, rows)
        kept.discard(fresh_key)  # the oracle always loads afresh
        if batch in swaps:  # the partition ran in another worker: nothing to resume
            kept.discard(resumed_key)
        held = kept.holds(resumed_key)
        assert run_task(resumed, batch, rows) == expected, f"batch {batch}"
        assert committed(resumed, batch) == committed(fresh, batch)
        assert held == (batch > 0 and batch not in swaps)
        assert kept.holds(resumed_key) and not kept.holds(fresh_key)


def test_replayed_batch_loads_afresh_and_repeats_its_output(spark, tmp_path):
    config = stream_config(spark, tmp_path, AGGS, 5_000)
    batches = micro_batches(spark, config, 11, 4)
    first = [run_task(config, b, rows) for b, rows in enumerate(batches)]
    # a driver restart replays batch 3 in the same worker: the kept partition is at 3, not 2
    assert run_task(config, 3, batches[3]) == first[3]
    # and batch 2 again after that (an older replay): still exactly the first attempt's output
    assert run_task(config, 2, batches[2]) == first[2]


def test_a_task_that_fails_keeps_nothing(spark, tmp_path):
    config = stream_config(spark, tmp_path, AGGS, 5_000)
    batches = micro_batches(spark, config, 5, 3)
    expected = [run_task(config, b, rows) for b, rows in enumerate(batches)]
    kept.close_all()
    other = stream_config(spark, tmp_path / "other", AGGS, 5_000)
    run_task(other, 0, batches[0])
    broken = [*batches[1], pa.RecordBatch.from_pylist([{"nope": 1}])]  # not the input schema
    with pytest.raises(Exception):  # noqa: B017 - whatever Arrow raises; the point is below
        run_task(other, 1, broken)
    assert kept.kept_count() == 0  # the failed task's uncommitted writes are gone
    assert run_task(other, 1, batches[1]) == expected[1]
    assert run_task(other, 2, batches[2]) == expected[2]


def test_another_configuration_never_resumes_a_kept_partition(spark, tmp_path):
    config = stream_config(spark, tmp_path, AGGS, 5_000)
    batches = micro_batches(spark, config, 3, 2)
    run_task(config, 0, batches[0])
    assert kept.kept_count() == 1
    changed = stream_config(spark, tmp_path, AGGS, 5_000)
    changed.delay_ms = 6_000  # not part of the test digest, but of the kept key
    assert kept.take(key_of(changed), 0) is None
    assert kept.kept_count() == 1  # the other configuration's partition is left alone
    # a restart whose configuration digest differs (say, another aggregation object) never
    # takes over the engine the old configuration built, even with every other part equal
    other = stream_config(spark, tmp_path, AGGS, 5_000)
    other.layout_digest = "another-digest"
    assert kept.take(key_of(other), 0) is None
    assert kept.kept_count() == 1


# -- the worker's heap ------------------------------------------------------------------------------

def _collected(thing: object) -> bool:
    """Whether the cyclic garbage collector would visit ``thing`` (it is not frozen)."""
    return any(o is thing for o in gc.get_objects())


def test_a_task_takes_what_its_worker_held_out_of_the_collection_after_it(spark, tmp_path):
    # PySpark collects garbage after every task over every tracked object: what the worker held
    # before the task is frozen, what the task makes is not
    config = stream_config(spark, tmp_path, AGGS, 5_000)
    batches = micro_batches(spark, config, 7, 2)
    gc.unfreeze()
    held: list[list[int]] = [[]]
    assert _collected(held)
    run_task(config, 0, batches[0])
    assert not _collected(held)
    made_after: list[list[int]] = [[]]
    assert _collected(made_after)
    # the kept partition is frozen by the next task, which resumes it
    with kept._TABLE_LOCK:
        engine = kept._TABLE[key_of(config)].engine
    assert _collected(engine)
    run_task(config, 1, batches[1])
    assert not _collected(engine)


def test_a_static_task_freezes_what_its_worker_held_too(spark):
    config = config_for(spark, ["user"], AGGS)
    rows = arrow_batches(spark, config, make_rows(200, 5), 64)
    gc.unfreeze()
    held: list[list[int]] = [[]]
    out = list(arrow._renamed(partial(arrow.static_partition, config),
                              config.arrow_input_schema().names, iter(rows)))
    assert sum(b.num_rows for b in out) > 0
    assert not _collected(held)


def test_nothing_is_frozen_while_a_micro_batch_runs_in_the_process():
    # a relayed micro-batch running in a thread holds objects it is about to drop
    gc.unfreeze()
    held: list[list[int]] = [[]]
    with kept.running():
        assert not kept.freeze_heap()
    assert _collected(held)
    assert kept.freeze_heap()
    assert not _collected(held)


def test_a_processor_task_freezes_what_its_worker_held_too(spark, tmp_path):
    # a task of the processor engine starts by unpickling its processor (its init comes later,
    # after PySpark read its first rows): in a task that freezes, anywhere else it does not
    from pyspark import cloudpickle

    from spark_adapter.processor import SessionizeProcessor

    pickled = cloudpickle.dumps(SessionizeProcessor(stream_config(spark, tmp_path, AGGS, 5_000)))
    gc.unfreeze()
    held: list[list[int]] = [[]]
    assert isinstance(cloudpickle.loads(pickled), SessionizeProcessor)
    assert _collected(held)
    TaskContext._setTaskContext(TaskContext._getOrCreate())
    try:
        assert isinstance(cloudpickle.loads(pickled), SessionizeProcessor)
    finally:
        TaskContext._setTaskContext(None)  # type: ignore[arg-type]
    assert not _collected(held)


_PROBES: dict[int, list[int]] = {}


def _probe_the_freeze(key: Any, row: Any, before: Any) -> list[int]:
    """An aggregator for a Python worker of the processor engine: at its first call in a task,
    [how many objects the worker holds frozen, how many of them are cyclic garbage, how many
    tasks this worker probed before]; its later calls in that task repeat that. It collects
    the task's own garbage first, then unfreezes and collects again: what that second pass
    finds, the freeze hid."""
    context = TaskContext.get()
    assert context is not None
    task = context.taskAttemptId()
    if task not in _PROBES:
        frozen = gc.get_freeze_count()
        gc.collect()
        gc.unfreeze()
        _PROBES[task] = [frozen, gc.collect(), len(_PROBES)]
    return _PROBES[task]


def _later(key: Any, a: Any, b: Any) -> Any:
    return b


def test_the_processor_engine_freezes_its_python_workers_heap(spark, tmp_path):
    # the processor engine's tasks (transformWithStateInPandas) run in reused Python workers
    # too, which PySpark collects garbage over after every task, but not in the workers of
    # mapInArrow tasks: an aggregation reads the freeze in the processor's own workers. Every
    # task froze its worker's heap before aggregating, and froze no cyclic garbage with it
    # (frozen once its first rows were read, a class PySpark makes per Arrow batch would be)
    from tests.spark.streams import StreamRun, make_files

    probe = aggregations.aggregate(lambda: None, _probe_the_freeze, _later)
    run = StreamRun(spark, tmp_path, lambda stream: sessionize(
        stream, key="user", timestamp="ts", gap="10 seconds", aggregations={"probe": probe},
        watermark_delay="0 seconds", state_location=str(tmp_path / "state"),
        local_dir=str(tmp_path / "local"), engine="processor", n_buckets=2, state_version="1"))
    run.start()
    try:
        for index, rows in enumerate(make_files(4, 10)):
            run.feed(index, rows)
    finally:
        run.stop()
    probes = {tuple(json.loads(row[-1])) for row in run.rows()}
    assert probes and min(frozen for frozen, _, _ in probes) > 0, probes
    # a worker's first task imports the engine's modules as it unpickles its processor, and
    # freezes what of that import is not collected yet: once per worker. After it, nothing
    later = {garbage for _, garbage, earlier in probes if earlier}
    assert later == {0}, probes


@pytest.mark.parametrize("aggs", [AGGS, {"n": "count", "first_i": ("first", "i")}],
                         ids=["columnar", "rows"])
def test_a_closed_partition_is_freed_without_the_cyclic_collector(spark, tmp_path, aggs):
    # what makes freezing safe: a kept partition, frozen while kept, holds no reference cycle,
    # so closing it frees it (its engine's columns, its RocksDB handle) by reference counts alone
    config = stream_config(spark, tmp_path, aggs, 5_000)
    for batch, rows in enumerate(micro_batches(spark, config, 3, 3)):
        run_task(config, batch, rows)
    with kept._TABLE_LOCK:
        opened = kept._TABLE[key_of(config)]
    assert opened.provider.store is not None
    parts = {"partition": weakref.ref(opened), "engine": weakref.ref(opened.engine),
             "provider": weakref.ref(opened.provider),
             "store": weakref.ref(opened.provider.store)}
    del opened
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        kept.close_all()
        assert [name for name, ref in parts.items() if ref() is not None] == []
    finally:
        gc.enable()


# -- the working copy between processes -----------------------------------------------------------

def _engine(store: Any) -> SessionAggregator:
    """An engine on ``store`` that has seen one event (key "a" at 5 ms)."""
    engine = SessionAggregator(store, SessionWindows(1_000), aggregations.count(),
                               watermark="external")
    engine.process("a", None, 5)
    return engine


def _provider(root: Path, lock_timeout_ms: int = 400) -> SessionStoreProvider:
    return SessionStoreProvider(str(root / "state"), "op", 0, local_root=root / "local",
                                retention_ms=60_000, lock_timeout_ms=lock_timeout_ms)


def _only_wakeups() -> None:
    """In a keeping process: its watcher's safety-net timer never fires within a test, so only
    a waiter's wake-up can make it give a copy up (and no timeout needs to be tight)."""
    kept.WATCH_IDLE_S = 3600.0


def watcher_asleep() -> None:
    """Return once this process's watcher has gone to sleep: it looked at least once, then not
    again for 0.3 s. A request made after this reaches it only by a wake-up.

    Raises:
        AssertionError: it never stays asleep for 0.3 s within 60 s (it polls).
    """
    looks, since = kept.watcher_looks(), time.monotonic()
    deadline = since + 60
    while looks == 0 or time.monotonic() - since < 0.3:
        assert time.monotonic() < deadline, "the kept-partition watcher never sleeps: it polls"
        time.sleep(0.02)
        if kept.watcher_looks() != looks:
            looks, since = kept.watcher_looks(), time.monotonic()


def _hold(root: str, keep_it: bool, ready: Any, done: Any) -> None:
    """In another process: load and commit batch 0, then keep the partition (idle) or go on
    holding it as a running task would."""
    _only_wakeups()
    provider = _provider(Path(root))
    engine = _engine(provider.load(-1))
    provider.commit(engine.commit, 0, {})
    if keep_it:
        kept.keep(("test", 0), kept.OpenPartition(provider, engine))
        watcher_asleep()
    ready.set()
    done.wait(600)  # a holder that left would free the copy without being asked


@pytest.mark.parametrize("idle", [True, False], ids=["kept-idle", "in-use"])
def test_a_waiting_process_gets_a_kept_copy_but_never_one_in_use(tmp_path, idle):
    context = multiprocessing.get_context("spawn")
    ready, done = context.Event(), context.Event()
    holder = context.Process(target=_hold, args=(str(tmp_path), idle, ready, done))
    holder.start()
    try:
        assert ready.wait(120)
        if idle:
            # the holder's watcher, woken by this wait (it has no timer), closes its idle copy
            # for us; the timeout only bounds a failure, so a loaded machine cannot fail it
            provider = _provider(tmp_path, lock_timeout_ms=60_000)
            store = provider.load(0)
            assert provider.metrics["loads_reused"] == 1  # its working copy, as it committed
            assert [s.key for s, _ in store.find_sessions(0, 10_000)] == ["a"]
            provider.close()
        else:
            provider = _provider(tmp_path)
            with pytest.raises(StateLockedError, match="held by another process"):
                provider.load(0)
        assert not list((tmp_path / "local").rglob("release-requested"))  # withdrawn
    finally:
        done.set()
        holder.join(30)


def test_an_idle_watcher_does_not_poll(tmp_path, monkeypatch):
    """Kept copies cost their process nothing while nobody asks for them: the watcher sleeps
    until a waiter's wake-up, and then gives the asked-for copy up."""
    monkeypatch.setattr(kept, "WATCH_IDLE_S", 3600.0)
    providers = []
    for partition in range(3):
        provider = SessionStoreProvider(str(tmp_path / "state"), "op", partition,
                                        local_root=tmp_path / "local", retention_ms=60_000)
        engine = _engine(provider.load(-1))
        provider.commit(engine.commit, 0, {})
        kept.keep(("idle", partition), kept.OpenPartition(provider, engine))
        providers.append(provider)
    watcher_asleep()
    looks = kept.watcher_looks()
    time.sleep(0.5)
    assert kept.watcher_looks() == looks  # no timer: 0.5 s idle, not one look
    (providers[1].local / RELEASE_REQUEST).touch()
    wake_keeper(providers[1].local)
    deadline = time.monotonic() + 60
    while kept.holds(("idle", 1)) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [kept.holds(("idle", p)) for p in range(3)] == [True, False, True]
    assert not providers[1].holds_lock() and providers[0].holds_lock()
    (providers[1].local / RELEASE_REQUEST).unlink()
    for partition in (0, 2):
        kept.discard(("idle", partition))


def _in_use_then_kept(root: str, ready: Any, release: Any, done: Any) -> None:
    """In another process: hold batch 0 as a running task until ``release``, then keep it."""
    _only_wakeups()
    provider = _provider(Path(root))
    engine = _engine(provider.load(-1))
    provider.commit(engine.commit, 0, {})
    ready.set()
    release.wait(600)
    kept.keep(("test", 0), kept.OpenPartition(provider, engine))
    done.wait(600)  # a holder that left would free the copy without being asked


def _wait_then_keep(root: str, name: str, waiting: Any, results: Any, done: Any) -> None:
    """In another process: wait for the partition's lock, then keep it idle, as a task that
    committed would; ``waiting`` is set once its first try found the lock held and it asked for
    the copy. Only wake-ups make a keeper give the copy up (:func:`_only_wakeups`), so the
    timeout bounds a failure only and can be long enough for any load."""
    _only_wakeups()
    ask = provider_module.wake_keeper

    def asked(local: Path) -> None:  # called by the lock wait after each try that failed
        waiting.set()
        ask(local)

    provider_module.wake_keeper = asked
    provider = _provider(Path(root), lock_timeout_ms=60_000)
    try:
        store = provider.load(0)
    except StateLockedError as exc:
        results.put((name, f"locked: {exc}"))
        return
    kept.keep(("test", 0), kept.OpenPartition(provider, _engine(store)))
    results.put((name, "got it"))
    done.wait(600)  # a holder that left would free the copy without being asked


def test_two_waiting_processes_both_get_a_copy_each_keeps_in_turn(tmp_path):
    """The first waiter to get the lock withdraws the release request; the second must ask again,
    or the first, keeping the copy idle once its task is done, never gives it up."""
    context = multiprocessing.get_context("spawn")
    ready, release, done = context.Event(), context.Event(), context.Event()
    results = context.Queue()
    holder = context.Process(target=_in_use_then_kept, args=(str(tmp_path), ready, release, done))
    holder.start()
    waiters = []
    try:
        assert ready.wait(120)
        for name in ("first", "second"):
            waiting = context.Event()
            waiter = context.Process(target=_wait_then_keep,
                                     args=(str(tmp_path), name, waiting, results, done))
            waiter.start()
            waiters.append(waiter)
            # it tried, found the lock held and asked for the copy: no sleep guesses when
            assert waiting.wait(120)
        release.set()  # both wait for the lock, and only now the holder's task ends
        outcomes = dict(results.get(timeout=150) for _ in waiters)
        assert outcomes == {"first": "got it", "second": "got it"}
    finally:
        done.set()
        for process in [holder, *waiters]:
            process.join(30)


def test_at_most_keep_max_partitions_stay_open_the_least_recent_closed_first(tmp_path):
    opened = []
    for partition in range(kept.KEEP_MAX + 2):
        provider = SessionStoreProvider(str(tmp_path / "state"), "op", partition,
                                        local_root=tmp_path / "local", retention_ms=60_000)
        engine = _engine(provider.load(-1))
        provider.commit(engine.commit, 0, {})
        opened.append(kept.OpenPartition(provider, engine))
        kept.keep(("test", partition), opened[-1])
    assert kept.kept_count() == kept.KEEP_MAX
    assert [kept.holds(("test", p)) for p in range(len(opened))] \
        == [False, False] + [True] * kept.KEEP_MAX
    assert [o.provider.holds_lock() for o in opened] == [False, False] + [True] * kept.KEEP_MAX
    # kept again under a key already kept: the copy it replaces is closed
    replaced = opened[-1]
    again = SessionStoreProvider(str(tmp_path / "state"), "op", 99, local_root=tmp_path / "local",
                                 retention_ms=60_000)
    kept.keep(("test", len(opened) - 1), kept.OpenPartition(again, _engine(again.load(-1))))
    assert not replaced.provider.holds_lock() and again.holds_lock()
    assert kept.kept_count() == kept.KEEP_MAX


def test_resume_refuses_after_another_attempt_published(tmp_path):
    def attempt(local: str) -> SessionStoreProvider:
        provider = SessionStoreProvider(str(tmp_path / "state"), "op", 0,
                                        local_root=tmp_path / local, retention_ms=60_000)
        provider.commit(_engine(provider.load(-1)).commit, 0, {})
        return provider

    first = attempt("executor-a")
    assert first.resume(0) and first.metrics["loads_resumed"] == 1
    assert not first.resume(1)  # another version
    second = attempt("executor-b")  # a retry elsewhere published batch 0 again
    assert not first.resume(0)  # its commit is no longer the published one
    assert second.resume(0)
    (second.local / "provider.lock").unlink()  # an operator cleared the working copy
    assert not second.resume(0)
    first.close()
    second.close()
    assert not first.resume(0)  # closed
