"""The engine's open sessions, kept across batches: one persistent columnar table.

:class:`OpenSessions` holds every session the batch paths have not closed yet, so a batch
costs what its own keys hold, not what the whole state holds:

* a **key index** (:class:`KeyIndex`): each key gets a dense key id; a batch looks up only its
  own distinct keys (one dict probe each);
* **slots**: the sessions' key ids, bounds and accumulators in numpy columns, one row per slot;
  each key's live slots are a doubly linked list (``head`` per key id, ``nxt``/``prv`` per
  slot), so finding a batch's open sessions walks only those keys' lists; freed slots go on a
  free stack and are reused;
* an **end index**: sorted runs of ``(end, slot, generation)``, one per batch, merged while a
  run is at least half the size of the one below it (so there are O(log n) runs and each entry
  is merged O(log n) times); closing up to a time is a binary search per run. Freeing a slot
  bumps its generation, so the entries of sessions that merged away are skipped when the close
  cursor reaches them, and dropped when their run is merged.

Every per-session loop is a compiled kernel of :mod:`sessionstore.table_kernels`; the rest is
numpy over a batch's rows. Rows leave the table as :class:`~.columnar.SessionRows` (keys,
bounds, accumulator columns), the form the planner's folds and the emits take.

The store holds everything the table holds after every batch: the table is an index over the
open state, dropped on abort and rebuilt from the committed store (:meth:`OpenSessions.insert`
from the store's rows).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from .. import keyschema, packing
from .. import table_kernels as tk
from ..arrays import Int64Array
from ..kernels import compiled
from ..store.base import byte_rows
from ..store.keycodec import encode_key_column
from ..timeutil import INT64_MAX
from .columnar import (
    ITEM_KINDS,
    NUMERIC_KINDS,
    NotColumnar,
    PartColumns,
    SessionRows,
    key_column,
    numeric_column,
    object_array,
)
from .record import acc_of

_EMPTY = np.zeros(0, dtype=np.int64)


def _grown(array: npt.NDArray[Any], size: int, fill: Any = 0) -> npt.NDArray[Any]:
    """``array`` with room for ``size`` rows (doubling), the old rows kept, new ones ``fill``."""
    if size <= len(array):
        return array
    capacity = max(size, 2 * len(array), 64)
    out = np.full(capacity, fill, dtype=array.dtype)
    out[:len(array)] = array
    return out


def _headroom(size: int) -> int:
    """A capacity for ``size`` rows loaded at once, with room for a quarter more."""
    return size + size // 4 + 64


def unique_keys(keys: list[Any]) -> tuple[list[Any], Int64Array]:
    """The distinct keys (in first-seen order, types kept apart as :class:`KeyIndex` keeps
    them) and each key's position among them."""
    first: dict[tuple[type, Any], int] = {}
    codes = np.fromiter((first.setdefault((type(key), key), len(first)) for key in keys),
                        dtype=np.int64, count=len(keys))
    return [key for _, key in first], codes


