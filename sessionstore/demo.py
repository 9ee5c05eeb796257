"""The main job on the embedded default (``make run``).

Generates a deterministic sample clickstream (1.2M events: heavy-tailed gaps, out-of-order and
late events), sessionizes it with :func:`sessionstore.sessionize` (the bounded path: the sample
is all there, so every event counts, whatever its arrival order), writes the sessions to
``out/sessions.jsonl``, prints a summary of the longest and busiest sessions and writes a
histogram of session lengths to ``out/session_lengths.png``.

The same sample, written by ``sessionstore sample --out events.parquet``, goes through the CLI
as the README shows; with ``--state`` it goes through the incremental engine instead.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import pyarrow as pa

from . import aggspec
from .io import SessionWriter
from .report import LAST_EVENT_COLUMN, SessionSummary
from .sample import SAMPLE_EVENTS, clickstream_table

log = logging.getLogger("sessionstore.demo")
AGGREGATIONS = ["clicks=count", "revenue_cents=sum:amount", "landing_page=first:page",
                "exit_page=last:page"]
GAP = "30 minutes"
GAP_MS = 30 * 60_000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=SAMPLE_EVENTS)
    parser.add_argument("--out", default="out/sessions.jsonl")
    parser.add_argument("--png", default="out/session_lengths.png")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    log.info("sessionizing a sample of about %s events (gap %s) into %s", f"{args.events:,}",
             GAP, args.out)
    started = time.perf_counter()
    events = clickstream_table(args.events)
    from . import sessionize

    sessions = sessionize(events, key="user", time="ts", gap=GAP, time_unit="ms",
                          aggregations=[*AGGREGATIONS, f"{LAST_EVENT_COLUMN}=max:ts"])
    log.info("%s events in, %s sessions out", f"{len(events):,}", f"{sessions.num_rows:,}")
    planned = aggspec.plan(aggspec.parse_specs(AGGREGATIONS), events.schema)
    rows = pa.table({"user": sessions.column("user"),
                     "session_start_ms": sessions.column("session_start"),
                     "session_end_ms": sessions.column("session_end"),
                     **{name: sessions.column(name) for name in planned.output_names}})
    writer = SessionWriter(args.out, ["user"], planned.output_names, with_retraction=False)
    writer.write_table(rows)
    summary = SessionSummary("clicks", gap_ms=GAP_MS)
    summary.add_table(rows.append_column(LAST_EVENT_COLUMN, sessions.column(LAST_EVENT_COLUMN)),
                      ["user"])
    elapsed = time.perf_counter() - started
    result = {
        "events_in": len(events),
        "sessions_out": writer.rows_written,
        "events_dropped": 0,
        "seconds": round(elapsed, 2),
        "events_per_s": round(len(events) / elapsed),
        "output": str(Path(args.out)),
    }
    log.info("%s\n\n%s\n", json.dumps(result, indent=2), summary.table())
    try:
        log.info("histogram of session lengths: %s", summary.histogram(args.png))
    except ImportError as exc:
        log.info("%s", exc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
