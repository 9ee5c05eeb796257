"""Reading input files: formats, resolving and opening an input, streaming its record batches.

Inputs are read through ``pyarrow.dataset``: one file, a directory (Hive-partitioned or not), or
a glob, of JSON Lines, CSV or Parquet. Files are read one after another in path order, as Arrow
record batches, so that large inputs stream through the engine's batch path and a resumed run can
skip exactly the rows it already committed. JSON Lines files nested too deep are refused before
the parser sees them.
"""

from __future__ import annotations

import glob
import json
import os
import re
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.json as pajson

from .json_guard import (
    COMPILED_FROM_BYTES,
    DEEP,
    OFFENCE,
    guard_block,
    guard_kernel,
    new_state,
)

if TYPE_CHECKING:  # importing pyarrow.dataset costs about a second (it loads pandas)
    import pyarrow.dataset as ds

FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".csv": "csv",
           ".parquet": "parquet", ".pq": "parquet"}
#: Tab-separated inputs: read as CSV with a tab delimiter (inputs only; outputs are CSV).
TSV_SUFFIXES = (".tsv", ".tab")
#: Deeper JSON values are refused before the JSON parser sees them: the parser recurses and
#: crashes the process (a value 20,000 deep segfaults it). 1,000 is Jackson's default
#: ``maxNestingDepth``, which Spark's JSON reader inherits.
MAX_JSON_DEPTH = 1000
#: The UTF-8 byte order mark some tools write at the start of a text file. pyarrow's CSV
#: reader skips it; its JSON dataset reader fails on it with a parse error that names neither.
UTF8_BOM = b"\xef\xbb\xbf"
#: The key types ``--key-type`` may declare; without it, CSV and partition keys are strings.
KEY_TYPES = {"string": pa.string(), "int64": pa.int64(), "binary": pa.binary()}
_BLOCK = 1 << 22
#: The CSV fields read as null: pyarrow's defaults but the spellings of NaN ("NaN", "nan" and
#: their negatives), which are float values (a NaN makes a sum NaN, as Spark reads them) and are
#: how sessionstore's own CSV output writes NaN.
CSV_NULLS = [v for v in pacsv.ConvertOptions().null_values
             if v.lower().lstrip("-") != "nan"]


class InputError(ValueError):
    """An input file cannot be read as asked; the message is meant for a person."""


def file_format(path: str | os.PathLike[str], name: str) -> str:
    """The format of ``path`` from its extension: ``jsonl``, ``csv`` or ``parquet``. An input
    (``name == "input"``) may also be ``.tsv`` or ``.tab``, read as CSV separated by tabs.

    Raises:
        InputError: an unknown extension, naming ``name`` and the path.
    """
    suffix = Path(path).suffix.lower()
    if name == "input" and suffix in TSV_SUFFIXES:
        return "csv"
    if suffix not in FORMATS:
        known = ".jsonl, .csv, .tsv or .parquet" if name == "input" else ".jsonl, .csv or .parquet"
        raise InputError(f"{name} {str(path)!r}: unknown format {suffix or '(none)'!r}; use "
                         f"{known}")
    return FORMATS[suffix]


def csv_delimiter(files: Sequence[Path], delimiter: str | None) -> str:
    """The delimiter of CSV-like ``files``: ``delimiter`` when given (``\\t`` and ``tab``
    name a tab), else a tab for ``.tsv``/``.tab`` files and a comma for ``.csv`` files.

    Raises:
        InputError: naming ``--delimiter``: not one character, or files of both kinds without it.
    """
    if delimiter is not None:
        named = {"\\t": "\t", "tab": "\t"}.get(delimiter.lower(), delimiter)
        if len(named) != 1 or named in "\r\n\"":
            raise InputError(f"--delimiter must be one character (or \\t / tab), got "
                             f"{delimiter!r}")
        return named
    found = {"\t" if f.suffix.lower() in TSV_SUFFIXES else "," for f in files}
    if len(found) > 1:
        raise InputError("the input mixes .csv and .tsv files: give --delimiter")
    return found.pop()


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


