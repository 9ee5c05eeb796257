"""The heap freeze every ``mapInArrow`` task of ``sessionize`` starts with (``kept.freeze_heap``
in ``arrow.task_entry``) hides nothing from the collector that should have been collected: in a
real Spark worker, no cyclic garbage sits behind the freeze after static runs of either plan.
"""

from __future__ import annotations

import datetime as dt
import gc
from typing import Any

import pyarrow as pa

from spark_adapter import sessionize

EPOCH = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)


def _per_worker(spark: Any, task: Any) -> dict[int, list[int]]:
    """``task()`` run by each task of a 16-task job: {worker pid: its tasks' results}."""

    def run(batches: Any) -> Any:
        import os

        for _ in batches:
            pass
        yield pa.RecordBatch.from_arrays([pa.array([os.getpid()]), pa.array([task()])],
                                         ["pid", "n"])

    results: dict[int, list[int]] = {}
    for row in spark.range(0, 16, 1, 16).mapInArrow(run, "pid long, n long").collect():
        results.setdefault(row.pid, []).append(row.n)
    return results


def _garbage_behind_the_freeze() -> int:
    """Unfreeze this worker and collect: the objects found unreachable are cyclic garbage
    the freeze kept out of every collection since."""
    gc.unfreeze()
    return gc.collect()


def test_tasks_leave_no_cyclic_garbage_behind_the_freeze(spark):
    """What a task's freeze takes out of the collector's sight must be what outlives the task:
    cyclic garbage frozen with it would never be collected, a leak per task of a worker that
    serves query after query. After a clean start, three runs of each static plan (the bucketed
    one and the row path) leave none."""
    df = spark.createDataFrame([(k, EPOCH + dt.timedelta(seconds=s), s) for k in "abcdefgh"
                                for s in (0, 5, 40)], "k string, ts timestamp, v long")
    bucketed = sessionize(df, key="k", timestamp="ts", gap="10 seconds",
                          aggregations={"n": "count", "s": ("sum", "v")})
    rows = sessionize(df, key="k", timestamp="ts", gap="10 seconds",
                      aggregations={"n": "count", "f": ("first", "v")})
    assert "HashAggregate" in bucketed._jdf.queryExecution().executedPlan().toString()
    assert "HashAggregate" not in rows._jdf.queryExecution().executedPlan().toString()
    _per_worker(spark, _garbage_behind_the_freeze)
    for _ in range(3):
        assert len(bucketed.collect()) == len(rows.collect()) == 16
    garbage = _per_worker(spark, _garbage_behind_the_freeze)
    assert {n for ns in garbage.values() for n in ns} == {0}, garbage
