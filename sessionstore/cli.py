"""The ``sessionstore`` command: sessionize files, inspect a state directory, run a benchmark.

Errors are one line on stderr (exit status 2); ``--debug`` shows the traceback instead. A run
never loses input: it refuses an output or state that overlaps the input, records the input's
identity and the output's place with every commit, and refuses to resume against anything else.
"""

from __future__ import annotations

import argparse
import errno
import fnmatch
import glob
import hashlib
import json
import logging
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import aggregations, aggspec
from .aggspec import AggSpec
from .fsutil import pid_alive, remove_dead
from .io import (
    KEY_TYPES,
    TIME_UNITS,
    InputError,
    InputSource,
    ReplacedOutput,
    SessionWriter,
    check_gap_column,
    engine_batch,
    file_format,
    first_line,
    gap_column_ms,
    identity_difference,
    input_identity,
    iter_batches,
    open_input,
    time_column_ms,
)
from .locking import is_locked
from .metrics_export import (
    MetricsServer,
    MetricsSnapshot,
    engine_registry,
    read_engine,
    require_prometheus,
    write_metrics_file,
)
from .report import SessionSummary
from .sample import SAMPLE_EVENTS
from .timeutil import INT64_MAX, INT64_MIN, duration_ms
from .windows import SessionWindows

if TYPE_CHECKING:  # the engine and the store load only for the runs that use them
    from .engine import Emit, SessionAggregator
    from .store import SessionStore

log = logging.getLogger("sessionstore.cli")
_TEMP_PREFIX = "sessionstore-cli-"
_TEMP_NAME = re.compile(re.escape(_TEMP_PREFIX) + r"(\d+)-")
_SESSION_COLUMNS = ("session_start_ms", "session_end_ms", "retracted")
#: The exit status of a run that completed but dropped more than --max-dropped-share of its
#: events as late (2 is an error: nothing was done).
EXIT_DROPPED = 3


class CliError(ValueError):
    """A problem with the command line or its inputs, shown as one line."""


def _duration(text: str, name: str, time_unit: str | None) -> int:
    """A duration flag in ms. A bare number is milliseconds, as integer times are without
    ``--time-unit``; beside another ``--time-unit`` it could mean either, so it is refused
    (0 excepted)."""
    try:
        millis = duration_ms(text, name)
    except (TypeError, ValueError) as exc:
        raise CliError(str(exc)) from None
    if millis and time_unit not in (None, "ms") and text.strip().isdigit():
        raise CliError(f"{name} {text.strip()} has no unit, and --time-unit {time_unit} says "
                       f"the times are not milliseconds: write it with its unit, e.g. "
                       f"{text.strip()}s or {text.strip()}ms")
    return millis


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def check_paths(source: InputSource, out: str, state: str | None) -> None:
    """Refuse an ``--out`` or ``--state`` that is, holds or lies inside the input, and a
    ``--state`` that overlaps ``--out``. Paths are compared resolved (symlinks, ``..``), and
    existing files by inode too (hard links).

    Raises:
        CliError: naming both paths.
    """
    out_path = Path(out).resolve()
    state_path = Path(state).resolve() if state is not None else None
    roots = [source.root.resolve()] if source.root is not None else []
    for f in source.files:
        real = f.resolve()
        same = out_path.exists() and os.path.samefile(out_path, real)
        if same or _inside(real, out_path):
            raise CliError(f"--out {out!r} resolves to the input file {str(f)!r}: writing it "
                           f"would destroy the input")
        if state_path is not None and _inside(real, state_path):
            raise CliError(f"--state {state!r} holds the input file {str(f)!r}")
    for root in roots:
        if _inside(out_path, root):
            raise CliError(f"--out {out!r} is inside the input directory {str(root)!r}: the "
                           f"output would be read as input")
        if state_path is not None and _inside(state_path, root):
            raise CliError(f"--state {state!r} is inside the input directory {str(root)!r}")
    if glob.has_magic(source.spec) and fnmatch.fnmatch(str(out_path),
                                                         os.path.abspath(source.spec)):
        raise CliError(f"--out {out!r} matches the input glob {source.spec!r}: the output "
                       f"would be read as input")
    if state_path is not None and (_inside(state_path, out_path) or _inside(out_path,
                                                                          state_path)):
        raise CliError(f"--state {state!r} and --out {out!r} overlap; give them separate "
                       f"places")


def sweep_stale_temp_states(root: Path | None = None) -> int:
    """Remove temporary state directories left by CLI runs that died (SIGKILL, power loss).

    Each run names its directory after its process id. A directory is removed only when that
    process is gone and no process holds its store's lock (a run in another PID namespace
    sharing the temporary directory still holds its lock), and never one this process may not
    look into (another user's, in a shared temporary directory). Returns how many were removed.
    """
    def dead(entry: Path) -> bool:
        match = _TEMP_NAME.match(entry.name)
        return match is not None and entry.is_dir() and not pid_alive(int(match.group(1))) \
            and not is_locked(entry / "LOCK")

    return remove_dead(Path(root or tempfile.gettempdir()), _TEMP_PREFIX, dead)