class KeyIndex:
    """Keys to dense key ids, kept across batches. Keys of different types stay apart (``1``,
    ``1.0`` and ``True`` are three keys, as the store's key encoding keeps them)."""

    def __init__(self) -> None:
        # while every key is an int that fits in int64 (the common case), the index is a
        # compiled hash table (_hash_keys, _hash_ids) and ``ints`` holds the keys by id, so
        # that probes and output key columns need no Python object per key; otherwise dicts
        # by key type, built on the first other key
        self._ids: dict[type, dict[Any, int]] | None = None
        self.ints: Int64Array | None = np.zeros(0, dtype=np.int64)
        self._hash_keys = np.zeros(0, dtype=np.int64)
        self._hash_ids = np.zeros(0, dtype=np.int64)
        self.keys: npt.NDArray[Any] = np.empty(0, dtype=object)  # by key id, dicts only
        self.size = 0

    @staticmethod
    def _as_ints(keys: list[Any]) -> Int64Array | None:
        """``keys`` as int64 when they are all ints (not bools) that fit, else None."""
        if not set(map(type, keys)) <= {int}:
            return None
        try:
            return np.array(keys, dtype=np.int64).reshape(-1)
        except OverflowError:
            return None

    def lookup(self, keys: list[Any], ints: Int64Array | None = None) -> Int64Array:
        """Each key's id, ``-1`` for keys the index lacks. ``ints``: the same keys as int64,
        when the caller has them (an Arrow int column's values): they are not converted."""
        if not keys:
            return _EMPTY
        if self._ids is None:
            out = np.full(len(keys), -1, dtype=np.int64)
            if not len(self._hash_ids):
                return out
            if ints is None:
                ints = self._as_ints(keys)
            if ints is not None:
                compiled(tk.int_index_lookup)(self._hash_keys, self._hash_ids, ints, out)
                return out
            # other keys too (absent: the index holds ints only): look up the ints among them
            rows = [i for i, key in enumerate(keys)
                    if type(key) is int and -(1 << 63) <= key < (1 << 63)]
            if rows:
                found = np.empty(len(rows), dtype=np.int64)
                compiled(tk.int_index_lookup)(self._hash_keys, self._hash_ids,
                                              np.array([keys[i] for i in rows], dtype=np.int64),
                                              found)
                out[rows] = found
            return out
        by_type = self._ids
        kinds = set(map(type, keys))
        if len(kinds) == 1:
            ids = by_type.get(kinds.pop())
            if ids is None:
                return np.full(len(keys), -1, dtype=np.int64)
            return np.fromiter(map(ids.get, keys, itertools.repeat(-1)), dtype=np.int64,
                               count=len(keys))
        empty: dict[Any, int] = {}
        return np.fromiter((by_type.get(type(key), empty).get(key, -1) for key in keys),
                           dtype=np.int64, count=len(keys))

    def add(self, keys: list[Any], ints: Int64Array | None = None) -> Int64Array:
        """Give ids to ``keys`` (distinct, and absent from the index); return them.
        ``ints``: as in :meth:`lookup`; while the index holds ints only, ``keys`` may then be
        empty (the ints are the keys)."""
        first = self.size
        n = len(keys) if ints is None else len(ints)
        ids = np.arange(first, first + n, dtype=np.int64)
        self.size = first + n
        if self._ids is None:
            if ints is None:
                ints = self._as_ints(keys)
            if ints is not None:
                assert self.ints is not None
                self.ints = _grown(self.ints, first + n)
                self.ints[first:first + n] = ints
                self._hash(ints, ids)
                return ids
            # the first key that is not an int64: the index becomes dicts by type, and the
            # keys are kept as objects
            assert self.ints is not None
            known = self.ints[:first].tolist()
            self.ints = None
            self._hash_keys = self._hash_ids = _EMPTY
            self._ids = {}
            self.keys = object_array(known)
            self._add_to_dicts(known, 0)
        self.keys = _grown(self.keys, first + n, None)
        self.keys[first:first + n] = object_array(keys)  # tuples stay elements
        self._add_to_dicts(keys, first)
        return ids

    def _add_to_dicts(self, keys: list[Any], first: int) -> None:
        by_type = self._ids
        assert by_type is not None
        kinds = set(map(type, keys))
        if len(kinds) == 1:  # the usual case (a cold start's millions of keys): one C call
            kind = kinds.pop()
            table = by_type.get(kind)
            if table is None:
                table = by_type[kind] = {}
            table.update(zip(keys, range(first, first + len(keys)), strict=True))
            return
        for kid, key in enumerate(keys, first):
            table = by_type.get(type(key))
            if table is None:
                table = by_type[type(key)] = {}
            table[key] = kid

    def _hash(self, ints: Int64Array, ids: Int64Array) -> None:
        """Add to the int hash table, doubling it to stay at most half full."""
        if 2 * self.size > len(self._hash_ids):
            capacity = 1024
            while capacity < 4 * self.size:
                capacity *= 2
            assert self.ints is not None
            self._hash_keys = np.zeros(capacity, dtype=np.int64)
            self._hash_ids = np.full(capacity, -1, dtype=np.int64)
            ints = self.ints[:self.size]
            ids = np.arange(self.size, dtype=np.int64)
        compiled(tk.int_index_insert)(self._hash_keys, self._hash_ids, ints, ids)

    def column(self, kids: Int64Array) -> Any:
        """The keys of ``kids`` as a key column (:func:`~.columnar.key_column`)."""
        if self.ints is not None:
            return pa.array(self.ints[kids])
        return key_column(self.keys[kids].tolist())

    def keep(self, kids: Int64Array) -> None:
        """Keep only the keys ``kids`` (ascending), renumbered ``0..len(kids)-1``."""
        if self.ints is not None:
            ints = self.ints[kids]
            self.__init__()  # type: ignore[misc]
            self.add(ints.tolist(), ints)
            return
        keys = self.keys[kids]
        self.__init__()  # type: ignore[misc]
        self.add(keys.tolist())


