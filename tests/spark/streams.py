"""Helpers that feed files to a streaming query, batch by batch, and collect its output."""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyspark.sql import types as T

SCHEMA = T.StructType([
    T.StructField("user", T.StringType()),
    T.StructField("ts", T.TimestampType()),
    T.StructField("amount", T.LongType()),
])
EPOCH = dt.datetime(2024, 1, 1)
PROJECT = Path(__file__).resolve().parents[2]
SPAN_S = 60  # event time covered by one file


def make_files(n_files: int, rows_per_file: int, seed: int = 5) -> list[list[tuple[str, int, int]]]:
    """Rows (user, seconds since EPOCH, amount); file i covers [i*SPAN_S, (i+1)*SPAN_S)."""
    rng = random.Random(seed)
    files = []
    for i in range(n_files):
        rows = []
        for _ in range(rows_per_file):
            second = i * SPAN_S + rng.randrange(SPAN_S)
            rows.append((f"u{rng.randrange(6)}", second, rng.randrange(100)))
        # events exactly one gap (10 s) apart, which must share a session
        rows.append(("edge", i * SPAN_S, 1))
        rows.append(("edge", i * SPAN_S + 10, 2))
        files.append(rows)
    return files


def write_file(directory: Path, index: int, rows: list[tuple[str, int, int]]) -> None:
    tmp = directory / f".f{index:04d}.tmp"
    with open(tmp, "w") as handle:
        for user, second, amount in rows:
            ts = (EPOCH + dt.timedelta(seconds=second)).isoformat()
            handle.write(json.dumps({"user": user, "ts": ts, "amount": amount}) + "\n")
    tmp.rename(directory / f"f{index:04d}.json")


class StreamRun:
    """A streaming sessionize query over a directory of JSON files, with a foreachBatch sink
    that keeps each batch's rows by batch id (a retried batch replaces its rows)."""

    def __init__(self, spark: Any, root: Path, build: Callable[[Any], Any]) -> None:
        self.spark = spark
        self.source = root / "source"
        self.checkpoint = root / "checkpoint"
        self.source.mkdir(parents=True, exist_ok=True)
        self.build = build
        self.batches: dict[int, list[tuple]] = {}
        self.query: Any = None

    def start(self) -> None:
        stream = self.spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1) \
            .json(str(self.source))
        batches = self.batches

        def sink(frame: Any, batch_id: int) -> None:
            batches[batch_id] = [tuple(r) for r in frame.collect()]

        self.query = (self.build(stream).writeStream.foreachBatch(sink)
                      .option("checkpointLocation", str(self.checkpoint))
                      .outputMode("append").start())

    def feed(self, index: int, rows: list[tuple[str, int, int]],
             between: Callable[[], None] | None = None) -> None:
        write_file(self.source, index, rows)
        self.query.processAllAvailable()
        if between is not None:
            between()

    def stop(self) -> None:
        self.progress = list(self.query.recentProgress)
        self.query.stop()

    def state_location(self, base: Path) -> str:
        """Where sessionize kept this query's state under ``base``."""
        from spark_adapter import query_state_location

        return query_state_location(str(base), str(self.query.id))

    def dropped_by_watermark(self) -> int:
        """Spark's own count of input rows it dropped as older than the watermark."""
        return sum(
            op.get("numRowsDroppedByWatermark", 0)
            for progress in self.progress
            for op in (progress.get("stateOperators") or [])
        )

    def rows(self) -> list[tuple]:
        return [row for batch in sorted(self.batches) for row in self.batches[batch]]


def one_file_plan(spark: Any, root: Path, build: Callable[[Any], Any],
                  rows: list[tuple[str, int, int]], capsys: Any) -> tuple[str, int, str]:
    """Run ``build(stream)`` over one file of ``rows`` into a memory sink: the physical plan of
    its last micro-batch (the final one, where Spark planned it adaptively), the input rows
    Spark reported, and the memory table's name."""
    source = root / "source"
    source.mkdir(parents=True)
    stream = spark.readStream.schema(SCHEMA).json(str(source))
    name = f"plan_{root.name}".replace("-", "_").replace("+", "_")
    query = (build(stream).writeStream.format("memory").queryName(name).outputMode("append")
             .option("checkpointLocation", str(root / "checkpoint")).start())
    try:
        write_file(source, 0, rows)
        query.processAllAvailable()
        capsys.readouterr()
        query.explain()
        # a stateless micro-batch runs adaptively: its plan prints twice (final, then initial)
        plan = capsys.readouterr().out.split("== Initial Plan ==")[0]
        reported = sum(p["numInputRows"] for p in query.recentProgress)
    finally:
        query.stop()
    return plan, reported, name


