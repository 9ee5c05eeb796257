"""Window definitions: session windows (KIP-94) and stream-time batch windows (KIP "BatchWindows")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .timeutil import check_int64, duration_ms


@dataclass(frozen=True, init=False)
class SessionWindows:
    """Session windows: an event at ``t`` opens ``[t, t + gap)``; overlapping windows merge.

    Args:
        gap_ms: the inactivity gap (> 0). Also accepts a ``timedelta`` or ``"10 minutes"``.
        grace_ms: how long after a session's end (in watermark time) late events may still
            change it (>= 0).
        inclusive_gap: True (Spark, Flink, Kafka) merges windows that merely touch, so events
            exactly ``gap`` apart share a session; False (Beam) requires them to overlap.
        retention_ms: how long the store keeps a session after its end; at least
            ``gap_ms + grace_ms``, which is the default.

    Raises:
        ValueError: ``gap_ms <= 0``, ``grace_ms < 0``, ``retention_ms < gap_ms + grace_ms``, or
            a value (``gap_ms + grace_ms`` included) outside int64.
        TypeError: an argument is not a duration.
    """

    gap_ms: int
    grace_ms: int
    inclusive_gap: bool
    retention_ms: int

    def __init__(
        self,
        gap_ms: Any,
        grace_ms: Any = 0,
        inclusive_gap: bool = True,
        retention_ms: Any = None,
    ) -> None:
        gap = duration_ms(gap_ms, "gap_ms")
        if gap <= 0:
            raise ValueError(f"gap_ms must be > 0, got {gap}")
        grace = duration_ms(grace_ms, "grace_ms")
        if grace < 0:
            raise ValueError(f"grace_ms must be >= 0, got {grace}")
        if not isinstance(inclusive_gap, bool):
            raise TypeError(f"inclusive_gap must be a bool, got {inclusive_gap!r}")
        if retention_ms is None:  # the derived value must fit int64 like the given ones
            retention = check_int64(gap + grace, "retention_ms (gap_ms + grace_ms)")
        else:
            retention = duration_ms(retention_ms, "retention_ms")
        if retention < gap + grace:
            raise ValueError(
                f"retention_ms must be >= gap_ms + grace_ms = {gap + grace}, got {retention}"
            )
        object.__setattr__(self, "gap_ms", gap)
        object.__setattr__(self, "grace_ms", grace)
        object.__setattr__(self, "inclusive_gap", inclusive_gap)
        object.__setattr__(self, "retention_ms", retention)

    def merge_bounds(self, timestamp_ms: int) -> tuple[int, int]:
        """``(earliest_end, latest_start)`` of the sessions an event at ``timestamp_ms`` joins."""
        if self.inclusive_gap:
            return timestamp_ms, timestamp_ms + self.gap_ms
        return timestamp_ms + 1, timestamp_ms + self.gap_ms - 1


@dataclass(frozen=True, init=False)
class BatchWindows:
    """Fixed windows chosen by the *observed stream time*, not the event's own time.

    An event goes to ``[start, start + size)`` with ``start = floor(stream_time / size) * size``.
    Nothing is ever late; a window closes when stream time reaches its end.

    Raises:
        ValueError: ``size_ms <= 0``.
    """

    size_ms: int

    def __init__(self, size_ms: Any) -> None:
        size = duration_ms(size_ms, "size_ms")
        if size <= 0:
            raise ValueError(f"size_ms must be > 0, got {size}")
        object.__setattr__(self, "size_ms", size)

    @property
    def retention_ms(self) -> int:
        return self.size_ms

    def window_start(self, stream_time_ms: int) -> int:
        return (stream_time_ms // self.size_ms) * self.size_ms
