"""The engine's state: one object every path of :class:`~sessionstore.engine.SessionAggregator`
is handed (the façade holds it and delegates to it).

:class:`EngineCore` validates the options, decides once what they imply, and holds the state:
the store layers (the caching store over the metered store over the user's), the clock and
cursors (:class:`~sessionstore.engine.time.TimeKeeper`), the trigger state, the close index, the
columnar table of the fast batch path, the counters. Every attribute is public and documented
here; the paths read and write them (they are typed against
:class:`~sessionstore.engine.host.EngineHost`).

Its steps are the paths' own functions, taken as methods (``on_watermark =
closing.on_watermark``): a call through the core is a call of that function, with no layer in
between (the event path calls them per event).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..aggregations import Aggregation, Combined, is_count
from ..serde import MsgpackSerde
from ..store.caching import CachingSessionStore
from ..store.metered import MeteredSessionStore
from ..timeutil import INT64_MIN
from ..triggers import AccumulationMode, AfterWatermark, system_clock
from ..types import Session, SessionStoreProtocol
from ..windows import SessionWindows
from . import closing, event, lifecycle
from .columnar import columnar_parts
from .config import EngineConfig
from .emit import Emit, EmitStrategy, EngineMetrics, make_emit
from .max_duration import MaxDuration
from .record import SessionRecord
from .table import OpenSessions
from .time import TimeKeeper, close_time_ms
from .triggers import TriggerRunner


def check_aggregation(aggregation: Any) -> None:
    """Raises TypeError unless ``aggregation`` is one of :mod:`sessionstore.aggregations`."""
    if not isinstance(aggregation, Aggregation):
        raise TypeError(
            f"aggregation must be a sessionstore.aggregations object, "
            f"got {type(aggregation).__name__}"
        )


def check_store(store: Any) -> None:
    """Raises TypeError unless ``store`` is a writable session store."""
    for name in ("put", "remove", "find_sessions_to_merge", "find_sessions", "commit",
                 "cap_expiry_time"):
        if not callable(getattr(store, name, None)):
            raise TypeError(
                f"store must be a writable session store (with {name}()), "
                f"got {type(store).__name__}"
            )


class EngineCore:
    """The state of one engine, and its steps. Arguments and errors: those of
    :class:`~sessionstore.engine.SessionAggregator`."""

    def __init__(
        self,
        store: SessionStoreProtocol,
        windows: SessionWindows,
        aggregation: Aggregation,
        *,
        emit: EmitStrategy | None,
        watermark: str,
        max_out_of_orderness_ms: Any,
        on_late: Callable[[Any, Any, int], None] | None,
        trigger: AfterWatermark | None,
        accumulation: AccumulationMode | None,
        clock: Callable[[], int] | None,
        write_cache: bool,
        cache_max_sessions: int,
    ) -> None:
        check_store(store)
        if not isinstance(windows, SessionWindows):
            raise TypeError(f"windows must be SessionWindows, got {type(windows).__name__}")
        check_aggregation(aggregation)
        if emit is not None and not isinstance(emit, EmitStrategy):
            raise TypeError(f"emit must be an EmitStrategy, got {emit!r}")
        if trigger is not None and not isinstance(trigger, AfterWatermark):
            raise TypeError(f"trigger must be AfterWatermark(...), got {type(trigger).__name__}")
        if trigger is not None and emit is not None:
            raise ValueError("pass either emit= or trigger=, not both")
        if accumulation is not None and not isinstance(accumulation, AccumulationMode):
            raise TypeError(f"accumulation must be an AccumulationMode, got {accumulation!r}")
        if accumulation is not None and trigger is None:
            raise ValueError("accumulation= needs a trigger=")
        self.config = EngineConfig.build(
            windows, watermark=watermark, max_out_of_orderness_ms=max_out_of_orderness_ms,
            cache_max_sessions=cache_max_sessions, store_retention_ms=store.retention_ms)
        if on_late is not None and not callable(on_late):
            raise TypeError(f"on_late must be callable, got {type(on_late).__name__}")
        if clock is not None and not callable(clock):
            raise TypeError(f"clock must be callable, got {type(clock).__name__}")
        if not isinstance(write_cache, bool):
            raise TypeError(f"write_cache must be a bool, got {write_cache!r}")
        if write_cache and (trigger is not None or emit is EmitStrategy.ON_WINDOW_CLOSE):
            raise ValueError("write_cache applies to emit=ON_WINDOW_UPDATE only")

        # -- the options, as given and validated
        self.store = store
        self.windows = windows
        self.aggregation = aggregation
        self.trigger = trigger
        #: None with a trigger
        self.emit_strategy = (
            None if trigger is not None else (emit or EmitStrategy.ON_WINDOW_UPDATE)
        )
        self.accumulation = accumulation or AccumulationMode.DISCARDING
        self.on_late = on_late
        self.clock: Callable[[], int] = clock or system_clock
        self.write_cache = write_cache

        # -- what the options imply, decided once
        #: ON_WINDOW_UPDATE: each change is emitted (or forwarded by the write cache)
        self.updates = self.emit_strategy is EmitStrategy.ON_WINDOW_UPDATE
        #: ON_WINDOW_CLOSE or a trigger: closing needs the close index
        self.tracks_close = not self.updates
        #: each new accumulator is checked to be storable
        self.check_acc = not aggregation.acc_always_encodable
        #: the lean event path: no trigger and no maximum duration, so a stored record is only
        #: its accumulator (no SessionRecord objects)
        self.lean = trigger is None and windows.max_duration_ms is None
        #: the aggregation is count(): the lean paths fold it without calls
        self.is_count = is_count(aggregation)
        #: the lean path with a fixed gap: the event path's common case
        self.fixed_lean = self.lean and not self.config.dynamic
        # copies of config values the event path reads per event (one attribute read less)
        self.max_timestamp_ms = self.config.max_timestamp_ms
        self.max_gap_ms = self.config.max_gap_ms
        self.grace_ms = self.config.grace_ms
        self.inclusive_gap = self.config.inclusive_gap
        self.event_time = self.config.watermark == "event_time"
        self.max_out_of_orderness_ms = self.config.max_out_of_orderness_ms
        #: emit-on-close from the cache's memory (CachingSessionStore.take_closed) instead of
        #: writing closed sessions and reading them back: the cache indexes ends, and the close
        #: heap is only fed by the other paths. The emitted values are what the store would
        #: return, so this needs the store's default msgpack serde (tuples come back as lists).
        self.closes_in_cache = (
            self.lean and self.tracks_close and self.config.cache_max_sessions > 0
            and type(getattr(store, "value_serde", None)) is MsgpackSerde
        )
        parts = (None if trigger is not None or write_cache
                 or windows.max_duration_ms is not None else columnar_parts(aggregation))
        #: the accumulator kinds of the fast batch path (None: it does not apply)
        self.columnar_kinds = None if parts is None else [kind for kind, _ in parts]
        #: the column each of them reads (None: the event value)
        self.columnar_columns = [] if parts is None else [column for _, column in parts]
        #: the output names of a combined aggregation (None: one output)
        self.result_names = aggregation.names if isinstance(aggregation, Combined) else None

        # -- the state
        self.metrics = EngineMetrics()
        #: the user's store, timed
        self.metered = MeteredSessionStore(store)
        #: what the write cache delivered and the next call returns
        self.forwarded: list[Emit] = []
        #: the write-back cache over the metered store: every path reads and writes it
        self.cache = CachingSessionStore(
            self.metered, self.config.cache_max_sessions,
            forward=self.forward if write_cache else None,
            index_ends=self.closes_in_cache,
        )
        #: the keys the cache holds (a mapping)
        self.held_keys = self.cache.held_keys
        #: the watermark, close cursor and arrival counter
        self.times = TimeKeeper(self.config)
        #: the trigger's state and firings (None without a trigger)
        self.runner = (
            None if trigger is None else TriggerRunner(
                trigger, self.accumulation, self.clock, aggregation, self.times,
                self.metrics, self.put_record)
        )
        #: the open sessions as columns, while the fast batch path runs (None otherwise); the
        #: store holds everything it holds after every batch, so it can be dropped at any time
        self.table: OpenSessions | None = None
        #: the key names and output schema of the last process_table call: the columns of
        #: advance_watermark_table and flush_table
        self.table_columns: tuple[list[str], Any] | None = None
        #: issue 12: with max_duration_ms every event takes the re-cutting step of
        #: sessionstore/engine/max_duration.py (which refuses triggers)
        self.max_duration = (None if windows.max_duration_ms is None
                             else MaxDuration(self, windows.max_duration_ms))
        self.reset_indexes()
        self.restore()

    # -- the steps (the paths' functions, as methods) -----------------------------------------

    process = event.process_event
    process_one = event.process_one
    process_lean = event.process_lean
    drop = event.drop
    on_watermark = closing.on_watermark
    restore = lifecycle.restore
    cap_expiry = lifecycle.cap_expiry
    open_table = lifecycle.open_table
    leave_table = lifecycle.leave_table
    advance_table = lifecycle.advance_table

    # -- the close index ----------------------------------------------------------------------

    def reset_indexes(self) -> None:
        """Empty the in-memory indexes (rebuilt from the store on start: they only save store
        queries)."""
        #: the ends of the open sessions, when the other paths than the cache's end index
        #: close them (ON_WINDOW_CLOSE, triggers)
        self.close_heap: list[int] = []
        #: the heap holds every open session (not yet after a restart)
        self.close_heap_complete = True
        #: sessions ending up to here may be missing from the heap
        self.unindexed_until = INT64_MIN
        #: the close times of changed sessions, kept once drain_close_times() is used
        self.new_close_times: list[int] = []
        self.record_close_times: bool = getattr(self, "record_close_times", False)
        if self.runner is not None:
            self.runner.on_time_heap.clear()
            self.runner.timers.clear()

    def drain_close_times(self) -> list[int]:
        """The close times (``end + grace``) of sessions changed since the last call; from the
        first call on, they are recorded."""
        self.record_close_times = True
        grace = self.config.grace_ms
        times = [close_time_ms(end, grace) for end in self.new_close_times]
        self.new_close_times = []
        return times

    # -- records and the write cache ----------------------------------------------------------

    def put_record(self, session: Session, record: SessionRecord) -> None:
        """Store ``record`` as ``session``'s."""
        self.cache.put(session, record.to_wire())

    def get_record(self, session: Session) -> SessionRecord | None:
        """The stored record of ``session`` (None: not stored)."""
        raw = self.cache.fetch_session(*session)
        return None if raw is None else SessionRecord.from_wire(raw)

    def forward(self, session: Session, new: Any, old: Any) -> None:
        """The write cache delivers a change (Kafka's putAndMaybeForward)."""
        result = self.aggregation.result
        if new is None:
            self.forwarded.append(
                make_emit(session, result(SessionRecord.from_wire(old).acc), retraction=True))
        else:
            self.forwarded.append(make_emit(session, result(SessionRecord.from_wire(new).acc)))

    def drain_forwarded(self) -> list[Emit]:
        """What the write cache delivered since the last call (counted as emitted)."""
        out = self.forwarded
        self.forwarded = []
        self.metrics.emitted += len(out)
        return out

    def flush(self) -> list[Emit]:
        """Deliver the write cache (``write_cache=True``); [] otherwise."""
        if self.max_duration is not None:
            self.max_duration.write_all([])  # sessions written lazily (ON_WINDOW_CLOSE)
        if not self.write_cache:
            return []
        self.cache.flush()
        return self.drain_forwarded()
