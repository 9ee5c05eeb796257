"""Render docs/benchmarks.md and its plots from the JSON results under docs/bench/.

The harness scripts write the JSON; this turns it into tables and PNG plots, so that nothing in
docs/benchmarks.md is typed by hand::

    python -m benchmarks.report
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from .common import RESULTS_DIR  # noqa: E402

DOCS = RESULTS_DIR.parent
log = logging.getLogger("benchmarks.report")


def _load(name: str) -> dict[str, Any] | None:
    path = RESULTS_DIR / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:,.1f}"


def _conditions(data: dict[str, Any]) -> str:
    """When the run was taken and how loaded the machine was (1, 5, 15-minute load averages at
    its start and end), if the JSON records it."""
    if "load_average_start" not in data:
        return ""
    start = "/".join(f"{x:.1f}" for x in data["load_average_start"])
    end = "/".join(f"{x:.1f}" for x in data.get("load_average_end", []))
    loads = [*data["load_average_start"], *data.get("load_average_end", [])]
    if max(loads) <= 2.5:
        note = "the machine was otherwise idle"
    else:
        note = ("on 2 cores shared with other work: ratios within one row are comparable, "
                "absolute rates and rows against each other much less")
    return (f" Run on {data.get('date', '?')} with load averages {start} at the start and "
            f"{end} at the end (1/5/15 minutes); {note}.")


def _machine(data: dict[str, Any]) -> str:
    m = data["machine"]
    return f"Python {m['python']}, {m['machine']}, {m['cpus']} CPUs"


def _bar_plot(path: Path, labels: list[str], values: list[float], title: str, xlabel: str) -> None:
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(labels) + 1.2))
    ax.barh(labels[::-1], values[::-1], color="#3b7dd8")
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    for i, v in enumerate(values[::-1]):
        ax.text(v, i, f" {_fmt(v)}", va="center", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def store_section() -> list[str]:
    data = _load("store")
    if data is None:
        return []
    n = data["sessions"]
    rows = [
        ("put", data["segmented_put_per_s"], data["kvlist_put_per_s"], "per s"),
        ("find_sessions_to_merge", data["segmented_find_sessions_to_merge_per_s"],
         data["kvlist_find_sessions_to_merge_per_s"], "per s"),
        ("expire everything (one segment of all sessions)", data["segmented_expiry_ms"],
         data["kvlist_expiry_ms"], "ms"),
    ]
    lines = [
        "## Store: segmented layout against KIP-94's rejected key-value layout",
        "",
        f"`python -m benchmarks.store_bench`: {n:,} sessions over {data['keys']:,} keys, "
        f"{data['queries']:,} lookups; both layouts in the same run on the same data "
        f"({_machine(data)}).",
        "",
        "| operation | segmented SessionStore | key-value list per key | unit |",
        "|---|---:|---:|---|",
    ]
    lines += [f"| {name} | {_fmt(a)} | {_fmt(b)} | {unit} |" for name, a, b, unit in rows]
    if "segmented_put_many_and_commit_per_s" in data:
        lines.append(
            f"| put_many (bulk write, chunks of 100,000) and its commit | "
            f"{_fmt(data['segmented_put_many_and_commit_per_s'])} | n/a | sessions per s |")
    lines += [
        f"| find_sessions (3 s end range, cross-key) | "
        f"{_fmt(data['segmented_find_sessions_rows_per_s'])} rows/s | not possible without a "
        f"full scan | rows per s |",
        f"| commit (flush + checkpoint of {n:,} sessions) | {_fmt(data['segmented_commit_ms'])} "
        f"| n/a | ms |",
        "",
        "Expiry drops a column family, so its cost does not grow with the number of sessions in "
        "the segment; the key-value layout must read and rewrite every key.",
        "",
    ]
    if "segmented_put_many_and_commit_per_s" in data:
        lines += [
            f"`put_many` (chunks of 100,000 sessions, columnar input, as the batch path hands "
            f"them over) stages each segment's records as one sorted SST file and ingests it; "
            f"the commit then makes them durable. On RocksDB: "
            f"**{_fmt(data['segmented_put_many_and_commit_per_s'])} sessions/s** wall-clock "
            f"for the writes and their commit together "
            f"({_fmt(data['segmented_put_many_and_commit_cpu_per_s'])} per CPU second of the "
            f"process, RocksDB's background threads included); the writes alone "
            f"{_fmt(data['segmented_put_many_per_s'])} sessions/s, the commit "
            f"{_fmt(data['segmented_put_many_commit_ms'])} ms. In memory: "
            f"{_fmt(data['memory_put_many_per_s'])} sessions/s. Load average (1 minute) "
            f"{data['load_average_1m']:.1f}. [Operations](operations.md) (\"Which records a "
            f"write costs\") says where a bulk write's time goes.",
            "",
        ]
    return lines


SWEEP_RUNS = [(f"{path}/{store}", f"{label}, {store_label}")
              for store, store_label in (("rocksdb", "RocksDB"), ("memory", "memory"))
              for path, label in (("event", "event path"), ("process_batch", "process_batch"),
                                  ("process_table", "process_table"))]


def sweep_table(rows: list[dict[str, Any]]) -> list[str]:
    """One table row per stream: the dict sessionizer's rate, then each run as a multiple of it
    in wall-clock time / CPU time (medians over the row's rounds)."""
    lines = [
        "| out of order | events/session | gap | plain-Python dict (events/s) | "
        + " | ".join(label for _, label in SWEEP_RUNS) + " | sessions |",
        "|---:|---:|---:|---:|" + "---:|" * len(SWEEP_RUNS) + "---|",
    ]
    for row in rows:
        counts = {c for emitted in row["emitted"].values() for c in emitted}
        check = f"{counts.pop():,} (all equal)" if len(counts) == 1 else "differ: " + ", ".join(
            f"{name} {emitted}" for name, emitted in row["emitted"].items())
        lines.append(
            f"| {row['disorder_ms']:,} ms | {row['events_per_session']:.1f} | "
            f"{row['gap_ms']:,} ms | {_fmt(row['events_per_s']['dict'])} | "
            + " | ".join(f"{row['ratio'][name]:.2f}x / {row['cpu_ratio'][name]:.2f}x"
                         for name, _ in SWEEP_RUNS)
            + f" | {check} |"
        )
    return lines


def sweep_plot(path: Path, rows: list[dict[str, Any]], title: str) -> None:
    fig, ax = plt.subplots(figsize=(10, 4.5))
    width = 0.8 / len(SWEEP_RUNS)
    for i, (name, label) in enumerate(SWEEP_RUNS):
        ax.bar([x + i * width for x in range(len(rows))],
               [row["ratio"][name] for row in rows], width, label=label)
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(rows))])
    ax.set_xticklabels([f"{row['disorder_ms']:,} ms\n{row['events_per_session']:.1f} ev/session"
                        for row in rows])
    ax.set_ylabel("x plain-Python dict sessionizer (wall-clock)")
    ax.set_title(title)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def engine_section() -> list[str]:
    data = _load("engine")
    if data is None:
        return []
    lines = []
    sweeps = data.get("sweeps", [])
    if sweeps:
        by_disorder = [r for r in sweeps if "disorder" in r["sweep"]]
        by_density = sorted((r for r in sweeps if "events_per_session" in r["sweep"]),
                            key=lambda r: r["events_per_session"])
        lines += [
            "## Engine sweeps: out-of-orderness and events per session",
            "",
            f"`python -m benchmarks.engine_bench`: q11-like streams of {data['events']:,} events "
            f"over {data['bidders']:,} skewed keys at 10k events/s of event time, each event up to "
            f"the given time out of order; the gap is chosen to give the events per session shown. "
            f"The engine counts per key with emit-on-close and `max_out_of_orderness_ms` equal to "
            f"the disorder, in batches of {data.get('batch_events', 100_000):,} events with a "
            f"commit after every batch (event path too): the event path is a loop of `process`, "
            f"`process_batch` takes Python or numpy columns and returns `Emit` objects, "
            f"`process_table` takes and returns Arrow tables. Every run of a row is in one "
            f"process on one stream ({_machine(data)}), {data.get('repeat', 1)} rounds in turn; "
            f"each cell is the median ratio to the plain-Python dict sessionizer of the same "
            f"round, in wall-clock time / in CPU time of the process (commits wait for fsync, "
            f"which CPU time does not count).{_conditions(data)}",
            "",
            "### Out-of-orderness sweep",
            "",
            *sweep_table(by_disorder),
            "",
            "![disorder sweep](bench/engine_disorder_sweep.png)",
            "",
            "### Events-per-session sweep",
            "",
            *sweep_table(by_density),
            "",
            "![events-per-session sweep](bench/engine_density_sweep.png)",
            "",
        ]
        sweep_plot(DOCS / "bench" / "engine_disorder_sweep.png", by_disorder,
                   "Out-of-orderness sweep (x plain-Python sessionizer)")
        sweep_plot(DOCS / "bench" / "engine_density_sweep.png", by_density,
                   "Events-per-session sweep (x plain-Python sessionizer)")
    runs = data.get("runs", [])
    if not runs:
        return lines
    baseline = next(r for r in runs if r["name"].startswith("process_batch on rocksdb, ON_WIN"))
    q11_events = data.get("q11_events", data["events"])
    plot = DOCS / "bench" / "engine_q11.png"
    _bar_plot(plot, [r["name"] for r in runs], [r["events_per_s"] for r in runs],
              f"Nexmark q11, {q11_events:,} events, one core", "events/s")
    lines += [
        "## Engine: Nexmark q11 (bids per bidder, 10 s session gap), one core",
        "",
        f"`python -m benchmarks.engine_bench`: {q11_events:,} generated bids over "
        f"{data['bidders']:,} skewed bidders, up to 200 ms out of order; every run in the same "
        f"process on the same stream ({_machine(data)}). Each run ends with a commit."
        f"{_conditions(data)}",
        "",
        "| run | events/s | vs batch path on RocksDB | sessions emitted |",
        "|---|---:|---:|---:|",
    ]
    for r in runs:
        lines.append(
            f"| {r['name']} | {_fmt(r['events_per_s'])} | "
            f"{r['events_per_s'] / baseline['events_per_s']:.2f}x | {r['emitted']:,} |"
        )
    lines += [
        "",
        "![q11 throughput](bench/engine_q11.png)",
        "",
        "The anchor is Flink's published Nexmark q11 on RocksDB: 39.7k events/s per core. The "
        "plain-Python sessionizer keeps everything in memory, is not durable and has no late "
        "data handling; it emits the same number of sessions, which cross-checks the engine.",
        "",
    ]
    return lines


