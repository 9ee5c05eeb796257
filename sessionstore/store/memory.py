"""The in-memory session store: the model other implementations are tested against."""

from __future__ import annotations

import bisect
import operator
from collections.abc import Iterator
from itertools import filterfalse

import numpy as np

from ..types import ValueSerde
from .base import BulkSessions, CommittedState, SegmentedSessionStore

# (end, key, start) -> (key, end, start), and back: the two orders of one session's tuple
_KEY_FIRST = operator.itemgetter(1, 0, 2)


class _Segment:
    """One segment: values by ``(end, encoded_key, start)`` and the same sessions in two sorted
    lists, time-first ``(end, key, start)`` and key-first ``(key, end, start)``.

    Flat containers only, so that a commit's snapshot and a bulk write are C-level dict and list
    operations rather than a Python call per key or per session.
    """

    __slots__ = ("values", "by_time", "by_key")

    def __init__(self) -> None:
        self.values: dict[tuple[int, bytes, int], bytes] = {}
        self.by_time: list[tuple[int, bytes, int]] = []
        self.by_key: list[tuple[bytes, int, int]] = []

    def copy(self) -> _Segment:
        other = _Segment()
        other.values = self.values.copy()
        other.by_time = self.by_time.copy()
        other.by_key = self.by_key.copy()
        return other

    def add_index(self, added: list[tuple[int, bytes, int]]) -> None:
        """Index sessions new to ``values``; one sort each (Timsort merges the sorted runs)."""
        self.by_time.extend(added)
        self.by_time.sort()
        self.by_key.extend(map(_KEY_FIRST, added))
        self.by_key.sort()


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
            bisect.insort(segment.by_time, entry)
            bisect.insort(segment.by_key, (encoded_key, end, start))
        segment.values[entry] = data

    def _write_many(self, sessions: BulkSessions) -> None:
        # Whole-column operations per touched segment: dict.update from pre-built tuples, and
        # the indexes extended and sorted once (an insort per session moves the list each time).
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
                segment.add_index(added)

    def _delete(self, encoded_key: bytes, end: int, start: int) -> None:
        segment = self._segments.get(end // self._interval)
        if segment is None:
            return
        entry = (end, encoded_key, start)
        if segment.values.pop(entry, None) is not None:
            del segment.by_time[bisect.bisect_left(segment.by_time, entry)]
            del segment.by_key[bisect.bisect_left(segment.by_key, (encoded_key, end, start))]

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
            if segment is None:
                continue
            present = entries & segment.values.keys()
            if not present:
                continue
            for entry in present:
                del segment.values[entry]
            # one filtering pass per index instead of a list deletion per session
            segment.by_time = list(filterfalse(present.__contains__, segment.by_time))
            gone = set(map(_KEY_FIRST, present))
            segment.by_key = list(filterfalse(gone.__contains__, segment.by_key))

    def _get(self, encoded_key: bytes, end: int, start: int) -> bytes | None:
        segment = self._segments.get(end // self._interval)
        if segment is None:
            return None
        return segment.values.get((end, encoded_key, start))

    def _scan_key(
        self, encoded_key: bytes, earliest_end: int, latest_start: int
    ) -> Iterator[tuple[int, int, bytes]]:
        first = earliest_end // self._interval
        for seg in sorted(s for s in self._segments if s >= first):
            segment = self._segments[seg]
            index = segment.by_key
            rows = []
            for i in range(bisect.bisect_left(index, (encoded_key,)), len(index)):
                key, end, start = index[i]
                if key != encoded_key:
                    break
                if end >= earliest_end and start <= latest_start:
                    rows.append((end, start, segment.values[(end, key, start)]))
            yield from rows

    def _scan_time(
        self, earliest_end: int, latest_end: int
    ) -> Iterator[tuple[int, bytes, int, bytes]]:
        if earliest_end > latest_end:
            return
        first, last = earliest_end // self._interval, latest_end // self._interval
        for seg in sorted(s for s in self._segments if first <= s <= last):
            segment = self._segments[seg]
            index = segment.by_time
            rows = []
            for i in range(bisect.bisect_left(index, (earliest_end,)), len(index)):
                entry = index[i]
                if entry[0] > latest_end:
                    break
                rows.append((*entry, segment.values[entry]))
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
