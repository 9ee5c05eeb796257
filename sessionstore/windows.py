"""Window definitions: session windows (KIP-94) and stream-time batch windows (KIP "BatchWindows")."""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, overload

from . import gap_boundary
from .timeutil import INT64_MAX, check_int64, duration_ms


@dataclass(frozen=True, init=False)
class SessionWindows:
    """Session windows: an event at ``t`` opens ``[t, t + gap)``; overlapping windows merge.

    The gap is fixed (one duration for every event) or *dynamic* (each event brings its own,
    as Spark's ``session_window(time, gap_expression)`` and Flink's dynamic session windows do).
    A session ends at the largest ``t + gap`` over its events.

    Args:
        gap_ms: the inactivity gap: a duration (> 0; an int of milliseconds, a ``timedelta`` or
            ``"10 minutes"``) for a fixed gap; a callable ``(key, value, timestamp_ms) -> gap``
            (the gap as a duration, or ``None``) for a gap computed per event; or ``None`` for a
            gap given with each event (``process(..., gap_ms=)``, ``gaps_ms=`` of
            ``process_batch``, ``gap=`` of ``process_table``).
        grace_ms: how long after a session's end (in watermark time) late events may still
            change it (>= 0).
        inclusive_gap: True (Spark, Flink, Kafka) merges windows that merely touch, so events
            exactly ``gap`` apart share a session; False (Beam) requires them to overlap.
        retention_ms: how long the store keeps a session after its end; at least
            ``max_gap_ms + grace_ms`` (plus ``max_duration_ms`` when set), which is the default.
        max_gap_ms: the largest gap an event may have (> 0). Required with a dynamic gap (the
            store's retention must cover the largest gap that can occur); an event whose gap
            exceeds it is refused with ``ValueError``. With a fixed gap it is the gap (passing a
            different value is an error).
        max_duration_ms: the longest span a session may have (> 0), or ``None`` (no cap). An
            event at or past ``start + max_duration_ms`` starts a new session, whatever the
            arrival order; an event is then late when ``W >= t + min(gap, max_duration_ms) +
            grace``; triggers are refused. The exact rule: :mod:`sessionstore.engine.max_duration`.

    Per event, a dynamic gap that is ``None`` or ``<= 0`` drops the event (counted in the
    ``dropped-records`` and ``dropped-invalid-gap-records`` metrics), as Spark filters such rows.

    Attributes:
        dynamic: whether the gap varies per event.
        gap_ms: the fixed gap, or ``None`` when dynamic.
        gap_fn: the per-event gap callable, or ``None``.
        max_gap_ms: the largest gap (the fixed gap when not dynamic); always set.
        max_duration_ms: the session length cap, or ``None``.

    Raises:
        ValueError: ``gap_ms <= 0``, ``max_gap_ms <= 0``, a dynamic gap without ``max_gap_ms``,
            a fixed gap with a different ``max_gap_ms``, ``grace_ms < 0``,
            ``max_duration_ms <= 0``, ``retention_ms`` below its minimum, or a value (the derived
            retention included) outside int64.
        TypeError: an argument is not a duration (or a callable / ``None`` for ``gap_ms``).
    """

    gap_ms: int | None
    grace_ms: int
    inclusive_gap: bool
    retention_ms: int
    max_gap_ms: int
    max_duration_ms: int | None
    gap_fn: Callable[[Any, Any, int], Any] | None
    dynamic: bool

    def __init__(
        self,
        gap_ms: Any,
        grace_ms: Any = 0,
        inclusive_gap: bool = True,
        retention_ms: Any = None,
        *,
        max_gap_ms: Any = None,
        max_duration_ms: Any = None,
    ) -> None:
        gap_fn: Callable[[Any, Any, int], Any] | None = None
        gap: int | None = None
        if gap_ms is None or (callable(gap_ms) and not isinstance(gap_ms, (str, _dt.timedelta))):
            gap_fn = gap_ms
            if max_gap_ms is None:
                raise ValueError("max_gap_ms is required with a dynamic gap_ms (a callable or "
                                 "None): the store's retention must cover the largest gap")
            max_gap = duration_ms(max_gap_ms, "max_gap_ms")
            if max_gap <= 0:
                raise ValueError(f"max_gap_ms must be > 0, got {max_gap}")
            gap_term = "max_gap_ms"
        else:
            gap = duration_ms(gap_ms, "gap_ms")
            if gap <= 0:
                raise ValueError(f"gap_ms must be > 0, got {gap}")
            if max_gap_ms is not None:
                given = duration_ms(max_gap_ms, "max_gap_ms")
                if given != gap:
                    raise ValueError(f"max_gap_ms must equal a fixed gap_ms = {gap} (or be "
                                     f"omitted), got {given}")
            max_gap = gap
            gap_term = "gap_ms"
        grace = duration_ms(grace_ms, "grace_ms")
        if grace < 0:
            raise ValueError(f"grace_ms must be >= 0, got {grace}")
        if not isinstance(inclusive_gap, bool):
            raise TypeError(f"inclusive_gap must be a bool, got {inclusive_gap!r}")
        max_duration: int | None = None
        if max_duration_ms is not None:
            max_duration = duration_ms(max_duration_ms, "max_duration_ms")
            if max_duration <= 0:
                raise ValueError(f"max_duration_ms must be > 0, got {max_duration}")
        minimum = minimum_retention_ms(max_gap, grace, max_duration)
        label = f"{gap_term} + grace_ms" + (" + max_duration_ms" if max_duration else "")
        if retention_ms is None:  # the derived value must fit int64 like the given ones
            retention = check_int64(minimum, f"retention_ms ({label})")
        else:
            retention = duration_ms(retention_ms, "retention_ms")
        if retention < minimum:
            raise ValueError(f"retention_ms must be >= {label} = {minimum}, got {retention}")
        object.__setattr__(self, "gap_ms", gap)
        object.__setattr__(self, "grace_ms", grace)
        object.__setattr__(self, "inclusive_gap", inclusive_gap)
        object.__setattr__(self, "retention_ms", retention)
        object.__setattr__(self, "max_gap_ms", max_gap)
        object.__setattr__(self, "max_duration_ms", max_duration)
        object.__setattr__(self, "gap_fn", gap_fn)
        object.__setattr__(self, "dynamic", gap is None)

    @property
    def latest_event_time_ms(self) -> int:
        """The largest event time whose window end plus grace still fits in int64 for every
        allowed gap (an event's own check uses its own gap: ``INT64_MAX - gap - grace``)."""
        return latest_event_time_ms(self.max_gap_ms, self.grace_ms)

    def merge_bounds(self, timestamp_ms: int, gap_ms: int | None = None) -> tuple[int, int]:
        """``(earliest_end, latest_start)`` of the sessions an event at ``timestamp_ms`` joins.

        ``gap_ms`` is the event's own gap; it defaults to the fixed gap (required when
        dynamic)."""
        gap = self.gap_ms if gap_ms is None else gap_ms
        if gap is None:
            raise ValueError("merge_bounds needs the event's gap_ms with a dynamic gap")
        return gap_boundary.merge_bounds(timestamp_ms, timestamp_ms + gap, self.inclusive_gap)


@overload
def latest_event_time_ms(max_gap_ms: int, grace_ms: int) -> int: ...
@overload
def latest_event_time_ms(max_gap_ms: Any, grace_ms: int) -> Any: ...
def latest_event_time_ms(max_gap_ms: Any, grace_ms: int) -> Any:
    """The largest event time whose window end (with a gap up to ``max_gap_ms``) plus
    ``grace_ms`` still fits in int64: the one overflow rule for event times.

    ``max_gap_ms`` is an int, or an int64 array of each event's gap (>= 0, each at most a
    ``max_gap_ms`` that fits with ``grace_ms``), answered elementwise without wrapping.
    """
    return INT64_MAX - max_gap_ms - grace_ms


def minimum_retention_ms(max_gap_ms: int, grace_ms: int, max_duration_ms: int | None) -> int:
    """The smallest retention that keeps a session until it closes, with any watermark that
    never runs ahead of the data: ``max_gap + grace (+ max_duration)``. The one retention rule:
    :class:`SessionWindows` defaults to it and the engine adds its watermark's lag
    (:func:`sessionstore.engine.config.required_retention_ms`)."""
    return max_gap_ms + grace_ms + (max_duration_ms or 0)


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
