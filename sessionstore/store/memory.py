"""The in-memory session store: the model other implementations are tested against."""

from __future__ import annotations

import bisect
from collections.abc import Collection, Iterator, Sequence
from itertools import filterfalse
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from .. import keyschema
from ..arrays import ByteRows, SeenBits, first_equal_rows, last_rows, sort_order
from ..packing import PackedValues
from ..types import ValueSerde
from .base import BulkSessions, CommittedState, SegmentedSessionStore
from .keycodec import EncodedKeys

# A segment looks at its log of bulk operations (see _Segment.log) once the log holds more rows
# than this plus twice its applied sessions plus twice what it held when last looked at, and
# compacts it when at least a quarter of its rows may be garbage (_Segment.garbage_bound): the
# log stays within a constant factor of the live data, and a logged row is looked at (and
# compacted) about twice on average.
_MAX_UNAPPLIED_ROWS = 1 << 17


class _Bulk(NamedTuple):
    """One bulk write (``data`` given) or bulk delete (``data`` None) into one segment, not yet
    applied: session ``i`` is ``(ends[i], keys[key_index[i]], starts[i])``, with value
    ``data[i]``. The encodings and values are byte rows (:class:`~sessionstore.arrays.ByteRows`),
    or values not packed yet (:class:`~sessionstore.packing.PackedValues` of columns, packed
    when the bulk is applied or compacted): no Python object per key or value until the bulk
    is applied. Never mutated, so that a commit's snapshot can share it."""

    keys: ByteRows
    key_index: npt.NDArray[np.int64]
    starts: npt.NDArray[np.int64]
    ends: npt.NDArray[np.int64]
    data: ByteRows | PackedValues | None

    def entries(self) -> list[tuple[int, bytes, int]]:
        """The sessions as ``(end, encoded_key, start)`` tuples (sessions of one key share its
        bytes object)."""
        keys = self.keys.tolist()
        if len(self.key_index) * 4 < len(keys):
            picked = [keys[k] for k in self.key_index.tolist()]
        else:  # an object array gathers about twice as fast as a list comprehension
            boxed = np.empty(len(keys), dtype=object)
            boxed[:] = keys
            picked = boxed[self.key_index].tolist()
        return list(zip(self.ends.tolist(), picked, self.starts.tolist(), strict=True))


def compact_log(pending: list[_Bulk],
                applied: Collection[tuple[int, bytes, int]]) -> list[_Bulk]:
    """The net effect of applying the bulks of ``pending`` in order to ``applied`` (the
    segment's applied sessions), as at most two bulks.

    A delete of the sessions whose last logged operation deletes them and that ``applied``
    holds (the others have nothing to delete), and a write of every other logged session with
    its last value, in log order. The two touch disjoint sessions, so that applying them in
    either order gives what applying ``pending`` gives. Costs a few array operations and two
    hash-table passes (compiled) per row, and a Python tuple only per deleted session.
    """
    if not pending:
        return []
    # each bulk has its own key rows: one id per distinct encoding across them, the position
    # of its first listing in the chained rows
    listed = ByteRows.concat([bulk.keys for bulk in pending])
    first_listed = first_equal_rows(listed.data, listed.first, listed.stop)
    at = 0
    parts = []
    for bulk in pending:
        parts.append(first_listed[at + bulk.key_index])
        at += len(bulk.keys)
    key_ids = np.concatenate(parts)
    ends = np.concatenate([bulk.ends for bulk in pending])
    starts = np.concatenate([bulk.starts for bulk in pending])
    writes = np.repeat(np.array([bulk.data is not None for bulk in pending], dtype=np.bool_),
                       [len(bulk.ends) for bulk in pending])
    last = last_rows(ends, key_ids, starts)  # each session's last operation
    written = last & writes
    values = [_rows_of(bulk.data) for bulk in pending if bulk.data is not None]
    data = (ByteRows.concat(values).take(np.flatnonzero(written[writes])) if values
            else None)
    deleted = np.flatnonzero(last & ~writes) if len(applied) else np.zeros(0, dtype=np.int64)
    if len(deleted):  # only what the applied sessions hold: the log stays within the data
        entries = zip(ends[deleted].tolist(), listed.tolist(key_ids[deleted]),
                      starts[deleted].tolist(), strict=True)
        deleted = deleted[np.fromiter(map(applied.__contains__, entries), dtype=np.bool_,
                                      count=len(deleted))]
    kept: list[tuple[npt.NDArray[np.int64], ByteRows | None]] = [
        (deleted, None), (np.flatnonzero(written), data)]
    used = np.zeros(len(listed), dtype=np.bool_)
    for picked, _ in kept:
        used[key_ids[picked]] = True
    renumber = np.cumsum(used) - 1
    keys = listed.take(np.flatnonzero(used))
    return [_Bulk(keys, renumber[key_ids[picked]], starts[picked], ends[picked], rows)
            for picked, rows in kept if len(picked)]


