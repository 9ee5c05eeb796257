"""Reading the open-session table back from the store: in bulk (keys, bounds and packed records
decoded in arrays, :func:`table_from_columns`) where the store and the accumulators allow it,
row by row otherwise (:func:`table_from_rows`, the reference the bulk read is tested against).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np

from .. import keyschema, packing
from .. import table_kernels as tk
from ..jit import compiled
from ..timeutil import INT64_MAX
from .columnar import (
    NUMERIC_KINDS,
    PartColumns,
    SessionRows,
    numeric_column,
)
from .key_index import EncodedKeyIndex, headroom, unique_keys
from .record import acc_of
from .table import OpenSessions


def load_open_sessions(state: Any, low_ms: int, kinds: list[str], *, combined: bool
                       ) -> OpenSessions:
    """The table of every session of ``state`` (a store, or a layer over one) ending at or
    after ``low_ms``: a cold start, a reopen, or after an abort.

    Read in bulk (``find_sessions_columns``: keys, bounds and packed records decoded in arrays,
    a Python object per distinct key only) when the store offers it and every record is of the
    layout :func:`~sessionstore.packing.pack_session_records` writes; otherwise row by row
    (``find_sessions``), which is also what names a damaged record.

    Args:
        state: the store.
        low_ms: the smallest end wanted.
        kinds: the aggregation's part kinds.
        combined: the accumulators are lists of the parts' (see
            :meth:`~.columnar.SessionRows.from_rows`).

    Raises:
        NotColumnar: stored accumulators the table cannot hold exactly.
        StoreCorruptedError, ValueError, ...: a damaged store, as ``find_sessions`` raises.
    """
    read = getattr(state, "find_sessions_columns", None)
    if read is not None and _bulk_kinds(kinds):
        with _small_pages():
            stored = read(low_ms)
            table = None if stored is None else table_from_columns(stored, kinds, combined)
        if table is not None:
            return table
    return table_from_rows(state.find_sessions(low_ms, INT64_MAX), kinds, combined=combined)


@contextlib.contextmanager
def _small_pages() -> Iterator[None]:
    """Allocate without numpy's transparent huge page advice while in the block.

    A cold start allocates about 200 bytes per open session in fresh arrays (1 GB at 5M) and
    touches each once. With the kernel's ``defrag=madvise`` setting, every first touch of a
    huge page advised region may compact memory in the fault: measured on a shared 2-core
    machine at 5M sessions, 2.4 s of system time against 0.6 s without the advice. The
    setting is numpy's process-wide one, restored on the way out (a numpy without it: no-op).
    """
    setter = getattr(getattr(np, "_core", None), "multiarray", None)
    setter = getattr(setter, "_set_madvise_hugepage", None)
    if setter is None:
        yield
        return
    before = setter(False)
    try:
        yield
    finally:
        setter(before)


def table_from_rows(rows: Any, kinds: list[str], *, combined: bool) -> OpenSessions:
    """The table of stored ``(session, record)`` rows (``find_sessions``' answer), one row at
    a time: the reference the bulk read of :func:`load_open_sessions` is tested against.

    Raises:
        NotColumnar, ValueError, ...: as :func:`load_open_sessions`.
    """
    accs = [(session, acc_of(raw)) for session, raw in rows]
    loaded = SessionRows.from_rows(kinds, accs, combined=combined)
    table = OpenSessions(kinds)
    keys, codes = unique_keys([session.key for session, _ in accs])
    table.insert(keys, codes, table.index.lookup(keys), loaded)
    return table


def _bulk_kinds(kinds: list[str]) -> bool:
    """Whether the bulk read decodes these parts' records (the numbers packing.py packs);
    other kinds (first, last, collect) are read row by row, and not read twice."""
    return all(kind == "count" or kind in NUMERIC_KINDS for kind in kinds)


def table_from_columns(stored: Any, kinds: list[str], combined: bool) -> OpenSessions | None:
    """The table of :class:`~sessionstore.store.base.StoredSessions`, or None when a record or
    a key is not of the layouts decoded here (the caller reads row by row)."""
    if not stored.msgpack_values or not _bulk_kinds(kinds):
        return None
    if not len(stored):
        return OpenSessions(kinds)
    columns = packing.unpack_session_records(stored.value_bytes, stored.value_first,
                                             stored.value_stop, len(kinds), combined=combined)
    if columns is None:
        return None
    # the distinct keys: a hash table over the encodings, which becomes the key index when
    # the keys are str or bytes (they then never become Python objects here)
    data, first, stop = stored.key_bytes, stored.key_first, stored.key_stop
    n = len(first)
    hashes = np.empty(n, dtype=np.int64)
    compiled(tk.bytes_hashes)(data, first, stop, hashes)
    capacity = 1024
    while capacity < 2 * headroom(n):  # at most half full with a quarter more keys
        capacity *= 2
    ids = np.full(capacity, -1, dtype=np.int64)
    codes = np.empty(n, dtype=np.int64)
    key_first = np.empty(n, dtype=np.int64)
    key_stop = np.empty(n, dtype=np.int64)
    key_hashes = np.empty(n, dtype=np.int64)
    found = compiled(tk.bytes_index_find)(ids, data, key_first, key_stop, key_hashes, 0, data,
                                          first, stop, hashes, codes, True)
    key_first, key_stop, key_hashes = key_first[:found], key_stop[:found], key_hashes[:found]
    classified = keyschema.classify_key_rows(data, key_first, key_stop)
    if classified is None:
        return None
    kind, decoded = classified
    parts = []
    for part_kind, column in zip(kinds, columns, strict=True):
        if part_kind == "count":
            if column.dtype != np.int64:
                return None  # floats where counts belong: the row path decides
            parts.append(PartColumns(part_kind, column))
        else:  # refused exactly as the row path refuses them (NaN)
            parts.append(PartColumns(part_kind, numeric_column(column, "stored accumulators")))
    table = OpenSessions(kinds)
    table.reserve(headroom(n))
    loaded = SessionRows(None, stored.starts_ms, stored.ends_ms, parts)
    if kind in ("str", "bytes"):
        table.index = EncodedKeyIndex.gathered(data, key_first, key_stop, key_hashes, ids, kind)
        table.insert([], codes, np.arange(found, dtype=np.int64), loaded)
    elif kind == "int":
        table.insert([], codes, np.full(found, -1, dtype=np.int64), loaded, decoded)
    else:
        table.insert(decoded, codes, np.full(found, -1, dtype=np.int64), loaded)
    return table
