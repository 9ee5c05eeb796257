"""An integer sum that leaves int64 through the Spark adapter (issue 25): the job fails with
the engine's SumOverflowError naming the output and the key, as native Spark's ``sum`` fails
with ARITHMETIC_OVERFLOW in ANSI mode (Spark 4's default), instead of a bare OverflowError."""

from __future__ import annotations

import datetime as dt

import pytest
from pyspark.sql import functions as F

from spark_adapter import sessionize

EPOCH = dt.datetime(2024, 1, 1)


@pytest.mark.parametrize("engine", ["arrow", "processor"])
def test_a_sum_leaving_int64_fails_the_job_naming_output_and_key(spark, engine):
    rows = [("a", EPOCH, -(2**63)), ("a", EPOCH + dt.timedelta(seconds=1), -1),
            ("b", EPOCH, 5)]
    df = spark.createDataFrame(rows, "user string, ts timestamp, amount long")
    with pytest.raises(Exception) as exc:  # Spark wraps the worker's error
        sessionize(df, key="user", timestamp="ts", gap="10 seconds",
                   aggregations={"total": ("sum", "amount")}, engine=engine).collect()
    text = str(exc.value)
    assert "SumOverflowError" in text and "'total'" in text and "'a'" in text, text[-2000:]
    # native Spark's sum in ANSI mode refuses the same input
    spark.conf.set("spark.sql.ansi.enabled", "true")
    try:
        with pytest.raises(Exception, match="ARITHMETIC_OVERFLOW"):
            df.groupBy("user").agg(F.sum("amount")).collect()
    finally:
        spark.conf.unset("spark.sql.ansi.enabled")
