"""The Spark examples in README.md and docs/ run against the suite's SparkSession."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
BLOCK = re.compile(r"```python\n(# docs-test: spark\n.*?)```", re.S)
EXAMPLES = [
    pytest.param(match.group(1), id=f"{doc.name}#{i}")
    for doc in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
    for i, match in enumerate(BLOCK.finditer(doc.read_text()))
]


def test_there_is_a_spark_example():
    assert EXAMPLES, "docs/spark.md must hold a runnable example"


@pytest.mark.parametrize("code", EXAMPLES)
def test_spark_doc_example_runs(spark, code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "<doc>", "exec"), {"__name__": "__doc_example__", "spark": spark})
