"""The engine's open sessions for the columnar batch path, owned by the engine across batches.

:class:`SlottedSessions` is the persistent table: each open session has a slot in growable
columns (key, start, end, accumulator parts), a dict maps each key to its slots, freed slots are
reused (a generation number per slot makes stale end-index entries harmless), and runs of
``(end, slot, generation)`` sorted by end, one per batch, are the end index for closing. A batch probes the index with its own
keys only, reads its candidates by slot, and writes the planned sessions back into slots, so it
costs what it changes, not what the table holds.

:class:`RebuiltSessions` keeps the whole table as one :class:`OpenTable` and finds a batch's keys
with a hash join over every open key, rebuilding the table each batch. It remains for the
``collect`` aggregation, whose accumulators are ragged (a list per session) and do not fit in
fixed-width slots. Both answer the same methods, and the property suite runs the batch paths on
both (``tests/engine/test_engine_properties.py``).
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import numpy.typing as npt

from ..kernels import compiled
from .columnar import NUMERIC_KINDS, OpenTable, PartColumns, codes_in, key_column, object_array

Int64Array = npt.NDArray[np.int64]


def open_sessions(kinds: list[str], table: OpenTable) -> SlottedSessions | RebuiltSessions:
    """The engine's open-session table for aggregation part ``kinds``, holding ``table``'s rows
    (the open sessions read back from the store on a cold start)."""
    if "collect" in kinds:
        return RebuiltSessions(table)
    slotted = SlottedSessions(kinds)
    none = np.zeros(0, dtype=np.int64)
    slotted.replace(none, none, table)
    return slotted


class RebuiltSessions:
    """The open sessions as one :class:`OpenTable`, rebuilt by every batch (see the module)."""

    def __init__(self, table: OpenTable) -> None:
        self.table = table

    def __len__(self) -> int:
        return len(self.table)

    def numeric_dtype(self, part: int) -> np.dtype[Any] | None:
        """The dtype of accumulator part ``part``'s values, or None when the table is empty."""
        return self.table.parts[part].value.dtype if len(self.table) else None

    def probe(self, uniques: list[Any], uniques_arrow: Any) -> tuple[Int64Array, Int64Array]:
        """``(rows, codes)``: the rows of the batch's keys ``uniques`` and each one's index in
        ``uniques``."""
        codes = codes_in(self.table.keys, uniques, uniques_arrow)
        rows = np.flatnonzero(codes >= 0).astype(np.int64)
        return rows, codes[rows]

    def bounds(self, rows: Int64Array) -> tuple[Int64Array, Int64Array]:
        """Starts and ends of ``rows``."""
        return self.table.starts_ms[rows], self.table.ends_ms[rows]

    def take(self, rows: Int64Array) -> OpenTable:
        """``rows`` as an :class:`OpenTable` (the table is unchanged)."""
        return self.table.take(rows)

    def take_parts(self, rows: Int64Array) -> list[PartColumns]:
        """The accumulator parts of ``rows``."""
        return [part.take(rows) for part in self.table.parts]

    def replace(self, rows: Int64Array, into: Int64Array, new: OpenTable,
                new_codes: Int64Array | None = None) -> None:
        """Remove ``rows`` and add ``new``'s sessions (``into``, ``new_codes``: see
        :meth:`SlottedSessions.replace`)."""
        kept = np.ones(len(self.table), dtype=np.bool_)
        kept[rows] = False
        self.table = self.table.take(np.flatnonzero(kept)).concat(new)

    def close_upto(self, upto_ms: int) -> OpenTable:
        """Remove and return the sessions ending at or before ``upto_ms`` (any order)."""
        closing = self.table.ends_ms <= upto_ms
        closed = self.table.take(np.flatnonzero(closing))
        if len(closed):
            self.table = self.table.take(np.flatnonzero(~closing))
        return closed

    def live_ends(self) -> list[int]:
        """The end of every open session."""
        ends: list[int] = self.table.ends_ms.tolist()
        return ends


