"""Time progress: the watermark, lateness, and the close cursor.

* The watermark ``W`` never goes back. In ``"event_time"`` mode it is the largest event time
  minus ``max_out_of_orderness_ms``; in ``"external"`` mode only the owner moves it.
* An event is late when its own window is already closed on arrival: ``W >= t + gap + grace``
  (with a dynamic gap, the event's own gap), judged against ``W`` as it stood before the event.
* Sessions ending at or before ``closed_before`` are final. The close cursor ``last_close`` is
  the largest ``W - grace`` the engine has emitted every closed session for; expiry is never
  allowed past it (see :func:`~sessionstore.engine.config.expiry_cap_ms`).
* A session closes when ``W`` reaches ``end + grace`` (:func:`close_time_ms`); its emit-final
  latency is how far ``W`` had passed that when it was emitted (:func:`final_latency_ms`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from ..jit import compiled
from ..timeutil import check_int64
from .config import NO_WATERMARK, EngineConfig


def close_time_ms(end_ms: Any, grace_ms: int) -> Any:
    """The watermark at which a session ending at ``end_ms`` closes: ``end + grace`` (ints,
    or elementwise an int64 array)."""
    return end_ms + grace_ms


def final_latency_ms(watermark_ms: int, end_ms: int, grace_ms: int) -> int:
    """The emit-final latency rule: a session ending at ``end_ms`` emitted as final at
    watermark ``watermark_ms`` was emitted ``max(0, W - (end + grace))`` ms of event time after
    it closed (:func:`close_time_ms`); 0 when it was emitted before (a flush).

    Every path calls this or :func:`final_latencies_ms`; the emit from the write cache's
    memory (``closing.emit_taken``) sums it inline for speed, pinned by
    ``tests/engine/test_final_latency.py``.
    """
    latency = watermark_ms - close_time_ms(end_ms, grace_ms)
    return latency if latency > 0 else 0


def final_latencies_ms(watermark_ms: Any, ends_ms: np.ndarray, grace_ms: Any) -> np.ndarray:
    """:func:`final_latency_ms` elementwise, in the arrays' dtype: int64 is exact for closed
    sessions (their ``end + grace <= W`` fits); float64 never wraps at extreme times, which a
    histogram bucket can take (it needs no more precision)."""
    close = np.asarray(close_time_ms(ends_ms, grace_ms))
    # in place where the dtypes allow: each step of a batch's closes would take a fresh array
    in_place = close is not ends_ms and np.result_type(watermark_ms, close) == close.dtype
    latency = np.subtract(watermark_ms, close, out=close if in_place else None)
    clamped: np.ndarray = np.maximum(latency, 0, out=latency)
    return clamped


def arrival_kernel(times: np.ndarray, own_ends: np.ndarray, w0: int, out_of_orderness: int,
                   grace: int, floor: int, last_close: int, external: bool, late: np.ndarray,
                   closed_before: np.ndarray, accepted: np.ndarray) -> int:
    """:meth:`TimeKeeper.arrive_batch_reference` in one pass: each event's watermark on
    arrival (``w0``, then the running maximum of the times minus ``out_of_orderness``, never
    below ``w0``; ``w0`` throughout when ``external``), its late flag (``W >= own_end +
    grace``) and its close cursor (``max(max(W, floor) - grace, last_close)``, ``floor`` being
    ``NO_WATERMARK + grace``), in int64 arithmetic as numpy's. Fills ``late`` and
    ``closed_before``, puts the indexes of the events that are not late first in ``accepted``
    and returns their number. (Compiled.)"""
    w = w0
    top = times[0] if len(times) else 0
    m = 0
    for i in range(len(times)):
        if not external and i:
            t = times[i - 1]
            if t > top:
                top = t
            moved = top - out_of_orderness
            w = moved if moved > w0 else w0
        is_late = w >= own_ends[i] + grace
        late[i] = is_late
        raised = w if w > floor else floor
        cursor = raised - grace
        closed_before[i] = cursor if cursor > last_close else last_close
        if not is_late:
            accepted[m] = i
            m += 1
    return m


class BatchArrival(NamedTuple):
    """What each event of a batch meets on arrival, as a loop of events would
    (:meth:`TimeKeeper.arrive_batch`)."""

    late: np.ndarray
    """:meth:`TimeKeeper.is_late` of each event (bool)."""
    closed_before: np.ndarray
    """:meth:`TimeKeeper.closed_before` each event meets (int64)."""
    accepted: np.ndarray
    """The indexes of the events that are not late, in arrival order."""
    seqs: np.ndarray
    """The arrival numbers the accepted events get (the clock's ``seq`` is not advanced)."""


class TimeKeeper:
    """The watermark and cursors of one engine; committed with its state."""

    __slots__ = ("config", "watermark", "max_event_time", "last_close", "last_on_time",
                 "seq")

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.watermark = NO_WATERMARK
        self.max_event_time: int | None = None
        self.last_close = NO_WATERMARK  # every session ending at or before it was emitted
        self.last_on_time = NO_WATERMARK  # ON_TIME panes fired up to here (triggers)
        self.seq = 0  # arrival sequence of accepted events (orders ties in collect)

    def is_late(self, own_end_ms: int) -> bool:
        """The late rule: an event whose own window ends at ``own_end_ms`` (``t + gap``; with
        a maximum duration ``t + min(gap, max_duration)``) is late when that window closed
        before it arrived, ``W >= own_end + grace``.

        Every path calls this or :meth:`late_in_batch`; the fused event steps inline it for
        speed (``tests/engine/test_late_rule.py`` pins each copy to it at the boundary).
        """
        return self.watermark >= own_end_ms + self.config.grace_ms

    def late_in_batch(self, watermarks_before: np.ndarray, own_ends_ms: np.ndarray
                      ) -> np.ndarray:
        """:meth:`is_late` of each event of a batch, each against the watermark it meets on
        arrival (:meth:`watermarks_before`); a bool array."""
        return np.asarray(watermarks_before >= own_ends_ms + self.config.grace_ms)

    def closed_before(self) -> int:
        """Sessions ending at or before this never change again
        (:func:`~sessionstore.gap_boundary.is_final`): ``W - grace``, never below the close
        cursor. Every path calls this or :meth:`closed_before_in_batch`; the fused event step
        (``engine/fast_event.py``) computes it inline, pinned by
        ``tests/engine/test_fast_event.py``."""
        closed = self.watermark - self.config.grace_ms
        return closed if closed > self.last_close else self.last_close

    def closed_before_in_batch(self, watermarks_before: np.ndarray) -> np.ndarray:
        """:meth:`closed_before` of each event of a batch, against the watermark it meets on
        arrival (:meth:`watermarks_before`), without wrapping below INT64_MIN; int64."""
        grace = self.config.grace_ms
        return np.asarray(np.maximum(np.maximum(watermarks_before, NO_WATERMARK + grace) - grace,
                                     self.last_close), dtype=np.int64)

    def arrive_batch(self, times_ms: np.ndarray, own_ends_ms: np.ndarray) -> BatchArrival:
        """The late rule and the close cursor for a batch (``own_ends_ms``: each event's own
        window end, see :meth:`is_late`), against the watermark each event meets on arrival.
        Every batch path starts here.

        One compiled pass (:func:`arrival_kernel`) over int64 columns; the same outcome as
        :meth:`arrive_batch_reference` (the rules' own composition), which
        ``tests/engine/test_late_rule.py`` pins it to."""
        n = len(times_ms)
        if (type(times_ms) is not np.ndarray or type(own_ends_ms) is not np.ndarray
                or times_ms.dtype != np.int64 or own_ends_ms.dtype != np.int64
                or len(own_ends_ms) != n):
            return self.arrive_batch_reference(times_ms, own_ends_ms)
        grace = self.config.grace_ms
        late = np.empty(n, dtype=np.bool_)
        closed_before = np.empty(n, dtype=np.int64)
        accepted = np.empty(n, dtype=np.int64)
        m = compiled(arrival_kernel)(
            times_ms, own_ends_ms, self.watermark, self.config.max_out_of_orderness_ms, grace,
            NO_WATERMARK + grace, self.last_close, self.config.watermark == "external",
            late, closed_before, accepted)
        return BatchArrival(late, closed_before, accepted[:m],
                            np.arange(self.seq + 1, self.seq + 1 + m, dtype=np.int64))

    def arrive_batch_reference(self, times_ms: np.ndarray, own_ends_ms: np.ndarray
                               ) -> BatchArrival:
        """:meth:`arrive_batch` composed from the rules themselves (:meth:`watermarks_before`,
        :meth:`late_in_batch`, :meth:`closed_before_in_batch`): the reference the compiled
        pass is pinned to, and the path for columns that are not int64 arrays."""
        before = self.watermarks_before(times_ms)
        late = self.late_in_batch(before, own_ends_ms)
        accepted = np.flatnonzero(~late)
        return BatchArrival(late, self.closed_before_in_batch(before), accepted,
                            self.seq + 1 + np.arange(len(accepted), dtype=np.int64))

    def observe(self, t_ms: int) -> bool:
        """Account an accepted event; True when the event-time watermark moved."""
        if self.config.watermark != "event_time":
            return False
        if self.max_event_time is None or t_ms > self.max_event_time:
            self.max_event_time = t_ms
        candidate = t_ms - self.config.max_out_of_orderness_ms
        if candidate > self.watermark:
            self.watermark = candidate
            return True
        return False

    def advance_to(self, to_ms: int) -> bool:
        if to_ms > self.watermark:
            self.watermark = to_ms
            return True
        return False

    def watermarks_before(self, times_ms: np.ndarray) -> np.ndarray:
        """The watermark each event of a batch sees on arrival, as a loop of events would.

        Late events do not move the watermark in a loop either (they are dropped first), but a
        late event is by definition at least ``gap + grace`` (gap > 0) behind the watermark, so
        counting it in the running maximum changes nothing. Events dropped for an invalid gap
        never reach this (they are removed from the batch first).
        """
        w0 = self.watermark
        n = len(times_ms)
        if self.config.watermark == "external" or n == 0:
            return np.full(n, w0, dtype=np.int64)
        after = np.maximum(
            np.maximum.accumulate(times_ms) - self.config.max_out_of_orderness_ms, w0
        )
        return np.concatenate((np.array([w0], dtype=np.int64), after[:-1])).astype(np.int64)

    def to_state(self) -> dict[str, Any]:
        return {
            "watermark": self.watermark,
            "max_event_time": self.max_event_time,
            "last_close": self.last_close,
            "last_on_time": self.last_on_time,
            "seq": self.seq,
        }

    def restore(self, state: Any) -> None:
        """Load committed cursors. Raises ValueError when they are damaged."""
        try:
            self.watermark = check_int64(state["watermark"], "watermark")
            met = state["max_event_time"]
            self.max_event_time = None if met is None else check_int64(met, "max_event_time")
            self.last_close = check_int64(state["last_close"], "last_close")
            self.last_on_time = check_int64(state["last_on_time"], "last_on_time")
            self.seq = check_int64(state["seq"], "seq")
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"corrupted engine metadata in the store: {exc}") from None
