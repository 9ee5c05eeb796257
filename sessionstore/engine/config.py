"""One place for the engine's defaults and the retention rule.

The store's retention must cover every session until the engine has emitted it. Sessions end
at most ``max_gap`` after their last event (``max_gap`` is the gap when it is fixed), stream time
(the largest session end the store saw) runs up to ``max_gap + max_out_of_orderness`` ahead of
the watermark, and a session may change for ``grace`` after its end, so the minimum is
``max_gap + grace + max_out_of_orderness`` (the out-of-orderness term only applies when the
engine derives its watermark from event times), plus ``max_duration`` when sessions are capped
(a cut session's successors are re-cut from its start).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..timeutil import INT64_MAX, INT64_MIN, duration_ms
from ..windows import SessionWindows, latest_event_time_ms, minimum_retention_ms

DEFAULT_CACHE_MAX_SESSIONS = 100_000
"""Sessions the write-back cache holds before it writes everything and starts over."""

WATERMARK_MODES = ("event_time", "external")
NO_WATERMARK = INT64_MIN
"""The watermark (and close cursor) before any progress."""


def required_retention_ms(windows: SessionWindows, max_out_of_orderness_ms: int,
                          watermark: str) -> int:
    """The smallest store retention that keeps every session until the engine emitted it.

    Args:
        windows: the session windows (largest gap, grace, maximum duration).
        max_out_of_orderness_ms: the lag of an event-time watermark behind the data.
        watermark: ``"event_time"`` or ``"external"``.

    Returns:
        ``max_gap + grace (+ max_duration)`` plus ``max_out_of_orderness_ms`` for an event-time
        watermark.
    """
    ooo = max_out_of_orderness_ms if watermark == "event_time" else 0
    return minimum_retention_ms(windows.max_gap_ms, windows.grace_ms, windows.max_duration_ms) + ooo


def closing_watermark_ms(windows: SessionWindows, max_time_ms: int) -> int:
    """A watermark that closes every session whose events are at or before ``max_time_ms``:
    each ends by ``t + max_gap``, and stays open ``grace`` after that (capped at int64)."""
    return min(max_time_ms + windows.max_gap_ms + windows.grace_ms, INT64_MAX)


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
        gap_ms, grace_ms, inclusive_gap: from the windows (``gap_ms`` is None when dynamic).
        max_gap_ms: the largest gap an event may have (the gap when fixed).
        dynamic: whether each event has its own gap.
        max_duration_ms: the longest a session may span, or None.
        max_out_of_orderness_ms: lag of the event-time watermark behind the largest event time.
        watermark: ``"event_time"`` or ``"external"``.
        cache_max_sessions: capacity of the write-back cache (0: write through).
    """

    gap_ms: int | None
    grace_ms: int
    inclusive_gap: bool
    max_out_of_orderness_ms: int
    watermark: str
    cache_max_sessions: int
    max_gap_ms: int = 0
    dynamic: bool = False
    max_duration_ms: int | None = None

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
                f"({'max_gap_ms' if windows.dynamic else 'gap_ms'} + grace_ms"
                f"{' + max_duration_ms' if windows.max_duration_ms else ''}"
                f" + max_out_of_orderness_ms), or closed sessions could "
                f"expire before they are emitted"
            )
        return cls(windows.gap_ms, windows.grace_ms, windows.inclusive_gap, ooo, watermark,
                   cache_max_sessions, windows.max_gap_ms, windows.dynamic,
                   windows.max_duration_ms)

    @property
    def max_timestamp_ms(self) -> int:
        """The largest event time whose window end plus grace still fits in int64 for every
        allowed gap (an event's own check uses its own gap: ``INT64_MAX - gap - grace``)."""
        return latest_event_time_ms(self.max_gap_ms, self.grace_ms)

    def check_times_fit(self, times_ms: Any, name: str) -> None:
        """Refuse, before anything changes, a batch of a fixed gap with an event whose window
        end plus grace leaves int64 (:attr:`max_timestamp_ms`); with a dynamic gap each event's
        own gap is checked with its gap (``batch_gaps.event_gaps``).

        Args:
            times_ms: the batch's event times (an int64 array).
            name: the argument or column to name in the error.

        Raises:
            ValueError: naming ``name[row]`` and the first time that does not fit.
        """
        if self.dynamic or not len(times_ms):
            return
        limit = self.max_timestamp_ms
        if int(times_ms.max()) > limit:
            row = int((times_ms > limit).argmax())
            raise ValueError(
                f"{name}[{row}] = {int(times_ms[row])}: + gap_ms + grace_ms overflows int64")