def spark_section() -> list[str]:
    data = _load("spark")
    if data is None:
        return []
    lines = [
        "## Spark: native session_window, the Arrow engine and the processor engine",
        "",
        f"`python -m benchmarks.spark_bench`: the sample clickstream ({data['rows']:,} rows, "
        f"{data['gap']} gap, {data['watermark_delay']} watermark delay) in one Spark "
        f"{data['spark']} session, `{data['master']}`, {data['partitions']} shuffle partitions "
        f"({_machine(data)}; load average at the end {data['load_average'][0]:.1f}). Streaming: "
        f"{data['batches']} Parquet files, one per micro-batch, then one far-future event that "
        "closes every session; the time is the sum over every micro-batch, no-data batches "
        "included. Static: the same files as one DataFrame. Each run counts its sessions and "
        "sums a hash of every session row, so equal counts and checksums mean equal results.",
        "",
        "| mode | peer | rows/s | x native | CPU s (JVM + Python) | sessions "
        "| batches (data + no-data) |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for mode in ("streaming", "static"):
        for name, run in data[mode].items():
            ratio = data["ratios_vs_native"][mode][name]
            batches = (f"{run['data_batches']} + {run['no_data_batches']}"
                       if mode == "streaming" else "")
            cpu = (f"{run['cpu_s']:.1f} ({run['jvm_cpu_s']:.1f} + {run['python_cpu_s']:.1f})"
                   if "cpu_s" in run else "")  # results written before CPU was measured
            rate = run.get("median_rows_per_s", run["rows_per_s"])
            lines.append(f"| {mode} | {name} | {_fmt(rate)} | {ratio:.2f} | {cpu} | "
                         f"{run['sessions']:,} | {batches} |")
    equal = data["equal_results"]
    lines += [
        "",
        f"Equal results across the three: streaming {'yes' if equal['streaming'] else 'NO'}, "
        f"static {'yes' if equal['static'] else 'NO'}.",
        "",
    ]
    return lines


def peers_section() -> list[str]:
    data = _load("peers")
    if data is None:
        return []
    rows = [r for r in data["rows"] if "error" not in r]
    lines = [
        "## Peers, side by side",
        "",
        f"`python -m benchmarks.peers` ({data['events']:,} events per workload; "
        f"{_machine(data)}): every peer in its own process, so peak RSS is its own (Spark's "
        "and Flink's JVMs included). *q11*: Nexmark bids, count per bidder, 10 s gap. "
        "*clicks*: the sample clickstream, count per user, 30 min gap. Ratios are against this "
        "engine's batch path on RocksDB. Cores: this engine and the plain-Python sessionizer use "
        "one; PyFlink runs with parallelism 1; Spark's static job runs in `local[2]` on both "
        "cores of the machine, so per core it is about half the figure shown.",
        "",
        "| workload | peer | events/s | x engine | peak RSS (MB) | x engine | sessions |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for workload in dict.fromkeys(r["workload"] for r in rows):
        base = next((r for r in rows if r["workload"] == workload
                     and r["peer"] == "engine-batch"), None)
        for r in (r for r in rows if r["workload"] == workload):
            ratio = r["events_per_s"] / base["events_per_s"] if base else float("nan")
            mem = r["peak_rss_mb"] / base["peak_rss_mb"] if base else float("nan")
            lines.append(f"| {workload} | {r['peer']} | {_fmt(r['events_per_s'])} | "
                         f"{ratio:.2f} | {r['peak_rss_mb']:.0f} | {mem:.2f} | "
                         f"{r['sessions']:,} |")
    for r in data["rows"]:
        if "error" in r:
            lines.append(f"| {r['workload']} | {r['peer']} | failed: {r['error']} | | | | |")
    labels = [f"{r['workload']}: {r['peer']}" for r in rows]
    if rows:
        _bar_plot(DOCS / "bench" / "peers.png", labels, [r["events_per_s"] for r in rows],
                  "Peers: events/s", "events/s")
        lines += ["", "![peers](bench/peers.png)", ""]
    if data.get("flink_note"):
        lines += [f"Note: {data['flink_note']}", ""]
    return lines


def static_section() -> list[str]:
    """``benchmarks/static_bench.py``: sessionize against DuckDB and polars on one file."""
    runs = [d for d in (_load("static"), _load("static_large")) if d is not None]
    if not runs:
        return []
    lines = [
        "## Static input",
        "",
        "`python -m benchmarks.static_bench` (`make bench`'s `static` step): one Parquet file, "
        "a 30 min gap, a count and a sum per session, every tool in its own process reading "
        "the file itself; wall, CPU (user + system) and peak RSS of that process, the median "
        "of the runs noted below the table. *pareto*: the issue's workload (about 526k users per 10M "
        "events, Pareto activity, rows in random order); *sample*: the bundled 1.2M-event "
        "clickstream. Ratios are this tool's figure over DuckDB's (and polars'); below 1 is "
        "better. Every row of a run found the same sessions, events and sum, unless marked.",
        "",
        "| workload | events | memory limit | tool | wall (s) | CPU (s) | peak RSS (MB) | "
        "CPU x DuckDB | wall x DuckDB | RSS x DuckDB | CPU x polars | wall x polars | "
        "sessions |",
        "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    notes = []
    for data in runs:
        for result in data["results"]:
            rows = {r["tool"]: r for r in result["rows"]}
            duck, polars = rows.get("duckdb"), rows.get("polars")
            for tool, r in rows.items():
                def ratio(peer: dict[str, Any] | None, key: str,
                          r: dict[str, Any] = r) -> str:
                    return f"{r[key] / peer[key]:.2f}" if peer else ""

                lines.append(
                    f"| {result['workload']} | {result['events']:,} | "
                    f"{result['memory_limit'] or 'default'} | {tool} | {r['wall_s']:.2f} | "
                    f"{r['cpu_s']:.2f} | {r['peak_rss_mb']:.0f} | {ratio(duck, 'cpu_s')} | "
                    f"{ratio(duck, 'wall_s')} | {ratio(duck, 'peak_rss_mb')} | "
                    f"{ratio(polars, 'cpu_s')} | {ratio(polars, 'wall_s')} | "
                    f"{r['sessions']:,} |")
            if not result["same_sessions"]:
                notes.append(f"{result['workload']} {result['events']:,}: the tools disagree "
                             f"on the sessions (see the JSON)")
        label = " and ".join(f"{r['events']:,}" for r in data["results"])
        notes.append(f"{label} events: median of {data['repeat']} run(s)."
                     f"{_conditions(data)}")
    lines += ["", *(f"* {note}" for note in notes), ""]
    return lines


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    lines = [
        "# Benchmarks",
        "",
        "Generated by `python -m benchmarks.report` from the JSON in `docs/bench/`, which the "
        "harness scripts in `benchmarks/` write. Benchmarks report numbers; nothing here is "
        "asserted by the test suite. Re-run them with `make bench`.",
        "",
    ]
    for section in (store_section, engine_section, spark_section, peers_section,
                    static_section):
        lines += section()
    extra = DOCS / "bench" / "notes.md"
    if extra.exists():
        lines += [extra.read_text().rstrip(), ""]
    (DOCS / "benchmarks.md").write_text("\n".join(lines))
    log.info("wrote %s", DOCS / "benchmarks.md")


if __name__ == "__main__":
    main()