def _port_error(port: int, exc: OSError) -> CliError:
    return CliError(f"--metrics-port {port}: cannot serve metrics on 127.0.0.1:{port}: "
                    f"{first_line(exc)}")


def _check_port(port: int) -> None:
    """Refuse a ``--metrics-port`` that cannot be bound, before anything is opened or written
    (the server itself starts with the run, once the metrics exist)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the HTTP server does
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as exc:
            raise _port_error(port, exc) from None


def _check_metrics_file(path: str) -> None:
    """Refuse a ``--metrics-file`` whose directory is missing or not writable, before the run
    (the file is written at each commit and at the end)."""
    folder = Path(path).resolve().parent
    if not folder.is_dir():
        raise CliError(f"--metrics-file {path!r}: the directory {str(folder)!r} does not exist")
    if not os.access(folder, os.W_OK):
        raise CliError(f"--metrics-file {path!r}: the directory {str(folder)!r} is not "
                       f"writable")
    if Path(path).is_dir():
        raise CliError(f"--metrics-file {path!r} is a directory; name a file (*.prom)")


def _terminate(signum: int, frame: Any) -> None:
    # SIGTERM and SIGHUP unwind like Ctrl-C, so that ``finally`` blocks clean up
    raise SystemExit(128 + signum)


def _options_fingerprint(args: argparse.Namespace, keys: list[str], specs: list[AggSpec],
                         windows: list[Any]) -> str:
    # "columnar-1": the accumulators of process_table's plan (aggspec.columnar_plan); a state
    # written with another layout is refused as written "with other options"
    described = [keys, args.time, *windows, args.emit, args.key_type,
                 [(s.name, s.kind, s.column) for s in specs], "columnar-1"]
    # how the input is parsed; recorded only when given, so that older states still resume
    described += [[flag, value] for flag, value in (("--time-unit", args.time_unit),
                                                    ("--delimiter", args.delimiter))
                  if value is not None]
    # the unit of an integer gap column, unless it is the milliseconds every state before it
    # was written with: a state whose gaps were read as ms is not resumed in another unit
    if args.gap_column is not None and args.gap_unit not in (None, "ms"):
        described.append(["--gap-unit", args.gap_unit])
    return hashlib.sha256(json.dumps(described).encode()).hexdigest()[:32]


def _check_resume(committed: dict[str, Any], state: str, options: str,
                  identity: dict[str, Any], out: Path, out_format: str) -> None:
    if committed.get("options") != options:
        raise CliError(f"--state {state!r} was written with other options (key, time, gap, "
                       f"gap column, max gap, max duration, grace, lateness, emit, aggregations "
                       f"or key type); use a new state directory")
    change = identity_difference(committed.get("input", {}), identity)
    if change is not None:
        raise CliError(f"--state {state!r} belongs to another input: {change}; resuming would "
                       f"skip or repeat rows. Use a new state directory")
    output = committed.get("output", {})
    if output.get("format") != out_format or output.get("path") != str(out):
        raise CliError(f"--state {state!r} writes {output.get('format')} output to "
                       f"{output.get('path')!r}; resume with that --out, or use a new state "
                       f"directory")


def _close_quietly(store: SessionStore) -> None:
    # after a failure, a second error from close() must not hide the first one
    try:
        store.close()
    except Exception as exc:  # noqa: BLE001 - reported at debug level, the first error wins
        log.debug("closing the store after an error also failed: %s", exc)


def _windows(args: argparse.Namespace) -> tuple[SessionWindows, list[Any]]:
    """The session windows of ``--gap`` or ``--gap-column``/``--max-gap``, ``--grace`` and
    ``--max-duration``, and what of them the options fingerprint records.

    Raises:
        CliError: naming the flag: both or neither of --gap and --gap-column, --max-gap without
            --gap-column or missing with it, a non-positive or unparsable duration.
    """
    if args.gap is not None and args.gap_column is not None:
        raise CliError("--gap and --gap-column exclude each other: give a fixed gap or a gap "
                       "column")
    if args.gap is None and args.gap_column is None:
        raise CliError("one of --gap (a fixed gap) or --gap-column (a gap per event) is required")
    if args.gap_column is not None and args.max_gap is None:
        raise CliError(f"--gap-column {args.gap_column!r} needs --max-gap: the state must be "
                       f"kept as long as the largest gap an event may have")
    if args.gap_column is None and args.max_gap is not None:
        raise CliError("--max-gap applies to --gap-column only (a fixed --gap is its own "
                       "maximum)")
    if args.gap_column is None and args.gap_unit is not None:
        raise CliError("--gap-unit applies to --gap-column only (a fixed --gap says its unit, "
                       "e.g. 30m)")
    grace = _duration(args.grace, "--grace", args.time_unit)
    gap = None if args.gap is None else _duration(args.gap, "--gap", args.time_unit)
    max_gap = None if args.max_gap is None else _duration(args.max_gap, "--max-gap", args.time_unit)
    max_duration = None if args.max_duration is None else _duration(
        args.max_duration, "--max-duration", args.time_unit)
    try:
        windows = SessionWindows(gap, grace, max_gap_ms=max_gap, max_duration_ms=max_duration)
    except ValueError as exc:
        text = str(exc)
        for name, flag in (("max_gap_ms", "--max-gap"), ("max_duration_ms", "--max-duration"),
                           ("gap_ms", "--gap"), ("grace_ms", "--grace")):
            text = text.replace(name, flag)
        raise CliError(text) from None
    return windows, [args.gap_column, max_gap, max_duration, gap, grace]


def cmd_sessionize(args: argparse.Namespace) -> int:
    windows, described_windows = _windows(args)
    lateness = _duration(args.max_out_of_order, "--max-out-of-order", args.time_unit)
    if lateness < 0:
        raise CliError(f"--max-out-of-order must be >= 0, got {lateness} ms")
    if windows.retention_ms + lateness > INT64_MAX:
        raise CliError(f"the state must be kept for --gap + --grace + --max-out-of-order"
                       f"{' + --max-duration' if args.max_duration is not None else ''} = "
                       f"{windows.retention_ms + lateness} ms, which does not fit in int64")
    for flag, value in (("--commit-every", args.commit_every), ("--batch-rows", args.batch_rows)):
        if value < 1:
            raise CliError(f"{flag} must be >= 1, got {value}")
    if args.metrics_port is not None and not 1 <= args.metrics_port <= 65535:
        raise CliError(f"--metrics-port must be a TCP port in 1..65535, got {args.metrics_port}")
    if args.summary_png is not None and not args.summary:
        raise CliError("--summary-png names where --summary writes its histogram: add --summary")
    if args.summary_png is not None:  # checked now: the histogram is drawn after the run
        if Path(args.summary_png).suffix.lower() != ".png":
            raise CliError(f"--summary-png {args.summary_png!r}: the histogram is a PNG; name "
                           f"a .png file")
        if Path(args.summary_png).is_dir():
            raise CliError(f"--summary-png {args.summary_png!r}: a directory; name a .png "
                           f"file")
    try:
        specs = aggspec.parse_specs(args.agg)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    keys = [k.strip() for k in args.key.split(",") if k.strip()]
    if not keys:
        raise CliError(f"--key {args.key!r} names no column")
    twice = [k for i, k in enumerate(keys) if k in keys[:i]]
    if twice:
        raise CliError(f"--key {args.key!r} names the column {twice[0]!r} twice")
    counts = [s.name for s in specs if s.kind == "count"]
    if args.summary and not counts:
        raise CliError("--summary counts events per session: add an aggregation NAME=count")
    if not 0 <= args.max_dropped_share <= 1:
        raise CliError(f"--max-dropped-share must be a share in 0..1 (0.01 is 1%), got "
                       f"{args.max_dropped_share}")
    source = open_input(args.input, key_columns=keys, key_type=args.key_type,
                        delimiter=args.delimiter)
    for flag, name in [*(("--key", k) for k in keys), ("--time", args.time)]:
        if name not in source.schema.names:
            raise InputError(f"{flag}: input has no column {name!r} (columns: "
                             f"{source.schema.names})")
    if args.gap_column is not None:
        # from here on, the unit the gap column's integers are read in (None: durations)
        args.gap_unit = check_gap_column(source.schema, args.gap_column, keys, args.time,
                                         args.time_unit, args.gap_unit)
    try:
        planned = aggspec.plan(specs, source.schema, scalar_single_column=True)
    except ValueError as exc:
        untyped = [s for s in specs if s.column in source.schema.names
                   and pa.types.is_null(source.schema.field(s.column).type)]
        if untyped:  # say why the column has no type: where its type is inferred, it is empty
            raise CliError(f"--agg {untyped[0].name}={untyped[0].kind}:{untyped[0].column}: "
                           f"the column {untyped[0].column!r} holds no value where its type is "
                           f"read (a Parquet schema, or the first 4 MiB of each text file), so "
                           f"it has none; an aggregation needs a typed column") from None
        raise CliError(f"--agg: {exc}") from None
    clash = [s.name for s in specs if s.name in keys or s.name in _SESSION_COLUMNS]
    if clash:
        raise CliError(f"--agg: output name {clash[0]!r} is also a key or session column; "
                       f"rename it")
    columnar = aggspec.columnar_plan(specs, [*keys, args.time])
    out_format = file_format(args.out, "output")
    check_paths(source, args.out, args.state)
    out_path = Path(args.out).resolve()
    if args.memory_limit is not None and not _bounded(args):
        raise CliError("--memory-limit applies to runs without --state (the bounded path); "
                       "an incremental run keeps its sessions in the store")
    if _bounded(args):
        from .bounded.options import memory_limit_bytes
        from .cli_bounded import run_bounded

        if args.memory_limit is not None:
            try:
                memory_limit_bytes(args.memory_limit)
            except (TypeError, ValueError) as exc:
                raise CliError(str(exc).replace("memory_limit", "--memory-limit")) from None

        session_summary = SessionSummary(counts[0], gap_ms=windows.gap_ms) \
            if args.summary else None
        with ReplacedOutput(args.out) as output:
            report = run_bounded(args, source, keys, specs, planned, windows, session_summary,
                                 lambda times, row: _check_latest(times, row, windows, args),
                                 _progress(args.progress, "events"), output.temporary)
        return _finish(args, report, session_summary, out_path)
    from .engine import EmitStrategy, SessionAggregator
    from .store import SessionStore

    emit = EmitStrategy.ON_WINDOW_CLOSE if args.emit == "final" else EmitStrategy.ON_WINDOW_UPDATE
    options = _options_fingerprint(args, keys, specs, [*described_windows, lateness])
    identity = input_identity(source)
    temp: Path | None = None
    replaced: ReplacedOutput | None = None  # the output of a run without --state
    # the output of a new --state until its first commit (then the output is the state's)
    first: ReplacedOutput | None = None
    state = args.state
    if args.metrics_port is not None or args.metrics_file is not None:
        require_prometheus()  # a missing extra is named before anything is touched
    if args.metrics_port is not None:
        _check_port(args.metrics_port)  # before the state or the output is touched
    if args.metrics_file is not None:
        _check_metrics_file(args.metrics_file)
    if state is None:
        sweep_stale_temp_states()
        temp = Path(tempfile.mkdtemp(prefix=f"{_TEMP_PREFIX}{os.getpid()}-"))
        state = str(temp)
    try:
        if temp is not None:
            replaced = ReplacedOutput(args.out)
        store = SessionStore(state, retention_ms=windows.retention_ms + lateness)
        try:
            engine = SessionAggregator(store, windows, columnar.aggregation, emit=emit,
                                       max_out_of_orderness_ms=lateness)
            committed = engine.committed_metadata or {}
            if committed:
                _check_resume(committed, state, options, identity, out_path, out_format)
            elif replaced is None:
                # written beside --out until the first commit: a run that fails before it
                # leaves an existing --out as it was
                first = ReplacedOutput(args.out)
            key_fields = [source.schema.field(k) for k in keys]
            schema = pa.schema([*key_fields, pa.field("session_start_ms", pa.int64()),
                                pa.field("session_end_ms", pa.int64()), *planned.output_fields,
                                *([pa.field("retracted", pa.bool_())]
                                  if emit is EmitStrategy.ON_WINDOW_UPDATE else [])])
            beside = replaced or first
            writer = SessionWriter(args.out if beside is None else beside.temporary,
                                   keys, planned.output_names,
                                   emit is EmitStrategy.ON_WINDOW_UPDATE,
                                   committed.get("output"), schema=schema,
                                   presence={name: hidden for name, (hidden, _)
                                             in columnar.presence.items()})
            if committed:
                log.info("resuming at input row %d (state version %d)", committed["offset"],
                         store.committed_version)
            run = _Run(args, engine, writer, source, keys, columnar,
                       {"options": options, "input": identity,
                        "output_path": str(out_path)},
                       SessionSummary(counts[0], emit is EmitStrategy.ON_WINDOW_UPDATE,
                                      windows.gap_ms)
                       if args.summary else None, first)
            summary = run.execute(int(committed.get("offset", 0)))
        except BaseException:
            _close_quietly(store)
            raise
        store.close()
        if replaced is not None:
            replaced.commit()
    finally:
        for beside_out in (replaced, first):
            if beside_out is not None:
                beside_out.discard()
        if temp is not None:
            shutil.rmtree(temp, ignore_errors=True)
    summary["path"] = "incremental"
    return _finish(args, summary, run.summary, out_path)


def _bounded(args: argparse.Namespace) -> bool:
    """Whether a run takes the bounded path: it has no ``--state`` to resume, so its input is
    all there, and it asks for nothing that only the incremental engine has (an update
    changelog, the engine's live metrics)."""
    return (args.state is None and args.emit == "final" and args.metrics_port is None
            and getattr(args, "metrics_file", None) is None)


def _finish(args: argparse.Namespace, report: dict[str, Any],
            summary: SessionSummary | None, out_path: Path) -> int:
    """Print the summary, report the drops and the run's JSON report; the exit status is 3 when
    more than ``--max-dropped-share`` of the events were dropped as late, else 0."""
    if summary is not None:
        sys.stderr.write(summary.table() + "\n")
        try:
            png = summary.histogram(args.summary_png or
                                    out_path.parent / f"{out_path.stem}_session_lengths.png")
            report["summary_png"] = str(png)
            sys.stderr.write(f"histogram: {png}\n")
        except ImportError as exc:
            sys.stderr.write(f"{exc}\n")
    events = int(report["events_in"])
    late, invalid = int(report["late_dropped"]), int(report["invalid_gap_dropped"])
    for count, why in ((late, "as late (behind the watermark by more than the gap, --grace and "
                              "--max-out-of-order allow)"),
                       (invalid, "for a null or non-positive --gap-column value")):
        if count:
            sys.stderr.write(f"sessionstore: dropped {count:,} of {events:,} events "
                             f"({_share(count, events)}) {why}\n")
    sys.stdout.write(json.dumps(report) + "\n")
    if events and late / events > args.max_dropped_share:
        sys.stderr.write(f"sessionstore: {_share(late, events)} of the events were dropped as "
                         f"late, more than --max-dropped-share {args.max_dropped_share:g}; the "
                         f"output is written and the state committed. A file sorted by key "
                         f"sessionizes exactly without --state\n")
        return EXIT_DROPPED
    return 0


def _share(count: int, total: int) -> str:
    return f"{100 * count / total:.2f}%" if total else "0%"


def _check_latest(times_ms: pa.Array, first_row: int, windows: SessionWindows,
                  args: argparse.Namespace) -> None:
    """Refuse an event time whose session end plus ``--grace`` would leave int64, naming its
    input row and the flags (the engine would name its row within the batch)."""
    if not len(times_ms):
        return
    limit = windows.latest_event_time_ms
    if pc.max(times_ms).as_py() > limit:
        row = int(np.argmax(times_ms.to_numpy() > limit))
        raise CliError(f"input row {first_row + row}: {args.time} = "
                       f"{times_ms[row].as_py()} is too late: its session end plus "
                       f"--grace would pass the largest int64 time ({INT64_MAX}); the "
                       f"latest time allowed with this --gap and --grace is {limit}")


class _Run:
    """One sessionize run: reads, feeds the engine, writes, commits, and publishes metrics."""

    def __init__(self, args: argparse.Namespace, engine: SessionAggregator,
                 writer: SessionWriter, source: InputSource, keys: list[str],
                 plan: aggspec.ColumnarPlan, identity: dict[str, Any],
                 summary: SessionSummary | None, first: ReplacedOutput | None = None) -> None:
        self.args = args
        self.engine = engine
        self.writer = writer
        self.source = source
        self.keys = keys
        self.plan = plan
        self.value_columns = list(plan.value_names)
        self.identity = identity
        self.summary = summary
        self.first = first  # the output written beside --out until the first commit
        self.pending: list[pa.Table] = []
        self.processed = 0
        self.floored = 0
        self.row_path_batches = 0
        self.seen = 0  # input rows before the batch being fed
        self.max_time_ms: int | None = None
        self.snapshot = MetricsSnapshot()
        self.registry = None if args.metrics_port is None and args.metrics_file is None \
            else engine_registry(self.snapshot)
        self.publish()

    def cli_counters(self) -> dict[str, float]:
        return {"cli-input-records-total": self.processed,
                "cli-output-records-total": self.writer.rows_written,
                "cli-times-floored-to-ms-total": self.floored,
                "cli-row-path-batches-total": self.row_path_batches}

    def metrics(self) -> dict[str, float]:
        """The engine's metrics and the CLI's own counters."""
        return {**self.engine.metrics, **self.cli_counters()}

    def publish(self, write_file: bool = False) -> None:
        """Hand the scraper a fresh reading (after every batch), and with ``write_file`` write
        ``--metrics-file`` too (at each commit and at the end)."""
        if self.registry is None:
            return
        self.snapshot.publish(read_engine(self.engine, self.cli_counters()))
        if write_file and self.args.metrics_file is not None:
            write_metrics_file(self.registry, self.args.metrics_file)

    def emitted(self, emits: list[Emit]) -> None:
        if emits:
            self.pending.append(self.writer.table(emits))

    def commit(self, position: int) -> None:
        self.emitted(self.engine.flush())
        tables = [t for t in self.pending if t.num_rows]
        self.pending = []
        rows = pa.concat_tables(tables) if tables else None
        self.writer.write_table(rows)  # durable (fsynced) before the state that records it
        if self.first is not None and not self.first.done:
            # the first commit of a new state: its output takes --out's place, durably, before
            # the state records it
            self.first.commit()
            self.writer.path = self.first.path
        if self.summary is not None and rows is not None:
            self.summary.add_table(rows, self.keys)
        output = {**self.writer.position(), "path": self.identity["output_path"]}
        try:
            self.engine.commit({"options": self.identity["options"],
                                "input": self.identity["input"], "offset": position,
                                "output": output})
        except OSError:
            raise
        except Exception as exc:  # RocksDB reports I/O errors as a bare Exception
            text = first_line(exc)
            if not text.startswith("IO error"):
                raise
            code = errno.ENOSPC if "No space left" in text else errno.EIO
            raise OSError(code, f"{text} (while committing the state in "
                                f"{self.args.state or 'a temporary directory'})") from None

    def feed(self, batch: pa.RecordBatch) -> None:
        """The one place input reaches the engine: the record batch's columns go to
        ``process_table`` as Arrow arrays. A batch the columnar path cannot take (nulls in an
        aggregated column, decimals) goes to ``process_batch`` row by row instead, counted in
        ``cli-row-path-batches-total``; both give the same sessions."""
        times = time_column_ms(batch, self.args.time, self.seen, self.args.time_unit)
        self.floored += times.floored
        if len(times.millis):
            latest = pc.max(times.millis).as_py()
            if self.args.gap_column is None:
                _check_latest(times.millis, self.seen, self.engine.windows, self.args)
            self.max_time_ms = latest if self.max_time_ms is None else max(self.max_time_ms,
                                                                           latest)
        gap = self.args.gap_column
        gaps = None if gap is None else gap_column_ms(batch, gap, self.engine.windows.max_gap_ms,
                                                      self.seen, self.args.gap_unit)
        prepared = engine_batch(batch, self.keys, self.args.time, times.millis, self.plan, gaps)
        if prepared.columnar:
            out = self.engine.process_table(prepared.table, key=self.keys, time=self.args.time,
                                            gap=prepared.gap_name)
            if out.num_rows:
                self.pending.append(self.writer.engine_table(out))
            return
        self.row_path_batches += 1
        keys, values, times_ms = prepared.rows()
        self.emitted(self.engine.process_batch(keys, values, times_ms, gaps_ms=gaps))

    def execute(self, offset: int) -> dict[str, Any]:
        from .engine.config import closing_watermark_ms

        args = self.args
        seen = offset
        since_commit = 0
        started = time.perf_counter()
        server = None
        if args.metrics_port is not None:
            try:
                server = MetricsServer(self.registry, args.metrics_port)
            except OSError as exc:
                raise _port_error(args.metrics_port, exc) from None
        progress = _progress(args.progress, "events")
        try:
            columns = list(dict.fromkeys([*self.keys, args.time, *self.value_columns,
                                          *([args.gap_column] if args.gap_column else [])]))
            for batch in iter_batches(self.source, columns, skip_rows=offset,
                                      batch_rows=args.batch_rows, key_columns=self.keys,
                                      key_type=args.key_type):
                # split the read batch where a commit falls: commits come every
                # --commit-every rows exactly, whatever the read batch size
                done = 0
                while done < batch.num_rows:
                    rows = min(batch.num_rows - done, args.commit_every - since_commit)
                    part = batch if rows == batch.num_rows else batch.slice(done, rows)
                    self.seen = seen
                    try:
                        self.feed(part)
                    except CliError:
                        raise  # names its row already
                    except (TypeError, ValueError) as exc:
                        raise CliError(f"input rows {seen}..{seen + rows - 1}: {exc}") from None
                    done += rows
                    seen += rows
                    self.processed += rows
                    since_commit += rows
                    progress.update(rows)
                    committing = since_commit >= args.commit_every
                    if committing:
                        self.commit(seen)
                        since_commit = 0
                    self.publish(write_file=committing)
            # The input is over: move W just far enough that every session closes, so the
            # emit-final latency metrics stay meaningful (INT64_MAX would make them huge).
            end = INT64_MAX if self.max_time_ms is None else \
                closing_watermark_ms(self.engine.windows, self.max_time_ms)
            self.emitted(self.engine.advance_watermark(end))
            self.commit(seen)
            self.publish(write_file=True)
        finally:
            progress.close()
            if server is not None:
                server.close()
        elapsed = time.perf_counter() - started
        metrics = self.metrics()
        if self.floored:
            log.warning("%d event times had a sub-millisecond part; each was floored to its "
                        "millisecond", self.floored)
        return {
            "events_in": self.processed,
            "sessions_out": self.writer.rows_written,
            "late_dropped": int(metrics["dropped-records"]
                                - metrics.get("dropped-invalid-gap-records", 0)),
            "invalid_gap_dropped": int(metrics.get("dropped-invalid-gap-records", 0)),
            "times_floored_to_ms": self.floored,
            "events_per_s": round(self.processed / elapsed) if elapsed > 0 else None,
            "output": str(args.out),
            "metrics": metrics,
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
    from .store import ReadOnlySessionStore, committed_versions
    from .store.rocksdb import version_dir_name

    if args.sample < 0:
        raise CliError(f"--sample must be >= 0, got {args.sample}")
    path = Path(args.state)
    if not (path / "checkpoints").is_dir():
        raise CliError(f"{str(path)!r} is not a sessionstore state directory (no checkpoints/)")
    if not committed_versions(path):
        raise CliError(f"{str(path)!r} holds no committed version")
    # the read-only view copies the newest checkpoint and takes no lock: a writer may run
    with ReadOnlySessionStore(path) as view:
        interval = view.segment_interval_ms
        by_segment: dict[int, list[tuple[Any, int, int]]] = {s: [] for s in view.live_segments()}
        for session, _ in view.find_sessions(INT64_MIN, INT64_MAX):
            by_segment.setdefault(session.end // interval, []).append(
                (session.key, session.start, session.end))
        segments = [{
            "segment": seg, "end_from_ms": seg * interval, "end_to_ms": (seg + 1) * interval - 1,
            "sessions": len(items),
            "sample": [[repr(k), s, e] for k, s, e in items[: args.sample]],
        } for seg, items in sorted(by_segment.items())]
        report = {
            "path": str(path),
            "versions": [version_dir_name(v) for v in committed_versions(path)],
            "committed_version": view.version,
            "metadata": view.metadata,
            "segment_interval_ms": interval,
            "observed_stream_time_ms": view.observed_stream_time,
            "segments": segments,
        }
    sys.stdout.write(json.dumps(report, indent=2, default=repr) + "\n")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    if args.events < 1:
        raise CliError(f"--events must be >= 1, got {args.events}")
    from .engine import EmitStrategy, SessionAggregator
    from .sample import bid_stream
    from .store import SessionStore

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


def cmd_sample(args: argparse.Namespace) -> int:
    from .sample import write_sample

    path = write_sample(args.out, args.events)
    sys.stdout.write(json.dumps({"events": args.events, "output": str(path)}) + "\n")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sessionstore",
        description="Session windows on a segmented RocksDB session store.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    sub = parser.add_subparsers(dest="command", required=True)

    s = sub.add_parser("sessionize", help="sessionize JSON Lines, CSV, TSV or Parquet files",
                       description="Sessionize INPUT and write one row per session to --out. "
                                   "With --state, a crashed or interrupted run resumes where "
                                   "it committed, without losing or duplicating sessions.")
    s.add_argument("input", help="a .jsonl, .csv, .tsv or .parquet file, a directory of them "
                                 "(Hive partitions name=value/ included), or a quoted glob")
    s.add_argument("--key", required=True, help="key column, or several separated by commas")
    s.add_argument("--time", required=True,
                   help="event-time column: integers (ms, or see --time-unit), timestamps, "
                        "dates (their midnight, UTC) or ISO-8601 strings")
    s.add_argument("--time-unit", choices=list(TIME_UNITS),
                   help="the unit of an integer --time column: s, ms, us or ns. Without it "
                        "integers are milliseconds, and a column whose values look like epoch "
                        "seconds, microseconds or nanoseconds is refused")
    s.add_argument("--delimiter", metavar="CHAR",
                   help="field delimiter of CSV input (default: a comma; a tab for .tsv and "
                        ".tab files; '\\t' or 'tab' name a tab)")
    s.add_argument("--gap", help="inactivity gap, e.g. 30m, '10 minutes', 7d or 2w (years and "
                                 "months have no fixed length and are refused) (or "
                                 "--gap-column)")
    s.add_argument("--gap-column", metavar="NAME",
                   help="a gap per event, from the column NAME: Arrow durations, or integers "
                        "in the unit of an integer --time column (--time-unit, ms without it) "
                        "or of --gap-unit; a null or non-positive gap drops the event (counted "
                        "in dropped-invalid-gap-records, as Spark filters such rows); needs "
                        "--max-gap")
    s.add_argument("--gap-unit", choices=list(TIME_UNITS),
                   help="the unit of an integer --gap-column: s, ms, us or ns. Without it the "
                        "gaps are in the unit of the integer --time column; beside timestamps, "
                        "dates or ISO-8601 strings, integer gaps need it")
    s.add_argument("--max-gap", metavar="DURATION",
                   help="with --gap-column: the largest gap an event may have (a larger one is "
                        "an error); the state is kept that long")
    s.add_argument("--max-duration", metavar="DURATION",
                   help="cap a session's span: an event at or past start + DURATION starts a "
                        "new session, even within the gap")
    s.add_argument("--grace", default="0", help="how long late events may still change a "
                                                "session (default 0)")
    s.add_argument("--max-out-of-order", default="0",
                   help="how far event time may run backwards before events count as late")
    s.add_argument("--emit", choices=["final", "update"], default="final",
                   help="final: each session once (default); update: every change")
    s.add_argument("--agg", action="append", default=[], metavar="NAME=KIND[:COLUMN]",
                   help="aggregation, repeatable: n=count, total=sum:amount, "
                        "first_page=first:page, pages=collect:page (default events=count)")
    s.add_argument("--state",
                   help="state directory, for incremental runs: reuse it to resume an "
                        "interrupted run or to add new input. Without it the input is all "
                        "there: it is sessionized exactly, whatever its row order, and nothing "
                        "is late")
    s.add_argument("--memory-limit", metavar="SIZE",
                   help="without --state: the memory the sessionizing may use before it "
                        "spills to disk, partitioned by key, e.g. 512MB or 2GiB (default a "
                        "quarter of physical memory, at most 2 GiB)")
    s.add_argument("--max-dropped-share", type=float, default=0.01, metavar="SHARE",
                   help="with --state (or --emit update): exit with status 3 when more than "
                        "SHARE of the events are dropped as late (default 0.01, 1%%); drops "
                        "are always reported on stderr")
    s.add_argument("--out", required=True, help="output: .jsonl, .csv, or a .parquet directory")
    s.add_argument("--commit-every", type=int, default=200_000, metavar="ROWS",
                   help="commit state and output every ROWS input rows (default 200000)")
    s.add_argument("--batch-rows", type=int, default=65_536, help=argparse.SUPPRESS)
    s.add_argument("--key-type", choices=sorted(KEY_TYPES),
                   help="declare the key type; without it, keys in CSV files and partition "
                        "paths are read as strings (so 007 and 7 are two keys)")
    s.add_argument("--metrics-port", type=int, metavar="PORT",
                   help="serve Prometheus metrics on 127.0.0.1:PORT/metrics while running, "
                        "updated after every input batch (needs the prometheus extra)")
    s.add_argument("--metrics-file", metavar="PATH",
                   help="write the metrics in Prometheus' text format to PATH (a *.prom file "
                        "for node_exporter's textfile collector) at each commit and at the "
                        "end, replacing it atomically, so a short job stays observable after "
                        "it exits (needs the prometheus extra)")
    s.add_argument("--summary", action="store_true",
                   help="print the longest and busiest sessions and write a histogram PNG")
    s.add_argument("--summary-png", metavar="PATH",
                   help="the .png file where --summary writes its histogram (default: beside "
                        "--out)")
    s.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True,
                   help="show a progress bar on stderr")
    s.set_defaults(func=cmd_sessionize)

    i = sub.add_parser("inspect", help="show a state directory's versions and segments",
                       description="Print versions, committed metadata, segments with their "
                                   "time ranges and counts, and sample sessions, as JSON.")
    i.add_argument("state", help="state directory written by sessionize --state")
    i.add_argument("--sample", type=int, default=3,
                   help="sample sessions shown per segment (default 3)")
    i.set_defaults(func=cmd_inspect)

    g = sub.add_parser("sample", help="write the sample clickstream to a file",
                       description="Write the deterministic sample clickstream that make run "
                                   "sessionizes (columns user, ts in epoch milliseconds, page, "
                                   "amount in cents, gap_ms a gap per event; arrival order, "
                                   "some events late) to a .parquet, .csv, .tsv or .jsonl file.")
    g.add_argument("--out", required=True, help="the file to write (its format by extension)")
    g.add_argument("--events", type=int, default=SAMPLE_EVENTS,
                   help=f"about how many events (default {SAMPLE_EVENTS})")
    g.set_defaults(func=cmd_sample)

    b = sub.add_parser("bench", help="run the standalone Nexmark q11 benchmark",
                       description="Count bids per bidder in 10 s sessions on RocksDB and "
                                   "report events/s (the full harness is benchmarks/).")
    b.add_argument("--events", type=int, default=1_000_000,
                   help="how many bids to generate and sessionize (default 1000000)")
    b.add_argument("--path", choices=["process", "process_batch", "both"], default="both",
                   help="measure the event-at-a-time path, the batch path, or both (default)")
    b.set_defaults(func=cmd_bench)
    return parser


#: Options whose value is a duration: a negative one ("-5m") must reach the duration check,
#: which names the flag, rather than argparse, which takes it for an option.
_DURATION_FLAGS = ("--gap", "--grace", "--max-out-of-order", "--max-gap", "--max-duration")
_NEGATIVE_VALUE = re.compile(r"-[0-9.]")


def _attach_negative_durations(argv: Sequence[str]) -> list[str]:
    """``--gap -5m`` as ``--gap=-5m``, so that the flag's own check reports the bad value."""
    out: list[str] = []
    items = list(argv)
    i = 0
    while i < len(items):
        token = items[i]
        if (token in _DURATION_FLAGS and i + 1 < len(items)
                and _NEGATIVE_VALUE.match(items[i + 1])):
            out.append(f"{token}={items[i + 1]}")
            i += 2
            continue
        if token == "--":
            out.extend(items[i:])
            break
        out.append(token)
        i += 1
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(_attach_negative_durations(sys.argv[1:] if argv is None else argv))
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    previous: dict[signal.Signals, Any] = {}
    if args.command == "sessionize":
        for signum in (signal.SIGTERM, signal.SIGHUP):
            previous[signum] = signal.signal(signum, _terminate)
    try:
        result: int = args.func(args)
        return result
    except (CliError, InputError, ValueError, TypeError, OSError, ImportError) as exc:
        if args.debug:
            raise
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        if isinstance(exc, OSError):  # name it: "disk full" must read as such, not as a bug
            message = f"{type(exc).__name__}: {message}"
        sys.stderr.write(f"sessionstore: error: {message or type(exc).__name__}\n")
        return 2
    finally:
        for signum, handler in previous.items():  # main() may run inside another program
            signal.signal(signum, handler)


if __name__ == "__main__":
    sys.exit(main())
