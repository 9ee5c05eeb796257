"""The CLI's Spark comparison uses the one shared SparkSession fixture of tests/spark."""

from tests.spark.conftest import spark  # noqa: F401
