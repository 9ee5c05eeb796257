"""Beam-model triggers, panes, accumulation modes and clocks.

A trigger only describes *when* panes fire; the engine (:mod:`sessionstore.engine`) runs it.
See docs/semantics.md for the exact rules, which follow Beam's Java runner.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass
from typing import Any

from .timeutil import check_int64, duration_ms


class PaneTiming(enum.Enum):
    """When a pane fired relative to the watermark."""

    EARLY = "EARLY"
    ON_TIME = "ON_TIME"
    LATE = "LATE"


@dataclass(frozen=True, slots=True)
class Pane:
    """Which firing of a window an emitted result is."""

    timing: PaneTiming
    index: int
    is_first: bool
    is_last: bool


class AccumulationMode(enum.Enum):
    """DISCARDING: a pane holds what arrived since the window last fired.
    ACCUMULATING: a pane holds everything the window has seen."""

    DISCARDING = "DISCARDING"
    ACCUMULATING = "ACCUMULATING"


@dataclass(frozen=True, init=False)
class AfterProcessingTime:
    """Fires when processing time is strictly past (first element of the pane + delay)."""

    delay_ms: int

    def __init__(self, delay_ms: Any) -> None:
        delay = duration_ms(delay_ms, "delay_ms")
        if delay < 0:
            raise ValueError(f"delay_ms must be >= 0, got {delay}")
        object.__setattr__(self, "delay_ms", delay)


@dataclass(frozen=True, init=False)
class AfterCount:
    """Fires once the pane holds at least ``n`` elements."""

    n: int

    def __init__(self, n: int) -> None:
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(f"n must be an int, got {n!r}")
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        object.__setattr__(self, "n", n)


SubTrigger = AfterProcessingTime | AfterCount


@dataclass(frozen=True)
class AfterWatermark:
    """Fires ON_TIME when the watermark passes the end of the window.

    Args:
        early: optional early firings before that (``AfterProcessingTime`` or ``AfterCount``).
        late: optional late firings for data within grace. Without it, late data waits for the
            closing pane; a merge that lands behind the watermark fires at once either way.
    """

    early: SubTrigger | None = None
    late: SubTrigger | None = None

    def __post_init__(self) -> None:
        for name in ("early", "late"):
            sub = getattr(self, name)
            if sub is not None and not isinstance(sub, AfterProcessingTime | AfterCount):
                raise TypeError(
                    f"{name} must be AfterProcessingTime or AfterCount, got {type(sub).__name__}"
                )


class ManualClock:
    """A processing-time clock that moves only when told: deterministic tests."""

    def __init__(self, start_ms: int = 0) -> None:
        self.now_ms = check_int64(start_ms, "start_ms")

    def __call__(self) -> int:
        return self.now_ms

    def set(self, to_ms: int) -> None:
        """Move to ``to_ms``. Raises ValueError when that is in the past."""
        to = check_int64(to_ms, "to_ms")
        if to < self.now_ms:
            raise ValueError(f"processing time cannot go back: {to} < {self.now_ms}")
        self.now_ms = to


def system_clock() -> int:
    """Wall-clock processing time in milliseconds."""
    return time.time_ns() // 1_000_000


__all__ = [
    "AccumulationMode",
    "AfterCount",
    "AfterProcessingTime",
    "AfterWatermark",
    "ManualClock",
    "Pane",
    "PaneTiming",
    "system_clock",
]
