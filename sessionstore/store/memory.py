"""The in-memory session store: the model other implementations are tested against."""

from __future__ import annotations

import bisect
from collections.abc import Iterator

from ..types import ValueSerde
from .base import BulkSessions, CommittedState, SegmentedSessionStore


class _Segment:
    """One segment: sessions by key (the key-first layout) and a sorted time-first index."""

    __slots__ = ("by_key", "by_time")

    def __init__(self) -> None:
        self.by_key: dict[bytes, dict[tuple[int, int], bytes]] = {}
        self.by_time: list[tuple[int, bytes, int]] = []

    def copy(self) -> _Segment:
        other = _Segment()
        other.by_key = {key: dict(sessions) for key, sessions in self.by_key.items()}
        other.by_time = list(self.by_time)
        return other


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

    def _write(self, encoded_key: bytes, end: int, start: int, data: bytes) -> None:
        segment = self._segments.get(end // self._interval)
        if segment is None:
            segment = self._segments[end // self._interval] = _Segment()
        sessions = segment.by_key.setdefault(encoded_key, {})
        if (end, start) not in sessions:
            bisect.insort(segment.by_time, (end, encoded_key, start))
        sessions[(end, start)] = data

    def _write_many(self, sessions: BulkSessions) -> None:
        # Index entries are appended and each touched segment's index sorted once: one insort
        # per session would move the whole list every time.
        interval = self._interval
        keys = sessions.encoded_keys
        added: dict[int, list[tuple[int, bytes, int]]] = {}
        for k, start, end, data in zip(sessions.key_index.tolist(), sessions.starts_ms.tolist(),
                                       sessions.ends_ms.tolist(), sessions.values, strict=True):
            seg = end // interval
            segment = self._segments.get(seg)
            if segment is None:
                segment = self._segments[seg] = _Segment()
            key = keys[k]
            stored = segment.by_key.setdefault(key, {})
            if (end, start) not in stored:
                added.setdefault(seg, []).append((end, key, start))
            stored[(end, start)] = data
        for seg, entries in added.items():
            index = self._segments[seg].by_time
            index.extend(entries)
            index.sort()

    def _delete(self, encoded_key: bytes, end: int, start: int) -> None:
        segment = self._segments.get(end // self._interval)
        if segment is None:
            return
        sessions = segment.by_key.get(encoded_key)
        if sessions is not None and sessions.pop((end, start), None) is not None:
            index = bisect.bisect_left(segment.by_time, (end, encoded_key, start))
            del segment.by_time[index]
            if not sessions:
                del segment.by_key[encoded_key]

    def _get(self, encoded_key: bytes, end: int, start: int) -> bytes | None:
        segment = self._segments.get(end // self._interval)
        if segment is None:
            return None
        return segment.by_key.get(encoded_key, {}).get((end, start))

    def _scan_key(
        self, encoded_key: bytes, earliest_end: int, latest_start: int
    ) -> Iterator[tuple[int, int, bytes]]:
        first = earliest_end // self._interval
        for seg in sorted(s for s in self._segments if s >= first):
            sessions = self._segments[seg].by_key.get(encoded_key)
            if not sessions:
                continue
            for end, start in sorted(sessions):
                if end >= earliest_end and start <= latest_start:
                    yield end, start, sessions[(end, start)]

    def _scan_time(
        self, earliest_end: int, latest_end: int
    ) -> Iterator[tuple[int, bytes, int, bytes]]:
        if earliest_end > latest_end:
            return
        first, last = earliest_end // self._interval, latest_end // self._interval
        for seg in sorted(s for s in self._segments if first <= s <= last):
            segment = self._segments[seg]
            index = bisect.bisect_left(segment.by_time, (earliest_end,))
            rows = []
            for end, key, start in segment.by_time[index:]:
                if end > latest_end:
                    break
                rows.append((end, key, start, segment.by_key[key][(end, start)]))
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