def open_input(spec: str, *, key_columns: Sequence[str], key_type: str | None = None,
               delimiter: str | None = None) -> InputSource:
    """Resolve ``spec`` and open it as a dataset.

    Args:
        spec: a file, a directory (``name=value`` sub-directories are Hive partitions) or a glob.
        key_columns: read as strings in CSV files and partition paths, where types are guessed,
            unless ``key_type`` declares another type (``007`` and ``7`` stay two keys).
        key_type: a name in :data:`KEY_TYPES`: the key columns are read as, or cast to, it in
            every format.
        delimiter: the field delimiter of CSV input (see :func:`csv_delimiter`); refused for
            other formats.

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
    if delimiter is not None and fmt != "csv":
        raise InputError(f"--delimiter applies to CSV and TSV input; {spec!r} is {fmt}")
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
            parse_options=pacsv.ParseOptions(delimiter=csv_delimiter(files, delimiter)),
            convert_options=pacsv.ConvertOptions(
                column_types={k: key_arrow for k in key_columns}, null_values=CSV_NULLS))
    else:
        compiled = _compiled_guard(sum(f.stat().st_size for f in files))
        for f in files:
            check_json_depth(f, compiled=compiled)
        # newlines_in_values: without it, pyarrow's dataset reader reads a file holding one
        # record and no final newline as one row of nulls (pyarrow 26); measured at no cost
        file_format_obj = ds.JsonFileFormat(
            read_options=pajson.ReadOptions(block_size=_BLOCK),
            parse_options=pajson.ParseOptions(newlines_in_values=True))
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
        if partition_columns:
            assert root is not None
            _refuse_partition_columns_in_files(dataset, partition_columns, root)
        typed = _decoded(_typed_nulls(dataset) or dataset.schema)
        if typed != dataset.schema:
            dataset = ds.dataset([str(f) for f in files], schema=typed, format=file_format_obj,
                                 partitioning=partitioning,
                                 partition_base_dir=str(root) if root is not None else None)
    except (pa.ArrowException, OSError, UnicodeDecodeError) as exc:
        raise _read_error(spec, fmt, exc) from None
    return InputSource(spec, all_files, fmt, root, dataset, partition_columns)


def _refuse_partition_columns_in_files(dataset: ds.Dataset, names: Sequence[str],
                                       root: Path) -> None:
    """Refuse a file that holds a column named like one of its partition directories
    (``user=a/part.jsonl`` with a ``user`` column): pyarrow, as Spark, would silently read the
    directory's value in place of the file's, so an event of user ``b`` stored there would join
    user ``a``'s sessions. Each file's schema is read (a Parquet footer, the first block of a
    text file).

    Raises:
        InputError: naming the file, the column and the directory level.
    """
    for fragment in dataset.get_fragments():
        held = [n for n in names if n in fragment.physical_schema.names]
        if held:
            levels = Path(fragment.path).relative_to(root).parts[:-1]
            level = next((p for p in levels if p.startswith(f"{held[0]}=")), held[0])
            raise InputError(f"input file {fragment.path!r} holds a column {held[0]!r}, which "
                             f"is also its partition ({level}/): which of the two holds the "
                             f"value is ambiguous; remove the column from the file or the "
                             f"directory level")


def _typed_nulls(dataset: ds.Dataset) -> pa.Schema | None:
    """The dataset's schema with each column of type null (no value in the first file, from
    which pyarrow infers the schema) typed as the first other file that has values in it types
    it; None when no column is null or no other file types one. A file whose values then do
    not fit that type fails to read, naming itself, as any file that disagrees does."""
    nulls = {f.name for f in dataset.schema if pa.types.is_null(f.type)}
    if not nulls:
        return None
    types: dict[str, pa.DataType] = {}
    for fragment in dataset.get_fragments():
        physical = fragment.physical_schema
        for name in nulls - types.keys():
            index = physical.get_field_index(name)
            if index >= 0 and not pa.types.is_null(physical.field(index).type):
                types[name] = physical.field(index).type
        if len(types) == len(nulls):
            break
    if not types:
        return None
    return pa.schema([f.with_type(types.get(f.name, f.type)) for f in dataset.schema])


def _decoded(schema: pa.Schema) -> pa.Schema:
    """``schema`` with dictionary columns (pandas' categoricals, kept in pandas' Parquet files)
    read as their values, which keys and aggregations take."""
    return pa.schema([f.with_type(f.type.value_type) if pa.types.is_dictionary(f.type) else f
                      for f in schema], metadata=schema.metadata)


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


def check_json_depth(path: Path, limit: int = MAX_JSON_DEPTH, block_bytes: int = 1 << 20, *,
                     compiled: bool | None = None) -> None:
    """Refuse a JSON Lines file with a value nested deeper than ``limit``, or with a record that
    is not a JSON object, before parsing.

    One pass over the file, in blocks of ``block_bytes`` whose state carries into the next (see
    :mod:`sessionstore.io.json_guard` for the rule). The depth is counted over the whole file,
    so a record may span lines and is as deep as its nesting however it is written. Outside
    every object, only whitespace and the ``{`` that opens the next record may appear: a bare
    ``null``, number, string, ``true``, ``false`` or array there is refused. pyarrow's JSON
    reader refuses most of those itself, but a block that starts with a bare ``null`` crashes
    the process (pyarrow 26), so none reaches it.

    Args:
        compiled: scan with the compiled kernel (True) or with array operations (False), with
            the same answer; None takes the kernel for a file of ``COMPILED_FROM_BYTES`` or more,
            or once numba is loaded.

    Raises:
        InputError: naming the file and the line of the first offence: where the nesting first
            goes deeper than ``limit``, or the first value outside every object; or a file that
            starts with a UTF-8 byte order mark.
        ValueError: a negative ``limit`` or a ``block_bytes`` below 1.
    """
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    if block_bytes < 1:
        raise ValueError(f"block_bytes must be >= 1, got {block_bytes}")
    if compiled is None:
        compiled = _compiled_guard(path.stat().st_size)
    if compiled:
        from ..jit import compiled as compile_kernel

        scan = compile_kernel(guard_kernel)
    else:
        scan = guard_block
    state = new_state()
    buffer = bytearray(block_bytes)
    data = np.frombuffer(buffer, dtype=np.uint8)
    lines_before = 0
    with open(path, "rb") as handle:
        if handle.read(len(UTF8_BOM)) == UTF8_BOM:
            raise InputError(f"input {str(path)!r} line 1: starts with a UTF-8 byte order mark, "
                             f"which pyarrow's JSON Lines reader does not take; save the file "
                             f"without it (refused before parsing)")
        handle.seek(0)
        while stop := handle.readinto(buffer):
            at = scan(data, stop, state, limit)
            if at >= 0:
                line = lines_before + buffer.count(b"\n", 0, at) + 1
                if state[OFFENCE] == DEEP:
                    raise InputError(f"input {str(path)!r} line {line}: JSON nested deeper than "
                                     f"{limit} levels; refused before parsing")
                raise InputError(f"input {str(path)!r} line {line}: {_stray_kind(buffer[at])}, "
                                 f"not an object (JSON Lines holds one object per record); "
                                 f"refused before parsing")
            lines_before += buffer.count(b"\n", 0, stop)


def _compiled_guard(input_bytes: int) -> bool:
    """Whether to scan ``input_bytes`` of JSON Lines with the compiled guard: numba's import
    costs more than the array form takes below :data:`COMPILED_FROM_BYTES`."""
    return input_bytes >= COMPILED_FROM_BYTES or "numba" in sys.modules


def _stray_kind(byte: int) -> str:
    """What a JSON value that starts (or, for a string, ends) with ``byte`` is, in the words of
    :func:`_json_kind`."""
    kinds = {ord("["): "array", ord('"'): "string", ord("t"): "boolean", ord("f"): "boolean",
             ord("n"): "null", ord("-"): "number", **{c: "number" for c in b"0123456789"}}
    kind = kinds.get(byte)
    return f"a JSON {kind}" if kind is not None else f"a stray {chr(byte)!r}"
