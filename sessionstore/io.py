"""Reading events from files and writing sessions to files, for the CLI and the main job.

Inputs are JSON Lines, CSV or Parquet, read as Arrow record batches so that large files stream
through the engine's batch path. Outputs are written so that a run resumed from its committed
state neither loses nor duplicates rows: a JSON Lines or CSV file is truncated back to the size
recorded at the last commit, and a Parquet output is a directory of one part per commit.
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.json as pajson
import pyarrow.parquet as pq

from .engine import Emit

FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".csv": "csv",
           ".parquet": "parquet", ".pq": "parquet"}


class InputError(ValueError):
    """An input file cannot be read as asked; the message is meant for a person."""


def file_format(path: str | os.PathLike[str], name: str) -> str:
    """The format of ``path`` from its extension. Raises InputError for an unknown one."""
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise InputError(f"{name} {str(path)!r}: unknown format {suffix or '(none)'!r}; use "
                         f".jsonl, .csv or .parquet")
    return FORMATS[suffix]


def read_batches(path: str | os.PathLike[str], batch_rows: int = 65_536) -> Iterator[pa.RecordBatch]:
    """Stream the rows of a JSON Lines, CSV or Parquet file as Arrow record batches.

    Raises:
        InputError: the file is missing, unreadable or not valid for its format.
    """
    fmt = file_format(path, "input")
    if not os.path.isfile(path):
        raise InputError(f"input {str(path)!r} does not exist or is not a file")
    try:
        if fmt == "parquet":
            yield from pq.ParquetFile(path).iter_batches(batch_size=batch_rows)
        elif fmt == "csv":
            reader = pacsv.open_csv(path, read_options=pacsv.ReadOptions(block_size=1 << 22))
            yield from reader
        else:
            opener = getattr(pajson, "open_json", None)
            if opener is not None:
                yield from opener(path, read_options=pajson.ReadOptions(block_size=1 << 22))
            else:
                yield from pajson.read_json(path).to_batches(max_chunksize=batch_rows)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read {str(path)!r} as {fmt}: {_first_line(exc)}") from None


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def column(batch: pa.RecordBatch, name: str) -> pa.Array:
    """A column by name. Raises InputError naming the columns there are."""
    index = batch.schema.get_field_index(name)
    if index < 0:
        raise InputError(f"input has no column {name!r} (columns: {batch.schema.names})")
    return batch.column(index)


def time_column_ms(batch: pa.RecordBatch, name: str) -> pa.Array:
    """Event times as int64 milliseconds: integers are taken as ms; timestamps and ISO-8601
    strings are converted."""
    values = column(batch, name)
    if values.null_count:
        raise InputError(f"time column {name!r} holds nulls")
    kind = values.type
    try:
        if pa.types.is_integer(kind):
            return pc.cast(values, pa.int64())
        if pa.types.is_timestamp(kind):
            return pc.cast(pc.cast(values, pa.timestamp("ms", tz=kind.tz)), pa.int64())
        if pa.types.is_string(kind) or pa.types.is_large_string(kind):
            parsed = pc.cast(values, pa.timestamp("ms"))
            return pc.cast(parsed, pa.int64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise InputError(f"time column {name!r}: {_first_line(exc)}") from None
    raise InputError(f"time column {name!r} must hold integer milliseconds, timestamps or "
                     f"ISO-8601 strings, not {kind}")


def rows_of(batch: pa.RecordBatch, names: Sequence[str]) -> list[Any]:
    """The values of ``names`` per row: a scalar for one name, a tuple for several."""
    columns = [column(batch, n).to_pylist() for n in names]
    if len(columns) == 1:
        only: list[Any] = columns[0]
        return only
    return list(zip(*columns, strict=True))


class SessionWriter:
    """Writes emitted sessions; resumable at a committed position (see the module docstring).

    Args:
        path: the output file (.jsonl, .csv) or directory (.parquet).
        key_names: names of the key fields in the output.
        value_names: the aggregation outputs, in order.
        with_retraction: add a ``retracted`` field (update mode).
        position: the committed position to resume from (``None`` for a new output).
    """

    def __init__(self, path: str | os.PathLike[str], key_names: Sequence[str],
                 value_names: Sequence[str], with_retraction: bool,
                 position: dict[str, Any] | None = None) -> None:
        self.path = Path(path)
        self.format = file_format(path, "output")
        self.key_names = list(key_names)
        self.value_names = list(value_names)
        self.with_retraction = with_retraction
        self.fields = [*self.key_names, "session_start_ms", "session_end_ms",
                       *self.value_names, *(["retracted"] if with_retraction else [])]
        self.rows_written = 0
        if self.format == "parquet":
            self.parts = 0 if position is None else int(position["parts"])
            self.path.mkdir(parents=True, exist_ok=True)
            for part in self.path.glob("part-*.parquet"):
                if int(part.stem.split("-")[1]) >= self.parts:
                    part.unlink()  # written after the last commit: it will be written again
        else:
            size = 0 if position is None else int(position["bytes"])
            if position is None and self.path.exists():
                self.path.unlink()
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.touch()
            if self.path.stat().st_size < size:
                raise InputError(f"output {str(self.path)!r} is shorter than its committed size "
                                 f"{size}: it was changed outside sessionstore")
            with open(self.path, "r+b") as handle:
                handle.truncate(size)
            self.size = size

    def _record(self, emit: Emit) -> dict[str, Any]:
        key = emit.session.key
        keys = [key] if len(self.key_names) == 1 else list(key)
        record = dict(zip(self.key_names, keys, strict=True))
        record["session_start_ms"] = emit.session.start
        record["session_end_ms"] = emit.session.end
        value = emit.value
        if isinstance(value, dict) and set(self.value_names) <= set(value):
            record.update((name, value[name]) for name in self.value_names)
        else:
            record[self.value_names[0]] = value
        if self.with_retraction:
            record["retracted"] = emit.retraction
        return record

    def write(self, emits: Sequence[Emit]) -> None:
        """Append ``emits`` and make them durable (fsync) before the caller commits."""
        records = [self._record(e) for e in emits]
        self.rows_written += len(records)
        if self.format == "parquet":
            if records:
                table = pa.Table.from_pylist(records)
                target = self.path / f"part-{self.parts:06d}.parquet"
                pq.write_table(table, target)
                self.parts += 1
            return
        buffer = io.StringIO()
        if self.format == "jsonl":
            for record in records:
                buffer.write(json.dumps(record, default=str) + "\n")
        else:
            writer = csv.DictWriter(buffer, fieldnames=self.fields)
            if self.size == 0:
                writer.writeheader()
            writer.writerows({k: _csv_cell(v) for k, v in r.items()} for r in records)
        data = buffer.getvalue().encode()
        with open(self.path, "ab") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        self.size += len(data)

    def position(self) -> dict[str, Any]:
        """What to commit with the state so that a resumed run continues here."""
        if self.format == "parquet":
            return {"parts": self.parts}
        return {"bytes": self.size}


def _csv_cell(value: Any) -> Any:
    return json.dumps(value) if isinstance(value, list | dict) else value
