"""Out of core: hash-partition a stream of record batches by key into Arrow IPC spill files.

Every row of a key lands in the same partition, in arrival order, so each partition can be
sessionized alone and the answers put side by side. The files live in a temporary directory that
:class:`Spill` removes when it is closed, also on error.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from .frame import arrow_of, as_numpy

_MIX = np.uint64(0x9E3779B97F4A7C15)


def key_hashes(batch: pa.RecordBatch, keys: Sequence[str], salt: int) -> npt.NDArray[np.uint64]:
    """A hash per row of the key columns, equal for equal keys within this process (Python's
    ``hash`` of each distinct value, salted so that a partition can be split again)."""
    import pyarrow.compute as pc

    total = np.zeros(batch.num_rows, dtype=np.uint64)
    for name in keys:
        column = batch.column(name)
        if pa.types.is_dictionary(column.type):
            column = column.cast(column.type.value_type)
        encoded = pc.dictionary_encode(column)
        distinct = np.array([hash((salt, value)) for value in encoded.dictionary.to_pylist()],
                            dtype=np.int64).view(np.uint64)
        indices = as_numpy(encoded.indices)
        with np.errstate(over="ignore"):
            total = (total * _MIX) ^ distinct[indices]
    with np.errstate(over="ignore"):
        total ^= total >> np.uint64(29)
        total *= _MIX
        total ^= total >> np.uint64(32)
    return total


class Spill:
    """Partition files of one schema in a temporary directory (removed by :meth:`close`).

    Args:
        schema: the schema of every batch written.
        keys: the key columns that choose a row's partition.
        partitions: how many partitions (>= 2).
        salt: varies the hash, so that re-partitioning a partition splits it.
        directory: where to make the temporary directory (default: the system's).
    """

    def __init__(self, schema: pa.Schema, keys: Sequence[str], partitions: int, salt: int,
                 directory: str | Path | None = None) -> None:
        self.schema = schema
        self.keys = list(keys)
        self.partitions = partitions
        self.salt = salt
        self.root = Path(tempfile.mkdtemp(prefix="sessionstore-spill-", dir=directory))
        self._writers: dict[int, pa.ipc.RecordBatchStreamWriter] = {}
        self._sinks: dict[int, pa.NativeFile] = {}
        self.rows = [0] * partitions
        self.bytes_written = 0

    def path(self, part: int) -> Path:
        return self.root / f"part-{part:05d}.arrows"

    def write(self, batch: pa.RecordBatch) -> None:
        """Append each row of ``batch`` to its key's partition, keeping their order."""
        if batch.num_rows == 0:
            return
        part = (key_hashes(batch, self.keys, self.salt) % np.uint64(self.partitions)).astype(
            np.int64)
        order = np.argsort(part, kind="stable")
        counts = np.bincount(part, minlength=self.partitions)
        grouped = batch.take(arrow_of(order, pa.int64()))
        at = 0
        for p in np.flatnonzero(counts).tolist():
            size = int(counts[p])
            self._writer(p).write_batch(grouped.slice(at, size))
            self.rows[p] += size
            self.bytes_written += grouped.slice(at, size).nbytes
            at += size

    def _writer(self, part: int) -> pa.ipc.RecordBatchStreamWriter:
        writer = self._writers.get(part)
        if writer is None:
            sink = pa.OSFile(str(self.path(part)), "wb")
            self._sinks[part] = sink
            writer = pa.ipc.new_stream(sink, self.schema)
            self._writers[part] = writer
        return writer

    def finish(self) -> None:
        """Close the files for writing (they stay until :meth:`close`)."""
        for part, writer in self._writers.items():
            writer.close()
            self._sinks[part].close()
        self._writers.clear()
        self._sinks.clear()

    def read(self) -> Iterator[tuple[int, pa.Table]]:
        """Each non-empty partition as a table, one at a time, deleting its file once read."""
        self.finish()
        for part in range(self.partitions):
            if not self.rows[part]:
                continue
            yield part, self._take(part)

    def _take(self, part: int) -> pa.Table:
        """Read a partition's file and delete it."""
        path = self.path(part)
        with pa.OSFile(str(path), "rb") as source:
            table = pa.ipc.open_stream(source).read_all()
        path.unlink()
        return table

    def close(self) -> None:
        """Remove the files and their directory."""
        for writer in self._writers.values():
            with contextlib.suppress(Exception):  # closing after an error; files go anyway
                writer.close()
        for sink in self._sinks.values():
            sink.close()
        self._writers.clear()
        self._sinks.clear()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Spill:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