class _Segment:
    """One segment: values by ``(end, encoded_key, start)``, the same sessions time-first in a
    list ``(end, key, start)`` sorted on first read, key-first as a per-key index
    ``{key: [(end, start), ...]}`` built on first read, and the bulk writes and deletes not
    applied yet.

    Bulk operations are logged as columns (:class:`_Bulk`) and applied, in order, by the first
    operation that needs the dict (:meth:`settle`): a read, a single write or delete. The fast
    batch path writes every batch and rarely reads the store, and segments expire whole, so
    most bulk-written sessions never become Python tuples; a read pays what the write skipped,
    once. A log that grows with no read in between is compacted in columns (:meth:`compact`).
    The values dict and the time list are flat, so that applying a bulk write and a
    commit's snapshot are C-level dict and list operations rather than a Python call per key or
    per session. The key index is per key because the event path's one-by-one writes land at
    random places of a single key-first list, and inserting there moved half of it each time.
    """

    __slots__ = ("_values", "_by_time", "_unsorted", "_by_key", "_pending", "_pending_rows",
                 "_compacted_rows")

    def __init__(self) -> None:
        self._values: dict[tuple[int, bytes, int], bytes] = {}
        self._by_time: list[tuple[int, bytes, int]] = []
        self._unsorted = False
        # encoded key -> its sessions' (end, start), sorted; None: rebuild on the next read
        self._by_key: dict[bytes, list[tuple[int, int]]] | None = {}
        self._pending: list[_Bulk] = []
        self._pending_rows = 0
        # the rows the log held when last looked at: after its last compaction, or when it
        # was found with too little garbage to compact
        self._compacted_rows = 0

    def copy(self) -> _Segment:
        other = _Segment()
        other._values = self._values.copy()
        other._by_time = self._by_time.copy()
        other._unsorted = self._unsorted
        other._by_key = None  # rebuilt if the copy is ever read by key
        other._pending = self._pending.copy()
        other._pending_rows = self._pending_rows
        other._compacted_rows = self._compacted_rows
        return other

    def log(self, bulk: _Bulk) -> None:
        """Log a bulk write or delete, applied by the next :meth:`settle`."""
        self._pending.append(bulk)
        self._pending_rows += len(bulk.ends)
        # a log is applied by the next read; bound what it holds when no read comes (rewrites
        # and deletes of the same sessions would otherwise pile up until the segment expires)
        if self._pending_rows > _MAX_UNAPPLIED_ROWS + 2 * (len(self._values)
                                                          + self._compacted_rows):
            # the deletes alone (no hashing) often tell: logs of rewritten sessions
            if 8 * self._deleted_rows() > self._pending_rows or (
                    4 * self.garbage_bound() > self._pending_rows):
                self.compact()
            else:  # mostly live (new sessions): compacting would copy it for nothing
                self._compacted_rows = self._pending_rows

    def garbage_bound(self) -> int:
        """At least as many rows as compacting the log would drop (the rows a later row of the
        log overwrites or deletes, and deletes of what is not applied): each logged delete
        counts twice, each logged write of a session that an earlier logged write wrote (by
        a hash of its key's bytes, end and start, marked in a bitmap: a hash sharing a bit
        only counts more) once. Costs a compiled hash pass over the written rows, a fraction
        of a compaction."""
        writes = [bulk for bulk in self._pending if bulk.data is not None]
        seen = SeenBits(sum(len(bulk.ends) for bulk in writes))
        repeats = sum(seen.add_rows(bulk.keys, bulk.key_index, bulk.ends, bulk.starts)
                      for bulk in writes)
        return repeats + 2 * self._deleted_rows()

    def _deleted_rows(self) -> int:
        return sum(len(bulk.ends) for bulk in self._pending if bulk.data is None)

    def compact(self) -> None:
        """Replace the log by its net effect (:func:`compact_log`), in columns: what a read
        sees does not change, and no session becomes a Python object."""
        # new bulks in a new list: a commit's snapshot may share the old ones
        self._pending = compact_log(self._pending, self._values)
        self._pending_rows = self._compacted_rows = sum(len(b.ends) for b in self._pending)

    def values(self) -> dict[tuple[int, bytes, int], bytes]:
        """The sessions' values, every logged bulk operation applied."""
        if self._pending:
            self.settle()
        return self._values

    def settle(self) -> None:
        """Apply the logged bulk operations, in the order they came."""
        pending, self._pending = self._pending, []
        self._pending_rows = self._compacted_rows = 0
        for bulk in pending:
            entries = bulk.entries()
            if bulk.data is None:
                self.discard_many(set(entries))
                continue
            values = self._values
            added = list(filterfalse(values.__contains__, entries))
            values.update(zip(entries, _rows_of(bulk.data).tolist(), strict=True))
            if added:
                self.add_many(added)

    def by_time(self) -> list[tuple[int, bytes, int]]:
        """The sessions in (end, key, start) order."""
        if self._pending:
            self.settle()
        if self._unsorted:
            self._by_time.sort()
            self._unsorted = False
        return self._by_time

    def key_index(self) -> dict[bytes, list[tuple[int, int]]]:
        """Each key's sessions as ``(end, start)``, in that order."""
        if self._pending:
            self.settle()
        index = self._by_key
        if index is None:
            index = {}
            for end, key, start in self.by_time():  # by end: each key's list comes out sorted
                bounds = index.get(key)
                if bounds is None:
                    index[key] = [(end, start)]
                else:
                    bounds.append((end, start))
            self._by_key = index
        return index

    def write(self, entry: tuple[int, bytes, int], data: bytes) -> None:
        """Write one session."""
        values = self.values()
        if entry not in values:
            self._add(entry)
        values[entry] = data

    def _add(self, entry: tuple[int, bytes, int]) -> None:
        """Index one session new to the values."""
        if self._unsorted:
            self._by_time.append(entry)
        else:
            bisect.insort(self._by_time, entry)
        index = self._by_key
        if index is not None:
            end, key, start = entry
            bounds = index.get(key)
            if bounds is None:
                index[key] = [(end, start)]
            else:
                bisect.insort(bounds, (end, start))

    def add_many(self, added: list[tuple[int, bytes, int]]) -> None:
        """Index sessions new to the values: a few are inserted in place, many are appended
        and sorted (and the key index rebuilt) on the next read (re-sorting a large index for a
        small flush costs more than the insertions)."""
        if self._unsorted or len(added) * 16 > len(self._by_time):
            self._by_time.extend(added)
            self._unsorted = True
            self._by_key = None
        else:
            for entry in added:
                self._add(entry)

    def discard(self, entry: tuple[int, bytes, int]) -> bool:
        """Remove one session; False when absent."""
        if self.values().pop(entry, None) is None:
            return False
        by_time = self.by_time()
        del by_time[bisect.bisect_left(by_time, entry)]
        index = self._by_key
        if index is not None:
            end, key, start = entry
            bounds = index[key]
            del bounds[bisect.bisect_left(bounds, (end, start))]
            if not bounds:
                del index[key]
        return True

    def discard_many(self, entries: set[tuple[int, bytes, int]]) -> None:
        """Remove the sessions of ``entries`` that are present: one filtering pass over the
        time list (keeping its order) instead of a list deletion per session."""
        values = self.values()
        present = entries & values.keys()
        if not present:
            return
        for entry in present:
            del values[entry]
        self._by_time = list(filterfalse(present.__contains__, self._by_time))
        index = self._by_key
        if index is not None:
            if len(present) * 16 > len(values):
                self._by_key = None
                return
            for end, key, start in present:
                bounds = index[key]
                del bounds[bisect.bisect_left(bounds, (end, start))]
                if not bounds:
                    del index[key]


