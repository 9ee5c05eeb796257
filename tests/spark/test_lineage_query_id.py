"""What an executor task can see of its streaming query, checked with real streaming queries:
``sql.streaming.queryId`` is set in the tasks of every micro-batch, equals ``query.id``, and
survives a restart from the same checkpoint (``runId`` does not), so per-query state locations
derived from it are stable per query and distinct between queries."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pyspark.sql import types as T

from spark_adapter import query_state_location
from spark_adapter.state import current_query_id

SCHEMA = T.StructType([T.StructField("k", T.LongType())])
OUT = T.StructType([T.StructField("location", T.StringType()),
                    T.StructField("batch", T.StringType())])


def locate(batches: Any) -> Any:
    """On the executor: the state location this task derives, and its batch id."""
    import pyarrow as pa
    from pyspark import TaskContext

    location = query_state_location("s3://bucket/state")
    batch = TaskContext.get().getLocalProperty("streaming.sql.batchId")
    for frame in batches:
        yield pa.RecordBatch.from_pylist([{"location": location, "batch": batch}] * frame.num_rows,
                                         schema=pa.schema([("location", pa.string()),
                                                           ("batch", pa.string())]))


def run(spark: Any, root: Path, name: str, files: range) -> tuple[str, str, set[tuple[str, str]]]:
    source, checkpoint = root / "source", root / name / "checkpoint"
    source.mkdir(parents=True, exist_ok=True)
    for i in files:
        (source / f"f{i}.json").write_text(json.dumps({"k": i}) + "\n")
    df = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(source))
    query = (df.repartition(2, "k").mapInArrow(locate, OUT).writeStream.format("json")
             .option("path", str(root / name / "out"))
             .option("checkpointLocation", str(checkpoint)).start())
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    rows = spark.read.json(str(root / name / "out")).collect()
    return query.id, query.runId, {(r.location, r.batch) for r in rows}


def test_query_id_is_visible_in_tasks_and_stable_across_restarts(spark, tmp_path):
    assert current_query_id() is None  # on the driver
    first_id, first_run, _ = run(spark, tmp_path, "q1", range(1))
    again_id, again_run, seen = run(spark, tmp_path, "q1", range(1, 2))  # restart, same checkpoint
    assert again_id == first_id and again_run != first_run
    assert {batch for _, batch in seen} == {"0", "1"}  # both runs, every batch
    assert {location for location, _ in seen} == {f"s3://bucket/state/query-{first_id}"}
    # a second query with identical arguments but its own checkpoint: another location
    other_id, _, other = run(spark, tmp_path / "second", "q1", range(1))
    assert other_id != first_id
    assert {location for location, _ in other} == {f"s3://bucket/state/query-{other_id}"}
