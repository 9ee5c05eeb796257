"""``spark_bench --breakdown``: the summary of where a streaming micro-batch's time went.

The stage records are in the shape the driver's UI REST API returns (``stages/<id>?details=true``),
so these run without Spark.
"""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.spark_bench import _stage_times, breakdown_summary


def _rest_stage(stage_id: int, start: str, end: str, tasks: list[int]) -> dict[str, Any]:
    return {
        "stageId": stage_id, "numTasks": len(tasks), "status": "COMPLETE",
        "submissionTime": f"2026-11-27T05:00:{start}GMT",
        "completionTime": f"2026-11-27T05:00:{end}GMT",
        "executorRunTime": sum(tasks), "executorDeserializeTime": len(tasks),
        "executorCpuTime": 7_000_000,
        # the API keys tasks by id, in no particular order
        "tasks": {str(100 + i): {"index": i, "duration": d,
                                 "taskMetrics": {"executorRunTime": d - 1,
                                                 "executorDeserializeTime": 1}}
                  for i, d in reversed(list(enumerate(tasks)))},
    }


def test_stage_times_reads_wall_time_and_tasks_in_index_order() -> None:
    times = _stage_times(_rest_stage(7, "01.250", "01.600", [30, 20, 10]))
    assert times["ms"] == 350
    assert times["tasks"] == 3
    assert times["task_ms"] == [30, 20, 10]
    assert times["task_run_ms"] == [29, 19, 9]
    assert times["jvm_cpu_ms"] == 7


def _batch(rows: int, trigger: int, stages: list[tuple[int, list[int]]],
           commit: int = 0) -> dict[str, Any]:
    return {"spark_rows": rows, "ms": trigger, "state_commit_ms": commit,
            "durations": {"triggerExecution": trigger, "queryPlanning": trigger // 10},
            "stages": [{"stage": i, "tasks": len(tasks), "ms": ms, "task_ms": tasks}
                       for i, (ms, tasks) in enumerate(stages)]}


def test_summary_is_over_data_batches_after_the_first_and_the_widest_stage() -> None:
    batches = [
        # the first data batch starts the Python workers: left out
        _batch(100, 5000, [(50, [50]), (4000, [4000, 3000, 2000, 1000])], commit=900),
        _batch(100, 1000, [(40, [40]), (600, [100, 110, 300, 350]), (10, [10])], commit=60),
        _batch(0, 90, []),  # a no-data batch: no rows read, left out
        _batch(100, 800, [(30, [30]), (400, [90, 100, 250, 200]), (20, [20])], commit=40),
        _batch(100, 900, [(35, [35]), (500, [80, 120, 280, 260]), (15, [15])], commit=50),
    ]
    summary = breakdown_summary(batches)
    assert summary["triggerExecution_ms"] == 900
    assert summary["queryPlanning_ms"] == 90
    assert summary["stateful_stage_ms"] == 500
    # per batch, then the median: 1000 - 600, 800 - 400, 900 - 500
    assert summary["outside_stateful_stage_ms"] == 400
    assert summary["state_commit_ms"] == 50
    assert summary["stages"] == 3
    assert summary["task_ms_by_index"] == [90, 110, 280, 260]


@pytest.mark.parametrize("batches", [[], [_batch(100, 900, [(10, [10])])], [_batch(0, 90, [])]])
def test_summary_is_empty_without_a_data_batch_after_the_first(
        batches: list[dict[str, Any]]) -> None:
    assert breakdown_summary(batches) == {}
