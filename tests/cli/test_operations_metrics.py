"""docs/operations.md lists every metric the CLI exports to Prometheus, and nothing else: the
names come from scraping a real run (with and without a dynamic gap), not from a list."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from sessionstore.cli import main

prometheus_client = pytest.importorskip("prometheus_client")

from sessionstore.metrics_export import EngineMetricsCollector  # noqa: E402

DOC = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
STORE_OPS = ("put", "remove", "fetch", "find_sessions", "commit")


def documented() -> set[str]:
    """The metric names of the Grafana table, with ``<op>`` and ``_suffix`` shorthands expanded."""
    text = DOC.read_text()
    table = text[text.index("A Grafana-ready list"):text.index("A dashboard needs")]
    names: set[str] = set()
    for line in table.splitlines():
        if not line.startswith("| `sessionstore_"):
            continue
        cell = line.split("|")[1]
        found = re.findall(r"`([a-z_<>]+)`", cell)
        base = found[0]
        variants = [base] + [re.sub(r"_[a-z]+_[a-z]+$", "", base) + extra
                             for extra in found[1:]]
        for name in variants:
            names.update(name.replace("<op>", op) for op in STORE_OPS) if "<op>" in name \
                else names.add(name)
    return names


def exported(metrics: dict[str, float]) -> set[str]:
    """The sample names a scrape shows for this mapping (counters with their ``_total``)."""
    registry = prometheus_client.CollectorRegistry()
    registry.register(EngineMetricsCollector(lambda: metrics))
    text = prometheus_client.generate_latest(registry).decode()
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines()
            if line and not line.startswith("#")}


def run(tmp_path: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> dict[str, float]:
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"u": u, "ts": t, "g": g}) + "\n" for u, t, g in
                              [("a", 0, 10), ("a", 5, None), ("b", 9, 3), ("a", 1, 10)]))
    out = tmp_path / f"out{len(flags)}.jsonl"
    assert main(["sessionize", str(source), "--key", "u", "--time", "ts", "--out", str(out),
                 "--no-progress", "--state", f"{out}.state", *flags]) == 0
    return json.loads(capsys.readouterr().out)["metrics"]  # type: ignore[no-any-return]


def test_the_grafana_table_lists_exactly_the_exported_names(tmp_path, capsys):
    fixed = exported(run(tmp_path, capsys, "--gap", "10ms"))
    dynamic = exported(run(tmp_path, capsys, "--gap-column", "g", "--max-gap", "1s"))
    assert "sessionstore_dropped_invalid_gap_records" in dynamic
    assert documented() == fixed | dynamic
