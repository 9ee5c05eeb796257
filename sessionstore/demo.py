"""The main job on the embedded default (``make run``).

Generates a deterministic sample clickstream (1.2M events: heavy-tailed gaps, out-of-order and
late events), sessionizes it with the RocksDB store and emit-on-close, writes the sessions to
``out/sessions.jsonl``, prints a summary of the longest and busiest sessions and writes a
histogram of session lengths to ``out/session_lengths.png``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from tqdm import tqdm

from . import aggspec
from .engine import EmitStrategy, SessionAggregator
from .io import SessionWriter, engine_columns
from .report import SessionSummary
from .sample import PAGES, generate
from .store import SessionStore
from .timeutil import INT64_MAX
from .windows import SessionWindows

log = logging.getLogger("sessionstore.demo")
AGGREGATIONS = ["clicks=count", "revenue_cents=sum:amount", "landing_page=first:page",
                "exit_page=last:page"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_200_000)
    parser.add_argument("--out", default="out/sessions.jsonl")
    parser.add_argument("--png", default="out/session_lengths.png")
    parser.add_argument("--batch", type=int, default=200_000)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    stream = generate(args.events)
    users = pc.binary_join_element_wise("user", pc.cast(pa.array(stream.users), pa.string()), "")
    # a numpy array of str converts to Arrow slowly; the seven pages go through a dictionary
    names = np.unique(PAGES)
    pages = pa.DictionaryArray.from_arrays(
        pa.array(np.searchsorted(names, stream.pages).astype(np.int32)), pa.array(names)
    ).cast(pa.string())
    events = pa.table({"user": users,
                       "ts": stream.times_ms, "page": pages, "amount": stream.amounts})
    windows = SessionWindows("30 minutes", grace_ms="5 minutes")
    lateness = 10_000
    planned = aggspec.plan(aggspec.parse_specs(AGGREGATIONS), events.schema)
    summary = SessionSummary("clicks")
    log.info("sessionizing %s events (gap 30 min, grace 5 min) into %s", f"{len(events):,}",
             args.out)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="sessionstore-demo-") as state:
        store = SessionStore(state, retention_ms=windows.retention_ms + lateness)
        engine = SessionAggregator(store, windows, planned.aggregation,
                                   emit=EmitStrategy.ON_WINDOW_CLOSE,
                                   max_out_of_orderness_ms=lateness)
        writer = SessionWriter(args.out, ["user"], planned.output_names, with_retraction=False)
        with tqdm(total=len(events), unit=" events", unit_scale=True, file=sys.stderr,
                  mininterval=0.5) as bar:
            for batch in events.to_batches(max_chunksize=args.batch):
                keys, values = engine_columns(batch, ["user"], planned.value_columns)
                emits = engine.process_batch(keys, values, batch.column("ts"))
                writer.write(emits)
                summary.add(emits)
                bar.update(batch.num_rows)
        emits = engine.advance_watermark(INT64_MAX)
        writer.write(emits)
        summary.add(emits)
        engine.commit({"events": len(events)})
        metrics = engine.metrics
        store.close()
    elapsed = time.perf_counter() - started
    result = {
        "events_in": len(events),
        "sessions_out": writer.rows_written,
        "late_events_dropped": int(metrics["dropped-records"]),
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
