"""Reading events from files and writing sessions to files, for the CLI and the main job.

Inputs are read through ``pyarrow.dataset``: one file, a directory (Hive-partitioned or not), or
a glob, of JSON Lines, CSV or Parquet. Files are read one after another in path order, as Arrow
record batches, so that large inputs stream through the engine's batch path and a resumed run can
skip exactly the rows it already committed. :func:`input_identity` fingerprints every file so that
a run never resumes against changed input.

Outputs are written so that a run resumed from its committed state neither loses nor duplicates
rows: a JSON Lines or CSV file is truncated back to the size recorded at the last commit, and a
Parquet output is a directory of one part per commit. Everything written is fsynced, with its
directory, before the caller commits the state that records it.
"""

from __future__ import annotations

import base64
import csv
import glob
import hashlib
import io
import json
import math
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.json as pajson
import pyarrow.parquet as pq

from .aggspec import ColumnarPlan, from_engine, needs_codec, to_engine
from .engine import Emit
from .store.rocksdb import fsync_dir

if TYPE_CHECKING:  # importing pyarrow.dataset costs about a second (it loads pandas)
    import pyarrow.dataset as ds

FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".csv": "csv",
           ".parquet": "parquet", ".pq": "parquet"}
#: Deeper JSON values are refused before the JSON parser sees them: the parser recurses and
#: crashes the process (a value 20,000 deep segfaults it). 1,000 is Jackson's default
#: ``maxNestingDepth``, which Spark's JSON reader inherits.
MAX_JSON_DEPTH = 1000
#: The key types ``--key-type`` may declare; without it, CSV and partition keys are strings.
KEY_TYPES = {"string": pa.string(), "int64": pa.int64(), "binary": pa.binary()}
_TIME_UNIT_PER_MS = {"s": None, "ms": 1, "us": 1_000, "ns": 1_000_000}
_BLOCK = 1 << 22
INT64_MAX_VALUE = (1 << 63) - 1


class InputError(ValueError):
    """An input file cannot be read as asked; the message is meant for a person."""


