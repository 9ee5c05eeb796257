"""Prometheus export: a collector that reads the engine's metrics on every scrape, in a user's
registry; the CLI's --metrics-port endpoint scraped during a real run and checked against
Prometheus' naming rules; and the --metrics-file a short job leaves behind."""

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
    MetricsReading,
    MetricsSnapshot,
    read_engine,
    register_engine_metrics,
    serve_metrics,
)
from sessionstore.store.metered import LatencyHistogram

ROOT = Path(__file__).resolve().parents[2]


def samples(text: str) -> dict[str, float]:
    """Sample name (with its ``le`` for buckets) -> value."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            le = s.labels.get("le")
            out[s.name if le is None else f"{s.name}{{le={le}}}"] = s.value
    return out


def naming_violations(text: str) -> list[str]:
    """Every breach of Prometheus' naming rules in an exposition (empty when it follows them):
    counters and only counters end in ``_total``; histograms are of time, in ``_seconds``, and
    expose only ``_bucket``/``_sum``/``_count``; no precomputed ``_rate``, ``_avg``, ``_max``;
    no other unit than seconds; a HELP for every family that says what it counts."""
    bad: list[str] = []
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    helps = dict(re.findall(r"^# HELP (\S+) (.*)$", text, re.M))
    if not types:
        return ["no # TYPE lines"]
    for name, kind in types.items():
        if not name.startswith("sessionstore_"):
            bad.append(f"{name}: not in the sessionstore_ namespace")
        if kind not in ("counter", "gauge", "histogram"):
            bad.append(f"{name}: unexpected type {kind}")
        if (kind == "counter") != name.endswith("_total"):
            bad.append(f"{name}: a {kind} {'without' if kind == 'counter' else 'with'} _total")
        if kind == "histogram" and not name.endswith("_seconds"):
            bad.append(f"{name}: a latency histogram not in _seconds")
        if re.search(r"_(rate|avg|average|max|min|mean)(_|$)", name):
            bad.append(f"{name}: a precomputed statistic")
        if re.search(r"_(ms|millis|milliseconds|us|minutes|hours)(_|$)", name):
            bad.append(f"{name}: a unit other than seconds")
        doc = helps.get(name, "")
        if len(doc.split()) < 4 or "metric" in doc.lower() or name in doc:
            bad.append(f"{name}: generic HELP {doc!r}")
    if len(set(helps.values())) != len(helps):
        bad.append("two families share a HELP text")
    suffixes = {"counter": ("_total",), "gauge": ("",),
                "histogram": ("_bucket", "_sum", "_count")}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        sample = line.split("{")[0].split(" ")[0]
        owner = [n for n in types if sample in {n.removesuffix("_total") + s if
                                                types[n] == "counter" else n + s
                                                for s in suffixes[types[n]]}]
        if not owner:
            bad.append(f"{sample}: a sample of no declared family, or with a foreign suffix")
    return bad


def test_the_naming_check_catches_each_rule():
    """The checker itself fails the exposition the engine exported before (gauges for running
    totals, ms latencies, rates, averages, a generic HELP)."""
    assert naming_violations("# HELP sessionstore_x_total Events handed over, all of them.\n"
                             "# TYPE sessionstore_x_total counter\nsessionstore_x_total 1.0\n"
                             ) == []
    for wrong in ("# HELP sessionstore_records_in sessionstore engine metric 'records-in'\n"
                  "# TYPE sessionstore_records_in gauge\nsessionstore_records_in 3.0\n",
                  "# HELP sessionstore_y_rate Events per second over a window.\n"
                  "# TYPE sessionstore_y_rate gauge\nsessionstore_y_rate 3.0\n",
                  "# HELP sessionstore_z_latency_avg Milliseconds per commit on average.\n"
                  "# TYPE sessionstore_z_latency_avg gauge\nsessionstore_z_latency_avg 3.0\n",
                  "# HELP sessionstore_w_latency Time of each commit, in a histogram.\n"
                  "# TYPE sessionstore_w_latency histogram\nsessionstore_w_latency_count 3.0\n",
                  "# HELP sessionstore_v_seconds Time of each commit, in a histogram.\n"
                  "# TYPE sessionstore_v_seconds histogram\nsessionstore_v_seconds_max 3.0\n"):
        assert naming_violations(wrong), wrong


def test_latency_histogram_buckets_are_inclusive_upper_bounds():
    h = LatencyHistogram((0.001, 0.01))
    h.observe(0.001)
    h.observe_ms([0.5, 1.0, 1.5, 10.0, 11.0])
    reading = h.reading()
    assert reading.counts == (3, 2, 1) and reading.count == 6
    assert reading.sum_s == pytest.approx((1.0 + 0.5 + 1.0 + 1.5 + 10.0 + 11.0) / 1000)
    with pytest.raises(ValueError, match="bounds_s must be strictly increasing"):
        LatencyHistogram((0.1, 0.1))


def test_a_users_registry_reads_the_engines_metrics_at_each_scrape(tmp_path):
    store = SessionStore(tmp_path / "s", retention_ms=10_000)
    engine = SessionAggregator(store, SessionWindows(1000), aggregations.count(),
                               emit=EmitStrategy.ON_WINDOW_CLOSE)
    registry = CollectorRegistry()
    collector = register_engine_metrics(engine, registry, labels={"job": "clicks"})
    before = samples(generate_latest(registry).decode())
    assert before["sessionstore_emit_final_records_total"] == 0
    assert "sessionstore_watermark_seconds" not in before  # no event yet: no watermark
    engine.process_batch(["a", "b", "a"], [None] * 3, [0, 10, 5000])
    engine.process("late", None, 0)  # behind the watermark by more than gap + grace: dropped
    engine.advance_watermark(100_000)
    engine.commit()
    text = generate_latest(registry).decode()
    assert naming_violations(text) == []
    after = samples(text)
    assert after["sessionstore_emit_final_records_total"] == 3
    assert after["sessionstore_input_records_total"] == 4
    assert after["sessionstore_dropped_records_total"] == 1
    assert after["sessionstore_watermark_seconds"] == 100.0
    # [0, 1000) and [10, 1010) close when the batch moves W to 5000, [5000, 6000) at 100 s
    assert after["sessionstore_emit_final_latency_seconds_count"] == 3
    assert after["sessionstore_emit_final_latency_seconds_sum"] == pytest.approx(
        (5000 - 1000) / 1000 + (5000 - 1010) / 1000 + (100_000 - 6000) / 1000)
    assert after["sessionstore_emit_final_latency_seconds_bucket{le=1.0}"] == 0
    assert after["sessionstore_emit_final_latency_seconds_bucket{le=10.0}"] == 2
    assert after["sessionstore_emit_final_latency_seconds_bucket{le=60.0}"] == 2
    assert after["sessionstore_emit_final_latency_seconds_bucket{le=300.0}"] == 3
    assert after["sessionstore_store_commit_latency_seconds_count"] == 1
    assert 'job="clicks"' in text
    registry.unregister(collector)
    assert "sessionstore_" not in generate_latest(registry).decode()
    store.close()


def test_a_snapshot_source_and_the_http_server(tmp_path):
    snapshot = MetricsSnapshot({"records-in": 1})
    server = serve_metrics(snapshot, 0)
    try:
        url = f"http://127.0.0.1:{server.port}/metrics"
        assert samples(urllib.request.urlopen(url).read().decode())[
            "sessionstore_input_records_total"] == 1
        snapshot.publish(MetricsReading({"records-in": 5, "odd name!": 2}))
        scraped = samples(urllib.request.urlopen(url).read().decode())
        assert scraped["sessionstore_input_records_total"] == 5
        assert not any("odd" in name for name in scraped)  # only the documented names
    finally:
        server.close()
    with pytest.raises(TypeError, match="source must be an engine"):
        register_engine_metrics(42, CollectorRegistry())


def test_read_engine_adds_the_callers_counters(tmp_path):
    with SessionStore(tmp_path / "s", retention_ms=10_000) as store:
        engine = SessionAggregator(store, SessionWindows(1000), aggregations.count())
        engine.process("a", None, 2500)
        reading = read_engine(engine, {"cli-input-records-total": 7})
        assert reading.values["watermark-ms"] == 2500
        assert reading.values["cli-input-records-total"] == 7
        assert reading.histograms["store-commit-latency"].count == 0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_scraping_the_cli_during_a_run_follows_the_naming_rules(tmp_path):
    """The endpoint scraped over HTTP while a CLI run works: every exposition follows the
    naming rules, figures move mid-run (not only at exit), never go back and never pass the
    final ones; the --metrics-file left behind parses and holds the final totals."""
    n = 60_000
    rng = np.random.default_rng(5)
    source = tmp_path / "in.parquet"
    times = np.sort(rng.integers(0, n * 20, n))
    times[::997] -= 50_000  # some rows arrive too late to count
    pq.write_table(pa.table({"user": rng.integers(0, 3000, n), "ts": times}), source,
                   row_group_size=3000)
    out = tmp_path / "o.jsonl"
    prom = tmp_path / "textfile" / "sessionize.prom"
    prom.parent.mkdir()
    port = free_port()
    child = subprocess.Popen(
        [sys.executable, "-m", "sessionstore.cli", "sessionize", str(source), "--key", "user",
         "--time", "ts", "--gap", "2s", "--agg", "n=count", "--out", str(out),
         "--state", str(tmp_path / "state"), "--commit-every", "3000", "--batch-rows", "3000",
         "--no-progress", "--metrics-port", str(port), "--metrics-file", str(prom)],
        env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    bodies: list[str] = []
    while child.poll() is None:
        try:
            body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
            bodies.append(body.decode())
        except (urllib.error.URLError, ConnectionError):
            pass  # not listening yet, or already closed
        time.sleep(0.02)
    stdout, stderr = child.communicate()
    assert child.returncode == 0, stderr
    summary = json.loads(stdout)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    counted = sum(r["n"] for r in rows)
    dropped = n - counted
    assert dropped == summary["late_dropped"] > 0
    assert bodies, "no scrape answered"
    for body in bodies:
        assert naming_violations(body) == [], body
    scrapes = [samples(body) for body in bodies]
    mid = [s for s in scrapes if 0 < s["sessionstore_cli_input_records_total"] < n]
    assert mid, f"no scrape landed mid-run ({len(scrapes)} scrapes)"
    busy = mid[-1]
    for name in ("sessionstore_input_records_total", "sessionstore_emit_final_records_total",
                 "sessionstore_cli_output_records_total", "sessionstore_watermark_seconds",
                 "sessionstore_store_commit_latency_seconds_count",
                 "sessionstore_store_commit_latency_seconds_sum",
                 "sessionstore_emit_final_latency_seconds_count"):
        assert busy[name] > 0, name  # observed while running, not only at exit
    for name, limit in (("sessionstore_cli_input_records_total", n),
                        ("sessionstore_input_records_total", n),
                        ("sessionstore_emit_final_records_total", len(rows)),
                        ("sessionstore_dropped_records_total", dropped)):
        series = [s[name] for s in scrapes]
        assert series == sorted(series) and max(series) <= limit, name
    # the textfile: written atomically (no temporary left beside it), parsed, the final totals
    assert [p.name for p in prom.parent.iterdir()] == [prom.name]
    final = samples(prom.read_text())
    assert naming_violations(prom.read_text()) == []
    assert final["sessionstore_cli_input_records_total"] == n == summary["events_in"]
    assert final["sessionstore_input_records_total"] == n
    assert final["sessionstore_cli_output_records_total"] == len(rows)
    assert final["sessionstore_emit_final_records_total"] == len(rows)
    assert final["sessionstore_emit_final_latency_seconds_count"] == len(rows)
    assert final["sessionstore_dropped_records_total"] == dropped
    assert final["sessionstore_store_commit_latency_seconds_count"] >= n // 3000
    assert final["sessionstore_watermark_seconds"] * 1000 >= int(times.max())


def test_a_metrics_file_in_a_missing_directory_is_refused_before_the_run(tmp_path, capsys):
    from sessionstore.cli import main
    source = tmp_path / "in.jsonl"
    source.write_text('{"u": "a", "ts": 0}\n')
    out = tmp_path / "o.jsonl"
    assert main(["sessionize", str(source), "--key", "u", "--time", "ts", "--gap", "1s",
                 "--out", str(out), "--no-progress",
                 "--metrics-file", str(tmp_path / "nowhere" / "m.prom")]) == 2
    assert "--metrics-file" in capsys.readouterr().err and not out.exists()


def test_without_prometheus_client_the_cli_names_the_extra_and_touches_nothing(
        tmp_path, capsys, monkeypatch):
    from sessionstore.cli import main
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import fails, as uninstalled
    source = tmp_path / "in.jsonl"
    source.write_text('{"u": "a", "ts": 0}\n')
    out, state = tmp_path / "o.jsonl", tmp_path / "state"
    assert main(["sessionize", str(source), "--key", "u", "--time", "ts", "--gap", "1s",
                 "--out", str(out), "--state", str(state), "--no-progress",
                 "--metrics-file", str(tmp_path / "m.prom")]) == 2
    assert "sessionstore[prometheus]" in capsys.readouterr().err
    assert not out.exists() and not state.exists()