def wipe(path: Path) -> Callable[[], None]:
    def run() -> None:
        shutil.rmtree(path, ignore_errors=True)

    return run


# -- driver processes: each run its own driver, killed and restarted by the test ---------------


def jvm_temp_option(directory: str | None = None) -> str:
    """The driver JVM option that puts its temporary files (``spark.local.dir``'s default:
    block manager and ``spark-*`` directories, extracted native libraries) in ``directory``
    (default: this process's temporary directory, which ``$TMPDIR`` sets; Java's own default
    is /tmp, whatever ``$TMPDIR`` says)."""
    return f"-Djava.io.tmpdir={directory or tempfile.gettempdir()}"


def run_driver(module: str, root: Path, *args: str,
               timeout_s: int = 600) -> subprocess.CompletedProcess[str]:
    """Run ``python -m <module> <root> <args>`` with this project importable; its result.

    The driver's temporary files, and its JVMs' (see :func:`jvm_temp_option`), go in
    ``<root>.tmp`` beside ``root``, in the test's own directory: a driver or executor the test
    kills cannot remove its own."""
    temp = root.with_name(f"{root.name}.tmp")
    temp.mkdir(exist_ok=True)
    env = {**os.environ, "TMPDIR": str(temp), "PYTHONPATH": os.pathsep.join(
        [str(PROJECT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    return subprocess.run([sys.executable, "-m", module, str(root), *args], cwd=PROJECT,
                          env=env, capture_output=True, text=True, timeout=timeout_s)


def prepare_source(root: Path, files: list[list[tuple[str, int, int]]]) -> Path:
    """``<root>/source`` holding ``files``, which the file source will take in this order."""
    source = root / "source"
    source.mkdir(parents=True)
    for i, rows in enumerate(files):
        write_file(source, i, rows)
        # the file source takes files in modification-time order: make it the file order
        os.utime(source / f"f{i:04d}.json", (1_700_000_000 + i, 1_700_000_000 + i))
    return root


def driver_outputs(root: Path) -> dict[int, list[list]]:
    """Batch id -> the rows each attempt's sink wrote under ``<root>/out``, in attempt order."""
    found: dict[int, list[tuple[float, list]]] = {}
    for path in (root / "out").glob("*.json"):
        batch = int(path.name.split(".")[0])
        found.setdefault(batch, []).append((path.stat().st_mtime, json.loads(path.read_text())))
    return {b: [rows for _, rows in sorted(attempts, key=lambda a: a[0])]
            for b, attempts in found.items()}


def final_rows(attempts: dict[int, list[list]]) -> list[tuple]:
    """What a sink that keeps each batch's last attempt holds at the end."""
    return sorted(tuple(r) for b in attempts for r in attempts[b][-1])


def run_json_stream(spark: Any, root: Path, schema: Any, batches: list[list[Any]],
                    as_json: Callable[[Any], dict[str, Any]], build: Callable[[Any], Any],
                    ) -> tuple[dict[int, list[tuple[Any, ...]]], str]:
    """Feed ``batches`` as one JSON Lines file each (``as_json`` turns a row into an object;
    an empty batch writes nothing, so Spark may run a no-data batch), one micro-batch per
    file, through ``build(stream)`` into a ``foreachBatch`` sink.

    Returns each micro-batch's sorted output rows (batches without rows left out) and the
    query's id.
    """
    source = root / "source"
    source.mkdir(parents=True)
    stream = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).json(str(source))
    got: dict[int, list[tuple[Any, ...]]] = {}

    def sink(frame: Any, batch_id: int) -> None:
        got[batch_id] = sorted(tuple(r) for r in frame.collect())

    query = (build(stream).writeStream.foreachBatch(sink).outputMode("append")
             .option("checkpointLocation", str(root / "checkpoint")).start())
    try:
        for i, rows in enumerate(batches):
            if rows:
                tmp = source / f".b{i}.tmp"
                tmp.write_text("".join(json.dumps(as_json(row)) + "\n" for row in rows))
                tmp.rename(source / f"b{i:03d}.json")
            query.processAllAvailable()
    finally:
        query.stop()
    return {b: rows for b, rows in got.items() if rows}, str(query.id)
