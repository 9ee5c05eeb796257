"""``sessionstore sessionize`` without ``--state``: the input is all there, so it is sessionized
by the bounded path (:func:`sessionstore.sessionize`), which gives the offline answer whatever
the row order, with no store, no watermark and no lateness.

The input is read as the incremental path reads it (the same readers, time and gap columns and
refusals), streamed to the bounded path as Arrow record batches, and the sessions are written
with the same columns: the keys, ``session_start_ms``, ``session_end_ms``, then the
aggregations. Only the row order differs: the incremental path writes sessions as they close.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from .aggspec import AggPlan, AggSpec
from .io import InputSource, SessionWriter, gap_column_ms, iter_batches, time_column_ms
from .report import LAST_EVENT_COLUMN, SessionSummary
from .windows import SessionWindows

if TYPE_CHECKING:
    from collections.abc import Callable

#: The bounded path's names for a session's bounds, and the CLI's (integer milliseconds).
_BOUNDS = {"session_start": "session_start_ms", "session_end": "session_end_ms"}


def spec_text(spec: AggSpec) -> str:
    """``spec`` in the aggregation language, ``NAME=KIND[:COLUMN]``."""
    return f"{spec.name}={spec.kind}" + (f":{spec.column}" if spec.column is not None else "")


class _Reader:
    """The input's batches as the bounded path takes them: keys and value columns as read, the
    event time as int64 ms in a column of its own (:attr:`time_name`: a value column may read
    the time column as it is), and each event's gap as int64 ms; events with a null or
    non-positive gap are left out and counted, as the incremental path drops and counts them."""

    def __init__(self, args: argparse.Namespace, source: InputSource, keys: list[str],
                 value_columns: Sequence[str], windows: SessionWindows,
                 check_latest: Callable[[pa.Array, int], None], progress: Any) -> None:
        self.args = args
        self.source = source
        self.keys = keys
        self.columns = list(dict.fromkeys([*keys, args.time, *value_columns,
                                           *([args.gap_column] if args.gap_column else [])]))
        self.kept = [c for c in self.columns
                     if c != args.time or c in keys or c in value_columns]
        self.time_name = "__time_ms"
        while self.time_name in self.columns:
            self.time_name = "_" + self.time_name
        self.windows = windows
        self.check_latest = check_latest
        self.progress = progress
        self.rows = 0
        self.floored = 0
        self.invalid_gap_dropped = 0

    def schema(self) -> pa.Schema:
        fields = [pa.field(c, pa.int64()) if c == self.args.gap_column
                  else self.source.schema.field(c) for c in self.kept]
        return pa.schema([*fields, pa.field(self.time_name, pa.int64())])

    def batches(self) -> Iterator[pa.RecordBatch]:
        args = self.args
        schema = self.schema()
        for batch in iter_batches(self.source, self.columns, batch_rows=args.batch_rows,
                                  key_columns=self.keys, key_type=args.key_type):
            first_row = self.rows
            self.rows += batch.num_rows
            self.progress.update(batch.num_rows)
            for key in self.keys:
                column = batch.column(batch.schema.get_field_index(key))
                if column.null_count:
                    row = first_row + int(pc.index(pc.is_null(column), True).as_py())
                    raise ValueError(f"key column {key!r} is null (None) at input row {row}: "
                                     f"every event needs a key")
            times = time_column_ms(batch, args.time, first_row, args.time_unit)
            self.floored += times.floored
            arrays = {c: batch.column(batch.schema.get_field_index(c)) for c in self.kept}
            arrays[self.time_name] = times.millis
            if args.gap_column is not None:
                gaps = gap_column_ms(batch, args.gap_column, self.windows.max_gap_ms, first_row,
                                     args.gap_unit)
                arrays[args.gap_column] = gaps
                valid = pc.fill_null(pc.greater(gaps, 0), False)
                kept = pc.sum(pc.cast(valid, pa.int64())).as_py() or 0
                if kept < batch.num_rows:
                    self.invalid_gap_dropped += batch.num_rows - kept
                    arrays = {c: pc.filter(a, valid) for c, a in arrays.items()}
            else:
                self.check_latest(times.millis, first_row)
            yield pa.RecordBatch.from_arrays([arrays[f.name] for f in schema], schema=schema)


def run_bounded(args: argparse.Namespace, source: InputSource, keys: list[str],
                specs: Sequence[AggSpec], planned: AggPlan, windows: SessionWindows,
                summary: SessionSummary | None,
                check_latest: Callable[[pa.Array, int], None], progress: Any,
                write_to: Path) -> dict[str, Any]:
    """Sessionize ``source`` on the bounded path and write every session to ``write_to`` (the
    place of ``args.out`` until the run succeeds: see :class:`sessionstore.io.ReplacedOutput`).

    Returns:
        The run's report (printed as JSON by the CLI).

    Raises:
        ValueError / InputError: naming the column, flag or input row at fault.
    """
    from . import sessionize

    started = time.perf_counter()
    value_columns = [s.column for s in specs if s.column is not None]
    reader = _Reader(args, source, keys, value_columns, windows, check_latest, progress)
    aggregations = [spec_text(s) for s in specs]
    if summary is not None:  # the last event time, for the summary's active span
        hidden = LAST_EVENT_COLUMN
        while hidden in {s.name for s in specs} or hidden in keys:
            hidden = "_" + hidden
        aggregations.append(f"{hidden}=max:{reader.time_name}")
    stream = pa.RecordBatchReader.from_batches(reader.schema(), reader.batches())
    try:
        sessions = sessionize(stream, key=keys if len(keys) > 1 else keys[0],
                              time=reader.time_name,
                              gap=args.gap_column if args.gap_column is not None
                              else windows.gap_ms,
                              aggregations=aggregations,
                              max_gap=windows.max_gap_ms if windows.dynamic else None,
                              max_duration=windows.max_duration_ms, inclusive_gap=True,
                              time_unit="ms", memory_limit=args.memory_limit)
    finally:
        progress.close()
    sessions = sessions.rename_columns([_BOUNDS.get(n, n) for n in sessions.column_names])
    key_fields = [source.schema.field(k) for k in keys]
    schema = pa.schema([*key_fields, pa.field("session_start_ms", pa.int64()),
                        pa.field("session_end_ms", pa.int64()), *planned.output_fields])
    rows = pa.Table.from_arrays([sessions.column(f.name).cast(f.type) for f in schema],
                                schema=schema)
    if summary is not None:
        names = [*keys, "session_start_ms", "session_end_ms", summary.count_output]
        summary.add_table(pa.table({**{n: rows.column(n) for n in names},
                                    LAST_EVENT_COLUMN: sessions.column(hidden)}), keys)
    writer = SessionWriter(write_to, keys, planned.output_names, False, None, schema=schema)
    writer.write_table(rows)
    elapsed = time.perf_counter() - started
    return {
        "path": "bounded",
        "events_in": reader.rows,
        "sessions_out": writer.rows_written,
        "late_dropped": 0,
        "invalid_gap_dropped": reader.invalid_gap_dropped,
        "times_floored_to_ms": reader.floored,
        "events_per_s": round(reader.rows / elapsed) if elapsed > 0 else None,
        "output": str(args.out),
    }