class _PartSlots:
    """One accumulator part's columns, by slot (``t_ms``/``seq`` for first and last)."""

    __slots__ = ("kind", "value", "t_ms", "seq")

    def __init__(self, kind: str, capacity: int) -> None:
        self.kind = kind
        self.value: npt.NDArray[Any] = np.zeros(
            capacity, dtype=np.int64 if kind == "count" or kind in NUMERIC_KINDS else object)
        timed = kind not in ("count", *NUMERIC_KINDS)
        self.t_ms = np.zeros(capacity, dtype=np.int64) if timed else None
        self.seq = np.zeros(capacity, dtype=np.int64) if timed else None

    def grow(self, capacity: int) -> None:
        self.value = _grown(self.value, capacity)
        if self.t_ms is not None and self.seq is not None:
            self.t_ms = _grown(self.t_ms, capacity)
            self.seq = _grown(self.seq, capacity)

    def write(self, slots: Int64Array, part: PartColumns, empty: bool) -> None:
        """Write ``part``'s rows into ``slots``; ``empty``: no live slot holds a value."""
        values = part.value
        if values.dtype != self.value.dtype:
            # a table of ints meeting floats keeps each row's Python type, as concatenating
            # the two would (objects); an empty table takes the batch's type
            self.value = (np.zeros(len(self.value), dtype=values.dtype) if empty
                          else self.value.astype(object))
        self.value[slots] = values
        if self.t_ms is not None and self.seq is not None:
            assert part.t_ms is not None and part.seq is not None
            self.t_ms[slots] = part.t_ms
            self.seq[slots] = part.seq

    def take(self, slots: Int64Array) -> PartColumns:
        if self.t_ms is None or self.seq is None:
            return PartColumns(self.kind, self.value[slots])
        return PartColumns(self.kind, self.value[slots], self.t_ms[slots], self.seq[slots])


_PLAIN_KEYS = (int, str, bytes)


def _index_keys(keys: list[Any]) -> list[Any]:
    """The dict keys of ``keys`` in ``SlottedSessions._key_ids``."""
    if set(map(type, keys)) <= set(_PLAIN_KEYS):
        return keys
    return [key if type(key) in _PLAIN_KEYS else (type(key), key) for key in keys]


class _EndRun:
    """One batch's written slots sorted by end, with the generation each was written at (an
    entry whose slot was freed or rewritten since is stale); ``front``: entries before it
    were consumed by a close."""

    __slots__ = ("ends", "slots", "generations", "front")

    def __init__(self, ends: Int64Array, slots: Int64Array, generations: Int64Array) -> None:
        self.ends = ends
        self.slots = slots
        self.generations = generations
        self.front = 0


def _grown(array: npt.NDArray[Any], capacity: int) -> npt.NDArray[Any]:
    out = np.zeros(capacity, dtype=array.dtype)
    out[:len(array)] = array
    return out


def _walk(heads: Int64Array, following: Int64Array, key_ids: Int64Array, codes: Int64Array
          ) -> tuple[Int64Array, Int64Array]:
    """The slots on the lists of ``key_ids`` (``heads[kid]``, then ``following``), and the
    code of each one's key (compiled)."""
    n = 0
    for q in range(len(key_ids)):
        slot = heads[key_ids[q]]
        while slot >= 0:
            n += 1
            slot = following[slot]
    slots = np.empty(n, dtype=np.int64)
    out_codes = np.empty(n, dtype=np.int64)
    n = 0
    for q in range(len(key_ids)):
        slot = heads[key_ids[q]]
        while slot >= 0:
            slots[n] = slot
            out_codes[n] = codes[q]
            n += 1
            slot = following[slot]
    return slots, out_codes


def _unlink(slots: Int64Array, key_of: Int64Array, heads: Int64Array, following: Int64Array,
            preceding: Int64Array) -> None:
    """Take ``slots`` off their keys' lists (compiled)."""
    for q in range(len(slots)):
        slot = slots[q]
        before = preceding[slot]
        after = following[slot]
        if before >= 0:
            following[before] = after
        else:
            heads[key_of[slot]] = after
        if after >= 0:
            preceding[after] = before
        following[slot] = -1
        preceding[slot] = -1


def _link(slots: Int64Array, key_ids: Int64Array, key_of: Int64Array, heads: Int64Array,
          following: Int64Array, preceding: Int64Array) -> None:
    """Put ``slots`` at the front of the lists of ``key_ids`` (compiled)."""
    for q in range(len(slots)):
        slot = slots[q]
        kid = key_ids[q]
        key_of[slot] = kid
        first = heads[kid]
        following[slot] = first
        preceding[slot] = -1
        if first >= 0:
            preceding[first] = slot
        heads[kid] = slot


