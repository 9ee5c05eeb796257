"""The engine's façade: :class:`SessionAggregator`, the public API over the engine's parts.

Each part is a module of its own; the façade documents the contract and delegates to the
engine's state object (:class:`~sessionstore.engine.core.EngineCore`) and the paths over it:

* :mod:`.core`: the validated options, what they imply, and the state every path shares;
* :mod:`.event` (with its fused form :mod:`.fast_event`): one event at a time;
* :mod:`.closing`: the watermark, the close cursor, emitting closed sessions, ON_TIME panes;
* :mod:`.lifecycle`: restore, commit, abort, the expiry cap, the open-session table handover;
* :mod:`.batch`, :mod:`.fast_batch`, :mod:`.batch_gaps`: a batch of events as columns;
* :mod:`.tables`: the Arrow table API;
* :mod:`.config`, :mod:`.time`, :mod:`.merge`, :mod:`.record`, :mod:`.emit`, :mod:`.triggers`,
  :mod:`.max_duration`: options, cursors, merge rule, records, emits, triggers, max duration;
* store layers below it: :class:`~sessionstore.store.caching.CachingSessionStore` over
  :class:`~sessionstore.store.metered.MeteredSessionStore` over the user's store.

The invariant every path keeps: *close first, then write, then expire* (see :mod:`.lifecycle`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..aggregations import Aggregation
from ..store.metered import HistogramReading
from ..triggers import AccumulationMode, AfterWatermark, ManualClock
from ..types import Session, SessionStoreProtocol
from ..windows import SessionWindows
from . import batch, closing, lifecycle, tables
from .config import DEFAULT_CACHE_MAX_SESSIONS
from .core import EngineCore
from .emit import Emit, EmitStrategy
from .fast_event import bind_event_step
from .lifecycle import ENGINE_METADATA_KEY, USER_METADATA_KEY
from .record import SessionRecord

__all__ = ["ENGINE_METADATA_KEY", "USER_METADATA_KEY", "SessionAggregator"]


class SessionAggregator:
    """Session-window aggregation of a keyed event stream on a session store.

    Args:
        store: any session store (``SessionStore`` or ``InMemorySessionStore``). Its retention
            must be at least ``max_gap + grace`` (+ ``max_duration_ms`` when set, +
            ``max_out_of_orderness_ms`` with an event-time watermark):
            :func:`~sessionstore.engine.config.required_retention_ms`.
        windows: the :class:`SessionWindows`.
        aggregation: an :class:`~sessionstore.aggregations.Aggregation`.
        emit: ``ON_WINDOW_UPDATE`` (the default without a trigger) or ``ON_WINDOW_CLOSE``.
        watermark: ``"event_time"`` (W = max event time - ``max_out_of_orderness_ms``) or
            ``"external"`` (only :meth:`advance_watermark` moves W).
        max_out_of_orderness_ms: see ``watermark``.
        on_late: called as ``on_late(key, value, timestamp_ms)`` for each dropped late event.
        trigger: a Beam :class:`~sessionstore.triggers.AfterWatermark`; replaces ``emit``.
        accumulation: the trigger's accumulation mode (DISCARDING by default, as in Beam).
        clock: processing time in ms (wall clock by default; :class:`ManualClock` in tests).
        write_cache: with ON_WINDOW_UPDATE, de-duplicate updates per session until
            :meth:`flush` (KIP-63); retractions are decided from what was delivered.
        cache_max_sessions: sessions the write-back cache holds between store writes (0 writes
            through).

    Raises:
        TypeError / ValueError: for bad arguments, naming the argument.
    """

    def __init__(
        self,
        store: SessionStoreProtocol,
        windows: SessionWindows,
        aggregation: Aggregation,
        *,
        emit: EmitStrategy | None = None,
        watermark: str = "event_time",
        max_out_of_orderness_ms: Any = 0,
        on_late: Callable[[Any, Any, int], None] | None = None,
        trigger: AfterWatermark | None = None,
        accumulation: AccumulationMode | None = None,
        clock: Callable[[], int] | None = None,
        write_cache: bool = False,
        cache_max_sessions: int = DEFAULT_CACHE_MAX_SESSIONS,
    ) -> None:
        core = EngineCore(
            store, windows, aggregation, emit=emit, watermark=watermark,
            max_out_of_orderness_ms=max_out_of_orderness_ms, on_late=on_late, trigger=trigger,
            accumulation=accumulation, clock=clock, write_cache=write_cache,
            cache_max_sessions=cache_max_sessions)
        self._core = core
        self.config = core.config
        self.store = store
        self.windows = windows
        self.aggregation = aggregation
        self.trigger = trigger
        self.emit_strategy = core.emit_strategy
        self.accumulation = core.accumulation
        self.watermark_mode = watermark
        self.max_out_of_orderness_ms = core.config.max_out_of_orderness_ms
        self.on_late = on_late
        self.clock = core.clock
        self.write_cache = write_cache
        self._bind_event_step()

    def _bind_event_step(self) -> None:
        """Install the event step as this engine's ``process`` (an instance attribute over the
        class's method, so that a call costs no layer): the fused step of :mod:`.fast_event`
        where it applies, the core's otherwise. Called again whenever the core replaces an
        object the fused step holds (an abort)."""
        step = bind_event_step(self._core)
        self.__dict__["process"] = self._core.process if step is None else step

    @property
    def watermark(self) -> int:
        """The current watermark W (``INT64_MIN`` before any progress)."""
        return self._core.times.watermark

    def drain_close_times(self) -> list[int]:
        """Watermarks at which sessions changed since the last call close (and, with a trigger
        and no grace, fire their ON_TIME pane).

        A driver that wakes the engine on timers (the Spark adapter) registers these, so that
        every session gets a timer at or after its close time.
        """
        return self._core.drain_close_times()

    @property
    def metrics(self) -> dict[str, float]:
        """``records-in``, ``dropped-records`` (late or invalid-gap events),
        ``dropped-invalid-gap-records``, ``emit-final-*`` (KIP-825) and store metrics."""
        return self._core.metrics.snapshot(self._core.metered.metrics)

    @property
    def latency_histograms(self) -> dict[str, HistogramReading]:
        """Lifetime latency histograms: ``emit-final-latency`` (event time from a session's
        close to its emission) and ``store-<op>-latency`` (wall time of each store call)."""
        out = self._core.metrics.histograms()
        for name, reading in self._core.metered.latency_histograms.items():
            out[f"store-{name}"] = reading
        return out

    def process(self, key: Any, value: Any, timestamp_ms: Any,
                gap_ms: Any = None) -> list[Emit]:
        """Add one event; return what it emits.

        Args:
            key, value, timestamp_ms: the event.
            gap_ms: the event's own gap, with windows whose gap comes with each event
                (``SessionWindows(None, max_gap_ms=...)``): a duration (int ms, ``timedelta``
                or ``"5 minutes"``), or None. Required then; refused with a fixed gap or a gap
                callable (which computes it from ``(key, value, timestamp_ms)``).

        A dynamic gap that is None or ``<= 0`` drops the event (counted in
        ``dropped-records`` and ``dropped-invalid-gap-records``; ``on_late`` is not called).

        Raises:
            ValueError: a None key, an out-of-range timestamp (``t + gap + grace`` must fit
                int64), a gap above ``max_gap_ms``, a missing or unexpected ``gap_ms``.
            TypeError: a key, timestamp, gap or value of the wrong type (the value and the new
                accumulator must be msgpack-serialisable). Nothing changes then.
        """
        return self._core.process(key, value, timestamp_ms, gap_ms)

    def process_batch(self, keys: Any, values: Any, timestamps_ms: Any,
                      gaps_ms: Any = None) -> list[Emit]:
        """Add a batch of events, in order. See :func:`sessionstore.engine.batch.process_batch`
        for the contract (atomic, validated first, equal to the event path); ``gaps_ms`` is
        each event's gap with windows whose gap comes with each event."""
        return batch.process_batch(self._core, keys, values, timestamps_ms, gaps_ms)

    def process_table(self, table: Any, *, key: str | list[str], time: str,
                      value: str | None = None, gap: str | None = None) -> Any:
        """Add a batch of events given as columns; return what it emits as columns.

        Args:
            table: a ``pyarrow.Table`` or ``RecordBatch``, one event per row, in arrival order.
            key: the key column, or a list of them (the engine key is then the tuple).
            time: the event-time column: integers in engine units (int64 ms), no nulls.
            value: the column that built-ins without ``column=`` read (``sum_of()``, ...), and
                the value custom aggregations and ``on_late`` receive. Without it, the exact
                slower path hands custom aggregations each row as a dict.
            gap: with windows whose gap comes with each event, the column of each event's gap:
                integers in engine units (like ``time``); a null or ``<= 0`` drops the row
                (counted). Refused with a fixed gap or a gap callable.

        Returns:
            A ``pyarrow.Table`` with one row per emitted session, in emission order: the key
            column(s) as given, ``session_start_ms``, ``session_end_ms`` (exclusive),
            ``retracted`` (bool, with ``ON_WINDOW_UPDATE`` only), then one column per
            aggregation output (the ``combine`` names, or the aggregation's name:
            ``count``, ``sum``, ``min``, ``max``, ``first``, ``last``, ``collect``; collect is
            a list column). The rows are what :meth:`process_batch` returns for the same
            events, in the same order. The built-ins take the columnar path and build no
            Python object per session; custom aggregations take the exact slower path.

        Raises:
            TypeError: ``table`` is not Arrow; a time column that is not integer; a value
                msgpack cannot store (naming the column and the row). A trigger is configured
                (use :meth:`process_batch`).
            ValueError: a missing column, a null key, time or aggregated value (naming the
                column and the row), an output name colliding with a key column. A batch is
                atomic: nothing changes then.
        """
        return tables.process_table(self._core, table, key=key, time=time, value=value,
                                    gap=gap)

    def advance_watermark_table(self, to_ms: Any, *, key: str | list[str] | None = None
                                ) -> Any:
        """:meth:`advance_watermark`, returning what it emits in :meth:`process_table`'s columns.

        Args:
            to_ms: the new watermark (never back). At the end of the input, a watermark past
                every session's end plus grace closes all of them.
            key: the key column name(s). Defaults to those of the last :meth:`process_table`
                call, whose column types the table then takes too (so the tables of one run
                concatenate); required before any.

        Returns:
            A ``pyarrow.Table`` in emission order, with the columns :meth:`process_table`
            returns (the update flag column ``retracted`` with ``ON_WINDOW_UPDATE``).

        Raises:
            ValueError: no ``key`` and no earlier :meth:`process_table` call (nothing changes
                then); a ``to_ms`` out of int64.
            TypeError: a trigger is configured (its panes do not fit these columns), or
                ``to_ms`` is not an integer time.
        """
        return tables.advance_watermark_table(self._core, to_ms, key)

    def flush_table(self, *, key: str | list[str] | None = None) -> Any:
        """:meth:`flush` (the write cache's updates and retractions), in
        :meth:`process_table`'s columns; ``key`` as in :meth:`advance_watermark_table`.

        Raises:
            ValueError: no ``key`` and no earlier :meth:`process_table` call.
            TypeError: a trigger is configured.
        """
        return tables.flush_table(self._core, key)

    def advance_watermark(self, to_ms: Any) -> list[Emit]:
        """Move W forward to ``to_ms`` (never back) and emit what that completes or closes."""
        return closing.advance_watermark(self._core, to_ms)

    def advance_processing_time(self, to_ms: Any) -> list[Emit]:
        """Set the :class:`ManualClock` to ``to_ms`` and fire what is due."""
        if not isinstance(self.clock, ManualClock):
            raise TypeError("advance_processing_time needs clock=ManualClock(...)")
        self.clock.set(to_ms)
        return self.poll()

    def poll(self) -> list[Emit]:
        """Fire processing-time triggers that are due by the clock."""
        out: list[Emit] = []
        runner = self._core.runner
        if runner is not None:
            runner.fire_timers(self.clock(), self._core.get_record, out)
        return out

    def flush(self) -> list[Emit]:
        """Deliver the write cache (``write_cache=True``): one update per changed session and
        a retraction for each delivered session since removed; [] otherwise."""
        return self._core.flush()

    def commit(self, metadata: Any = None) -> int:
        """Commit the store together with the engine's cursors and ``metadata``.

        Deliver the emits you have before committing. Returns the new store version. A failed
        commit keeps every pending write, so a retry commits it.

        Raises:
            TypeError: ``metadata`` is not msgpack-serialisable (nothing changes).
            ValueError: the write cache holds updates that :meth:`flush` has not returned.
        """
        return lifecycle.commit(self._core, metadata)

    def abort(self) -> None:
        """Discard everything since the last commit: state, cursors and the write cache."""
        lifecycle.abort(self._core)
        self._bind_event_step()

    @property
    def committed_metadata(self) -> Any:
        """The ``metadata`` of the last :meth:`commit`."""
        return lifecycle.committed_metadata(self._core)

    def sessions(self, key: Any) -> list[tuple[Session, Any]]:
        """The stored sessions of ``key`` with their current results (interactive query)."""
        result = self.aggregation.result
        if self._core.max_duration is not None:
            self._core.max_duration.write_key(key)
        return [(s, result(SessionRecord.from_wire(raw).acc))
                for s, raw in self._core.cache.fetch(key)]

    @property
    def recut_counts(self) -> dict[str, int]:
        """With ``max_duration_ms``, the work out-of-order events caused so far, as operation
        counts: ``events`` (events of the sessions re-cuts wrote) and ``steps`` (re-cut steps
        done one by one in Python). Empty without a maximum duration."""
        step = self._core.max_duration
        if step is None:
            return {}
        return {"events": step.recut_events, "steps": step.recut_steps}