class EncodedKeyIndex:
    """Keys to dense key ids by their encodings (:func:`~sessionstore.keyschema.encode_key`),
    for the str or bytes keys a cold start reads back from the store: the encodings in one
    arena, and a compiled hash table over them, so that millions of keys need no Python
    object each; only the keys a batch looks up, adds or emits become objects (or Arrow
    arrays). Distinct encodings are distinct keys, so ``1``, ``"1"`` and ``b"1"`` stay apart
    as :class:`KeyIndex` keeps them; a key the store cannot hold (a float, say) is never in
    the index, and looking one up raises :class:`NotColumnar` (the exact path reports it).

    Args:
        arena: the encodings, id after id (``arena[first[id]:stop[id]]``), uint8; the first
            ``used`` bytes are taken.
        first, stop: each id's bytes in the arena (the first ``size`` entries are taken).
        hashes: each id's hash (:func:`~sessionstore.table_kernels.bytes_hashes`).
        table: the hash table of the ids (a power of two, at most half full).
        kind: ``"str"`` or ``"bytes"`` while every key is of that type.
    """

    ints: Int64Array | None = None  # never an int index (see KeyIndex.ints)

    def __init__(self, arena: npt.NDArray[np.uint8], used: int, first: Int64Array,
                 stop: Int64Array, hashes: Int64Array, size: int, table: Int64Array,
                 kind: str | None) -> None:
        self._arena = arena
        self._used = used
        self._first = first
        self._stop = stop
        self._hashes = hashes
        self._table = table
        self._kind = kind
        self.size = size

    @classmethod
    def gathered(cls, data: npt.NDArray[np.uint8], first: Int64Array, stop: Int64Array,
                 hashes: Int64Array, table: Int64Array, kind: str | None) -> EncodedKeyIndex:
        """The index of the encodings ``data[first[i]:stop[i]]`` (id ``i``), copied into an
        arena of their own; ``table`` already holds the ids."""
        n = len(first)
        lengths = stop - first
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        # room for a quarter more keys: the batches after a cold start add keys, and growing
        # arrays of millions of keys at once would cost the first of them what the load did
        arena = np.empty(_headroom(int(offsets[-1])), dtype=np.uint8)
        compiled(tk.gather_bytes)(data, first, stop, arena, 0)
        index_first = np.zeros(_headroom(n), dtype=np.int64)
        index_stop = np.zeros(_headroom(n), dtype=np.int64)
        index_hashes = np.zeros(_headroom(n), dtype=np.int64)
        index_first[:n] = offsets[:-1]
        index_stop[:n] = offsets[1:]
        index_hashes[:n] = hashes
        return cls(arena, int(offsets[-1]), index_first, index_stop, index_hashes, n, table,
                   kind)

    @staticmethod
    def _encode(keys: Any) -> tuple[npt.NDArray[np.uint8], Int64Array, Int64Array, Int64Array]:
        """The keys' encodings as ``(bytes, first, stop, hashes)``.

        Raises:
            NotColumnar: a key the store cannot hold (nothing has changed yet).
        """
        try:
            encoded, _ = encode_key_column(keys)
        except (TypeError, ValueError) as exc:
            raise NotColumnar(f"a key the store cannot hold: {exc}") from None
        data, offsets = byte_rows(encoded)
        first, stop = offsets[:-1], offsets[1:]
        hashes = np.empty(len(encoded), dtype=np.int64)
        compiled(tk.bytes_hashes)(data, first, stop, hashes)
        return data, first, stop, hashes

    def lookup(self, keys: list[Any], ints: Int64Array | None = None) -> Int64Array:
        """Each key's id, ``-1`` for keys the index lacks (``ints`` is not needed here).

        Raises:
            NotColumnar: a key the store cannot hold.
        """
        if not len(keys):
            return _EMPTY
        data, first, stop, hashes = self._encode(keys)
        out = np.empty(len(keys), dtype=np.int64)
        compiled(tk.bytes_index_find)(self._table, self._arena, self._first, self._stop,
                                      self._hashes, self.size, data, first, stop, hashes, out,
                                      False)
        return out

    def add(self, keys: list[Any], ints: Int64Array | None = None) -> Int64Array:
        """Give ids to ``keys`` (distinct, absent, and looked up before: encodable); return
        them. ``ints``: the keys as int64 when ``keys`` is empty."""
        if not len(keys) and ints is not None:
            keys = ints.tolist()
        data, first, stop, hashes = self._encode(keys)
        n = len(keys)
        start = self.size
        ids = np.arange(start, start + n, dtype=np.int64)
        lengths = stop - first
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        self._arena = _grown(self._arena, self._used + int(offsets[-1]))
        compiled(tk.gather_bytes)(data, first, stop, self._arena, self._used)
        self._first = _grown(self._first, start + n)
        self._stop = _grown(self._stop, start + n)
        self._hashes = _grown(self._hashes, start + n)
        self._first[ids] = self._used + offsets[:-1]
        self._stop[ids] = self._used + offsets[1:]
        self._hashes[ids] = hashes
        self._used += int(offsets[-1])
        self.size = start + n
        if self._kind is not None and set(map(type, keys)) != {
                str if self._kind == "str" else bytes}:
            self._kind = None  # mixed: keys leave one by one (column)
        if 2 * self.size > len(self._table):
            self._rehash()
        else:
            compiled(tk.bytes_index_insert)(self._table, self._hashes, ids)
        return ids

    def _rehash(self) -> None:
        capacity = 1024
        while capacity < 4 * self.size:
            capacity *= 2
        self._table = np.full(capacity, -1, dtype=np.int64)
        compiled(tk.bytes_index_insert)(self._table, self._hashes,
                                        np.arange(self.size, dtype=np.int64))

    def column(self, kids: Int64Array) -> Any:
        """The keys of ``kids`` as a key column (:func:`~.columnar.key_column`)."""
        first, stop = self._first[kids], self._stop[kids]
        if self._kind is not None:
            return keyschema.text_key_column(self._arena, first, stop, self._kind == "bytes")
        arena = self._arena
        return key_column([keyschema.decode_key(arena[a:b].tobytes())
                           for a, b in zip(first.tolist(), stop.tolist(), strict=True)])

    def keep(self, kids: Int64Array) -> None:
        """Keep only the keys ``kids`` (ascending), renumbered ``0..len(kids)-1``."""
        kept = EncodedKeyIndex.gathered(self._arena, self._first[kids], self._stop[kids],
                                        self._hashes[kids], self._table, self._kind)
        self._arena, self._used = kept._arena, kept._used
        self._first, self._stop, self._hashes = kept._first, kept._stop, kept._hashes
        self.size = kept.size
        self._rehash()


