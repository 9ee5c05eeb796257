"""The adapter's decimal codec is exact to Spark's 38 digits (no SparkSession needed)."""

from __future__ import annotations

import decimal

import pyarrow as pa
import pytest
from pyspark.sql import types as T

from spark_adapter import columns

VALUES = [decimal.Decimal("12345678901234567890.1234567891"),
          decimal.Decimal("-9999999999999999999999999999.9999999999"), None,
          decimal.Decimal("0.0000000001")]


@pytest.mark.parametrize("nested", [False, True])
def test_decimals_of_38_digits_go_to_the_engine_and_back_exactly(nested: bool) -> None:
    spark_type = T.DecimalType(38, 10)
    arrow = pa.decimal128(38, 10)
    if nested:
        spark_type, arrow = T.ArrayType(spark_type), pa.list_(arrow)
    data = [VALUES] if nested else VALUES
    engine = columns.to_engine(pa.array(data, arrow), spark_type)
    flat = engine[0] if nested else engine
    assert flat[0] == 123456789012345678901234567891  # the unscaled value, every digit
    back = columns.from_engine(engine, spark_type, "UTC").to_pylist()
    assert back == data
