"""Prometheus export: a collector that reads the engine's metrics on every scrape, in a user's
registry, and the CLI's --metrics-port endpoint scraped during a real run."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sessionstore import EmitStrategy, SessionAggregator, SessionStore, SessionWindows, aggregations
from sessionstore.metrics_export import (
    MetricsSnapshot,
    prometheus_name,
    register_engine_metrics,
    serve_metrics,
)

ROOT = Path(__file__).resolve().parents[2]


def samples(text: str) -> dict[str, float]:
    return {s.name: s.value for family in text_string_to_metric_families(text)
            for s in family.samples}


def test_a_users_registry_reads_the_engines_metrics_at_each_scrape(tmp_path):
    store = SessionStore(tmp_path / "s", retention_ms=10_000)
    engine = SessionAggregator(store, SessionWindows(1000), aggregations.count(),
                               emit=EmitStrategy.ON_WINDOW_CLOSE)
    registry = CollectorRegistry()
    collector = register_engine_metrics(engine, registry, labels={"job": "clicks"})
    before = samples(generate_latest(registry).decode())
    assert before["sessionstore_emit_final_records_total"] == 0
    engine.process_batch(["a", "b", "a"], [None] * 3, [0, 10, 5000])
    engine.process("late", None, 0)  # behind the watermark by more than gap + grace: dropped
    engine.advance_watermark(100_000)
    text = generate_latest(registry).decode()
    after = samples(text)
    assert after["sessionstore_emit_final_records_total"] == 3
    assert after["sessionstore_dropped_records"] == 1
    assert 'job="clicks"' in text
    assert re.search(r"# TYPE sessionstore_emit_final_records(_total)? counter", text)
    assert "# TYPE sessionstore_emit_final_records_rate gauge" in text
    assert set(after) == {prometheus_name(n) for n in engine.metrics}  # every name, no list
    registry.unregister(collector)
    assert "sessionstore_" not in generate_latest(registry).decode()
    store.close()


def test_a_snapshot_source_and_the_http_server(tmp_path):
    snapshot = MetricsSnapshot({"records-in": 1})
    server = serve_metrics(snapshot, 0)
    try:
        url = f"http://127.0.0.1:{server.port}/metrics"
        assert samples(urllib.request.urlopen(url).read().decode())["sessionstore_records_in"] == 1
        snapshot.publish({"records-in": 5, "odd name!": 2, "nan-gauge": float("nan")})
        scraped = samples(urllib.request.urlopen(url).read().decode())
        assert scraped["sessionstore_records_in"] == 5
        assert scraped["sessionstore_odd_name_"] == 2
        assert "sessionstore_nan_gauge" not in scraped
    finally:
        server.close()
    with pytest.raises(TypeError, match="source must be an engine"):
        register_engine_metrics(42, CollectorRegistry())


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_scraping_the_cli_during_a_run_matches_its_output(tmp_path):
    n = 60_000
    rng = np.random.default_rng(5)
    source = tmp_path / "in.parquet"
    times = np.sort(rng.integers(0, n * 20, n))
    times[::997] -= 50_000  # some rows arrive too late to count
    pq.write_table(pa.table({"user": rng.integers(0, 3000, n), "ts": times}), source,
                   row_group_size=3000)
    out = tmp_path / "o.jsonl"
    port = free_port()
    child = subprocess.Popen(
        [sys.executable, "-m", "sessionstore.cli", "sessionize", str(source), "--key", "user",
         "--time", "ts", "--gap", "2s", "--agg", "n=count", "--out", str(out),
         "--commit-every", "3000", "--batch-rows", "3000", "--no-progress",
         "--metrics-port", str(port)],
        env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    scrapes: list[dict[str, float]] = []
    while child.poll() is None:
        try:
            body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
            scrapes.append(samples(body.decode()))
        except (urllib.error.URLError, ConnectionError):
            pass  # not listening yet, or already closed
        time.sleep(0.02)
    stdout, stderr = child.communicate()
    assert child.returncode == 0, stderr
    summary = json.loads(stdout)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    counted = sum(r["n"] for r in rows)
    final = summary["metrics"]
    # the final summary is the output, exactly
    assert final["cli-input-records-total"] == n == summary["events_in"]
    assert final["cli-output-records-total"] == len(rows) == final["emit-final-records-total"]
    assert final["dropped-records"] == n - counted == summary["late_dropped"] > 0
    # scrapes during the run: some mid-way, never ahead of the end, never going back
    mid = [s for s in scrapes if 0 < s["sessionstore_cli_input_records_total"] < n]
    assert mid, f"no scrape landed mid-run ({len(scrapes)} scrapes)"
    for name, limit in (("sessionstore_cli_input_records_total", n),
                        ("sessionstore_cli_output_records_total", len(rows)),
                        ("sessionstore_emit_final_records_total", len(rows)),
                        ("sessionstore_dropped_records", n - counted)):
        series = [s[name] for s in scrapes]
        assert series == sorted(series) and max(series) <= limit, name
    for scrape in scrapes:
        assert scrape["sessionstore_cli_output_records_total"] <= \
            scrape["sessionstore_emit_final_records_total"]
