"""``make spark-run``: sessionize the sample clickstream as a stream in ``local[2]``.

Writes the sample as Parquet files, streams them one file per micro-batch through
``sessionize``, logs each batch's progress with the engine's counters by name
(``progress_counters``), and writes the closed sessions to
``out/spark-sessions/`` (Parquet).
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from sessionstore.sample import generate

log = logging.getLogger("spark_adapter.example")


def progress_line(progress: Mapping[str, Any]) -> str:
    """One micro-batch's progress as ``make spark-run`` logs it: batch, rows, time, watermark,
    then the engine's counters by name (``observedMetrics``, read with ``progress_counters``).

    Raises:
        TypeError: ``progress`` is not a query progress (see ``progress_counters``).
    """
    from .progress import progress_counters

    counters = progress_counters(progress)
    return (f"batch {progress['batchId']:3d}: {progress['numInputRows']:7d} rows in "
            f"{progress['durationMs']['triggerExecution'] / 1000:5.2f} s, watermark "
            f"{(progress.get('eventTime') or {}).get('watermark')}; "
            + ", ".join(f"{name}={value}" for name, value in counters.items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=300_000)
    parser.add_argument("--files", type=int, default=6)
    parser.add_argument("--out", default="out/spark-sessions")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from .sessionize import ROCKSDB_PROVIDER, sessionize

    spark = (SparkSession.builder.master("local[2]").appName("sessionstore-example")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.ui.enabled", "false")
             .config("spark.sql.streaming.stateStore.providerClass", ROCKSDB_PROVIDER)
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    work = Path(tempfile.mkdtemp(prefix="sessionstore-spark-"))
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    try:
        stream = generate(args.events)
        source = work / "source"
        source.mkdir()
        parts = np.array_split(np.arange(len(stream)), args.files)
        schema = "user string, ts timestamp, page string, amount long"
        clicks = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1) \
            .parquet(str(source))
        sessions = sessionize(
            clicks, key="user", timestamp="ts", gap="30 minutes",
            aggregations={"clicks": "count", "revenue": ("sum", "amount"),
                          "landing": ("first", "page")},
            watermark_delay="10 minutes", state_location=str(work / "state"),
        )
        query = (sessions.writeStream.format("parquet").option("path", str(out))
                 .option("checkpointLocation", str(work / "checkpoint"))
                 .outputMode("append").start())
        started = time.perf_counter()
        reported: set[int] = set()
        for i, part in enumerate(parts):
            table = pa.table({
                "user": [f"user{u}" for u in stream.users[part].tolist()],
                "ts": pa.array(stream.times_ms[part], pa.timestamp("ms")),
                "page": stream.pages[part], "amount": stream.amounts[part],
            })
            pq.write_table(table, work / "part.tmp")
            os.rename(work / "part.tmp", source / f"part-{i:03d}.parquet")
            query.processAllAvailable()
            for progress in query.recentProgress:
                if progress["batchId"] in reported:
                    continue
                reported.add(progress["batchId"])
                log.info("%s", progress_line(progress))
        query.stop()
        written = spark.read.parquet(str(out)).count()
        log.info("%d events -> %d closed sessions in %s (%.1f s)", len(stream), written, out,
                 time.perf_counter() - started)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