def _rows_of(data: ByteRows | PackedValues) -> ByteRows:
    """Logged values as byte rows (packing values logged as columns)."""
    return data.rows() if isinstance(data, PackedValues) else data


def _key_rows(encoded: Sequence[bytes]) -> ByteRows:
    """Encodings as byte rows: those the encoder left uncut as they are, others joined."""
    if isinstance(encoded, EncodedKeys):
        return encoded.rows()
    return ByteRows.of_list(list(encoded))


def _copy(segments: dict[int, _Segment]) -> dict[int, _Segment]:
    return {seg: segment.copy() for seg, segment in segments.items()}


class InMemorySessionStore(SegmentedSessionStore):
    """A session store held in Python dicts, with the same API and semantics as
    :class:`~sessionstore.SessionStore`: segments, expiry, versions, commit and abort.

    Values go through the serde exactly as on disk, so round-trips match (tuples become lists).
    Nothing survives the process.
    """

    _KEEPS_BYTE_ROWS = True

    def __init__(
        self,
        *,
        retention_ms: int,
        segment_interval_ms: int | None = None,
        value_serde: ValueSerde | None = None,
    ) -> None:
        super().__init__(
            retention_ms=retention_ms,
            segment_interval_ms=segment_interval_ms,
            value_serde=value_serde,
        )
        self._segments: dict[int, _Segment] = {}
        self._snapshot: dict[int, _Segment] = {}

    def _segment(self, seg: int) -> _Segment:
        segment = self._segments.get(seg)
        if segment is None:
            segment = self._segments[seg] = _Segment()
        return segment

    def _write(self, encoded_key: bytes, end: int, start: int, data: bytes) -> None:
        self._segment(end // self._interval).write((end, encoded_key, start), data)

    def _key_ranks(self, encoded: Sequence[bytes], matrix: keyschema.KeyMatrix | None = None
                   ) -> npt.NDArray[np.int64]:
        """Identity, not byte order: nothing here is written in order. Each encoding ranks as
        the position of its first occurrence, found with a hash table over the encodings'
        bytes (the key matrix's rows when the encoder built one): no sort, and no Python
        hash per key. Encodings that come with labels of their identity
        (:attr:`~.keycodec.EncodedKeys.identities`: the engine's int keys) rank by those."""
        if isinstance(encoded, EncodedKeys) and encoded.identities is not None:
            return encoded.identities
        if matrix is not None:
            rows = np.ascontiguousarray(matrix.rows)
            n, width = rows.shape
            first = np.arange(n, dtype=np.int64) * width
            return first_equal_rows(rows.ravel(), first, first + matrix.lengths)
        keys = _key_rows(encoded)
        return first_equal_rows(keys.data, keys.first, keys.stop)

    def _last_writes(self, key_ranks: npt.NDArray[np.int64], ends: npt.NDArray[np.int64],
                     starts: npt.NDArray[np.int64]) -> npt.NDArray[np.int64] | None:
        # in the call's order: the log applies rows in order, and no read depends on it
        last = last_rows(key_ranks, ends, starts)
        return None if last.all() else np.flatnonzero(last)

    def _by_segment(
            self, sessions: BulkSessions) -> list[tuple[int, npt.NDArray[np.int64] | None]]:
        """``(segment, rows)`` for each segment the sessions touch; ``rows`` keep their
        order (None: every row, all in one segment)."""
        segs = sessions.ends_ms // self._interval
        first = int(segs[0])
        if (segs == first).all():
            return [(first, None)]
        order = sort_order([segs])
        bounds = np.flatnonzero(np.diff(segs[order])) + 1
        return [(int(segs[rows[0]]), rows) for rows in np.split(order, bounds)]

    def _write_many(self, sessions: BulkSessions) -> None:
        # logged as columns per touched segment, applied by the segment's next read (often
        # never: segments expire whole); see _Segment. The log holds byte rows of its own
        # (the caller's lists and packed values are not shared).
        keys = _key_rows(sessions.encoded_keys)
        values = sessions.values
        # values the engine left as columns (copies of its own) stay so until the bulk is
        # applied or compacted, which is often never: segments expire whole
        data: ByteRows | PackedValues
        if type(values) is PackedValues:
            data = values if not values.is_packed() else values.rows()
        else:
            data = ByteRows.of_list(list(values))
        for seg, rows in self._by_segment(sessions):
            if rows is None:  # copies: the log must not share what the caller may change
                bulk = _Bulk(keys, sessions.key_index.copy(), sessions.starts_ms.copy(),
                             sessions.ends_ms.copy(), data)
            else:
                bulk = _Bulk(keys, sessions.key_index[rows], sessions.starts_ms[rows],
                             sessions.ends_ms[rows], data.take(rows))
            self._segment(seg).log(bulk)

    def _delete(self, encoded_key: bytes, end: int, start: int) -> None:
        segment = self._segments.get(end // self._interval)
        if segment is None:
            return
        segment.discard((end, encoded_key, start))

    def _delete_many(self, sessions: BulkSessions) -> None:
        keys = _key_rows(sessions.encoded_keys)
        for seg, rows in self._by_segment(sessions):
            segment = self._segments.get(seg)
            if segment is None:
                continue
            if rows is None:  # copies: the log must not share what the caller may change
                segment.log(_Bulk(keys, sessions.key_index.copy(), sessions.starts_ms.copy(),
                                  sessions.ends_ms.copy(), None))
            else:
                segment.log(_Bulk(keys, sessions.key_index[rows], sessions.starts_ms[rows],
                                  sessions.ends_ms[rows], None))

    def _get(self, encoded_key: bytes, end: int, start: int) -> bytes | None:
        segment = self._segments.get(end // self._interval)
        if segment is None:
            return None
        return segment.values().get((end, encoded_key, start))

    def _scan_key(
        self, encoded_key: bytes, earliest_end: int, latest_start: int, backward: bool = False
    ) -> Iterator[tuple[int, int, bytes]]:
        first = earliest_end // self._interval
        for seg in sorted((s for s in self._segments if s >= first), reverse=backward):
            segment = self._segments[seg]
            bounds = segment.key_index().get(encoded_key)
            if bounds is None:
                continue
            values = segment.values()
            rows = [(end, start, values[(end, encoded_key, start)])
                    for end, start in bounds[bisect.bisect_left(bounds, (earliest_end,)):]
                    if start <= latest_start]
            if backward:
                rows.reverse()
            yield from rows

    def _scan_time(
        self, earliest_end: int, latest_end: int, backward: bool = False
    ) -> Iterator[tuple[int, bytes, int, bytes]]:
        if earliest_end > latest_end:
            return
        first, last = earliest_end // self._interval, latest_end // self._interval
        for seg in sorted((s for s in self._segments if first <= s <= last), reverse=backward):
            segment = self._segments[seg]
            index = segment.by_time()
            low = bisect.bisect_left(index, (earliest_end,))
            high = bisect.bisect_left(index, (latest_end + 1,), low)
            values = segment.values()
            picked = index[low:high]
            if backward:
                picked.reverse()
            rows = [(*entry, values[entry]) for entry in picked]
            yield from rows

    def _drop_segments_below(self, segment: int) -> int:
        doomed = [s for s in self._segments if s < segment]
        for s in doomed:
            del self._segments[s]
        return len(doomed)

    def _commit_state(self, state: CommittedState) -> None:
        self._snapshot = _copy(self._segments)

    def _restore_committed(self) -> None:
        self._segments = _copy(self._snapshot)

    def _release(self) -> None:
        self._segments = {}
