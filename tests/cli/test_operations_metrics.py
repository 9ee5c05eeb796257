"""docs/operations.md lists every metric the CLI exports to Prometheus, with its type, and
nothing else: the names come from the ``--metrics-file`` of real runs (with and without a
dynamic gap), not from a list."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from sessionstore.cli import main

prometheus_client = pytest.importorskip("prometheus_client")

DOC = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def documented() -> set[tuple[str, str]]:
    """``(name, type)`` of each row of the Grafana table."""
    text = DOC.read_text()
    table = text[text.index("A Grafana-ready list"):text.index("On Spark, the Arrow engine")]
    rows = re.findall(r"^\| `(sessionstore_[a-z_]+)` \| ([a-z]+) \|", table, re.M)
    assert len(rows) == len({name for name, _ in rows})  # no name twice
    return set(rows)


def exported(text: str) -> set[tuple[str, str]]:
    """``(name, type)`` of each ``# TYPE`` line of an exposition."""
    return set(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))


def run(tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, *flags: str) -> str:
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"u": u, "ts": t, "g": g}) + "\n" for u, t, g in
                              [("a", 0, 10), ("a", 5, None), ("b", 9, 3), ("a", 1, 10)]))
    prom = tmp_path / f"{name}.prom"
    assert main(["sessionize", str(source), "--key", "u", "--time", "ts",
                 "--out", str(tmp_path / f"{name}.jsonl"), "--state", str(tmp_path / name),
                 "--no-progress", "--metrics-file", str(prom), *flags]) == 0
    capsys.readouterr()
    return prom.read_text()


def test_the_grafana_table_lists_exactly_the_exported_names(tmp_path, capsys):
    fixed = exported(run(tmp_path, capsys, "fixed", "--gap", "10ms"))
    dynamic = exported(run(tmp_path, capsys, "dynamic", "--gap-column", "g", "--max-gap", "1s"))
    assert ("sessionstore_dropped_invalid_gap_records_total", "counter") in dynamic
    assert documented() == fixed | dynamic
