"""The main job on the embedded default (``make run``).

Generates a deterministic sample clickstream (1.2M events: heavy-tailed gaps, out-of-order and
late events), sessionizes it with the RocksDB store and emit-on-close, writes the sessions to
``out/sessions.jsonl`` and prints a summary.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

from tqdm import tqdm

from . import aggregations
from .engine import EmitStrategy, SessionAggregator
from .io import SessionWriter
from .sample import generate
from .store import SessionStore
from .timeutil import INT64_MAX
from .windows import SessionWindows

log = logging.getLogger("sessionstore.demo")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_200_000)
    parser.add_argument("--out", default="out/sessions.jsonl")
    parser.add_argument("--batch", type=int, default=200_000)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    stream = generate(args.events)
    windows = SessionWindows("30 minutes", grace_ms="5 minutes")
    lateness = 10_000
    aggregation = aggregations.combine({
        "clicks": aggregations.count(),
        "revenue_cents": aggregations.sum_of(lambda row: row[1]),
        "landing_page": aggregations.first_of(lambda row: row[0]),
        "exit_page": aggregations.last_of(lambda row: row[0]),
    })
    keys = [f"user{u}" for u in stream.users.tolist()]
    values = list(zip(stream.pages.tolist(), stream.amounts.tolist(), strict=True))
    times = stream.times_ms
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="sessionstore-demo-") as state:
        store = SessionStore(state, retention_ms=windows.retention_ms + lateness)
        engine = SessionAggregator(store, windows, aggregation, emit=EmitStrategy.ON_WINDOW_CLOSE,
                                   max_out_of_orderness_ms=lateness)
        writer = SessionWriter(args.out, ["user"], ["clicks", "revenue_cents", "landing_page",
                                                     "exit_page"], with_retraction=False)
        with tqdm(total=len(keys), unit=" events", unit_scale=True, file=sys.stderr,
                  mininterval=0.5) as bar:
            for i in range(0, len(keys), args.batch):
                j = i + args.batch
                writer.write(engine.process_batch(keys[i:j], values[i:j], times[i:j]))
                bar.update(min(j, len(keys)) - i)
        writer.write(engine.advance_watermark(INT64_MAX))
        engine.commit({"events": len(keys)})
        metrics = engine.metrics
        store.close()
    elapsed = time.perf_counter() - started
    summary = {
        "events_in": len(keys),
        "sessions_out": writer.rows_written,
        "late_events_dropped": int(metrics["dropped-records"]),
        "seconds": round(elapsed, 2),
        "events_per_s": round(len(keys) / elapsed),
        "output": str(Path(args.out)),
    }
    log.info("%s", json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
