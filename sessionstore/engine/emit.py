"""What the engine emits, and the counters of what it emitted (KIP-825's emit-final metrics)."""

from __future__ import annotations

import enum
import itertools
import time
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from ..store.metered import HistogramReading, LatencyHistogram, SlidingRate
from ..triggers import Pane
from ..types import Session
from .time import final_latencies_ms


class EmitStrategy(enum.Enum):
    """KIP-825: emit every update, or each session once when it closes."""

    ON_WINDOW_UPDATE = "ON_WINDOW_UPDATE"
    ON_WINDOW_CLOSE = "ON_WINDOW_CLOSE"


class Emit(NamedTuple):
    """One output record.

    ``session.end`` is exclusive (last event + gap) and ``timestamp`` is ``end - 1``.
    ``retraction`` marks a session that a merge replaced (ON_WINDOW_UPDATE only); its ``value``
    is the last value delivered for it. ``pane`` is set when a trigger is configured.
    """

    session: Session
    value: Any
    pane: Pane | None
    retraction: bool
    timestamp: int


def make_emit(session: Session, value: Any, pane: Pane | None = None,
              retraction: bool = False) -> Emit:
    return Emit(session, value, pane, retraction, session.end - 1)


#: How many final latencies :meth:`EngineMetrics.record_final_sum` holds back at most.
_PENDING_FINALS = 1 << 16

#: Upper bounds (seconds of event time) of the emit-final latency buckets: 1 ms to a day.
EVENT_TIME_BUCKETS_S = (0.001, 0.01, 0.1, 1.0, 10.0, 60.0, 300.0, 900.0, 1800.0, 3600.0,
                        3 * 3600.0, 6 * 3600.0, 24 * 3600.0)


class EngineMetrics:
    """Counters of one engine. Rates are over a sliding window, not the lifetime."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.records_in = 0
        self.dropped = 0  # every dropped event: late ones and those with an invalid gap
        self.dropped_invalid_gap = 0  # events whose dynamic gap was null or <= 0
        self.emitted = 0
        self.final = SlidingRate()
        self.final_latency_sum = 0
        self.final_latency_max = 0
        self.final_latency = LatencyHistogram(EVENT_TIME_BUCKETS_S)
        # record_final_sum's (watermark_ms, grace_ms, ends_ms), put in the histogram in bulk
        # (the event path closes a few sessions per watermark move; a numpy pass for each costs
        # more than the rest of the close)
        self._pending_ends: list[tuple[int, int, list[int]]] = []
        self._pending_count = 0

    def record_final(self, latency_ms: int) -> None:
        """One session emitted as final, ``latency_ms`` of event time after it closed."""
        self.final.record(1, float(latency_ms))
        self.final_latency.observe(latency_ms / 1000.0)
        self.final_latency_sum += latency_ms
        if latency_ms > self.final_latency_max:
            self.final_latency_max = latency_ms

    def record_finals(self, latencies_ms: Any) -> None:
        """:meth:`record_final` for many sessions at once (an int64 array or a list of ints)."""
        count = len(latencies_ms)
        if count == 0:
            return
        self.final.record(count)  # only its rate is reported; the latencies are kept here
        if isinstance(latencies_ms, np.ndarray) and latencies_ms.dtype == np.int64:
            # the batch paths' closes: one compiled pass, the same readings as below
            total, top = self.final_latency.observe_ints_ms(latencies_ms)
            self.final_latency_sum += total
            self.final_latency_max = max(self.final_latency_max, top)
            return
        values = np.asarray(latencies_ms, dtype=np.float64)
        # a conversion is the caller's no longer: clamp it in place
        self.final_latency.observe_ms(np.maximum(
            values, 0.0, out=None if values is latencies_ms else values))
        if isinstance(latencies_ms, list):  # Python ints: no int64 range to leave
            self.final_latency_sum += sum(latencies_ms)
            self.final_latency_max = max(self.final_latency_max, max(latencies_ms))
            return
        self.final_latency_sum += int(latencies_ms.sum())
        self.final_latency_max = max(self.final_latency_max, int(latencies_ms.max()))

    def record_final_sum(self, count: int, latency_sum_ms: int, latency_max_ms: int,
                         ends_ms: list[int], watermark_ms: int, grace_ms: int) -> None:
        """:meth:`record_finals` for ``count`` sessions whose latencies
        (:func:`~sessionstore.engine.time.final_latency_ms`) add up to ``latency_sum_ms``, the
        largest ``latency_max_ms``; ``ends_ms`` are their ends, emitted at ``watermark_ms``
        with ``grace_ms``, for the histogram."""
        if count == 0:
            return
        self.final.record(count)
        self.final_latency_sum += latency_sum_ms
        if latency_max_ms > self.final_latency_max:
            self.final_latency_max = latency_max_ms
        self._pending_ends.append((watermark_ms, grace_ms, ends_ms))
        self._pending_count += count
        if self._pending_count >= _PENDING_FINALS:
            self._observe_pending()

    def _observe_pending(self) -> None:
        """Put the latencies :meth:`record_final_sum` held back in the histogram."""
        pending = self._pending_ends
        if not pending:
            return
        # in float: W - grace - end may leave int64 with extreme times; a bucket needs no more
        lengths = [len(ends) for _, _, ends in pending]
        watermarks = np.repeat(np.array([float(w) for w, _, _ in pending]), lengths)
        graces = np.repeat(np.array([float(grace) for _, grace, _ in pending]), lengths)
        ends = np.fromiter(itertools.chain.from_iterable(ends for _, _, ends in pending),
                           dtype=np.float64, count=len(watermarks))
        self.final_latency.observe_ms(final_latencies_ms(watermarks, ends, graces))
        pending.clear()
        self._pending_count = 0

    def histograms(self) -> dict[str, HistogramReading]:
        """``emit-final-latency``: for each session emitted as final, the event time between
        its close (``end + grace``) and the watermark that emitted it."""
        self._observe_pending()
        return {"emit-final-latency": self.final_latency.reading()}

    def snapshot(self, store_metrics: Mapping[str, float]) -> dict[str, float]:
        rate, _, _ = self.final.snapshot()
        total = self.final.total
        out: dict[str, float] = {
            "records-in": self.records_in,
            "dropped-records": self.dropped,
            "dropped-invalid-gap-records": self.dropped_invalid_gap,
            "emitted-records": self.emitted,
            "emit-final-records-total": total,
            "emit-final-records-rate": rate,
            "emit-final-latency-max": self.final_latency_max,
            "emit-final-latency-avg": self.final_latency_sum / total if total else 0.0,
            "store-dropped-records": store_metrics.get("dropped-records", 0),
            "expired-segments": store_metrics.get("expired-segments", 0),
        }
        for name, value in store_metrics.items():
            if name.endswith(("-rate", "-total", "-latency-avg", "-latency-max")):
                out[f"store-{name}"] = value
        return out
