"""The ``sessionstore`` command: sessionize files, inspect a state directory, run a benchmark.

Errors are one line on stderr (exit status 2); ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import aggregations
from .aggregations import Aggregation
from .engine import EmitStrategy, SessionAggregator
from .io import InputError, SessionWriter, read_batches, rows_of, time_column_ms
from .store import SessionStore
from .timeutil import INT64_MAX, duration_ms
from .windows import SessionWindows

log = logging.getLogger("sessionstore.cli")
_AGG_KINDS = {"sum": aggregations.sum_of, "min": aggregations.min_of,
              "max": aggregations.max_of, "first": aggregations.first_of,
              "last": aggregations.last_of, "collect": aggregations.collect}


class CliError(ValueError):
    """A problem with the command line or its inputs, shown as one line."""


def parse_aggregations(specs: Sequence[str]) -> tuple[dict[str, tuple[str, str | None]], list[str]]:
    """``["n=count", "total=sum:amount"]`` -> ({name: (kind, column)}, value columns)."""
    plan: dict[str, tuple[str, str | None]] = {}
    columns: list[str] = []
    for spec in specs or ["events=count"]:
        name, sep, rest = spec.partition("=")
        if not sep or not name:
            raise CliError(f"--agg {spec!r}: expected NAME=count or NAME=KIND:COLUMN")
        if name in plan:
            raise CliError(f"--agg {spec!r}: {name!r} is given twice")
        if rest == "count":
            plan[name] = ("count", None)
            continue
        kind, sep, col = rest.partition(":")
        if not sep or kind not in _AGG_KINDS or not col:
            raise CliError(f"--agg {spec!r}: KIND must be count or one of "
                           f"{', '.join(_AGG_KINDS)}, as NAME=KIND:COLUMN")
        plan[name] = (kind, col)
        if col not in columns:
            columns.append(col)
    return plan, columns


def build_aggregation(plan: dict[str, tuple[str, str | None]], columns: list[str]) -> Aggregation:
    parts: dict[str, Aggregation] = {}
    for name, (kind, col) in plan.items():
        if kind == "count":
            parts[name] = aggregations.count()
        else:
            assert col is not None
            parts[name] = _AGG_KINDS[kind](_Picker(columns.index(col), len(columns)))
    return aggregations.combine(parts)


class _Picker:
    """Reads one value column of a row (rows are tuples when there are several columns)."""

    def __init__(self, index: int, width: int) -> None:
        self.index = index
        self.width = width

    def __call__(self, row: Any) -> Any:
        return row if self.width == 1 else row[self.index]


def _duration(text: str, name: str) -> int:
    try:
        return duration_ms(text, name)
    except (TypeError, ValueError) as exc:
        raise CliError(str(exc)) from None


def cmd_sessionize(args: argparse.Namespace) -> int:
    gap = _duration(args.gap, "--gap")
    grace = _duration(args.grace, "--grace")
    lateness = _duration(args.max_out_of_order, "--max-out-of-order")
    try:
        windows = SessionWindows(gap, grace)
    except ValueError as exc:
        raise CliError(str(exc).replace("gap_ms", "--gap").replace("grace_ms", "--grace")) from None
    plan, value_columns = parse_aggregations(args.agg)
    aggregation = build_aggregation(plan, value_columns)
    keys = [k.strip() for k in args.key.split(",") if k.strip()]
    emit = EmitStrategy.ON_WINDOW_CLOSE if args.emit == "final" else EmitStrategy.ON_WINDOW_UPDATE
    fingerprint = hashlib.sha1(json.dumps(
        [os.path.abspath(args.input), keys, args.time, gap, grace, lateness, args.emit,
         sorted(plan.items())]).encode()).hexdigest()
    temp = None
    state = args.state
    if state is None:
        temp = tempfile.TemporaryDirectory(prefix="sessionstore-")
        state = temp.name
    store = SessionStore(state, retention_ms=windows.retention_ms + lateness)
    try:
        engine = SessionAggregator(store, windows, aggregation, emit=emit,
                                   max_out_of_orderness_ms=lateness)
        committed = engine.committed_metadata or {}
        if committed and committed.get("fingerprint") != fingerprint:
            raise CliError(f"--state {state!r} belongs to another input or other options; use a "
                           f"new state directory")
        offset = int(committed.get("offset", 0))
        writer = SessionWriter(args.out, keys, list(plan), emit is EmitStrategy.ON_WINDOW_UPDATE,
                               committed.get("output"))
        if committed:
            log.info("resuming at input row %d (state version %d)", offset,
                     store.committed_version)
        summary = _run(args, engine, writer, keys, value_columns, offset, fingerprint)
    finally:
        store.close()
        if temp is not None:
            temp.cleanup()
    sys.stdout.write(json.dumps(summary) + "\n")
    return 0


def _run(args: argparse.Namespace, engine: SessionAggregator, writer: SessionWriter,
         keys: list[str], value_columns: list[str], offset: int, fingerprint: str) -> dict[str, Any]:
    seen = 0
    since_commit = 0
    pending: list[Any] = []
    started = time.perf_counter()
    processed = 0
    progress = _progress(args.progress, "events")

    def commit(position: int) -> None:
        writer.write(pending + engine.flush())
        pending.clear()
        engine.commit({"fingerprint": fingerprint, "offset": position,
                       "output": writer.position()})

    for batch in read_batches(args.input, args.batch_rows):
        rows = batch.num_rows
        if seen + rows <= offset:
            seen += rows
            continue
        if seen < offset:
            batch = batch.slice(offset - seen)
            seen = offset
        times = time_column_ms(batch, args.time)
        key_values = rows_of(batch, keys)
        values = rows_of(batch, value_columns) if value_columns else [None] * batch.num_rows
        try:
            pending.extend(engine.process_batch(key_values, values, times))
        except (TypeError, ValueError) as exc:
            raise CliError(f"input rows {seen}..{seen + batch.num_rows - 1}: {exc}") from None
        seen += batch.num_rows
        processed += batch.num_rows
        since_commit += batch.num_rows
        progress.update(batch.num_rows)
        if since_commit >= args.commit_every:
            commit(seen)
            since_commit = 0
    pending.extend(engine.advance_watermark(INT64_MAX))
    commit(seen)
    progress.close()
    elapsed = time.perf_counter() - started
    metrics = engine.metrics
    return {
        "events_in": processed,
        "sessions_out": writer.rows_written,
        "late_dropped": int(metrics["dropped-records"]),
        "events_per_s": round(processed / elapsed) if elapsed > 0 else None,
        "output": str(args.out),
    }


class _NoProgress:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _progress(enabled: bool, unit: str, total: int | None = None) -> Any:
    if not enabled:
        return _NoProgress()
    from tqdm import tqdm

    return tqdm(total=total, unit=f" {unit}", unit_scale=True, file=sys.stderr,
                mininterval=0.5)


def cmd_inspect(args: argparse.Namespace) -> int:
    path = Path(args.state)
    if not (path / "checkpoints").is_dir():
        raise CliError(f"{str(path)!r} is not a sessionstore state directory (no checkpoints/)")
    versions = sorted(p.name for p in (path / "checkpoints").iterdir() if p.name.startswith("v"))
    with SessionStore(path, retention_ms=0) as store:
        segments = []
        interval = store.segment_interval_ms
        for seg in store.live_segments():
            lo, hi = seg * interval, (seg + 1) * interval - 1
            sessions = list(store.find_sessions(lo, hi))
            segments.append({
                "segment": seg, "end_from_ms": lo, "end_to_ms": hi, "sessions": len(sessions),
                "sample": [[repr(s.key), s.start, s.end] for s, _ in sessions[: args.sample]],
            })
        report = {
            "path": str(path),
            "versions": versions,
            "committed_version": store.committed_version,
            "metadata": store.committed_metadata,
            "segment_interval_ms": interval,
            "observed_stream_time_ms": store.observed_stream_time,
            "segments": segments,
        }
    sys.stdout.write(json.dumps(report, indent=2, default=repr) + "\n")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from .sample import bid_stream

    bidders, times = bid_stream(args.events)
    keys, stamps = bidders.tolist(), times.tolist()
    windows = SessionWindows(10_000)
    results = {}
    for path in (["process", "process_batch"] if args.path == "both" else [args.path]):
        with tempfile.TemporaryDirectory() as tmp:
            store = SessionStore(tmp, retention_ms=windows.retention_ms + 200)
            engine = SessionAggregator(store, windows, aggregations.count(),
                                       emit=EmitStrategy.ON_WINDOW_CLOSE,
                                       max_out_of_orderness_ms=200)
            start = time.perf_counter()
            if path == "process":
                for key, t in zip(keys, stamps, strict=True):
                    engine.process(key, None, t)
            else:
                for i in range(0, len(keys), 100_000):
                    engine.process_batch(keys[i:i + 100_000], [None] * len(keys[i:i + 100_000]),
                                         stamps[i:i + 100_000])
            engine.advance_watermark(INT64_MAX)
            engine.commit()
            results[path] = round(args.events / (time.perf_counter() - start))
            store.close()
    sys.stdout.write(json.dumps({"workload": "nexmark-q11", "events": args.events,
                                 "events_per_s": results}) + "\n")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sessionstore",
        description="Session windows on a segmented RocksDB session store.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    sub = parser.add_subparsers(dest="command", required=True)

    s = sub.add_parser("sessionize", help="sessionize a JSON Lines, CSV or Parquet file",
                       description="Sessionize INPUT and write one row per session to --out. "
                                   "With --state, a crashed or interrupted run resumes where "
                                   "it committed, without losing or duplicating sessions.")
    s.add_argument("input", help="input file: .jsonl, .csv or .parquet")
    s.add_argument("--key", required=True, help="key column, or several separated by commas")
    s.add_argument("--time", required=True,
                   help="event-time column: integer ms, timestamps or ISO-8601 strings")
    s.add_argument("--gap", required=True, help="inactivity gap, e.g. 30m or '10 minutes'")
    s.add_argument("--grace", default="0", help="how long late events may still change a "
                                                "session (default 0)")
    s.add_argument("--max-out-of-order", default="0",
                   help="how far event time may run backwards before events count as late")
    s.add_argument("--emit", choices=["final", "update"], default="final",
                   help="final: each session once (default); update: every change")
    s.add_argument("--agg", action="append", default=[], metavar="NAME=KIND[:COLUMN]",
                   help="aggregation, repeatable: n=count, total=sum:amount, "
                        "first_page=first:page, pages=collect:page (default events=count)")
    s.add_argument("--state", help="state directory; reuse it to resume an interrupted run")
    s.add_argument("--out", required=True, help="output: .jsonl, .csv, or a .parquet directory")
    s.add_argument("--commit-every", type=int, default=200_000, metavar="ROWS",
                   help="commit state and output every ROWS input rows (default 200000)")
    s.add_argument("--batch-rows", type=int, default=65_536, help=argparse.SUPPRESS)
    s.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True,
                   help="show a progress bar on stderr")
    s.set_defaults(func=cmd_sessionize)

    i = sub.add_parser("inspect", help="show a state directory's versions and segments",
                       description="Print versions, committed metadata, segments with their "
                                   "time ranges and counts, and sample sessions, as JSON.")
    i.add_argument("state", help="state directory written by sessionize --state")
    i.add_argument("--sample", type=int, default=3, help="sample sessions per segment")
    i.set_defaults(func=cmd_inspect)

    b = sub.add_parser("bench", help="run the standalone Nexmark q11 benchmark",
                       description="Count bids per bidder in 10 s sessions on RocksDB and "
                                   "report events/s (the full harness is benchmarks/).")
    b.add_argument("--events", type=int, default=1_000_000)
    b.add_argument("--path", choices=["process", "process_batch", "both"], default="both")
    b.set_defaults(func=cmd_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        result: int = args.func(args)
        return result
    except (CliError, InputError, ValueError, TypeError, OSError) as exc:
        if args.debug:
            raise
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        sys.stderr.write(f"sessionstore: error: {message}\n")
        return 2


if __name__ == "__main__":
    sys.exit(main())
