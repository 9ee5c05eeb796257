"""Every ``python`` code block in README.md and docs/*.md runs as pasted, twice in a row in one
scratch directory (a second run must not trip over what the first left behind), and no shell
example overwrites the output of a command before it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"```python\n(.*?)```", re.S)
SHELL = re.compile(r"```sh\n(.*?)```", re.S)
SKIP_MARKS = ("# docs-test: skip", "# docs-test: spark")  # tests/spark runs the Spark ones


def blocks() -> list:
    found = []
    for doc in DOCS:
        for i, match in enumerate(BLOCK.finditer(doc.read_text())):
            code = match.group(1)
            if not any(mark in code for mark in SKIP_MARKS):
                found.append(pytest.param(code, id=f"{doc.name}#{i}"))
    return found


def run_twice(code: str, namespace: dict[str, object] | None = None) -> None:
    """Run ``code`` twice in the current directory, each time in fresh globals."""
    compiled = compile(code, "<doc>", "exec")
    for attempt in (1, 2):
        try:
            exec(compiled, {"__name__": "__doc_example__", **(namespace or {})})
        except Exception as exc:
            raise AssertionError(f"the example failed on run {attempt} of 2 in one "
                                 f"directory: {exc!r}") from exc


@pytest.mark.parametrize("code", blocks())
def test_doc_example_runs_twice(code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run_twice(code)


def test_no_shell_example_overwrites_an_earlier_output():
    """Within one shell block, two commands never write the same ``--out``: pasted in order,
    the second would replace the first's sessions (and a --state run's output)."""
    for doc in DOCS:
        for block in SHELL.findall(doc.read_text()):
            outs = re.findall(r"--out[ =](\S+)", block)
            assert len(outs) == len(set(outs)), f"{doc.name}: {outs}"
