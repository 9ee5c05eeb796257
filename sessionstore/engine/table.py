"""The engine's open sessions, kept across batches: one persistent columnar table.

:class:`OpenSessions` holds every session the batch paths have not closed yet, so a batch
costs what its own keys hold, not what the whole state holds:

* a **key index** (:class:`KeyIndex`): each key gets a dense key id; a batch looks up only its
  own distinct keys (one dict probe each);
* **slots**: the sessions' key ids, bounds and accumulators in numpy columns, one row per slot;
  each key's live slots are a doubly linked list (``head`` per key id, ``nxt``/``prv`` per
  slot), so finding a batch's open sessions walks only those keys' lists; freed slots go on a
  free stack and are reused. A slot's key id, generation, links and bounds are the columns of
  one block of 64-byte rows, and a key's ``head`` and ``count`` of one block of 16-byte rows,
  so that at millions of open sessions a slot or a key costs one cache miss, not one per
  column;
* an **end index**: sorted runs of ``(end, slot, generation)``, one per batch, merged while a
  run is at least half the size of the one below it (so there are O(log n) runs and each entry
  is merged O(log n) times); closing up to a time is a binary search per run. Freeing a slot
  bumps its generation, so the entries of sessions that merged away are skipped when the close
  cursor reaches them, and dropped when their run is merged;
* **young sessions**: an insert gives its keys their ids at once but keeps its sessions as
  rows until the table's next use (:meth:`OpenSessions.settle`). A :meth:`~OpenSessions.close_upto`
  that comes first returns those it closes straight from the rows and places only the rest: a
  batch's own watermark closes most of the sessions it makes (78% on a q11-like stream),
  and those never take a slot, a link or an end-index entry.

Every per-session loop is a compiled kernel of :mod:`sessionstore.table_kernels`; the rest is
numpy over a batch's rows. Rows leave the table as :class:`~.columnar.SessionRows` (keys,
bounds, accumulator columns), the form the planner's folds and the emits take.

The store holds everything the table holds after every batch: the table is an index over the
open state, dropped on abort and rebuilt from the committed store (:meth:`OpenSessions.insert`
from the store's rows).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from .. import table_kernels as tk
from ..arrays import Int64Array, sort_order
from ..jit import compiled
from .columnar import (
    ITEM_KINDS,
    NUMERIC_KINDS,
    NotColumnar,
    PartColumns,
    SessionRows,
)
from .key_index import EncodedKeyIndex, KeyIndex, grown

_EMPTY = np.zeros(0, dtype=np.int64)


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
        self.value = grown(current, rows, None if current.dtype == object else 0)

    def write(self, slots: Int64Array, columns: PartColumns, capacity: int, live: int) -> None:
        """Store the rows of ``columns`` in ``slots``; ``live``: accumulators still held."""
        if self.kind != "collect":
            self._store_values(capacity, columns.value, live)
            assert self.value is not None
            self.value[slots] = columns.value
            if columns.t_ms is not None and columns.seq is not None:
                self.t_ms = grown(self.t_ms, capacity)
                self.seq = grown(self.seq, capacity)
                self.t_ms[slots] = columns.t_ms
                self.seq[slots] = columns.seq
            return
        assert columns.offsets is not None and columns.t_ms is not None
        assert columns.seq is not None
        n_items = len(columns.value)
        end = self.used + n_items
        self._store_values(end, columns.value, self.live_items)
        assert self.value is not None
        self.t_ms = grown(self.t_ms, end)
        self.seq = grown(self.seq, end)
        self.value[self.used:end] = columns.value
        self.t_ms[self.used:end] = columns.t_ms
        self.seq[self.used:end] = columns.seq
        self.off = grown(self.off, capacity)
        self.length = grown(self.length, capacity)
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

    def merged(self, other: _EndRun, gen: Int64Array) -> _EndRun:
        """One run of both runs' live entries: this run's before the other's among equal
        ends (a stable sort of the two joined), in one compiled pass."""
        room = self.size() + other.size()
        ends = np.empty(room, dtype=np.int64)
        slots = np.empty(room, dtype=np.int64)
        gens = np.empty(room, dtype=np.int64)
        n = compiled(tk.end_runs_merge)(self.ends, self.slots, self.gens, self.pos,
                                        other.ends, other.slots, other.gens, other.pos, gen,
                                        ends, slots, gens)
        if n < room:
            ends, slots, gens = ends[:n].copy(), slots[:n].copy(), gens[:n].copy()
        return _EndRun(ends, slots, gens)

    def pop_upto(self, upto: int, gen: Int64Array) -> Int64Array:
        """Consume the entries ending at or before ``upto``; return their live slots."""
        stop = int(np.searchsorted(self.ends, upto, side="right"))
        if stop <= self.pos:
            return _EMPTY
        slots = self.slots[self.pos:stop]
        live: Int64Array = slots[gen[slots] == self.gens[self.pos:stop]]
        self.pos = stop
        return live


def _row_block(rows: int, empty_row: tuple[int, ...]) -> Int64Array:
    """An int64 block of ``rows`` rows, each ``empty_row`` (of 2 or 8 columns), aligned so
    that no row straddles two cache lines.

    A batch's per-session work at millions of open sessions is random access (a probe reads
    a slot's next link, a removal its key id, links and generation, the planner its bounds;
    a key's newest slot and count go together): columns used together in one row make that
    one cache miss, not one per column, and rows without padding keep a dense pass (a small
    table, all of it touched) at the lines separate columns would take."""
    width = len(empty_row)
    flat = np.empty(width * rows + 8, dtype=np.int64)
    skip = (-flat.ctypes.data % 64) // 8
    block = flat[skip:skip + width * rows].reshape(rows, width)
    block[:] = empty_row
    return block


def _slot_block(rows: int) -> Int64Array:
    """The slots' key id (-1: free), generation, next, previous, start and end, in a row of
    64 bytes (two columns unused): one cache line per slot."""
    return _row_block(rows, (-1, 0, -1, -1, 0, 0, 0, 0))


def _key_block(rows: int) -> Int64Array:
    """The key ids' newest slot (-1: none) and live slots."""
    return _row_block(rows, (-1, 0))


