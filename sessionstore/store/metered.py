"""A store layer that measures what passes through it (Kafka Streams' MeteredSessionStore).

Each operation gets ``<op>-total``, ``<op>-rate`` (per second, over a sliding window rather than
the lifetime, so a rate reflects the current load) and ``<op>-latency-avg`` / ``-max`` (ms, over
the same window). The wrapped store's own counters (``dropped-records``, ``expired-segments``,
...) are passed through. :attr:`MeteredSessionStore.latency_histograms` keeps every call's
latency over the lifetime, in fixed buckets, for a Prometheus histogram.
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import numpy as np
import numpy.typing as npt

from ..types import Session, SessionStoreProtocol

DEFAULT_WINDOW_S = 30.0
_OPS = ("put", "remove", "fetch", "find-sessions", "commit")


#: Upper bounds (seconds, inclusive) of wall-clock latency buckets: 0.1 ms to 10 s.
WALL_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                  0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass(frozen=True)
class HistogramReading:
    """A copy of a :class:`LatencyHistogram`: ``counts[i]`` observations fell at or below
    ``bounds_s[i]`` and above the bound before it; ``counts[-1]`` above the last bound. So
    ``len(counts) == len(bounds_s) + 1`` and ``sum(counts)`` is the number observed."""

    bounds_s: tuple[float, ...]
    counts: tuple[int, ...]
    sum_s: float

    @property
    def count(self) -> int:
        return sum(self.counts)


class LatencyHistogram:
    """Durations in fixed buckets over the lifetime, as a Prometheus histogram keeps them.

    Args:
        bounds_s: increasing upper bounds in seconds (each inclusive, as Prometheus' ``le``);
            values above the last one are counted in an overflow bucket (``+Inf``).

    Raises:
        ValueError: bounds that are empty or not strictly increasing.
    """

    def __init__(self, bounds_s: tuple[float, ...] = WALL_BUCKETS_S) -> None:
        if not bounds_s or any(a >= b for a, b in pairwise(bounds_s)):
            raise ValueError(f"bounds_s must be strictly increasing and not empty, got "
                             f"{bounds_s!r}")
        self.bounds_s = tuple(float(b) for b in bounds_s)
        self._bounds_ms = np.array(self.bounds_s) * 1000.0
        self._counts = [0] * (len(bounds_s) + 1)
        self._sum_s = 0.0

    def observe(self, seconds: float) -> None:
        """Count one duration of ``seconds``."""
        self._counts[bisect.bisect_left(self.bounds_s, seconds)] += 1
        self._sum_s += seconds

    def observe_ms(self, millis: Any) -> None:
        """Count many durations given in milliseconds (an array or a list of numbers)."""
        values = np.asarray(millis, dtype=np.float64)
        if values.size == 0:
            return
        slots = np.searchsorted(self._bounds_ms, values, side="left")
        for slot, n in enumerate(np.bincount(slots, minlength=len(self._counts)).tolist()):
            self._counts[slot] += n
        self._sum_s += float(values.sum()) / 1000.0

    def observe_ints_ms(self, millis: npt.NDArray[np.int64]) -> tuple[int, int]:
        """:meth:`observe_ms` of ``max(millis, 0)`` (int64 milliseconds), in one compiled pass
        with no float copy; returns the int64 sum (wrapping, as numpy's) and the maximum of
        ``millis`` themselves, which a caller that totals them needs too. The histogram's sum
        is the same float as :meth:`observe_ms`'s: the exact total where no partial sum can
        round, else numpy's own sum."""
        from ..jit import compiled  # numba, on first use only

        if len(millis) == 0:
            return 0, 0
        counts = np.zeros(len(self._counts), dtype=np.int64)
        total, top, clamped_total, exact = compiled(bucket_ints_kernel)(
            millis, self._bounds_ms, counts)
        for slot, n in enumerate(counts.tolist()):
            self._counts[slot] += n
        clamped_sum = (float(clamped_total) if exact
                       else float(np.maximum(millis.astype(np.float64), 0.0).sum()))
        self._sum_s += clamped_sum / 1000.0
        return int(total), int(top)

    def reading(self) -> HistogramReading:
        return HistogramReading(self.bounds_s, tuple(self._counts), self._sum_s)


# every integer up to this is a float64 exactly, and so is every sum that stays below it
_EXACT_FLOAT_INTS = 1 << 53


def bucket_ints_kernel(values: npt.NDArray[np.int64], bounds_ms: npt.NDArray[np.float64],
                       counts: npt.NDArray[np.int64]) -> tuple[int, int, int, bool]:
    """Count each of ``values``, clamped at 0 and as a float64, in the bucket
    ``searchsorted(bounds_ms, value, side="left")`` of ``counts`` (the bounds increasing),
    as :meth:`LatencyHistogram.observe_ms` does. Returns the wrapping int64 sum and the
    maximum of the values, the sum of the clamped values, and whether that sum is exact in
    float64 (every clamped value, times their number, below 2**53). (Compiled; ``values``
    not empty.)"""
    total = 0
    top = values[0]
    clamped_total = 0
    clamped_top = 0
    last = len(bounds_ms)
    for i in range(len(values)):
        v = values[i]
        total += v
        if v > top:
            top = v
        c = v if v > 0 else 0
        if c > clamped_top:
            clamped_top = c
        clamped_total += c
        x = float(c)
        slot = 0
        while slot < last and bounds_ms[slot] < x:
            slot += 1
        counts[slot] += 1
    exact = clamped_top < _EXACT_FLOAT_INTS // len(values)
    return total, top, clamped_total, exact


class SlidingRate:
    """Events per second and their latency over the last ``window_s`` seconds.

    Time is cut into ``buckets`` slices; old slices fall out as time moves on. ``clock`` returns
    seconds (``time.monotonic`` by default; injectable for tests).
    """

    def __init__(self, window_s: float = DEFAULT_WINDOW_S, buckets: int = 10,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if window_s <= 0:
            raise ValueError(f"window_s must be > 0, got {window_s}")
        self.window_s = window_s
        self._slice = window_s / buckets
        self._clock = clock
        self._started = clock()
        # (slice number, count, latency sum ms, latency max ms)
        self._buckets: deque[list[float]] = deque()
        self.total = 0

    def record(self, count: int = 1, latency_ms: float = 0.0, now_s: float | None = None
               ) -> None:
        """Count ``count`` events that took ``latency_ms`` together, at ``now_s`` (the clock's
        reading, taken here when None)."""
        self.total += count
        now = int((self._clock() if now_s is None else now_s) / self._slice)
        buckets = self._buckets
        if buckets and buckets[-1][0] == now:
            bucket = buckets[-1]
            bucket[1] += count
            bucket[2] += latency_ms
            if latency_ms > bucket[3]:
                bucket[3] = latency_ms
        else:
            buckets.append([now, count, latency_ms, latency_ms])
            self._expire(now)

    def _expire(self, now_slice: int) -> None:
        horizon = now_slice - round(self.window_s / self._slice)
        while self._buckets and self._buckets[0][0] <= horizon:
            self._buckets.popleft()

    def snapshot(self) -> tuple[float, float, float]:
        """``(rate per second, latency avg ms, latency max ms)`` over the window."""
        now = self._clock()
        self._expire(int(now / self._slice))
        count = sum(b[1] for b in self._buckets)
        span = min(self.window_s, max(now - self._started, 1e-9))
        latency_sum = sum(b[2] for b in self._buckets)
        return (count / span, latency_sum / count if count else 0.0,
                max((b[3] for b in self._buckets), default=0.0))


class MeteredSessionStore:
    """Wraps a session store and measures its operations. Same contract as the wrapped store.

    Args:
        wrapped: any :class:`~sessionstore.SessionStoreProtocol` store.
        window_s: the sliding window of rates and latencies.
        clock: seconds, for tests.
    """

    def __init__(self, wrapped: SessionStoreProtocol, window_s: float = DEFAULT_WINDOW_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.wrapped = wrapped
        self._clock = clock
        self._rates = {op: SlidingRate(window_s, clock=clock) for op in _OPS}
        self._latencies = {op: LatencyHistogram() for op in _OPS}

    def _timed(self, op: str, started: float, count: int = 1) -> None:
        now = self._clock()  # one reading for both the latency and the bucket
        self._rates[op].record(count, (now - started) * 1000.0, now)
        self._latencies[op].observe(now - started)

    @property
    def latency_histograms(self) -> dict[str, HistogramReading]:
        """``<op>-latency`` for each operation: the latency of every call (one call of
        ``put_many`` is one observation) since the store was wrapped."""
        return {f"{op}-latency": h.reading() for op, h in self._latencies.items()}

    # -- measured operations ----------------------------------------------------------------

    def put(self, session: Session, value: Any) -> bool:
        started = self._clock()
        written = self.wrapped.put(session, value)
        self._timed("put", started)
        return written

    def put_many(self, keys: Any, starts_ms: Any, ends_ms: Any, values: Any, *,
                 key_index: Any = None) -> Any:
        """The wrapped store's ``put_many`` (same arguments and result), measured as puts."""
        started = self._clock()
        written = self.wrapped.put_many(  # type: ignore[attr-defined]
            keys, starts_ms, ends_ms, values, key_index=key_index)
        self._timed("put", started, len(written))
        return written

    def remove_many(self, keys: Any, starts_ms: Any, ends_ms: Any, *,
                    key_index: Any = None) -> None:
        """The wrapped store's ``remove_many``, measured as removes."""
        started = self._clock()
        self.wrapped.remove_many(  # type: ignore[attr-defined]
            keys, starts_ms, ends_ms, key_index=key_index)
        self._timed("remove", started, len(starts_ms))

    def remove(self, session: Session) -> None:
        started = self._clock()
        self.wrapped.remove(session)
        self._timed("remove", started)

    def fetch_session(self, key: Any, start_ms: int, end_ms: int) -> Any:
        started = self._clock()
        value = self.wrapped.fetch_session(key, start_ms, end_ms)
        self._timed("fetch", started)
        return value

    def fetch(self, key: Any) -> Iterator[tuple[Session, Any]]:
        started = self._clock()
        rows = list(self.wrapped.fetch(key))
        self._timed("fetch", started)
        return iter(rows)

    def find_sessions_to_merge(self, key: Any, earliest_end_ms: int,
                               latest_start_ms: int) -> Iterator[tuple[Session, Any]]:
        started = self._clock()
        rows = list(self.wrapped.find_sessions_to_merge(key, earliest_end_ms, latest_start_ms))
        self._timed("fetch", started)
        return iter(rows)

    def find_sessions(self, earliest_end_ms: int,
                      latest_end_ms: int) -> Iterator[tuple[Session, Any]]:
        started = self._clock()
        rows = list(self.wrapped.find_sessions(earliest_end_ms, latest_end_ms))
        self._timed("find-sessions", started)
        return iter(rows)

    def find_sessions_columns(self, earliest_end_ms: int) -> Any:
        """The wrapped store's ``find_sessions_columns`` (None when it has none), measured as
        one ``find-sessions``."""
        read = getattr(self.wrapped, "find_sessions_columns", None)
        if read is None:
            return None
        started = self._clock()
        stored = read(earliest_end_ms)
        self._timed("find-sessions", started)
        return stored

    def commit(self, metadata: Any = None) -> int:
        started = self._clock()
        version = self.wrapped.commit(metadata)
        self._timed("commit", started)
        return version

    # -- pass-through -----------------------------------------------------------------------

    def abort(self) -> None:
        self.wrapped.abort()

    def close(self) -> None:
        self.wrapped.close()

    @property
    def retention_ms(self) -> int:
        return self.wrapped.retention_ms

    @property
    def segment_interval_ms(self) -> int:
        return self.wrapped.segment_interval_ms

    @property
    def observed_stream_time(self) -> int | None:
        return self.wrapped.observed_stream_time

    @property
    def committed_version(self) -> int:
        return self.wrapped.committed_version

    @property
    def committed_metadata(self) -> Any:
        return self.wrapped.committed_metadata

    def segment_id(self, timestamp_ms: int) -> int:
        return self.wrapped.segment_id(timestamp_ms)

    def is_expired(self, end_ms: int) -> bool:
        return self.wrapped.is_expired(end_ms)

    def expiry_boundary_ms(self, stream_time_ms: int) -> int | None:
        return self.wrapped.expiry_boundary_ms(stream_time_ms)

    def cap_expiry_time(self, cap_ms: int | None) -> None:
        self.wrapped.cap_expiry_time(cap_ms)  # type: ignore[attr-defined]

    @property
    def metrics(self) -> Mapping[str, float]:
        """The wrapped store's counters plus ``<op>-total/-rate/-latency-avg/-latency-max``."""
        out: dict[str, float] = dict(self.wrapped.metrics)
        for op, rate in self._rates.items():
            per_s, avg, top = rate.snapshot()
            out[f"{op}-total"] = rate.total
            out[f"{op}-rate"] = per_s
            out[f"{op}-latency-avg"] = avg
            out[f"{op}-latency-max"] = top
        return out
