"""The CLI sessionizes a Hive-partitioned Parquet directory written by Spark, and its sessions
equal ``spark_adapter.sessionize`` on the same data."""

from __future__ import annotations

import datetime as dt
import json

import numpy as np

from sessionstore.cli import main


def test_cli_on_sparks_partitioned_parquet_equals_spark_sessionize(spark, tmp_path, capsys):
    from pyspark.sql import functions as F

    from spark_adapter import sessionize

    rng = np.random.default_rng(7)
    n = 3000
    start = dt.datetime(2024, 5, 1, tzinfo=dt.timezone.utc)
    # microsecond timestamps with sub-millisecond parts, as Spark writes them
    offsets_us = np.sort(rng.integers(0, 3_600_000_000, n))
    rows = [(f"u{int(u):03d}", start + dt.timedelta(microseconds=int(t)), int(a), str(c))
            for u, t, a, c in zip(rng.integers(0, 60, n), offsets_us, rng.integers(0, 50, n),
                                  rng.choice(["de", "fr", "us"], n), strict=True)]
    df = spark.createDataFrame(rows, "user string, ts timestamp, amount int, country string")
    folder = tmp_path / "events"
    df.repartition(3).write.partitionBy("country").parquet(str(folder))
    assert {p.name for p in folder.iterdir() if p.is_dir()} == \
        {"country=de", "country=fr", "country=us"}

    out = tmp_path / "sessions.jsonl"
    assert main(["sessionize", str(folder), "--key", "user", "--time", "ts", "--gap", "90s",
                 "--max-out-of-order", "1d", "--agg", "n=count", "--agg", "total=sum:amount",
                 "--agg", "last_country=last:country", "--out", str(out), "--no-progress"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["events_in"] == n and summary["late_dropped"] == 0
    assert summary["times_floored_to_ms"] > 0
    cli = sorted((r["user"], r["session_start_ms"], r["session_end_ms"], r["n"], r["total"],
                  r["last_country"]) for r in map(json.loads, out.read_text().splitlines()))

    result = sessionize(spark.read.parquet(str(folder)), key="user", timestamp="ts", gap="90s",
                        aggregations={"n": "count", "total": ("sum", "amount"),
                                      "last_country": ("last", "country")})
    native = sorted(
        (r["user"], r["start_ms"], r["end_ms"], r["n"], r["total"], r["last_country"])
        for r in result.select("*", F.unix_millis("session_start").alias("start_ms"),
                               F.unix_millis("session_end").alias("end_ms")).collect())
    assert len(cli) > 100
    assert cli == native
