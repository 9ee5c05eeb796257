"""One place for the engine's defaults and the retention rule.

The store's retention must cover every session until the engine has emitted it. Sessions end
``gap`` after their last event, stream time (the largest session end the store saw) runs up to
``gap + max_out_of_orderness`` ahead of the watermark, and a session may change for ``grace``
after its end, so the minimum is ``gap + grace + max_out_of_orderness`` (the out-of-orderness
term only applies when the engine derives its watermark from event times).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..timeutil import INT64_MAX, INT64_MIN, duration_ms
from ..windows import SessionWindows

DEFAULT_CACHE_MAX_SESSIONS = 100_000
"""Sessions the write-back cache holds before it writes everything and starts over."""

WATERMARK_MODES = ("event_time", "external")
NO_WATERMARK = INT64_MIN
"""The watermark (and close cursor) before any progress."""


def required_retention_ms(windows: SessionWindows, max_out_of_orderness_ms: int,
                          watermark: str) -> int:
    """The smallest store retention that keeps every session until the engine emitted it.

    Args:
        windows: the session windows (gap and grace).
        max_out_of_orderness_ms: the lag of an event-time watermark behind the data.
        watermark: ``"event_time"`` or ``"external"``.

    Returns:
        ``gap + grace`` plus ``max_out_of_orderness_ms`` for an event-time watermark.
    """
    ooo = max_out_of_orderness_ms if watermark == "event_time" else 0
    return windows.gap_ms + windows.grace_ms + ooo


def expiry_cap_ms(close_cursor_ms: int, retention_ms: int) -> int:
    """The store time expiry may run at, given that every session ending at or before
    ``close_cursor_ms`` has been emitted: sessions it expires then end before the cursor."""
    if close_cursor_ms == NO_WATERMARK:
        return NO_WATERMARK
    return min(INT64_MAX, close_cursor_ms + retention_ms)


@dataclass(frozen=True)
class EngineConfig:
    """The validated options of a :class:`~sessionstore.engine.SessionAggregator`.

    Attributes:
        gap_ms, grace_ms, inclusive_gap: from the windows.
        max_out_of_orderness_ms: lag of the event-time watermark behind the largest event time.
        watermark: ``"event_time"`` or ``"external"``.
        cache_max_sessions: capacity of the write-back cache (0: write through).
    """

    gap_ms: int
    grace_ms: int
    inclusive_gap: bool
    max_out_of_orderness_ms: int
    watermark: str
    cache_max_sessions: int

    @classmethod
    def build(cls, windows: SessionWindows, *, watermark: str, max_out_of_orderness_ms: Any,
              cache_max_sessions: Any, store_retention_ms: int) -> EngineConfig:
        """Validate the options against each other and the store.

        Raises:
            TypeError / ValueError: naming the offending argument.
        """
        if not isinstance(windows, SessionWindows):
            raise TypeError(f"windows must be SessionWindows, got {type(windows).__name__}")
        if isinstance(cache_max_sessions, bool) or not isinstance(cache_max_sessions, int) \
                or cache_max_sessions < 0:
            raise ValueError(f"cache_max_sessions must be an int >= 0, got {cache_max_sessions!r}")
        if watermark not in WATERMARK_MODES:
            raise ValueError(f"watermark must be 'event_time' or 'external', got {watermark!r}")
        ooo = duration_ms(max_out_of_orderness_ms, "max_out_of_orderness_ms")
        if ooo < 0:
            raise ValueError(f"max_out_of_orderness_ms must be >= 0, got {ooo}")
        needed = required_retention_ms(windows, ooo, watermark)
        if store_retention_ms < needed:
            raise ValueError(
                f"store retention_ms={store_retention_ms} must be >= {needed} "
                f"(gap_ms + grace_ms + max_out_of_orderness_ms), or closed sessions could "
                f"expire before they are emitted"
            )
        return cls(windows.gap_ms, windows.grace_ms, windows.inclusive_gap, ooo, watermark,
                   cache_max_sessions)

    @property
    def max_timestamp_ms(self) -> int:
        """The largest event time whose window end plus grace still fits in int64."""
        return INT64_MAX - self.gap_ms - self.grace_ms
