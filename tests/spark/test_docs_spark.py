"""The Spark examples in README.md and docs/ run as pasted, twice in a row in one directory,
builder included: their ``getOrCreate`` returns the suite's SparkSession, whose settings are put
back afterwards so that the examples' builders cannot change what later tests run with."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.test_docs import run_twice

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
BLOCK = re.compile(r"```python\n(# docs-test: spark\n.*?)```", re.S)
EXAMPLES = [
    pytest.param(match.group(1), id=f"{doc.name}#{i}")
    for doc in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
    for i, match in enumerate(BLOCK.finditer(doc.read_text()))
]
BUILDER_SETS = re.compile(r'\.config\("([^"]+)"')


def test_there_is_a_spark_example():
    assert EXAMPLES, "docs/spark.md must hold a runnable example"


@pytest.mark.parametrize("code", EXAMPLES)
def test_spark_doc_example_runs_twice(spark, code, tmp_path, monkeypatch):
    assert "SparkSession.builder" in code and "spark.sql.shuffle.partitions" in code, \
        "a Spark example builds its session, with a laptop-sized shuffle"
    keys = set(BUILDER_SETS.findall(code))
    saved = {key: spark.conf.get(key, None) for key in keys}
    monkeypatch.chdir(tmp_path)
    try:
        run_twice(code)
    finally:
        for key, value in saved.items():
            if value is not None:
                spark.conf.set(key, value)


SHUFFLE = re.compile(r'\.config\("spark\.sql\.shuffle\.partitions",\s*"?(\d+)"?\)')
ANY_PYTHON = re.compile(r"```python\n(.*?)```", re.S)


def test_every_spark_example_is_run_here_with_a_laptop_sized_shuffle():
    """No example that builds a SparkSession escapes this file (without the marker it would run
    without the checks above), and each sets ``spark.sql.shuffle.partitions`` to a laptop's
    number: Spark's default of 200 left the first example running for minutes on 4 rows.
    Needs no SparkSession: it reads the docs."""
    for doc in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]:
        for code in ANY_PYTHON.findall(doc.read_text()):
            if "SparkSession" not in code:
                continue
            assert code.startswith("# docs-test: spark\n"), f"{doc.name}: {code[:80]!r}"
            partitions = [int(n) for n in SHUFFLE.findall(code)]
            assert partitions and all(1 <= n <= 8 for n in partitions), \
                f"{doc.name}: shuffle partitions {partitions} in {code[:80]!r}"
