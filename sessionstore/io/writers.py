"""Writing sessions to files, resumably.

Outputs are written so that a run resumed from its committed state neither loses nor duplicates
rows: a JSON Lines or CSV file is truncated back to the size recorded at the last commit, and a
Parquet output is a directory of one part per commit. Everything written is fsynced, with its
directory, before the caller commits the state that records it. A run that has no state to
resume from writes beside the output and replaces it only when it succeeds
(:class:`ReplacedOutput`).
"""

from __future__ import annotations

import base64
import csv
import io
import json
import math
import os
import re
import shutil
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from ..aggspec import from_engine, needs_codec
from ..fsutil import fsync_dir, pid_alive
from .readers import InputError, file_format, first_line

if TYPE_CHECKING:
    from ..engine import Emit

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
        check_output_place(self.path, self.format)

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
        :meth:`write` does. A table of no rows is written to a Parquet output that has no part
        yet, so that an output of no sessions still has its schema (a reader of an empty
        directory finds no columns); ``None`` writes nothing."""
        rows = 0 if table is None else table.num_rows
        if self.format == "parquet":
            if table is not None and (rows or self.parts == 0):
                name = f"part-{self.parts:06d}.parquet"
                temporary = self.path / f".{name}.inprogress"
                import pyarrow.parquet as pq

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
            encode = json.JSONEncoder(default=str, allow_nan=False).encode  # one for all rows
            for record in records:
                buffer.write(encode(record) + "\n")
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


def check_output_place(path: Path, fmt: str) -> None:
    """Refuse an output place that is not the output's kind: a directory where a JSON Lines or
    CSV file goes, a file where a Parquet output (a directory of parts) goes, or a Parquet
    directory holding anything sessionstore did not write (a Spark dataset's
    ``part-00000-<uuid>.snappy.parquet``, ``_SUCCESS``, other files): a run replaces its own
    parts, and must neither delete nor mix with anyone else's.

    Raises:
        InputError: naming the output.
    """
    if not path.exists():
        return
    if fmt != "parquet":
        if path.is_dir():
            raise InputError(f"output {str(path)!r} is a directory: a {fmt} output is a file")
        return
    if not path.is_dir():
        raise InputError(f"output {str(path)!r} exists and is not a directory: a "
                         f"Parquet output is a directory of parts")
    foreign = sorted(e.name for e in path.iterdir()
                     if not (_OWN_PART.fullmatch(e.name) or _OWN_TEMPORARY.fullmatch(e.name)))
    if foreign:
        raise InputError(f"output {str(path)!r} holds {len(foreign)} file(s) "
                         f"sessionstore did not write ({foreign[0]!r}"
                         f"{', ...' if len(foreign) > 1 else ''}); give a new or empty "
                         f"directory")


class ReplacedOutput:
    """The output of a run that has no state to resume from, written beside its place and moved
    there only when the run succeeds, so that a failure (an error, a full disk, Ctrl-C) leaves
    the previous output as it was and no partial one that reads as complete.

    The run writes to :attr:`temporary`, a hidden sibling (``.NAME.inprogress-PID.EXT``, which
    Spark and pyarrow skip when they read the directory). :meth:`commit` renames it over the
    output (a Parquet directory that exists is moved aside first, then removed);
    :meth:`discard` removes it and the directories made for it. As a context manager it commits
    when the block succeeds and discards otherwise.

    Args:
        path: the output (.jsonl, .csv, or a .parquet directory); through a symlink, the place
            it points to.

    Raises:
        InputError: the output's place does not suit it (:func:`check_output_place`).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        # an output through a symlink is written where the link points; the link stays
        self.path = Path(os.path.realpath(path)) if Path(path).is_symlink() else Path(path)
        self.format = file_format(path, "output")
        check_output_place(self.path, self.format)
        self.created: list[Path] = []  # the missing directories made for it, outermost first
        missing = self.path.parent
        while not missing.exists():
            self.created.insert(0, missing)
            missing = missing.parent
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.temporary = self.path.parent / (f".{self.path.name}.inprogress-{os.getpid()}"
                                             f"{self.path.suffix}")
        self._sweep()
        self.done = False

    def _sweep(self) -> None:
        """Remove what runs killed while writing this output left (SIGKILL, power loss): the
        hidden siblings of processes that are gone."""
        left = re.compile(re.escape(f".{self.path.name}.") + r"(?:inprogress|replaced)-(\d+)"
                          + f"(?:{re.escape(self.path.suffix)})?")
        for entry in self.path.parent.iterdir():
            match = left.fullmatch(entry.name)
            if match and (int(match.group(1)) == os.getpid()
                          or not pid_alive(int(match.group(1)))):
                _remove(entry)

    def commit(self) -> None:
        """Put what was written to :attr:`temporary` in the output's place, durably."""
        if self.format == "parquet" and self.path.exists():
            aside = self.path.parent / f".{self.path.name}.replaced-{os.getpid()}"
            _remove(aside)
            os.rename(self.path, aside)
            os.rename(self.temporary, self.path)
            fsync_dir(self.path.parent)
            _remove(aside)
        else:
            os.replace(self.temporary, self.path)
        fsync_dir(self.path.parent)
        self.done = True

    def discard(self) -> None:
        """Remove what was written and the directories made for it (nothing once committed)."""
        if self.done:
            return
        _remove(self.temporary)
        for folder in reversed(self.created):
            try:
                folder.rmdir()
            except OSError:
                break  # something else was put there meanwhile: keep it
        self.done = True

    def __enter__(self) -> ReplacedOutput:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 trace: TracebackType | None) -> None:
        if kind is None:
            self.commit()
        self.discard()
        if isinstance(exc, OSError) and exc.errno is not None and (
                exc.filename is None or str(exc.filename).startswith(str(self.temporary))):
            # a full disk while writing names no file, or the hidden one: name the output
            raise OSError(exc.errno, f"writing the output {str(self.path)!r}: "
                                     f"{exc.strerror or first_line(exc)}") from exc


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


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
