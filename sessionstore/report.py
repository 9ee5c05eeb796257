"""A summary a person can read after a run: the longest and the busiest sessions, and a histogram
of session durations and events per session (``make run``, ``sessionstore sessionize --summary``).
"""

from __future__ import annotations

import datetime as dt
import heapq
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # the bounded path reports without loading the engine
    from .engine import Emit

TOP = 5
#: The widest key cell; a longer key is cut to this width, its last character an ellipsis.
KEY_WIDTH_MAX = 60
#: What the duration column measures: a session is [first event, last event + gap).
WINDOW = "window (first event to last + gap)"
_W = len(WINDOW)
#: What the active span measures, beside the window: first event to last event.
ACTIVE = "active (first to last event)"
_A = len(ACTIVE)


#: The column of output rows that holds a session's last event time, when known.
LAST_EVENT_COLUMN = "last_event_ms"


class SessionSummary:
    """Collects each emitted session's duration and event count.

    A session's window runs from its first event to its last event plus the gap; its active
    span, from its first event to its last, is shown beside it when known: from a
    :data:`LAST_EVENT_COLUMN` column of the rows, else as the window less a fixed gap.

    Args:
        count_output: the aggregation output that counts events (a ``count`` aggregation).
        updates: emissions are updates with retractions (``--emit update``): a session's last
            update counts, and a retraction removes it.
        gap_ms: the fixed gap, or None (per-event gaps, or unknown).
    """

    def __init__(self, count_output: str, updates: bool = False,
                 gap_ms: int | None = None) -> None:
        self.count_output = count_output
        self.updates = updates
        self.gap_ms = gap_ms
        self._last: dict[tuple[Any, int, int], int] = {}
        self._final: list[tuple[Any, int, int, int]] = []
        self._live: dict[tuple[Any, int, int], int] = {}

    def add(self, emits: Iterable[Emit]) -> None:
        """Record emitted sessions."""
        for emit in emits:
            session = emit.session
            events = int(emit.value[self.count_output])
            if not self.updates:
                self._final.append((session.key, session.start, session.end, events))
            elif emit.retraction:
                self._live.pop((session.key, session.start, session.end), None)
            else:
                self._live[(session.key, session.start, session.end)] = events

    def add_table(self, table: Any, key_names: list[str]) -> None:
        """Record emitted sessions given as output rows (key columns, ``session_start_ms``,
        ``session_end_ms``, the count output and, for updates, ``retracted``)."""
        keys = [table.column(k).to_pylist() for k in key_names]
        key_values = keys[0] if len(keys) == 1 else list(zip(*keys, strict=True))
        starts = table.column("session_start_ms").to_pylist()
        ends = table.column("session_end_ms").to_pylist()
        if LAST_EVENT_COLUMN in table.column_names:
            last = table.column(LAST_EVENT_COLUMN).to_pylist()
            self._last.update(zip(zip(key_values, starts, ends, strict=True), last,
                                  strict=True))
        counts = table.column(self.count_output).to_pylist()
        retracted = table.column("retracted").to_pylist() if self.updates \
            else [False] * len(starts)
        for key, start, end, events, gone in zip(key_values, starts, ends, counts, retracted,
                                                 strict=True):
            if not self.updates:
                self._final.append((key, start, end, int(events)))
            elif gone:
                self._live.pop((key, start, end), None)
            else:
                self._live[(key, start, end)] = int(events)

    def sessions(self) -> list[tuple[Any, int, int, int]]:
        """``(key, start_ms, end_ms, events)`` of every session."""
        if not self.updates:
            return self._final
        return [(k, s, e, n) for (k, s, e), n in self._live.items()]

    def active_ms(self, key: Any, start: int, end: int) -> int | None:
        """The span from a session's first event to its last, or None when not known."""
        last = self._last.get((key, start, end))
        if last is not None:
            return int(last) - start
        return None if self.gap_ms is None else end - self.gap_ms - start

    def table(self) -> str:
        """The longest and the busiest sessions, as aligned text. Keys are shown whole (one
        longer than :data:`KEY_WIDTH_MAX` characters ends in ``…``); a session's window runs
        from its first event to its last event plus the gap."""
        rows = self.sessions()
        if not rows:
            return "no sessions"
        durations = np.array([e - s for _, s, e, _ in rows], dtype=np.int64)
        events = np.array([n for *_, n in rows], dtype=np.int64)
        lines = [f"{len(rows):,} sessions; {WINDOW} median "
                 f"{_duration(int(np.median(durations)))}, max {_duration(int(durations.max()))}"
                 f"; events per session median {int(np.median(events))}, "
                 f"max {int(events.max())}"]
        for title, order in (("longest", lambda r: r[2] - r[1]), ("busiest", lambda r: r[3])):
            top = heapq.nlargest(TOP, rows, key=order)
            width = min(max(len("key"), *(len(str(key)) for key, *_ in top)), KEY_WIDTH_MAX)
            lines.append("")
            lines.append(f"{title} sessions:")
            lines.append(f"  {'key':<{width}} {'first event (UTC)':<20} {WINDOW:>{_W}} "
                         f"{ACTIVE:>{_A}} {'events':>8}")
            for key, start, end, n in top:
                active = self.active_ms(key, start, end)
                lines.append(f"  {_key_cell(key, width):<{width}} {_when(start):<20} "
                             f"{_duration(end - start):>{_W}} "
                             f"{'-' if active is None else _duration(active):>{_A}} {n:>8,}")
        return "\n".join(lines)

    def histogram(self, path: str | Path) -> Path:
        """Write a PNG of the duration and events-per-session distributions; return its path.

        Raises:
            ImportError: matplotlib is not installed (``pip install 'sessionstore[plot]'``).
        """
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            raise ImportError("the histogram needs matplotlib: pip install "
                              "'sessionstore[plot]'") from None
        rows = self.sessions()
        minutes = np.array([(e - s) / 60_000 for _, s, e, _ in rows], dtype=float)
        events = np.array([n for *_, n in rows], dtype=float)
        figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
        left.hist(minutes, bins=50, color="#4c72b0")
        left.set_xlabel("session duration (minutes)")
        left.set_ylabel("sessions")
        right.hist(events, bins=np.unique(np.geomspace(1, max(events.max(initial=1), 2), 40)
                                         .round()), color="#dd8452")
        right.set_xscale("log")
        right.set_xlabel("events per session")
        if rows:  # a log scale of nothing makes matplotlib warn on stderr
            for axis in (left, right):
                axis.set_yscale("log")
        figure.suptitle(f"{len(rows):,} sessions")
        # fixed margins: tight_layout measures every tick label first, a third of the drawing
        figure.subplots_adjust(left=0.08, right=0.98, bottom=0.13, top=0.9, wspace=0.2)
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(target, dpi=100)
        plt.close(figure)
        return target


def _key_cell(key: Any, width: int) -> str:
    """``key`` as text, whole when it fits ``width``, else cut with a trailing ``…``."""
    text = str(key)
    return text if len(text) <= width else text[: width - 1] + "…"


def _duration(ms: int) -> str:
    seconds = ms // 1000
    if seconds < 60:
        return f"{ms / 1000:.1f}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _when(ms: int) -> str:
    try:
        return (dt.datetime(1970, 1, 1) + dt.timedelta(milliseconds=ms)).strftime(
            "%Y-%m-%d %H:%M:%S")
    except OverflowError:
        return str(ms)