def _grown(block: Int64Array, size: int,
           make: Callable[[int], Int64Array]) -> Int64Array | None:
    """A row block from ``make`` with room for ``size`` rows (doubling, at least 64) holding the
    rows of ``block`` first; None when ``block`` has room already."""
    if size <= len(block):
        return None
    grown = make(max(size, 2 * len(block), 64))
    grown[:len(block)] = block
    return grown


def _keyless_take(rows: SessionRows, picked: Int64Array, keys: Any) -> SessionRows:
    """The rows ``picked`` of ``rows`` with the keys ``keys`` (the table places rows by key
    id, so the rows it is given may have none)."""
    return SessionRows(keys, rows.starts_ms[picked], rows.ends_ms[picked],
                       [part.take(picked) for part in rows.parts])


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
        # by slot: its key id (-1: a free slot), generation and list links, and its bounds:
        # the columns of one row block (_slot_block), views set by _use_slots
        self.kid = self.starts_ms = self.ends_ms = self.gen = self.nxt = self.prv = _EMPTY
        self._use_slots(_slot_block(0))
        # by key id: its newest slot (-1: none) and its live slots, one row block likewise
        self.head = self.count = _EMPTY
        self._use_keys(_key_block(0))
        self.free = np.zeros(0, dtype=np.int64)
        self.n_free = 0
        self.top = 0  # slots ever used
        self.live = 0
        self.runs: list[_EndRun] = []
        # the last insert's sessions, not in slots yet: their key ids and rows (see insert)
        self.young: tuple[Int64Array, SessionRows] | None = None

    def __len__(self) -> int:
        return self.live + (0 if self.young is None else len(self.young[1]))

    def _use_slots(self, block: Int64Array) -> None:
        """Take ``block`` (:func:`_slot_block`) as the slots' columns."""
        self._slot_rows = block
        self.kid, self.gen, self.nxt, self.prv = block[:, 0], block[:, 1], block[:, 2], block[:, 3]
        self.starts_ms, self.ends_ms = block[:, 4], block[:, 5]

    def _grow_slots(self, size: int) -> None:
        """Room for ``size`` slots (doubling), the old rows kept."""
        block = _grown(self._slot_rows, size, _slot_block)
        if block is not None:
            self._use_slots(block)

    def _use_keys(self, block: Int64Array) -> None:
        """Take ``block`` (:func:`_key_block`) as the key ids' columns."""
        self._key_rows = block
        self.head, self.count = block[:, 0], block[:, 1]

    def _grow_keys(self, size: int) -> None:
        """Room for ``size`` key ids (doubling), the old rows kept."""
        block = _grown(self._key_rows, size, _key_block)
        if block is not None:
            self._use_keys(block)

    # -- reading -------------------------------------------------------------------------

    def check(self, values: list[npt.NDArray[Any] | None]) -> None:
        """Raise :class:`NotColumnar` for a batch the open accumulators cannot take."""
        self.settle()
        for part, part_values in zip(self.parts, values, strict=True):
            part.check(part_values, self.live)

    def probe(self, kids: Int64Array) -> tuple[Int64Array, Int64Array]:
        """The live slots of the key ids ``kids`` (``-1``: an unknown key), with the position
        in ``kids`` of each slot's key."""
        self.settle()
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
        self.settle()
        if keys is None:
            keys = self.index.column(self.kid[slots])
        return SessionRows(keys, self.starts_ms[slots], self.ends_ms[slots],
                           [part.gather(slots) for part in self.parts])

    def live_slots(self) -> Int64Array:
        self.settle()
        return np.flatnonzero(self.kid[:self.top] >= 0)

    def live_ends(self) -> Int64Array:
        # the slots first: placing the last insert may grow the row block, and with it the
        # column views, so a view taken before live_slots() settles would be the old block's
        slots = self.live_slots()
        ends: Int64Array = self.ends_ms[slots]
        return ends

    # -- changing ------------------------------------------------------------------------

    def remove(self, slots: Int64Array) -> None:
        """Forget the live, distinct ``slots``."""
        self.settle()
        if not len(slots):
            return
        for part in self.parts:
            part.free(slots)
        self.n_free = compiled(tk.table_unlink)(
            slots, self.kid, self.nxt, self.prv, self.head, self.count, self.gen, self.free,
            self.n_free)
        self.live -= len(slots)

    def insert(self, keys: Sequence[Any], key_codes: Int64Array, kids: Int64Array,
               rows: SessionRows, key_ints: Int64Array | None = None) -> None:
        """Add the sessions ``rows``; row ``i``'s key is ``keys[key_codes[i]]``, whose id is
        ``kids[key_codes[i]]`` (``-1``: new to the index; ``kids`` is filled in).

        The keys get their ids at once; the sessions take slots on the table's next use
        (:meth:`settle`), so that those the next :meth:`close_upto` closes (in a batch, most
        of the sessions it makes) never take one, nor an end-index entry."""
        n = len(rows)
        if not n:
            return
        self.settle()
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
        self.young = (kids[key_codes], rows)

    def settle(self) -> None:
        """Put the last insert's sessions in slots, if they are not yet."""
        young = self.young
        if young is not None:
            self.young = None
            self._place(*young)

    def _place(self, row_kids: Int64Array, rows: SessionRows) -> None:
        """Put the sessions ``rows`` in slots, row ``i`` under key id ``row_kids[i]``."""
        # every key id has a list, even an empty one (an index built beside the table may
        # hold keys already)
        self._grow_keys(self.index.size)
        n = len(rows)
        if not n:
            return
        slots = self._allocate(n)
        self.starts_ms[slots] = rows.starts_ms
        self.ends_ms[slots] = rows.ends_ms
        live_before = self.live
        for part, columns in zip(self.parts, rows.parts, strict=True):
            part.write(slots, columns, len(self.kid), live_before)
        compiled(tk.table_link)(slots, row_kids, self.kid, self.nxt, self.prv,
                                self.head, self.count)
        self.live += n
        self._push_ends(slots)
        # no key renumbering here: placing runs inside reads (settle), and a caller's key ids
        # looked up before the read must stay valid through it
        self._tidy(keys=False)

    def reserve(self, slots: int) -> None:
        """Make room for ``slots`` slots (and as many key ids) before a large insert, so that
        the inserts after it do not grow every column at once."""
        self.settle()
        self._grow_slots(slots)
        self.free = grown(self.free, slots)
        self._grow_keys(slots)

    def _allocate(self, n: int) -> Int64Array:
        reused = min(n, self.n_free)
        slots = np.empty(n, dtype=np.int64)
        slots[:reused] = self.free[self.n_free - reused:self.n_free]
        self.n_free -= reused
        first = self.top
        slots[reused:] = np.arange(first, first + n - reused, dtype=np.int64)
        self.top = first + n - reused
        if self.top > len(self.kid):
            self._grow_slots(self.top)
            self.free = grown(self.free, len(self.kid))
        return slots

    def _push_ends(self, slots: Int64Array) -> None:
        """Index the ends of the new live ``slots``: a run of their own, then merges."""
        ends = self.ends_ms[slots]
        order = sort_order([ends])
        runs = self.runs
        runs.append(_EndRun(ends[order], slots[order], self.gen[slots][order]))
        while len(runs) > 1 and runs[-1].size() >= runs[-2].size():
            top = runs.pop()
            runs[-1] = runs[-1].merged(top, self.gen)

    def close_upto(self, upto: int, *, rows: bool) -> SessionRows | None:
        """Forget every session ending at or before ``upto``; return them (``rows``), in no
        particular order. The last insert's sessions that close are taken from its rows
        (their keys from the key index, as the table's); the others take slots."""
        young_closed = None
        young = self.young
        if young is not None:
            self.young = None
            row_kids, new = young
            closing = new.ends_ms <= upto
            if closing.any():
                if rows:
                    picked = np.flatnonzero(closing)
                    young_closed = _keyless_take(new, picked,
                                                 self.index.column(row_kids[picked]))
                staying = np.flatnonzero(~closing)
                row_kids, new = row_kids[staying], _keyless_take(new, staying, None)
            self._place(row_kids, new)
        found = [run.pop_upto(upto, self.gen) for run in self.runs]
        self.runs = [run for run in self.runs if run.size()]
        slots = np.concatenate(found) if found else _EMPTY
        closed = None
        if len(slots):
            closed = self.rows(slots) if rows else None
            self.remove(slots)
            self._tidy()
        if young_closed is None:
            return closed if len(slots) else None
        return young_closed if closed is None else closed.concat(young_closed)

    def _tidy(self, *, keys: bool = True) -> None:
        """Drop key ids without sessions once they outnumber the live ones (``keys``: only
        :meth:`close_upto` does, the one step whose removals leave keys without sessions), and
        compact collect arenas: each costs what the live state holds, after at least as much
        churn."""
        for part in self.parts:
            if part.kind == "collect" and part.used > 2 * part.live_items + part.ARENA_SLACK:
                part.compact(self.live_slots())
        size = self.index.size
        if keys and size > self.KEY_SLACK and size > 2 * self.live:
            kept = np.flatnonzero(self.count[:size] > 0)
            renumber = np.full(size, -1, dtype=np.int64)
            renumber[kept] = np.arange(len(kept), dtype=np.int64)
            live = self.live_slots()
            self.kid[live] = renumber[self.kid[live]]
            block = _key_block(len(kept))
            block[:, 0] = self.head[kept]
            block[:, 1] = self.count[kept]
            self._use_keys(block)
            self.index.keep(kept)


# -- loading: the table rebuilt from the committed store ---------------------------------------