class SlottedSessions:
    """The persistent open-session table (see the module): slots, a key index, an end index.

    The key index: a dict gives each key a dense key id (ints, str and bytes are their own dict
    keys; other keys go as ``(type, key)``, so that ``1``, ``1.0`` and ``True`` stay apart as
    the key encoding keeps them); each key id heads a doubly linked list of its slots
    (``_heads``, ``_next``, ``_prev``), which compiled loops walk, link and unlink. Key ids of
    keys with no open session are dropped when they outnumber the open sessions.
    """

    def __init__(self, kinds: list[str]) -> None:
        capacity = 1024
        self.kinds = kinds
        self._keys = np.empty(capacity, dtype=object)
        self._starts = np.zeros(capacity, dtype=np.int64)
        self._ends = np.zeros(capacity, dtype=np.int64)
        self._alive = np.zeros(capacity, dtype=np.bool_)
        self._generation = np.zeros(capacity, dtype=np.int64)
        self._key_of = np.full(capacity, -1, dtype=np.int64)
        self._next = np.full(capacity, -1, dtype=np.int64)
        self._prev = np.full(capacity, -1, dtype=np.int64)
        self._parts = [_PartSlots(kind, capacity) for kind in kinds]
        self._used = 0  # slots [0, used) have been handed out at least once
        self._free: list[int] = []
        self._live = 0
        self._key_ids: dict[Any, int] = {}
        self._heads = np.full(1024, -1, dtype=np.int64)
        self._by_end: list[_EndRun] = []  # the end index: runs sorted by end
        self._probed: tuple[list[Any], Int64Array] = ([], np.zeros(0, dtype=np.int64))

    def __len__(self) -> int:
        return self._live

    def numeric_dtype(self, part: int) -> np.dtype[Any] | None:
        """The dtype of accumulator part ``part``'s values, or None when the table is empty."""
        return self._parts[part].value.dtype if self._live else None

    def probe(self, uniques: list[Any], uniques_arrow: Any) -> tuple[Int64Array, Int64Array]:
        """``(slots, codes)``: the slots of the batch's keys ``uniques`` and each one's index
        in ``uniques``. Costs a dict lookup per batch key and a step per slot found, whatever
        the table holds."""
        kids = np.fromiter(map(self._key_ids.get, _index_keys(uniques), itertools.repeat(-1)),
                           dtype=np.int64, count=len(uniques))
        self._probed = (uniques, kids)  # for replace: the batch's keys and their ids
        codes = np.flatnonzero(kids >= 0).astype(np.int64)
        slots, slot_codes = compiled(_walk)(self._heads, self._next, kids[codes], codes)
        return slots, slot_codes

    def bounds(self, slots: Int64Array) -> tuple[Int64Array, Int64Array]:
        """Starts and ends of ``slots``."""
        return self._starts[slots], self._ends[slots]

    def take(self, slots: Int64Array) -> OpenTable:
        """``slots`` as an :class:`OpenTable` (the table is unchanged)."""
        return OpenTable(key_column(self._keys[slots].tolist()), self._starts[slots],
                         self._ends[slots], [part.take(slots) for part in self._parts])

    def take_parts(self, slots: Int64Array) -> list[PartColumns]:
        """The accumulator parts of ``slots`` (:meth:`take` without the keys)."""
        return [part.take(slots) for part in self._parts]

    def replace(self, slots: Int64Array, into: Int64Array, new: OpenTable,
                new_codes: Int64Array | None = None) -> None:
        """Replace the sessions in ``slots`` by ``new``'s: ``slots[i]`` went into ``new``'s
        row ``into[i]``. A new session takes the slot of the first session it absorbed (the
        same key: most batches only extend sessions, which costs no index change); the other
        absorbed slots are freed, and sessions that absorbed nothing take free slots.

        ``new_codes``: each new session's key as an index into the ``uniques`` of the last
        :meth:`probe` (so known keys need no lookup); None: read the keys from ``new``."""
        n = len(new)
        target = np.full(n, -1, dtype=np.int64)
        if len(slots):
            target[into[::-1]] = slots[::-1]  # the first absorbed slot of each new session
            self._release(slots[target[into] != slots])
        fresh = np.flatnonzero(target < 0)
        if len(fresh):
            target[fresh] = self._allocate(len(fresh))
            if new_codes is None:
                added = new.take(fresh).key_list()
                self._keys[target[fresh]] = object_array(added)
                ids = self._ids_of(added)
            else:
                uniques, kids = self._probed
                codes = new_codes[fresh]
                self._keys[target[fresh]] = object_array(uniques)[codes]
                ids = kids[codes]
                unknown = np.flatnonzero(ids < 0)
                if len(unknown):  # keys the table did not hold: one id per distinct key
                    first = np.unique(codes[unknown])
                    kids[first] = self._ids_of([uniques[c] for c in first.tolist()])
                    ids = kids[codes]
            compiled(_link)(target[fresh], ids, self._key_of, self._heads, self._next,
                            self._prev)
            self._live += len(fresh)
        if n == 0:
            return
        empty = self._live == len(fresh)  # no slot held a value before this write
        self._starts[target] = new.starts_ms
        self._ends[target] = new.ends_ms
        self._alive[target] = True
        self._generation[target] += 1
        for part, columns in zip(self._parts, new.parts, strict=True):
            part.write(target, columns, empty)
        order = np.argsort(new.ends_ms, kind="stable")
        self._by_end.append(_EndRun(new.ends_ms[order], target[order],
                                    self._generation[target[order]]))
        if len(self._by_end) > 64:
            self._compact_ends()
        if len(self._key_ids) > 2 * self._live + 65_536:
            self._compact_key_ids()

    def close_upto(self, upto_ms: int) -> OpenTable:
        """Remove and return the sessions ending at or before ``upto_ms`` (any order), found
        through the end index: the cost is the closing sessions', not the table's."""
        found: list[Int64Array] = []
        runs = []
        for run in self._by_end:
            hi = int(np.searchsorted(run.ends, upto_ms, side="right"))
            if hi > run.front:
                picked = np.arange(run.front, hi)
                slots = run.slots[picked]
                current = self._alive[slots] & (self._generation[slots] == run.generations[picked])
                found.append(slots[current])
                run.front = hi
            if run.front < len(run.ends):
                runs.append(run)
        self._by_end = runs
        slots = np.concatenate(found) if found else np.zeros(0, dtype=np.int64)
        closed = self.take(slots)
        self._release(slots)
        return closed

    def _allocate(self, n: int) -> Int64Array:
        reused = self._free[len(self._free) - min(n, len(self._free)):]
        del self._free[len(self._free) - len(reused):]
        fresh = n - len(reused)
        if self._used + fresh > len(self._starts):
            self._grow(max(2 * len(self._starts), self._used + fresh))
        out = np.array(reused + list(range(self._used, self._used + fresh)), dtype=np.int64)
        self._used += fresh
        return out

    def _compact_ends(self) -> None:
        """Merge the end index's runs into one, dropping entries of freed or rewritten slots."""
        alive = np.flatnonzero(self._alive[:self._used]).astype(np.int64)
        ends = self._ends[alive]
        order = np.argsort(ends, kind="stable")
        self._by_end = [_EndRun(ends[order], alive[order], self._generation[alive[order]])]

    def live_ends(self) -> list[int]:
        """The end of every open session."""
        ends: list[int] = self._ends[:self._used][self._alive[:self._used]].tolist()
        return ends

    def _release(self, slots: Int64Array) -> None:
        if not len(slots):
            return
        compiled(_unlink)(slots, self._key_of, self._heads, self._next, self._prev)
        self._keys[slots] = None
        self._alive[slots] = False
        self._free.extend(slots.tolist())
        self._live -= len(slots)

    def _ids_of(self, keys: list[Any]) -> Int64Array:
        """The key id of each of ``keys``, giving new keys new ids."""
        index = self._key_ids
        held = _index_keys(keys)
        ids = np.fromiter(map(index.get, held, itertools.repeat(-1)), dtype=np.int64,
                          count=len(keys))
        missing = np.flatnonzero(ids < 0)
        for q in missing.tolist():
            kid = index.get(held[q])  # a key twice among the new ones
            if kid is None:
                kid = len(index)
                index[held[q]] = kid
            ids[q] = kid
        if len(index) > len(self._heads):
            heads = np.full(max(2 * len(self._heads), len(index)), -1, dtype=np.int64)
            heads[:len(self._heads)] = self._heads
            self._heads = heads
        return ids

    def _compact_key_ids(self) -> None:
        """Renumber the keys that have open sessions; forget the others."""
        alive = np.flatnonzero(self._alive[:self._used]).astype(np.int64)
        self._key_ids = {}
        self._heads = np.full(1024, -1, dtype=np.int64)
        self._next[:] = -1
        self._prev[:] = -1
        self._key_of[:] = -1
        compiled(_link)(alive, self._ids_of(self._keys[alive].tolist()), self._key_of,
                        self._heads, self._next, self._prev)

    def _grow(self, capacity: int) -> None:
        self._keys = _grown(self._keys, capacity)
        for name in ("_key_of", "_next", "_prev"):
            grown = np.full(capacity, -1, dtype=np.int64)
            grown[:len(getattr(self, name))] = getattr(self, name)
            setattr(self, name, grown)
        self._starts = _grown(self._starts, capacity)
        self._ends = _grown(self._ends, capacity)
        self._alive = _grown(self._alive, capacity)
        self._generation = _grown(self._generation, capacity)
        for part in self._parts:
            part.grow(capacity)