class _Part:
    """The accumulator columns of one aggregation part, by slot (collect: an item arena)."""

    #: collect: garbage items tolerated beyond twice the live ones before a compaction
    ARENA_SLACK = 1024

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.value: npt.NDArray[Any] | None = None  # dtype set by the first write
        self.t_ms = _EMPTY
        self.seq = _EMPTY
        # collect: each slot's items are arena[off[slot]:off[slot] + length[slot]]
        self.off = _EMPTY
        self.length = _EMPTY
        self.used = 0  # arena rows written
        self.live_items = 0

    def check(self, values: npt.NDArray[Any] | None, live: int) -> None:
        """Refuse (before any change) a batch whose values the live accumulators cannot take
        exactly: numeric parts keep one dtype while sessions are open."""
        if self.kind in NUMERIC_KINDS and live and values is not None \
                and self.value is not None and self.value.dtype != values.dtype:
            raise NotColumnar("the batch's values and the open accumulators differ in type")

    def gather(self, slots: Int64Array) -> PartColumns:
        value = self.value
        if value is None:
            value = np.zeros(0, dtype=object if self.kind in ITEM_KINDS else np.int64)
        if self.kind in ("count", *NUMERIC_KINDS):
            return PartColumns(self.kind, value[slots])
        if self.kind != "collect":
            return PartColumns(self.kind, value[slots], self.t_ms[slots], self.seq[slots])
        lengths = self.length[slots]
        offsets = np.zeros(len(slots) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        items = (np.arange(offsets[-1], dtype=np.int64)
                 + np.repeat(self.off[slots] - offsets[:-1], lengths))
        return PartColumns("collect", value[items], self.t_ms[items], self.seq[items], offsets)

    def _store_values(self, rows: int, values: npt.NDArray[Any], live: int) -> None:
        """Room for ``rows`` values of ``values``' type (objects when types mix)."""
        current = self.value
        if current is None or (live == 0 and current.dtype != values.dtype):
            self.value = np.zeros(max(rows, 64), dtype=values.dtype)
            return
        if current.dtype != values.dtype and current.dtype != object:
            current = current.astype(object)
        self.value = _grown(current, rows, None if current.dtype == object else 0)

    def write(self, slots: Int64Array, columns: PartColumns, capacity: int, live: int) -> None:
        """Store the rows of ``columns`` in ``slots``; ``live``: accumulators still held."""
        if self.kind != "collect":
            self._store_values(capacity, columns.value, live)
            assert self.value is not None
            self.value[slots] = columns.value
            if columns.t_ms is not None and columns.seq is not None:
                self.t_ms = _grown(self.t_ms, capacity)
                self.seq = _grown(self.seq, capacity)
                self.t_ms[slots] = columns.t_ms
                self.seq[slots] = columns.seq
            return
        assert columns.offsets is not None and columns.t_ms is not None
        assert columns.seq is not None
        n_items = len(columns.value)
        end = self.used + n_items
        self._store_values(end, columns.value, self.live_items)
        assert self.value is not None
        self.t_ms = _grown(self.t_ms, end)
        self.seq = _grown(self.seq, end)
        self.value[self.used:end] = columns.value
        self.t_ms[self.used:end] = columns.t_ms
        self.seq[self.used:end] = columns.seq
        self.off = _grown(self.off, capacity)
        self.length = _grown(self.length, capacity)
        self.off[slots] = self.used + columns.offsets[:-1]
        self.length[slots] = np.diff(columns.offsets)
        self.used = end
        self.live_items += n_items

    def free(self, slots: Int64Array) -> None:
        if self.kind == "collect" and len(slots):
            self.live_items -= int(self.length[slots].sum())
            self.length[slots] = 0

    def compact(self, live_slots: Int64Array) -> None:
        """Collect: once the arena's garbage outweighs its live items, move the live slots'
        items to the front of a fresh arena (a cost of what is live, after as much churn)."""
        if self.kind != "collect" or self.used <= 2 * self.live_items + self.ARENA_SLACK:
            return
        gathered = self.gather(live_slots)
        self.used = 0
        self.live_items = 0
        self.value = None
        self.t_ms = _EMPTY
        self.seq = _EMPTY
        if len(live_slots):
            self.write(live_slots, gathered, len(self.off), 0)


class _EndRun:
    """Entries ``(end, slot, generation)`` sorted by end; those before ``pos`` are consumed."""

    __slots__ = ("ends", "slots", "gens", "pos")

    def __init__(self, ends: Int64Array, slots: Int64Array, gens: Int64Array) -> None:
        self.ends = ends
        self.slots = slots
        self.gens = gens
        self.pos = 0

    def size(self) -> int:
        return len(self.ends) - self.pos

    def live(self, gen: Int64Array) -> _EndRun:
        """The unconsumed entries whose slot still holds the session they were made for."""
        slots = self.slots[self.pos:]
        keep = gen[slots] == self.gens[self.pos:]
        return _EndRun(self.ends[self.pos:][keep], slots[keep], self.gens[self.pos:][keep])

    def merged(self, other: _EndRun, gen: Int64Array) -> _EndRun:
        """One run of both runs' live entries."""
        a, b = self.live(gen), other.live(gen)
        ends = np.concatenate((a.ends, b.ends))
        order = np.argsort(ends, kind="stable")  # two sorted runs: a merge
        return _EndRun(ends[order], np.concatenate((a.slots, b.slots))[order],
                       np.concatenate((a.gens, b.gens))[order])

    def pop_upto(self, upto: int, gen: Int64Array) -> Int64Array:
        """Consume the entries ending at or before ``upto``; return their live slots."""
        stop = int(np.searchsorted(self.ends, upto, side="right"))
        if stop <= self.pos:
            return _EMPTY
        slots = self.slots[self.pos:stop]
        live: Int64Array = slots[gen[slots] == self.gens[self.pos:stop]]
        self.pos = stop
        return live


class OpenSessions:
    """The open sessions of one engine: see the module's docstring.

    Args:
        kinds: the aggregation's part kinds (:func:`~.columnar.columnar_parts`).
    """

    #: key ids without sessions tolerated (beyond the live sessions) before a renumbering
    KEY_SLACK = 65_536

    def __init__(self, kinds: list[str]) -> None:
        self.kinds = kinds
        self.index: KeyIndex | EncodedKeyIndex = KeyIndex()
        self.parts = [_Part(kind) for kind in kinds]
        self.kid = np.zeros(0, dtype=np.int64)  # -1: a free slot
        self.starts_ms = np.zeros(0, dtype=np.int64)
        self.ends_ms = np.zeros(0, dtype=np.int64)
        self.gen = np.zeros(0, dtype=np.int64)
        self.nxt = np.zeros(0, dtype=np.int64)
        self.prv = np.zeros(0, dtype=np.int64)
        self.head = np.zeros(0, dtype=np.int64)  # by key id: its newest slot, -1: none
        self.count = np.zeros(0, dtype=np.int64)  # by key id: its live slots
        self.free = np.zeros(0, dtype=np.int64)
        self.n_free = 0
        self.top = 0  # slots ever used
        self.live = 0
        self.runs: list[_EndRun] = []

    def __len__(self) -> int:
        return self.live

    # -- reading -------------------------------------------------------------------------

    def check(self, values: list[npt.NDArray[Any] | None]) -> None:
        """Raise :class:`NotColumnar` for a batch the open accumulators cannot take."""
        for part, part_values in zip(self.parts, values, strict=True):
            part.check(part_values, self.live)

    def probe(self, kids: Int64Array) -> tuple[Int64Array, Int64Array]:
        """The live slots of the key ids ``kids`` (``-1``: an unknown key), with the position
        in ``kids`` of each slot's key."""
        known = kids[kids >= 0]
        total = int(self.count[known].sum()) if len(known) else 0
        slots = np.empty(total, dtype=np.int64)
        codes = np.empty(total, dtype=np.int64)
        if total:
            compiled(tk.table_probe)(self.head, self.nxt, kids, slots, codes)
        return slots, codes

    def rows(self, slots: Int64Array, keys: Any = None) -> SessionRows:
        """The sessions in ``slots`` as rows; ``keys``: their keys when the caller has them
        (else they come from the key index)."""
        if keys is None:
            keys = self.index.column(self.kid[slots])
        return SessionRows(keys, self.starts_ms[slots], self.ends_ms[slots],
                           [part.gather(slots) for part in self.parts])

    def live_slots(self) -> Int64Array:
        return np.flatnonzero(self.kid[:self.top] >= 0)

    def live_ends(self) -> Int64Array:
        ends: Int64Array = self.ends_ms[self.live_slots()]
        return ends

    # -- changing ------------------------------------------------------------------------

    def remove(self, slots: Int64Array) -> None:
        """Forget the live, distinct ``slots``."""
        if not len(slots):
            return
        for part in self.parts:
            part.free(slots)
        self.n_free = compiled(tk.table_unlink)(
            slots, self.kid, self.nxt, self.prv, self.head, self.count, self.gen, self.free,
            self.n_free)
        self.live -= len(slots)

    def insert(self, keys: list[Any], key_codes: Int64Array, kids: Int64Array,
               rows: SessionRows, key_ints: Int64Array | None = None) -> None:
        """Add the sessions ``rows``; row ``i``'s key is ``keys[key_codes[i]]``, whose id is
        ``kids[key_codes[i]]`` (``-1``: new to the index; ``kids`` is filled in)."""
        n = len(rows)
        if not n:
            return
        used = np.zeros(len(kids), dtype=np.bool_)
        used[key_codes] = True
        fresh = np.flatnonzero(used & (kids < 0))  # the codes of keys new to the index
        if len(fresh):
            fresh_ints = None if key_ints is None else key_ints[fresh]
            # an int index takes the ints alone: no Python object per new key
            fresh_keys = ([] if fresh_ints is not None and self.index.ints is not None
                          else keys if len(fresh) == len(keys)  # all new (a cold start)
                          else [keys[c] for c in fresh.tolist()])
            kids[fresh] = self.index.add(fresh_keys, fresh_ints)
        size = self.index.size  # (an index built beside the table may hold keys already)
        self.head = _grown(self.head, size, -1)
        self.count = _grown(self.count, size)
        slots = self._allocate(n)
        self.starts_ms[slots] = rows.starts_ms
        self.ends_ms[slots] = rows.ends_ms
        live_before = self.live
        for part, columns in zip(self.parts, rows.parts, strict=True):
            part.write(slots, columns, len(self.kid), live_before)
        compiled(tk.table_link)(slots, kids[key_codes], self.kid, self.nxt, self.prv,
                                self.head, self.count)
        self.live += n
        self._push_ends(slots)
        self._tidy()

    def reserve(self, slots: int) -> None:
        """Make room for ``slots`` slots (and as many key ids) before a large insert, so that
        the inserts after it do not grow every column at once."""
        self.kid = _grown(self.kid, slots, -1)
        self.starts_ms = _grown(self.starts_ms, slots)
        self.ends_ms = _grown(self.ends_ms, slots)
        self.gen = _grown(self.gen, slots)
        self.nxt = _grown(self.nxt, slots, -1)
        self.prv = _grown(self.prv, slots, -1)
        self.free = _grown(self.free, slots)
        self.head = _grown(self.head, slots, -1)
        self.count = _grown(self.count, slots)

    def _allocate(self, n: int) -> Int64Array:
        reused = min(n, self.n_free)
        slots = np.empty(n, dtype=np.int64)
        slots[:reused] = self.free[self.n_free - reused:self.n_free]
        self.n_free -= reused
        first = self.top
        slots[reused:] = np.arange(first, first + n - reused, dtype=np.int64)
        self.top = first + n - reused
        if self.top > len(self.kid):
            size = self.top
            self.kid = _grown(self.kid, size, -1)
            self.starts_ms = _grown(self.starts_ms, size)
            self.ends_ms = _grown(self.ends_ms, size)
            self.gen = _grown(self.gen, size)
            self.nxt = _grown(self.nxt, size, -1)
            self.prv = _grown(self.prv, size, -1)
            self.free = _grown(self.free, len(self.kid))
        return slots

    def _push_ends(self, slots: Int64Array) -> None:
        """Index the ends of the new live ``slots``: a run of their own, then merges."""
        ends = self.ends_ms[slots]
        order = np.argsort(ends)
        runs = self.runs
        runs.append(_EndRun(ends[order], slots[order], self.gen[slots][order]))
        while len(runs) > 1 and runs[-1].size() >= runs[-2].size():
            top = runs.pop()
            runs[-1] = runs[-1].merged(top, self.gen)

    def close_upto(self, upto: int, *, rows: bool) -> SessionRows | None:
        """Forget every session ending at or before ``upto``; return them (``rows``), in no
        particular order."""
        found = [run.pop_upto(upto, self.gen) for run in self.runs]
        self.runs = [run for run in self.runs if run.size()]
        slots = np.concatenate(found) if found else _EMPTY
        if not len(slots):
            return None
        closed = self.rows(slots) if rows else None
        self.remove(slots)
        self._tidy()
        return closed

    def _tidy(self) -> None:
        """Drop key ids without sessions once they outnumber the live ones, and compact
        collect arenas: each costs what the live state holds, after at least as much churn."""
        for part in self.parts:
            if part.kind == "collect" and part.used > 2 * part.live_items + part.ARENA_SLACK:
                part.compact(self.live_slots())
        size = self.index.size
        if size > self.KEY_SLACK and size > 2 * self.live:
            kept = np.flatnonzero(self.count[:size] > 0)
            renumber = np.full(size, -1, dtype=np.int64)
            renumber[kept] = np.arange(len(kept), dtype=np.int64)
            live = self.live_slots()
            self.kid[live] = renumber[self.kid[live]]
            self.head = self.head[kept].copy()
            self.count = self.count[kept].copy()
            self.index.keep(kept)


# -- loading: the table rebuilt from the committed store ---------------------------------------


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
    while capacity < 2 * _headroom(n):  # at most half full with a quarter more keys
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
    table.reserve(_headroom(n))
    loaded = SessionRows(None, stored.starts_ms, stored.ends_ms, parts)
    if kind in ("str", "bytes"):
        table.index = EncodedKeyIndex.gathered(data, key_first, key_stop, key_hashes, ids, kind)
        table.insert([], codes, np.arange(found, dtype=np.int64), loaded)
    elif kind == "int":
        table.insert([], codes, np.full(found, -1, dtype=np.int64), loaded, decoded)
    else:
        table.insert(decoded, codes, np.full(found, -1, dtype=np.int64), loaded)
    return table
