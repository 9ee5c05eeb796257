"""The in-memory session store: the model other implementations are tested against."""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from itertools import filterfalse

import numpy as np
import numpy.typing as npt

from ..types import ValueSerde
from .base import BulkSessions, CommittedState, SegmentedSessionStore


class _Segment:
    """One segment: values by ``(end, encoded_key, start)``, the same sessions time-first in a
    list ``(end, key, start)`` sorted on first read, and key-first as a per-key index
    ``{key: [(end, start), ...]}`` built on first read.

    The values dict and the time list are flat, so that a commit's snapshot and a bulk write are
    C-level dict and list operations rather than a Python call per key or per session. A bulk
    write appends to the time list and drops the key index: the fast batch path writes every
    batch and rarely reads the store, so the sort (and the index) is paid by the read that needs
    it, once. The key index is per key because the event path's one-by-one writes land at
    random places of a single key-first list, and inserting there moved half of it each time.
    """

    __slots__ = ("values", "_by_time", "_unsorted", "_by_key")

    def __init__(self) -> None:
        self.values: dict[tuple[int, bytes, int], bytes] = {}
        self._by_time: list[tuple[int, bytes, int]] = []
        self._unsorted = False
        # encoded key -> its sessions' (end, start), sorted; None: rebuild on the next read
        self._by_key: dict[bytes, list[tuple[int, int]]] | None = {}

    def copy(self) -> _Segment:
        other = _Segment()
        other.values = self.values.copy()
        other._by_time = self._by_time.copy()
        other._unsorted = self._unsorted
        other._by_key = None  # rebuilt if the copy is ever read by key
        return other

    def by_time(self) -> list[tuple[int, bytes, int]]:
        """The sessions in (end, key, start) order."""
        if self._unsorted:
            self._by_time.sort()
            self._unsorted = False
        return self._by_time

    def key_index(self) -> dict[bytes, list[tuple[int, int]]]:
        """Each key's sessions as ``(end, start)``, in that order."""
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

    def add(self, entry: tuple[int, bytes, int]) -> None:
        """Index one session new to ``values``."""
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
        """Index sessions new to ``values``: a few are inserted in place, many are appended
        and sorted (and the key index rebuilt) on the next read (re-sorting a large index for a
        small flush costs more than the insertions)."""
        if self._unsorted or len(added) * 16 > len(self._by_time):
            self._by_time.extend(added)
            self._unsorted = True
            self._by_key = None
        else:
            for entry in added:
                self.add(entry)

    def discard(self, entry: tuple[int, bytes, int]) -> bool:
        """Remove one session; False when absent."""
        if self.values.pop(entry, None) is None:
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
        present = entries & self.values.keys()
        if not present:
            return
        for entry in present:
            del self.values[entry]
        self._by_time = list(filterfalse(present.__contains__, self._by_time))
        index = self._by_key
        if index is not None:
            if len(present) * 16 > len(self.values):
                self._by_key = None
                return
            for end, key, start in present:
                bounds = index[key]
                del bounds[bisect.bisect_left(bounds, (end, start))]
                if not bounds:
                    del index[key]


def _copy(segments: dict[int, _Segment]) -> dict[int, _Segment]:
    return {seg: segment.copy() for seg, segment in segments.items()}


class InMemorySessionStore(SegmentedSessionStore):
    """A session store held in Python dicts, with the same API and semantics as
    :class:`~sessionstore.SessionStore`: segments, expiry, versions, commit and abort.

    Values go through the serde exactly as on disk, so round-trips match (tuples become lists).
    Nothing survives the process.
    """

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
        segment = self._segment(end // self._interval)
        entry = (end, encoded_key, start)
        if entry not in segment.values:
            segment.add(entry)
        segment.values[entry] = data

    def _key_ranks(self, encoded: list[bytes]) -> npt.NDArray[np.int64]:
        """Identity, not byte order: nothing here is written in order. Distinct encodings (the
        batch path's keys) rank by position, skipping the sort; repeated ones by first
        occurrence."""
        n = len(encoded)
        if len(set(encoded)) == n:
            return np.arange(n, dtype=np.int64)
        first: dict[bytes, int] = {}
        return np.fromiter((first.setdefault(key, len(first)) for key in encoded),
                           dtype=np.int64, count=n)

    def _write_many(self, sessions: BulkSessions) -> None:
        # Whole-column operations per touched segment: dict.update from pre-built tuples, and
        # the indexes extended, to be sorted once on the next read (not an insort per session).
        ends = sessions.ends_ms
        segs = ends // self._interval
        keys = np.empty(len(sessions.encoded_keys), dtype=object)
        keys[:] = sessions.encoded_keys
        entries = list(zip(ends.tolist(), keys[sessions.key_index].tolist(),
                           sessions.starts_ms.tolist(), strict=True))
        first = int(segs[0])
        if (segs == first).all():
            groups = [(first, entries, sessions.values)]
        else:
            order = np.argsort(segs, kind="stable")
            bounds = np.flatnonzero(np.diff(segs[order])) + 1
            groups = []
            for rows in np.split(order, bounds):
                picked = rows.tolist()
                groups.append((int(segs[rows[0]]),
                               [entries[r] for r in picked],
                               [sessions.values[r] for r in picked]))
        for seg, seg_entries, seg_values in groups:
            segment = self._segment(seg)
            added = list(filterfalse(segment.values.__contains__, seg_entries))
            segment.values.update(zip(seg_entries, seg_values, strict=True))
            if added:
                segment.add_many(added)

    def _delete(self, encoded_key: bytes, end: int, start: int) -> None:
        segment = self._segments.get(end // self._interval)
        if segment is None:
            return
        segment.discard((end, encoded_key, start))

    def _delete_many(self, sessions: BulkSessions) -> None:
        interval = self._interval
        keys = np.empty(len(sessions.encoded_keys), dtype=object)
        keys[:] = sessions.encoded_keys
        doomed: dict[int, set[tuple[int, bytes, int]]] = {}
        for entry in zip(sessions.ends_ms.tolist(), keys[sessions.key_index].tolist(),
                         sessions.starts_ms.tolist(), strict=True):
            doomed.setdefault(entry[0] // interval, set()).add(entry)
        for seg, entries in doomed.items():
            segment = self._segments.get(seg)
            if segment is not None:
                segment.discard_many(entries)

    def _get(self, encoded_key: bytes, end: int, start: int) -> bytes | None:
        segment = self._segments.get(end // self._interval)
        if segment is None:
            return None
        return segment.values.get((end, encoded_key, start))

    def _scan_key(
        self, encoded_key: bytes, earliest_end: int, latest_start: int, backward: bool = False
    ) -> Iterator[tuple[int, int, bytes]]:
        first = earliest_end // self._interval
        for seg in sorted((s for s in self._segments if s >= first), reverse=backward):
            segment = self._segments[seg]
            bounds = segment.key_index().get(encoded_key)
            if bounds is None:
                continue
            values = segment.values
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
            values = segment.values
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