def file_format(path: str | os.PathLike[str], name: str) -> str:
    """The format of ``path`` from its extension. Raises InputError for an unknown one."""
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise InputError(f"{name} {str(path)!r}: unknown format {suffix or '(none)'!r}; use "
                         f".jsonl, .csv or .parquet")
    return FORMATS[suffix]


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type name when it has none)."""
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


_JSON_TYPE_CHANGE = re.compile(r"Column\((/[^)]*)\) changed from (\w+) to (\w+)")
_JSON_ROW = re.compile(r" in row \d+$")


def _read_error(path: str, fmt: str, exc: BaseException) -> InputError:
    text = first_line(exc)
    if "invalid UTF8" in text:
        text += " (keys are read as UTF-8 text: --key-type binary reads them as raw bytes)"
    if fmt == "jsonl" and _JSON_ROW.search(text) and Path(path).is_file():
        # Arrow counts that row from the start of its 4 MiB block, not of the file: find the
        # line (on the error path only: the file is scanned once more, in Python)
        change = _JSON_TYPE_CHANGE.search(text)
        found = _json_problem_line(Path(path), change.group(1) if change else None)
        if found is not None:
            return InputError(f"cannot read {path!r} as {fmt}: line {found[0]}: {found[1]}")
        text = _JSON_ROW.sub(" (a row of one of the file's 4 MiB blocks)", text)
    return InputError(f"cannot read {path!r} as {fmt}: {text}")


def _json_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object" if isinstance(value, dict) else "null"


def _json_problem_line(path: Path, pointer: str | None) -> tuple[int, str] | None:
    """The first 1-based line of a JSON Lines file that is not a JSON object, or where the value
    at ``pointer`` (``/a/b``) takes another JSON type than on the lines before it (nulls and
    missing values aside), with what is wrong; None when no line is."""
    parts = [p for p in (pointer or "").strip("/").split("/") if p]
    first: str | None = None
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            try:
                value: Any = json.loads(raw.rstrip(b"\r\n"))
            except json.JSONDecodeError as exc:
                return number, f"not valid JSON at column {exc.colno}: {exc.msg}"
            except ValueError as exc:  # bytes that are not UTF-8
                return number, f"not valid JSON: {exc}"
            if not isinstance(value, dict):
                return number, f"a JSON {_json_kind(value)}, not an object"
            if not parts:
                continue
            for part in parts:
                value = value.get(part) if isinstance(value, dict) else None
            kind = _json_kind(value)
            if kind == "null":
                continue
            if first is None:
                first = kind
            elif kind != first:
                return number, (f"{'/'.join(parts)!r} changed from {first} to {kind}; a column "
                                f"must hold one JSON type")
    return None


def _hidden(relative: Path) -> bool:
    # Spark and Hadoop mark metadata (_SUCCESS, .crc, _temporary/) this way; pyarrow skips it too
    return any(part.startswith((".", "_")) for part in relative.parts)


@dataclass
class InputSource:
    """The files of one input and how to read them (see :func:`open_input`).

    Attributes:
        spec: the input as the user gave it.
        files: the data files, sorted by path; the dataset reads them in this order, except
            the blank text files, which hold no rows (see :func:`open_input`).
        format: ``jsonl``, ``csv`` or ``parquet``.
        root: the directory partition values are relative to (a directory input), else None.
        dataset: the ``pyarrow.dataset`` over ``files``.
    """

    spec: str
    files: list[Path]
    format: str
    root: Path | None
    dataset: ds.Dataset
    partition_columns: list[str] = field(default_factory=list)

    @property
    def schema(self) -> pa.Schema:
        """The columns every file is read with (partition columns included)."""
        return self.dataset.schema


def resolve_files(spec: str) -> tuple[list[Path], Path | None]:
    """The data files named by ``spec`` (a file, a directory or a glob), sorted, and the
    directory they are relative to.

    Raises:
        InputError: nothing matches, or a directory holds no data file.
    """
    path = Path(spec)
    if path.is_file():
        return [path], None
    if path.is_dir():
        files = sorted(p for p in path.rglob("*")
                       if p.is_file() and not _hidden(p.relative_to(path)))
        if not files:
            raise InputError(f"input directory {spec!r} holds no data files")
        return files, path
    if glob.has_magic(spec):
        files = sorted(Path(p) for p in glob.glob(spec, recursive=True) if Path(p).is_file())
        if not files:
            raise InputError(f"input glob {spec!r} matches no file")
        return files, None
    raise InputError(f"input {spec!r} does not exist (give a file, a directory or a glob)")


def open_input(spec: str, *, key_columns: Sequence[str], key_type: str | None = None
               ) -> InputSource:
    """Resolve ``spec`` and open it as a dataset.

    Args:
        spec: a file, a directory (``name=value`` sub-directories are Hive partitions) or a glob.
        key_columns: read as strings in CSV files and partition paths, where types are guessed,
            unless ``key_type`` declares another type (``007`` and ``7`` stay two keys).
        key_type: a name in :data:`KEY_TYPES`: the key columns are read as, or cast to, it in
            every format.

    Text files (JSON Lines, CSV) that hold nothing but whitespace hold no rows: Spark and Hadoop
    write such files for empty partitions. They stay part of the input (its identity, the path
    checks) but are not read; an input made only of them is refused.

    Raises:
        InputError: no such input, mixed or unknown formats, unreadable files, a JSON file
            nested deeper than :data:`MAX_JSON_DEPTH`, or no file with any content.
    """
    import pyarrow.dataset as ds

    all_files, root = resolve_files(spec)
    formats = {file_format(f, "input") for f in all_files}
    if len(formats) > 1:
        raise InputError(f"input {spec!r} mixes formats {sorted(formats)}; give one format")
    fmt = formats.pop()
    files = [f for f in all_files if fmt == "parquet" or not _blank_text_file(f)]
    if not files:
        raise InputError(f"input {spec!r} holds no rows: "
                         f"{'its file is' if len(all_files) == 1 else 'every file is'} empty "
                         f"(or only whitespace)")
    key_arrow = KEY_TYPES[key_type] if key_type is not None else pa.string()
    if fmt == "parquet":
        file_format_obj: ds.FileFormat = ds.ParquetFileFormat()
    elif fmt == "csv":
        file_format_obj = ds.CsvFileFormat(
            read_options=pacsv.ReadOptions(block_size=_BLOCK),
            convert_options=pacsv.ConvertOptions(
                column_types={k: key_arrow for k in key_columns}))
    else:
        for f in files:
            check_json_depth(f)
        file_format_obj = ds.JsonFileFormat(read_options=pajson.ReadOptions(block_size=_BLOCK))
    partitioning = None
    partition_columns: list[str] = []
    try:
        if root is not None and any("=" in part for f in files
                                    for part in f.relative_to(root).parts[:-1]):
            found = ds.dataset([str(f) for f in files], format=file_format_obj,
                               partitioning=ds.HivePartitioning.discover(infer_dictionary=False),
                               partition_base_dir=str(root)).partitioning
            assert found is not None
            fields = [pa.field(f.name, key_arrow if f.name in key_columns else f.type)
                      for f in found.schema]
            partitioning = ds.HivePartitioning(pa.schema(fields))
            partition_columns = [f.name for f in fields]
        dataset = ds.dataset([str(f) for f in files], format=file_format_obj,
                             partitioning=partitioning,
                             partition_base_dir=str(root) if root is not None else None)
    except (pa.ArrowException, OSError, UnicodeDecodeError) as exc:
        raise _read_error(spec, fmt, exc) from None
    return InputSource(spec, all_files, fmt, root, dataset, partition_columns)


def _blank_text_file(path: Path, limit: int = 1 << 16) -> bool:
    """True for a text file of at most ``limit`` bytes holding only ASCII whitespace."""
    size = path.stat().st_size
    if size > limit:
        return False
    with open(path, "rb") as handle:
        return not handle.read(limit + 1).strip()


def iter_batches(source: InputSource, columns: Sequence[str], *, skip_rows: int = 0,
                 batch_rows: int = 65_536, key_columns: Sequence[str] = (),
                 key_type: str | None = None) -> Iterator[pa.RecordBatch]:
    """Stream ``columns`` of every file in order, after the first ``skip_rows`` rows.

    Parquet files wholly inside ``skip_rows`` are skipped from their metadata, unread.

    Raises:
        InputError: a missing column, or a file that cannot be read; the message names the file.
    """
    missing = [c for c in columns if c not in source.schema.names]
    if missing:
        raise InputError(f"input has no column {missing[0]!r} (columns: {source.schema.names})")
    seen = 0
    for fragment in source.dataset.get_fragments():
        try:
            if source.format == "parquet" and skip_rows > seen:
                rows = fragment.count_rows()
                if seen + rows <= skip_rows:
                    seen += rows
                    continue
            for batch in fragment.to_batches(schema=source.schema, columns=list(columns),
                                             batch_size=batch_rows, use_threads=False):
                if seen + batch.num_rows <= skip_rows:
                    seen += batch.num_rows
                    continue
                if seen < skip_rows:
                    batch = batch.slice(skip_rows - seen)
                    seen = skip_rows
                seen += batch.num_rows
                # the JSON reader does not check UTF-8; an invalid string fails later, deep in
                # a conversion, unless it is found here
                batch.validate(full=True)
                if key_type is not None:
                    batch = _cast_keys(batch, key_columns, KEY_TYPES[key_type], fragment.path)
                yield batch
        except (pa.ArrowException, OSError,
                UnicodeDecodeError) as exc:
            raise _read_error(fragment.path, source.format, exc) from None


def _cast_keys(batch: pa.RecordBatch, key_columns: Sequence[str], to: pa.DataType,
               path: str) -> pa.RecordBatch:
    arrays = list(batch.columns)
    for name in key_columns:
        index = batch.schema.get_field_index(name)
        if arrays[index].type != to:
            try:
                arrays[index] = pc.cast(arrays[index], to)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise InputError(f"{path!r}: key column {name!r} is not --key-type "
                                 f"{to}: {first_line(exc)}") from None
    return pa.RecordBatch.from_arrays(arrays, names=batch.schema.names)


def check_json_depth(path: Path, limit: int = MAX_JSON_DEPTH, block_bytes: int = 1 << 20) -> None:
    """Refuse a JSON Lines file with a value nested deeper than ``limit``, before parsing.

    The scan is vectorised: quotes not escaped by an odd run of backslashes toggle "inside a
    string", brackets outside strings move the depth, and each line starts afresh. The file is
    read in blocks; the state at a block's end is carried into the next one.

    Raises:
        InputError: naming the file, the line and the limit.
    """
    prefix = b""
    lines_before = 0
    with open(path, "rb") as handle:
        while block := handle.read(block_bytes):
            scan = _scan_depth(prefix + block)
            if scan.deepest > limit:
                raise InputError(f"input {str(path)!r} line {lines_before + scan.line + 1}: "
                                 f"JSON nested deeper than {limit} levels; refused before "
                                 f"parsing")
            lines_before += block.count(b"\n")
            prefix = (b"[" * max(scan.end_level, 0) + (b'"' if scan.end_in_string else b"")
                      + (b"\\" if scan.end_escaping else b""))


@dataclass
class _DepthScan:
    deepest: int  # the deepest nesting of any line
    line: int  # the line it is on, counted from the start of the scanned bytes
    end_level: int  # the state after the last byte, for the next block
    end_in_string: bool
    end_escaping: bool


def _scan_depth(data: bytes) -> _DepthScan:
    a = np.frombuffer(data, dtype=np.uint8)
    n = len(a)
    index = np.arange(n, dtype=np.int64)
    last_plain = np.maximum.accumulate(np.where(a == 0x5C, -1, index))
    quotes = np.flatnonzero(a == 0x22)
    before = quotes - 1
    run = np.where(before >= 0, before - last_plain[np.maximum(before, 0)], 0)
    toggles = np.zeros(n, dtype=np.int64)
    toggles[quotes[run % 2 == 0]] = 1
    newline = a == 0x0A
    line_of = np.cumsum(newline)
    breaks = np.flatnonzero(newline)  # a line's counts start after the newline before it
    flips = np.cumsum(toggles)
    flips -= np.concatenate(([0], flips[breaks]))[line_of]
    in_string = (flips & 1).astype(bool)
    step = ((a == 0x5B) | (a == 0x7B)).astype(np.int64) - ((a == 0x5D) | (a == 0x7D))
    step[in_string] = 0
    level = np.cumsum(step)
    level -= np.concatenate(([0], level[breaks]))[line_of]
    deepest = int(np.argmax(level))
    return _DepthScan(int(level[deepest]), int(line_of[deepest]), int(level[-1]),
                      bool(in_string[-1]), bool((n - 1 - last_plain[-1]) % 2))


def file_identity(path: Path, fmt: str) -> dict[str, Any]:
    """Size, mtime and a content fingerprint of one input file.

    Parquet files are fingerprinted by their footer (row groups, column chunk offsets and sizes,
    statistics), which any rewrite changes; other formats by a BLAKE2b hash of every byte.
    """
    stat = path.stat()
    digest = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as handle:
        if fmt == "parquet" and stat.st_size >= 12:
            handle.seek(stat.st_size - 8)
            tail = handle.read(8)
            footer = int.from_bytes(tail[:4], "little")
            handle.seek(max(stat.st_size - 8 - footer, 0))
            digest.update(b"parquet-footer:" + handle.read(footer + 8))
        else:
            while chunk := handle.read(_BLOCK):
                digest.update(chunk)
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
            "fingerprint": digest.hexdigest()}


def input_identity(source: InputSource) -> dict[str, Any]:
    """What a resumed run must find again: the format and, for every file, its path (relative
    to the input's directory) and :func:`file_identity`."""
    def name(f: Path) -> str:
        return str(f.relative_to(source.root)) if source.root is not None else str(f.resolve())

    return {"format": source.format,
            "files": [{"path": name(f), **file_identity(f, source.format)} for f in source.files]}


def identity_difference(recorded: dict[str, Any], current: dict[str, Any]) -> str | None:
    """How ``current`` differs from ``recorded`` (None when it is the same input).

    The modification time alone does not count: a copy with the same bytes is the same input.
    """
    if recorded.get("format") != current.get("format"):
        return f"its format was {recorded.get('format')}, now {current.get('format')}"
    old = {f["path"]: f for f in recorded.get("files", [])}
    new = {f["path"]: f for f in current.get("files", [])}
    for path in sorted(old.keys() - new.keys()):
        return f"file {path!r} is gone"
    for path in sorted(new.keys() - old.keys()):
        return f"file {path!r} is new"
    for path in sorted(old):
        if old[path]["size"] != new[path]["size"]:
            return f"file {path!r} was {old[path]['size']} bytes, now {new[path]['size']}"
        if old[path]["fingerprint"] != new[path]["fingerprint"]:
            return f"file {path!r} has the same size but different content"
    return None


@dataclass
class TimeColumn:
    """Event times of a batch as int64 ms, and how many of them had a sub-ms part floored."""

    millis: pa.Array
    floored: int


def time_column_ms(batch: pa.RecordBatch, name: str, first_row: int = 0) -> TimeColumn:
    """Event times as int64 milliseconds.

    Integers are taken as ms. Timestamps of any unit, and ISO-8601 strings, are converted;
    finer than ms (µs, ns), they are floored to the millisecond they fall in (towards the past,
    also before 1970), and the count of such rows is returned.

    Args:
        first_row: the input row number of the batch's first row, for error messages.

    Raises:
        InputError: a missing column, a null (naming its input row), or another type.
    """
    index = batch.schema.get_field_index(name)
    if index < 0:
        raise InputError(f"input has no column {name!r} (columns: {batch.schema.names})")
    values = batch.column(index)
    if values.null_count:
        row = _first(values.is_null())
        raise InputError(f"time column {name!r} is null at input row {first_row + row}: every "
                         f"event needs a time")
    kind = values.type
    try:
        if pa.types.is_integer(kind):
            return TimeColumn(pc.cast(values, pa.int64()), 0)
        if pa.types.is_string(kind) or pa.types.is_large_string(kind):
            values = pc.cast(values, pa.timestamp("ns"))
            kind = values.type
        if pa.types.is_timestamp(kind):
            raw = pc.cast(values, pa.int64())
            per_ms = _TIME_UNIT_PER_MS[kind.unit]
            if per_ms is None:
                return TimeColumn(pc.multiply_checked(raw, 1000), 0)
            if per_ms == 1:
                return TimeColumn(raw, 0)
            ticks = raw.to_numpy()
            millis = np.floor_divide(ticks, per_ms)
            floored = int(np.count_nonzero(ticks - millis * per_ms))
            return TimeColumn(pa.array(millis, pa.int64()), floored)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise InputError(f"time column {name!r}: {first_line(exc)}") from None
    raise InputError(f"time column {name!r} must hold integer milliseconds, timestamps or "
                     f"ISO-8601 strings, not {kind}")


def engine_columns(batch: pa.RecordBatch, keys: Sequence[str], value_columns: Sequence[str]
                   ) -> tuple[Any, Any]:
    """Keys and values of a batch in the form ``process_batch`` takes, column by column, in
    their engine representation (:func:`aggspec.to_engine`).

    One key or value column is handed over as its Arrow array when it needs no conversion;
    several become tuples, which is how the engine keys composite keys and how
    :mod:`aggspec` pickers read several values.
    """
    def of(names: Sequence[str]) -> Any:
        converted = [to_engine(batch.column(batch.schema.get_field_index(n))) for n in names]
        if len(names) == 1:
            return converted[0]
        lists = [c.to_pylist() if isinstance(c, pa.Array) else c for c in converted]
        return list(zip(*lists, strict=True))

    values = of(value_columns) if value_columns else [None] * batch.num_rows
    return of(keys), values


@dataclass
class EngineBatch:
    """One input batch in the engine's representation, for ``process_table``.

    Attributes:
        table: the key columns (their input names), the time column as int64 ms (its input
            name) and the value columns under the plan's names, plus the plan's presence
            columns (int64, 1 where the summed value is not null).
        columnar: every column is an Arrow array and no aggregated value is null, so
            ``process_table`` takes it; otherwise :meth:`rows` feeds ``process_batch``.
        gap_name: the column of each event's gap (int64 ms, nulls kept), or None.
    """

    table: pa.Table
    columnar: bool
    key_names: list[str]
    time_name: str
    _lists: dict[str, list[Any]]
    gap_name: str | None = None

    def rows(self) -> tuple[list[Any], list[dict[str, Any]], pa.Array]:
        """Keys, values (a dict per row, as the plan's aggregation reads them) and times, for
        ``process_batch`` (the exact path: decimals, or nulls in an aggregated column)."""
        def column(name: str) -> list[Any]:
            if name in self._lists:
                return self._lists[name]
            return self.table.column(name).to_pylist()  # type: ignore[no-any-return]

        keys = [column(k) for k in self.key_names]
        key_values = keys[0] if len(keys) == 1 else list(zip(*keys, strict=True))
        names = [n for n in self.table.column_names
                 if n not in self.key_names and n not in (self.time_name, self.gap_name)]
        values = [dict(zip(names, row, strict=True))
                  for row in zip(*[column(n) for n in names], strict=True)] \
            if names else [{} for _ in range(self.table.num_rows)]
        return key_values, values, self.table.column(self.time_name)


def engine_batch(batch: pa.RecordBatch, keys: Sequence[str], time_name: str,
                 times_ms: pa.Array, plan: ColumnarPlan, gaps_ms: pa.Array | None = None
                 ) -> EngineBatch:
    """The columns of ``batch`` as the engine's ``process_table`` reads them (see
    :class:`EngineBatch`): no per-row conversion unless a column needs one (decimals).
    ``gaps_ms`` is each event's gap (from :func:`gap_column_ms`), or None for a fixed gap."""
    arrays: dict[str, Any] = {}
    lists: dict[str, list[Any]] = {}
    columnar = True

    def put(name: str, converted: Any) -> None:
        nonlocal columnar
        if isinstance(converted, pa.Array | pa.ChunkedArray):
            arrays[name] = converted
            return
        lists[name] = converted
        columnar = False
        arrays[name] = pa.nulls(len(converted))  # a placeholder: rows() reads the list

    for key in keys:
        put(key, to_engine(batch.column(batch.schema.get_field_index(key))))
    arrays[time_name] = times_ms
    for column, name in plan.value_names.items():
        data = batch.column(batch.schema.get_field_index(column))
        if data.null_count:
            columnar = False
        put(name, to_engine(data))
    for name, column in plan.presence.values():
        valid = pc.is_valid(batch.column(batch.schema.get_field_index(column)))
        arrays[name] = pc.cast(valid, pa.int64())
    gap_name = None
    if gaps_ms is not None:
        gap_name = "__gap_ms"
        while gap_name in arrays:
            gap_name = "_" + gap_name
        arrays[gap_name] = gaps_ms
    return EngineBatch(pa.table(arrays), columnar, list(keys), time_name, lists, gap_name)


def check_gap_column(schema: pa.Schema, name: str, taken: Sequence[str]) -> None:
    """Refuse a ``--gap-column`` the input lacks, that is a key or the time column, or whose
    type is not integer milliseconds or a duration.

    Raises:
        InputError: naming the flag, the column and its type.
    """
    if name not in schema.names:
        raise InputError(f"--gap-column {name!r}: the input has no such column (columns: "
                         f"{schema.names})")
    if name in taken:
        raise InputError(f"--gap-column {name!r} is a key or the time column; the gap needs its "
                         f"own column")
    kind = schema.field(name).type
    if not (pa.types.is_integer(kind) or pa.types.is_duration(kind) or pa.types.is_null(kind)):
        raise InputError(f"--gap-column {name!r} must hold integer milliseconds or durations, "
                         f"not {kind}")


def gap_column_ms(batch: pa.RecordBatch, name: str, max_gap_ms: int, first_row: int
                  ) -> pa.Array:
    """Each event's gap as int64 milliseconds, nulls kept (the engine drops and counts null and
    non-positive gaps).

    Args:
        name: the ``--gap-column``: integers are milliseconds; durations are converted.
        max_gap_ms: ``--max-gap``: a larger gap is refused.
        first_row: the input row of the batch's first row, for messages.

    Raises:
        InputError: a gap above ``max_gap_ms``, or a duration finer than a millisecond that is
            not a whole number of them; naming the flag, the input row and the values.
    """
    values = batch.column(batch.schema.get_field_index(name))
    kind = values.type
    if pa.types.is_null(kind):
        gaps = pa.nulls(len(values), pa.int64())
    elif pa.types.is_integer(kind):
        if pa.types.is_unsigned_integer(kind) and len(values) \
                and (pc.max(values).as_py() or 0) > INT64_MAX_VALUE:
            row = _first(pc.greater(values, INT64_MAX_VALUE))
            raise InputError(f"--gap-column {name!r}: input row {first_row + row}: gap "
                             f"{values[row].as_py()} ms exceeds --max-gap {max_gap_ms} ms")
        gaps = pc.cast(values, pa.int64())
    elif pa.types.is_duration(kind):
        ticks = pc.cast(values, pa.int64())
        per_ms = _TIME_UNIT_PER_MS[kind.unit]
        if per_ms is None:
            gaps = pc.multiply_checked(ticks, 1000)
        elif per_ms == 1:
            gaps = ticks
        else:
            # a non-positive gap is dropped whatever its unit; a positive one must be whole ms
            rest = pc.and_(pc.greater(ticks, 0), pc.not_equal(
                pc.subtract(ticks, pc.multiply(pc.divide(ticks, per_ms), per_ms)), 0))
            if pc.any(rest).as_py():
                row = _first(rest)
                raise InputError(f"--gap-column {name!r}: input row {first_row + row}: gap "
                                 f"{values[row]} is not a whole number of milliseconds")
            gaps = pc.divide(ticks, per_ms)
    else:
        raise InputError(f"--gap-column {name!r} must hold integer milliseconds or durations, "
                         f"not {kind}")
    over = pc.greater(gaps, max_gap_ms)
    if pc.any(over).as_py():
        row = _first(over)
        raise InputError(f"--gap-column {name!r}: input row {first_row + row}: gap "
                         f"{gaps[row].as_py()} ms exceeds --max-gap {max_gap_ms} ms")
    return gaps


def _first(mask: pa.Array) -> int:
    """The index of the first true of a boolean array (nulls are false)."""
    return int(np.argmax(pc.fill_null(mask, False).to_numpy(zero_copy_only=False)))


#: The names of the parts a Parquet output is made of, and of a part being written.
_OWN_PART = re.compile(r"part-(\d{6,})\.parquet")
_OWN_TEMPORARY = re.compile(r"\.part-\d{6,}\.parquet\.inprogress")


class SessionWriter:
    """Writes emitted sessions; resumable at a committed position (see the module docstring).

    JSON Lines and CSV have no form for bytes or for NaN and the infinities: bytes (binary keys,
    collected binary values) are written as base64 text, and non-finite floats as the strings
    ``"NaN"``, ``"Infinity"`` and ``"-Infinity"``, as Spark's JSON writer does; Parquet keeps
    both as they are. A Parquet output is a directory of ``part-NNNNNN.parquet`` files, one per
    commit; a directory holding anything else is refused, never cleaned.

    Args:
        path: the output file (.jsonl, .csv) or directory (.parquet).
        key_names: names of the key fields in the output.
        value_names: the aggregation outputs, in order.
        with_retraction: add a ``retracted`` field (update mode).
        position: the committed position to resume from (``None`` for a new output); it must
            come from :meth:`position` of a writer of the same format.
        schema: the Arrow schema of a Parquet output (inferred from the rows when None).
        presence: output -> the emitted count of its non-null inputs: the output is null where
            that count is 0 (a sum of nothing but nulls is null, as in Spark).

    Raises:
        InputError: the output was shortened or changed outside sessionstore since the commit
            (a JSON Lines or CSV file shorter than committed; a committed Parquet part missing
            or of another size).
    """

    def __init__(self, path: str | os.PathLike[str], key_names: Sequence[str],
                 value_names: Sequence[str], with_retraction: bool,
                 position: dict[str, Any] | None = None, schema: pa.Schema | None = None,
                 presence: dict[str, str] | None = None) -> None:
        self.path = Path(path)
        self.presence = dict(presence or {})
        self.format = file_format(path, "output")
        self.key_names = list(key_names)
        self.value_names = list(value_names)
        self.with_retraction = with_retraction
        self.schema = schema
        self.fields = [*self.key_names, "session_start_ms", "session_end_ms",
                       *self.value_names, *(["retracted"] if with_retraction else [])]
        self.rows_written = 0
        if self.format == "parquet":
            self.parts = 0 if position is None else int(position["parts"])
            # sizes of the committed parts (positions committed before they were recorded
            # have none: those parts are only checked to exist)
            sizes = None if position is None else position.get("part_bytes")
            self.part_bytes: list[int] = [] if sizes is None else [int(b) for b in sizes]
            self._check_parts(sizes is not None)
            self._check_foreign()
            self.path.mkdir(parents=True, exist_ok=True)
            for entry in self.path.iterdir():
                own = _OWN_PART.fullmatch(entry.name)
                if own is not None and int(own.group(1)) >= self.parts:
                    entry.unlink()  # written after the last commit: it will be written again
                elif _OWN_TEMPORARY.fullmatch(entry.name):
                    entry.unlink()
            fsync_dir(self.path)
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
                os.fsync(handle.fileno())
            fsync_dir(self.path.parent)
            self.size = size

    def _check_foreign(self) -> None:
        """Refuse a Parquet output directory holding anything sessionstore did not write (a
        Spark dataset's ``part-00000-<uuid>.snappy.parquet``, ``_SUCCESS``, other files): a run
        replaces its own parts, and must neither delete nor mix with anyone else's."""
        if not self.path.exists():
            return
        if not self.path.is_dir():
            raise InputError(f"output {str(self.path)!r} exists and is not a directory: a "
                             f"Parquet output is a directory of parts")
        foreign = sorted(e.name for e in self.path.iterdir()
                         if not (_OWN_PART.fullmatch(e.name) or _OWN_TEMPORARY.fullmatch(e.name)))
        if foreign:
            raise InputError(f"output {str(self.path)!r} holds {len(foreign)} file(s) "
                             f"sessionstore did not write ({foreign[0]!r}"
                             f"{', ...' if len(foreign) > 1 else ''}); give a new or empty "
                             f"directory")

    def _check_parts(self, sized: bool) -> None:
        """Refuse to resume when a committed Parquet part is gone or resized: its sessions
        would be missing from the output, and the resumed run would not write them again."""
        for index in range(self.parts):
            part = self.path / f"part-{index:06d}.parquet"
            if not part.is_file():
                raise InputError(f"output {str(self.path)!r}: the committed part {part.name} is "
                                 f"missing: it was changed outside sessionstore")
            if sized and part.stat().st_size != self.part_bytes[index]:
                raise InputError(f"output {str(self.path)!r}: the committed part {part.name} is "
                                 f"{part.stat().st_size} bytes, {self.part_bytes[index]} were "
                                 f"committed: it was changed outside sessionstore")

    def _table(self, emits: Sequence[Emit]) -> pa.Table:
        columns: dict[str, list[Any]] = {name: [] for name in self.fields}
        several_keys = len(self.key_names) > 1
        several_values = len(self.value_names) > 1
        for emit in emits:
            session = emit.session
            keys = session.key if several_keys else (session.key,)
            for name, key in zip(self.key_names, keys, strict=True):
                columns[name].append(key)
            columns["session_start_ms"].append(session.start)
            columns["session_end_ms"].append(session.end)
            value = emit.value
            if several_values or (isinstance(value, dict) and self.value_names[0] in value):
                for name in self.value_names:
                    hidden = self.presence.get(name)
                    columns[name].append(None if hidden is not None and value[hidden] == 0
                                         else value[name])
            else:
                columns[self.value_names[0]].append(value)
            if self.with_retraction:
                columns["retracted"].append(emit.retraction)
        if self.schema is None:
            return pa.table({name: pa.array(values) for name, values in columns.items()})
        return pa.Table.from_arrays([from_engine(columns[f.name], f.type) for f in self.schema],
                                    schema=self.schema)

    def table(self, emits: Sequence[Emit]) -> pa.Table:
        """``emits`` as output rows (the output's schema)."""
        return self._table(emits)

    def engine_table(self, out: pa.Table) -> pa.Table:
        """What ``SessionAggregator.process_table`` returned, as output rows: engine
        representations back to the output's types, hidden outputs dropped. Needs
        ``schema``."""
        assert self.schema is not None, "engine_table needs the output schema"
        arrays = []
        for f in self.schema:
            column = out.column(f.name).combine_chunks()
            hidden = self.presence.get(f.name)
            if hidden is not None:
                empty = pc.equal(out.column(hidden).combine_chunks(), 0)
                column = pc.if_else(empty, pa.scalar(None, column.type), column)
            arrays.append(_as_type(column, f.type))
        return pa.Table.from_arrays(arrays, schema=self.schema)

    def write(self, emits: Sequence[Emit]) -> None:
        """Append ``emits`` and make them durable (file and directory fsynced) before the caller
        commits."""
        self.write_table(self._table(emits) if emits else None)

    def write_table(self, table: pa.Table | None) -> None:
        """Append output rows (from :meth:`table` or :meth:`engine_table`), durably, as
        :meth:`write` does."""
        rows = 0 if table is None else table.num_rows
        if self.format == "parquet":
            if rows:
                assert table is not None
                name = f"part-{self.parts:06d}.parquet"
                temporary = self.path / f".{name}.inprogress"
                pq.write_table(table, temporary)
                with open(temporary, "rb") as handle:
                    os.fsync(handle.fileno())
                os.replace(temporary, self.path / name)
                fsync_dir(self.path)
                self.parts += 1
                self.part_bytes.append((self.path / name).stat().st_size)
            self.rows_written += rows
            return
        records = table.to_pylist() if table is not None and rows else []
        recode = _text_codec_columns(table) if records else []
        if recode:
            for record in records:
                for name in recode:
                    record[name] = _text_safe(record[name])
        buffer = io.StringIO()
        if self.format == "jsonl":
            for record in records:
                buffer.write(json.dumps(record, default=str, allow_nan=False) + "\n")
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
        self.rows_written += len(records)

    def position(self) -> dict[str, Any]:
        """What to commit with the state so that a resumed run continues here."""
        if self.format == "parquet":
            return {"format": "parquet", "parts": self.parts, "part_bytes": list(self.part_bytes)}
        return {"format": self.format, "bytes": self.size}


def _as_type(column: pa.Array, data_type: pa.DataType) -> pa.Array:
    """An engine-representation column as ``data_type`` (see :func:`aggspec.from_engine`)."""
    if column.type == data_type:
        return column
    if needs_codec(data_type):
        return from_engine(column.to_pylist(), data_type)
    return column.cast(data_type)


def _csv_cell(value: Any) -> Any:
    if isinstance(value, list | dict):
        return json.dumps(value, default=str, allow_nan=False)
    return value


def _text_codec_columns(table: pa.Table) -> list[str]:
    """The columns of ``table`` holding values JSON has no form for, which :func:`_text_safe`
    must rewrite: bytes anywhere, and NaN or an infinity (a float column is checked in Arrow,
    so that finite floats cost nothing; floats nested in lists or structs are always
    rewritten)."""
    def nested(t: pa.DataType) -> bool:
        if (pa.types.is_binary(t) or pa.types.is_large_binary(t)
                or pa.types.is_fixed_size_binary(t) or pa.types.is_floating(t)):
            return True
        return any(nested(t.field(i).type) for i in range(t.num_fields))

    names = []
    for field_, column in zip(table.schema, table.columns, strict=True):
        if pa.types.is_floating(field_.type):
            finite = pc.is_finite(column)
            if not pc.all(pc.fill_null(finite, True)).as_py():
                names.append(field_.name)
        elif nested(field_.type):
            names.append(field_.name)
    return names


def _text_safe(value: Any) -> Any:
    """``value`` as the JSON Lines and CSV outputs write it, the way Spark's JSON writer does:
    bytes as base64 text (``str(bytes)`` would make ``b"a"`` and the string ``"b'a'"`` one
    key), and NaN and the infinities as the strings ``"NaN"``, ``"Infinity"`` and
    ``"-Infinity"`` (bare, they are not JSON)."""
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, list):
        return [_text_safe(v) for v in value]
    if isinstance(value, dict):
        return {k: _text_safe(v) for k, v in value.items()}
    return value
