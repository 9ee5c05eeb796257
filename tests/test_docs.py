"""Every ``python`` code block in README.md and docs/*.md runs, in a scratch directory."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"```python\n(.*?)```", re.S)
SKIP_MARKS = ("# docs-test: skip", "# docs-test: spark")  # tests/spark runs the Spark ones


def blocks() -> list:
    found = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for i, match in enumerate(BLOCK.finditer(doc.read_text())):
            code = match.group(1)
            if not any(mark in code for mark in SKIP_MARKS):
                found.append(pytest.param(code, id=f"{doc.name}#{i}"))
    return found


@pytest.mark.parametrize("code", blocks())
def test_doc_example_runs(code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "<doc>", "exec"), {"__name__": "__doc_example__"})
