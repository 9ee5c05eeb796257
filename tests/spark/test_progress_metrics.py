"""The Arrow engine's counters in the query's progress: ``lastProgress["observedMetrics"]``
(``df.observe``) reports, per micro-batch, the sessions emitted and the rows dropped as late or
for a null time, and they must equal what the output and the input show."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from spark_adapter import progress_counters, progress_json, sessionize
from tests.spark.streams import StreamRun, write_file

# two outputs: a one-part combine() hits an engine bug on restart (reported; see the report)
AGGS = {"n": "count", "total": ("sum", "amount")}


def _feed_null_times(run: StreamRun, index: int, users: list[str]) -> None:
    """A file whose rows have no time (the JSON reader reads a missing field as null)."""
    tmp = run.source / f".n{index:04d}.tmp"
    tmp.write_text("".join(json.dumps({"user": u, "amount": 1}) + "\n" for u in users))
    tmp.rename(run.source / f"f{index:04d}.json")
    run.query.processAllAvailable()


def _as_dict(metrics: Any) -> dict[str, Any]:
    """PySpark's progress holds each observation as a Row."""
    return metrics.asDict() if hasattr(metrics, "asDict") else dict(metrics)


def test_observed_counters_equal_output_and_input(spark, tmp_path: Path):
    state = tmp_path / "state"

    def build(stream):
        return sessionize(stream, key="user", timestamp="ts", gap="10 seconds",
                          aggregations=AGGS, watermark_delay="5 seconds",
                          state_location=str(state), local_dir=str(tmp_path / "local"))

    run = StreamRun(spark, tmp_path, build)
    run.start()
    inputs = [
        [("a", 0, 1), ("b", 3, 1), ("a", 100, 1)],        # W becomes 95 s
        [("a", 5, 1), ("b", 50, 1), ("c", 60, 1), ("a", 101, 1)],  # 5, 50 and 60 s: late
        [("a", 300, 1), ("d", 200, 1)],                   # closes a@100, then W = 295 s
    ]
    for i, rows in enumerate(inputs):
        write_file(run.source, i, rows)
        run.query.processAllAvailable()
    _feed_null_times(run, len(inputs), ["e", "f"])
    run.stop()

    observed = [_as_dict(p["observedMetrics"]["sessionstore"]) for p in run.progress
                if "sessionstore" in (p.get("observedMetrics") or {})]
    # every micro-batch reports, the no-data ones included
    assert len(observed) == len(run.progress)
    # as JSON, the counters keep their names (a Row alone would be written as a bare list)
    for progress, counters in zip(run.progress, observed, strict=True):
        dumped = json.loads(json.dumps(progress_json(progress)))
        assert dumped["observedMetrics"]["sessionstore"] == counters
        assert dumped["batchId"] == progress["batchId"] and isinstance(dumped["id"], str)
        assert progress_counters(progress) == {k: int(v) for k, v in counters.items()}
    assert set(observed[0]) >= {"sessions_emitted", "late_rows_dropped"}, observed[0]
    total = {name: sum(int(o[name]) for o in observed) for name in observed[0]}
    sessions = run.rows()
    assert sessions and total["sessions_emitted"] == len(sessions)
    # per micro-batch too: what the sink received in batch b is what batch b observed
    per_batch = {p["batchId"]: int(_as_dict(p["observedMetrics"]["sessionstore"])
                                   ["sessions_emitted"]) for p in run.progress}
    assert per_batch == {b: len(rows) for b, rows in run.batches.items()}
    # the input: rows whose window [t, t + 10 s) ended at or before the previous watermark
    late = sum(1 for t in (5, 50, 60) if t + 10 <= 95)
    assert total["late_rows_dropped"] == late == 3
    assert total["null_time_rows_dropped"] == 2
    assert total["null_key_rows_dropped"] == 0 and total["invalid_gap_rows_dropped"] == 0
    assert total["rows_in"] == sum(len(rows) for rows in inputs) + 2
    # the late rows appear in no session: the counts of the emitted sessions add up
    assert sum(r[3] for r in sessions) + late == sum(len(rows) for rows in inputs) \
        - sum(1 for r in inputs[-1] if r[1] + 10 > 295)  # still open at the end


def test_make_spark_run_logs_the_counters_by_name():
    """``json.dumps`` of a progress writes an observation (a PySpark ``Row``) as a bare list;
    ``make spark-run``'s line names every counter. No SparkSession: a progress as PySpark gives
    it (``observedMetrics`` holding a ``Row``)."""
    from pyspark.sql import Row

    from spark_adapter.example import progress_line

    progress = {"batchId": 3, "numInputRows": 7, "durationMs": {"triggerExecution": 1500},
                "eventTime": {"watermark": "1970-01-01T00:01:35.000Z"},
                "observedMetrics": {"sessionstore": Row(sessions_emitted=2, late_rows_dropped=1,
                                                        rows_in=7)}}
    assert json.loads(json.dumps(progress))["observedMetrics"]["sessionstore"] == [2, 1, 7]
    assert json.loads(json.dumps(progress_json(progress)))["observedMetrics"]["sessionstore"] \
        == {"sessions_emitted": 2, "late_rows_dropped": 1, "rows_in": 7}
    assert progress_line(progress) == (
        "batch   3:       7 rows in  1.50 s, watermark 1970-01-01T00:01:35.000Z; "
        "sessions_emitted=2, late_rows_dropped=1, rows_in=7")
    no_event_time = {**progress, "eventTime": None, "observedMetrics": {}}
    assert progress_line(no_event_time).endswith("watermark None; ")
