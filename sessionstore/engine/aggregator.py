"""The engine's façade: :class:`SessionAggregator` and its event-at-a-time path.

The parts it wires together, each in its own module:

* :mod:`.config`: validated options, defaults and the retention rule;
* :mod:`.time`: watermark, lateness and the close cursor;
* :mod:`.merge`: the one merge rule (and the batch kernel's entry point);
* :mod:`.record`: the typed session record and its wire form;
* :mod:`.emit`: what is emitted, and the counters;
* :mod:`.triggers`: Beam trigger state and firings;
* :mod:`.batch`: the columnar batch path;
* store layers below it: :class:`~sessionstore.store.caching.CachingSessionStore` over
  :class:`~sessionstore.store.metered.MeteredSessionStore` over the user's store.

The invariant every path keeps: *close first, then write, then expire*. Expiry is capped at the
close cursor (every session ending at or before it was emitted) plus retention, so no write or
flush, mid-batch or on cache eviction, can let the store expire a session nobody emitted.
"""

from __future__ import annotations

import functools
import heapq
from collections.abc import Callable
from typing import Any

from .. import keyschema
from ..aggregations import Aggregation, Combined, is_count
from ..serde import MsgpackSerde
from ..store.caching import CachingSessionStore, ClosedRow
from ..store.metered import HistogramReading, MeteredSessionStore
from ..timeutil import INT64_MAX, INT64_MIN, check_int64, duration_ms
from ..timeutil import timestamp_ms as to_timestamp_ms
from ..triggers import AccumulationMode, AfterWatermark, ManualClock, PaneTiming, system_clock
from ..types import Session, SessionStoreProtocol
from ..windows import SessionWindows
from .columnar import SessionRows, columnar_parts
from .config import DEFAULT_CACHE_MAX_SESSIONS, EngineConfig, expiry_cap_ms
from .emit import Emit, EmitStrategy, EngineMetrics, make_emit
from .fast_event import bind_event_step
from .max_duration import MaxDuration
from .merge import END_START, join_range, merge_event
from .record import Phase, SessionRecord, acc_of, as_stored, check_encodable, plain_record
from .table import OpenSessions, unique_keys
from .time import TimeKeeper
from .triggers import TriggerRunner

ENGINE_METADATA_KEY = "sessionstore.engine"
_new_session = functools.partial(tuple.__new__, Session)  # Session(k, s, e), without a call
_new_emit = functools.partial(tuple.__new__, Emit)
USER_METADATA_KEY = "user"
_MSGPACK_INT_MIN = -(1 << 63)  # msgpack stores ints in [-2**63, 2**64 - 1]
_MSGPACK_INT_MAX = (1 << 64) - 1


def check_aggregation(aggregation: Any) -> None:
    if not isinstance(aggregation, Aggregation):
        raise TypeError(
            f"aggregation must be a sessionstore.aggregations object, "
            f"got {type(aggregation).__name__}"
        )


def check_store(store: Any) -> None:
    for name in ("put", "remove", "find_sessions_to_merge", "find_sessions", "commit",
                 "cap_expiry_time"):
        if not callable(getattr(store, name, None)):
            raise TypeError(
                f"store must be a writable session store (with {name}()), "
                f"got {type(store).__name__}"
            )


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

        self.store = store
        self.windows = windows
        self.aggregation = aggregation
        self.trigger = trigger
        self.emit_strategy = (
            None if trigger is not None else (emit or EmitStrategy.ON_WINDOW_UPDATE)
        )
        self.accumulation = accumulation or AccumulationMode.DISCARDING
        self.watermark_mode = watermark
        self.max_out_of_orderness_ms = self.config.max_out_of_orderness_ms
        self.on_late = on_late
        self.clock: Callable[[], int] = clock or system_clock
        self.write_cache = write_cache
        self._updates = self.emit_strategy is EmitStrategy.ON_WINDOW_UPDATE
        self._tracks_close = not self._updates
        self._check_acc = not aggregation.acc_always_encodable
        self._metrics = EngineMetrics()
        self._metered = MeteredSessionStore(store)
        self._forwarded: list[Emit] = []
        # the lean event path: no trigger and no maximum duration, so a stored record is only
        # its accumulator (no SessionRecord objects); the count is folded without calls
        self._lean = trigger is None and windows.max_duration_ms is None
        self._count = is_count(aggregation)
        self._fixed_lean = self._lean and not self.config.dynamic
        self._max_t = self.config.max_timestamp_ms
        self._max_gap = self.config.max_gap_ms
        self._grace = self.config.grace_ms
        self._inclusive = self.config.inclusive_gap
        self._event_time = self.config.watermark == "event_time"
        self._ooo = self.config.max_out_of_orderness_ms
        # emit-on-close from the cache's memory (CachingSessionStore.take_closed) instead of
        # writing closed sessions and reading them back: the cache indexes ends, and the close
        # heap is only fed by the other paths. The emitted values are what the store would
        # return, so this needs the store's default msgpack serde (tuples come back as lists).
        self._closes_in_cache = (
            self._lean and self._tracks_close and self.config.cache_max_sessions > 0
            and type(getattr(store, "value_serde", None)) is MsgpackSerde
        )
        self._state = CachingSessionStore(
            self._metered, self.config.cache_max_sessions,
            forward=self._forward if write_cache else None,
            index_ends=self._closes_in_cache,
        )
        self._held_keys = self._state.held_keys
        self._times = TimeKeeper(self.config)
        self._runner = (
            None if trigger is None else TriggerRunner(
                trigger, self.accumulation, self.clock, aggregation, self._times,
                self._metrics, self._put_record)
        )
        parts = (None if trigger is not None or write_cache
                 or windows.max_duration_ms is not None else columnar_parts(aggregation))
        self._columnar_kinds = None if parts is None else [kind for kind, _ in parts]
        self._columnar_columns = [] if parts is None else [column for _, column in parts]
        self._result_names = aggregation.names if isinstance(aggregation, Combined) else None
        # the open sessions as columns, while the fast batch path runs (None otherwise); the
        # store holds everything it holds after every batch, so it can be dropped at any time
        self._table: OpenSessions | None = None
        # the key names and output schema of the last process_table call: the columns of
        # advance_watermark_table and flush_table
        self._table_columns: tuple[list[str], Any] | None = None
        # issue 12: with max_duration_ms every event takes the re-cutting step of
        # sessionstore/engine/max_duration.py (which refuses triggers)
        self._max_duration = (None if windows.max_duration_ms is None
                              else MaxDuration(self, windows.max_duration_ms))
        self._reset_indexes()
        self._restore()
        self._bind_event_step()

    def _bind_event_step(self) -> None:
        """Install the fused event step of :mod:`.fast_event` as this engine's ``process``
        (an instance attribute over the class's method), or remove it where it does not apply.
        Called again whenever the engine replaces an object the step holds (an abort). The
        step refers to the engine, so an engine is a reference cycle: dropped, it is freed by
        the collector rather than at once (close its store explicitly, as always)."""
        step = bind_event_step(self)
        if step is None:
            self.__dict__.pop("process", None)
        else:
            self.__dict__["process"] = step

    def _reset_indexes(self) -> None:
        # in-memory indexes, rebuilt from the store on start: they only save store queries
        self._close_heap: list[int] = []
        self._close_heap_complete = True
        self._unindexed_until = INT64_MIN  # sessions ending up to here may be missing from it
        self._new_close_times: list[int] = []  # only kept once drain_close_times() is used
        self._record_close_times = getattr(self, "_record_close_times", False)
        if self._runner is not None:
            self._runner.on_time_heap.clear()
            self._runner.timers.clear()

    # -- public API -------------------------------------------------------------------------

    @property
    def watermark(self) -> int:
        """The current watermark W (``INT64_MIN`` before any progress)."""
        return self._times.watermark

    def drain_close_times(self) -> list[int]:
        """Watermarks at which sessions changed since the last call close (and, with a trigger
        and no grace, fire their ON_TIME pane).

        A driver that wakes the engine on timers (the Spark adapter) registers these, so that
        every session gets a timer at or after its close time.
        """
        self._record_close_times = True
        grace = self.config.grace_ms
        times = [end + grace for end in self._new_close_times]
        self._new_close_times = []
        return times

    @property
    def metrics(self) -> dict[str, float]:
        """``records-in``, ``dropped-records`` (late or invalid-gap events),
        ``dropped-invalid-gap-records``, ``emit-final-*`` (KIP-825) and store metrics."""
        return self._metrics.snapshot(self._metered.metrics)

    @property
    def latency_histograms(self) -> dict[str, HistogramReading]:
        """Lifetime latency histograms: ``emit-final-latency`` (event time from a session's
        close to its emission) and ``store-<op>-latency`` (wall time of each store call)."""
        out = self._metrics.histograms()
        for name, reading in self._metered.latency_histograms.items():
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
        if self._fixed_lean and type(timestamp_ms) is int and gap_ms is None \
                and INT64_MIN <= timestamp_ms <= self._max_t and self._table is None:
            # the common case, checked as below: a fixed gap, an int time in range
            kind = type(key)
            if not ((kind is str or kind is int) and key in self._held_keys):
                keyschema.encode_key(key)  # a key the cache holds passed this already
            vkind = type(value)
            if not (value is None or vkind is float or vkind is bool
                    or (vkind is int and _MSGPACK_INT_MIN <= value <= _MSGPACK_INT_MAX)):
                check_encodable(value, "value")  # the scalars above always encode
            emits: list[Emit] = []
            self._process_lean(key, value, timestamp_ms, emits, None)
            if self._forwarded:
                emits.extend(self._drain_forwarded())
            return emits
        cfg = self.config
        t = timestamp_ms if type(timestamp_ms) is int else None
        gap: int | None = None  # the event's own gap; None with a fixed gap
        if not cfg.dynamic:
            if gap_ms is not None:
                raise ValueError(f"gap_ms={gap_ms!r} given, but the windows have a fixed gap "
                                 f"({cfg.gap_ms} ms); pass gap_ms only with "
                                 f"SessionWindows(None, max_gap_ms=...)")
            if t is None or not INT64_MIN <= t <= cfg.max_timestamp_ms:
                t = self._check_timestamp(timestamp_ms)
        else:
            if t is None or not INT64_MIN <= t <= INT64_MAX:
                t = to_timestamp_ms(timestamp_ms, "timestamp_ms")
        keyschema.encode_key(key)
        check_encodable(value, "value")
        if cfg.dynamic:  # after the key and value checks: a gap callable sees valid events
            gap = self._event_gap(key, value, t, gap_ms)
        if self._table is not None:
            self._leave_table()
        out: list[Emit] = []
        if gap is None and cfg.dynamic:  # an invalid gap: dropped, as Spark filters it
            # (dropped here, not as late: it does not call on_late nor move the watermark)
            self._metrics.records_in += 1
            self._metrics.dropped += 1
            self._metrics.dropped_invalid_gap += 1
            return out
        self._process_one(key, value, t, out, gap)
        if self._forwarded:
            out.extend(self._drain_forwarded())
        return out

    def _event_gap(self, key: Any, value: Any, t: int, gap_ms: Any) -> int | None:
        """The dynamic gap of one event (None: invalid, the event is dropped).

        Raises:
            ValueError / TypeError: naming the argument (a missing or unexpected ``gap_ms``, a
                gap that is not a duration, above ``max_gap_ms``, or overflowing int64).
        """
        fn = self.windows.gap_fn
        if fn is not None:
            if gap_ms is not None:
                raise ValueError(f"gap_ms={gap_ms!r} given, but the windows compute each "
                                 f"event's gap with their gap callable; pass one or the other")
            raw, name = fn(key, value, t), "the gap callable's result"
        else:
            if gap_ms is None:
                raise ValueError("gap_ms is required: the windows take each event's gap with "
                                 "the event (SessionWindows(None, ...))")
            raw, name = gap_ms, "gap_ms"
        if raw is None:
            return None
        gap = raw if type(raw) is int else duration_ms(raw, name)
        if gap <= 0:
            return None
        cfg = self.config
        if gap > cfg.max_gap_ms:
            raise ValueError(f"{name} = {gap} exceeds max_gap_ms = {cfg.max_gap_ms} "
                             f"(event at timestamp_ms {t})")
        if t > INT64_MAX - gap - cfg.grace_ms:
            raise ValueError(f"timestamp_ms {t} + {name} {gap} + grace_ms overflows int64")
        return gap

    def process_batch(self, keys: Any, values: Any, timestamps_ms: Any,
                      gaps_ms: Any = None) -> list[Emit]:
        """Add a batch of events, in order. See :func:`sessionstore.engine.batch.process_batch`
        for the contract (atomic, validated first, equal to the event path); ``gaps_ms`` is
        each event's gap with windows whose gap comes with each event."""
        from .batch import process_batch

        return process_batch(self, keys, values, timestamps_ms, gaps_ms)

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
        from .batch import process_table

        if self._runner is not None:
            raise TypeError("process_table does not emit panes: with trigger=, use "
                            "process_batch")
        out = process_table(self, table, key=key, time=time, value=value, gap=gap)
        # the columns of advance_watermark_table and flush_table
        self._table_columns = ([key] if isinstance(key, str) else list(key), out.schema)
        return out

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
        names, schema = self._table_shape(key)
        return self._emits_table(self.advance_watermark(to_ms), names, schema)

    def flush_table(self, *, key: str | list[str] | None = None) -> Any:
        """:meth:`flush` (the write cache's updates and retractions), in
        :meth:`process_table`'s columns; ``key`` as in :meth:`advance_watermark_table`.

        Raises:
            ValueError: no ``key`` and no earlier :meth:`process_table` call.
            TypeError: a trigger is configured.
        """
        names, schema = self._table_shape(key)
        return self._emits_table(self.flush(), names, schema)

    def _table_shape(self, key: str | list[str] | None) -> tuple[list[str], Any]:
        if self._runner is not None:
            raise TypeError("the table methods do not emit panes: with trigger=, use "
                            "advance_watermark and flush")
        known = self._table_columns
        if key is None:
            if known is None:
                raise ValueError("key= is required before the first process_table call: the "
                                 "table's key column names come from it")
            return known[0], known[1]
        names = [key] if isinstance(key, str) else list(key)
        if not names or not all(isinstance(n, str) for n in names):
            raise TypeError(f"key must be a column name or a non-empty list of names, "
                            f"got {key!r}")
        return names, known[1] if known is not None and known[0] == names else None

    def _emits_table(self, emits: list[Emit], names: list[str], schema: Any) -> Any:
        from .batch import emits_as_table

        return emits_as_table(self, emits, names, schema)

    def advance_watermark(self, to_ms: Any) -> list[Emit]:
        """Move W forward to ``to_ms`` (never back) and emit what that completes or closes."""
        to = check_int64(to_ms, "to_ms")
        out: list[Emit] = []
        if self._times.advance_to(to):
            self._on_watermark(out)
        if self._forwarded:
            out.extend(self._drain_forwarded())
        return out

    def advance_processing_time(self, to_ms: Any) -> list[Emit]:
        """Set the :class:`ManualClock` to ``to_ms`` and fire what is due."""
        if not isinstance(self.clock, ManualClock):
            raise TypeError("advance_processing_time needs clock=ManualClock(...)")
        self.clock.set(to_ms)
        return self.poll()

    def poll(self) -> list[Emit]:
        """Fire processing-time triggers that are due by the clock."""
        out: list[Emit] = []
        if self._runner is not None:
            self._runner.fire_timers(self.clock(), self._get_record, out)
        return out

    def flush(self) -> list[Emit]:
        """Deliver the write cache (``write_cache=True``): one update per changed session and
        a retraction for each delivered session since removed; [] otherwise."""
        if self._max_duration is not None:
            self._max_duration.write_all([])  # sessions written lazily (ON_WINDOW_CLOSE)
        if not self.write_cache:
            return []
        self._state.flush()
        return self._drain_forwarded()

    def commit(self, metadata: Any = None) -> int:
        """Commit the store together with the engine's cursors and ``metadata``.

        Deliver the emits you have before committing. Returns the new store version. A failed
        commit keeps every pending write, so a retry commits it.

        Raises:
            TypeError: ``metadata`` is not msgpack-serialisable (nothing changes).
            ValueError: the write cache holds updates that :meth:`flush` has not returned.
        """
        check_encodable(metadata, "metadata")
        if self._max_duration is not None:
            self._max_duration.write_all([])  # a commit holds every session
        if self.write_cache and self._state.dirty_count:
            raise ValueError("flush() the write cache and deliver its emits before commit()")
        engine_state = self._times.to_state()
        return self._state.commit({ENGINE_METADATA_KEY: engine_state, USER_METADATA_KEY: metadata})

    def abort(self) -> None:
        """Discard everything since the last commit: state, cursors and the write cache."""
        self._table = None
        self._state.abort()
        if self._max_duration is not None:
            self._max_duration.forget()
        self._forwarded.clear()
        self._times = TimeKeeper(self.config)
        if self._runner is not None:
            self._runner.times = self._times
        self._reset_indexes()
        self._restore()
        self._bind_event_step()

    @property
    def committed_metadata(self) -> Any:
        """The ``metadata`` of the last :meth:`commit`."""
        committed = self.store.committed_metadata
        if isinstance(committed, dict):
            return committed.get(USER_METADATA_KEY)
        return None

    def sessions(self, key: Any) -> list[tuple[Session, Any]]:
        """The stored sessions of ``key`` with their current results (interactive query)."""
        result = self.aggregation.result
        if self._max_duration is not None:
            self._max_duration.write_key(key)
        return [(s, result(SessionRecord.from_wire(raw).acc))
                for s, raw in self._state.fetch(key)]

    # -- state access -----------------------------------------------------------------------

    def _put_record(self, session: Session, record: SessionRecord) -> None:
        self._state.put(session, record.to_wire())

    def _get_record(self, session: Session) -> SessionRecord | None:
        raw = self._state.fetch_session(*session)
        return None if raw is None else SessionRecord.from_wire(raw)

    def _forward(self, session: Session, new: Any, old: Any) -> None:
        """The write cache delivers a change (Kafka's putAndMaybeForward)."""
        result = self.aggregation.result
        if new is None:
            self._forwarded.append(
                make_emit(session, result(SessionRecord.from_wire(old).acc), retraction=True))
        else:
            self._forwarded.append(make_emit(session, result(SessionRecord.from_wire(new).acc)))

    def _drain_forwarded(self) -> list[Emit]:
        out = self._forwarded
        self._forwarded = []
        self._metrics.emitted += len(out)
        return out

    # -- restore ----------------------------------------------------------------------------

    def _restore(self) -> None:
        committed = self.store.committed_metadata
        state = committed.get(ENGINE_METADATA_KEY) if isinstance(committed, dict) else None
        if state is not None:
            self._times.restore(state)
        self._cap_expiry()
        if not self._tracks_close or state is None:
            return
        if self._runner is None:
            # ON_WINDOW_CLOSE needs no scan: until the heap knows every open session again,
            # each watermark advance asks the store (one range query) instead of the heap
            self._close_heap_complete = False
            observed = self.store.observed_stream_time
            self._unindexed_until = INT64_MIN if observed is None else observed
            return
        last_close = self._times.last_close
        start = last_close + 1 if last_close < INT64_MAX else INT64_MAX
        for session, raw in self._state.find_sessions(start, INT64_MAX):
            heapq.heappush(self._close_heap, session.end)
            self._runner.index(session, SessionRecord.from_wire(raw))

    def _cap_expiry(self) -> None:
        """Keep the store from expiring what the engine has not emitted (the invariant)."""
        self._state.cap_expiry_time(expiry_cap_ms(self._times.last_close, self.store.retention_ms))

    # -- the event path ---------------------------------------------------------------------

    def _check_timestamp(self, value: Any) -> int:
        t = to_timestamp_ms(value, "timestamp_ms")
        if t > self.config.max_timestamp_ms:
            raise ValueError(f"timestamp_ms {t} + gap_ms + grace_ms overflows int64")
        return t

    def _drop(self, key: Any, value: Any, t: int) -> None:
        self._metrics.dropped += 1
        if self.on_late is not None:
            self.on_late(key, value, t)

    def _process_one(self, key: Any, value: Any, t: int, out: list[Emit],
                     gap: int | None = None) -> None:
        """One validated event; ``gap`` is its own gap (None: the fixed gap)."""
        if self._lean:
            self._process_lean(key, value, t, out, gap)
            return
        if self._max_duration is not None:  # issue 12: maximum session duration
            self._max_duration.process(
                key, value, t, t + (self.config.max_gap_ms if gap is None else gap), out)
            return
        self._metrics.records_in += 1
        times = self._times
        cfg = self.config
        own_end = t + (cfg.max_gap_ms if gap is None else gap)  # max_gap_ms: the fixed gap
        if times.is_late(own_end):
            self._drop(key, value, t)
            return
        closed_before = times.closed_before()
        view = self._state.sessions_of(key, closed_before)
        start, end, joined = merge_event(view.keys(), t, own_end, closed_before,
                                         cfg.inclusive_gap)
        new = Session(key, start, end)
        records = [SessionRecord.from_wire(view[b][0]) for b in joined]
        same = len(joined) == 1 and joined[0] == (start, end)
        agg = self.aggregation
        seq = times.seq + 1
        runner = self._runner
        if runner is not None and same:
            record = runner.on_element(records[0], agg.add(key, value, t, seq, records[0].acc))
        else:
            acc = agg.initial()
            for rec in records:
                acc = agg.merge(key, acc, rec.acc)
            acc = agg.add(key, value, t, seq, acc)
            record = (SessionRecord(acc) if runner is None
                      else runner.on_merge(records, acc, end))
        if self._check_acc:
            check_encodable(record.acc, f"the accumulator of {new}")
        times.seq = seq
        state = self._state
        for b in joined:
            if b != (start, end):
                state.remove(Session(key, b[0], b[1]))
        state.put(new, record.to_wire())
        if self._updates:
            if not self.write_cache:
                result = agg.result
                for b, rec in zip(joined, records, strict=True):
                    if b != (start, end):
                        out.append(make_emit(Session(key, b[0], b[1]), result(rec.acc),
                                             retraction=True))
                out.append(make_emit(new, result(record.acc)))
                self._metrics.emitted += len(joined) + 1 - same
        else:
            if not same:
                heapq.heappush(self._close_heap, end)
                if self._record_close_times:
                    self._new_close_times.append(end)
            if runner is not None:
                runner.after_update(new, record,
                                    records[0].pt_target_ms if same else None, same, out)
        if times.observe(t):
            self._on_watermark(out)

    def _process_lean(self, key: Any, value: Any, t: int, out: list[Emit],
                      gap: int | None) -> None:
        """:meth:`_process_one` without a trigger or maximum duration: the same steps, with
        the accumulator stored as the plain record ``[acc, 0, 0, 0, None]`` and the one-session
        merge (most events) inlined. The outcome is that of :func:`merge_event` and
        ``initial / merge / add`` in the same order, so any aggregation may take it."""
        self._metrics.records_in += 1
        times = self._times
        own_end = t + (self._max_gap if gap is None else gap)  # max_gap_ms: the fixed gap
        w = times.watermark
        grace = self._grace
        if w >= own_end + grace:  # TimeKeeper.is_late, inlined (the hot path)
            self._drop(key, value, t)
            return
        closed_before = times.closed_before()
        state = self._state
        view = state.sessions_of(key, closed_before)
        if view:
            floor, latest_start = join_range(t, own_end, closed_before, self._inclusive)
            joined: Any = []  # a loop: a comprehension is a call, and views hold 1-2 sessions
            for b in view:
                if b[1] >= floor and b[0] <= latest_start:
                    joined.append(b)
        else:
            joined = ()
        seq = times.seq + 1
        start, end = t, own_end
        accs: Any = ()
        if not joined:
            if self._count:
                acc: Any = 1
            else:
                agg = self.aggregation
                acc = agg.add(key, value, t, seq, agg.initial())
        else:
            if len(joined) > 1:
                joined.sort(key=END_START)
            accs = []
            for b in joined:
                s, e = b
                if s < start:
                    start = s
                if e > end:
                    end = e
                accs.append(acc_of(view[b][0]))
            if self._count:
                acc = sum(accs) + 1
            else:
                agg = self.aggregation
                acc = agg.initial()
                for old in accs:
                    acc = agg.merge(key, acc, old)
                acc = agg.add(key, value, t, seq, acc)
        if self._check_acc:
            check_encodable(acc, f"the accumulator of {Session(key, start, end)}")
        times.seq = seq
        same = len(joined) == 1 and joined[0] == (start, end)
        # plain tuples: msgpack stores the record tuple as the record list, and the garbage
        # collector stops tracking both (a list, or a Session, would stay tracked while cached)
        state.put_merged(key, view, joined, (key, start, end), plain_record(acc))
        if self._updates:
            if not self.write_cache:
                new = _new_session((key, start, end))
                result = self.aggregation.result
                for b, old in zip(joined, accs, strict=True):
                    if b != (start, end):
                        out.append(make_emit(Session(key, b[0], b[1]), result(old),
                                             retraction=True))
                out.append(make_emit(new, result(acc)))
                self._metrics.emitted += len(joined) + 1 - same
        elif not same:
            if not self._closes_in_cache:
                heapq.heappush(self._close_heap, end)
            if self._record_close_times:
                self._new_close_times.append(end)
        if self._event_time:  # TimeKeeper.observe, inlined
            met = times.max_event_time
            if met is None or t > met:
                times.max_event_time = t
            if t - self._ooo > times.watermark:
                times.watermark = t - self._ooo
                self._on_watermark(out)

    # -- closing (ON_WINDOW_CLOSE and the closing pane of triggers) ---------------------------

    def _on_watermark(self, out: list[Emit]) -> None:
        times = self._times
        w = times.watermark
        close_upto = w - self.config.grace_ms
        if close_upto > times.last_close:
            if self._max_duration is not None:  # sessions written lazily that may close
                self._max_duration.write_upto(close_upto, out)
            if self._table is not None:
                closed = self._advance_table()
                if closed is not None:
                    out.extend(closed.emits(self._result_names))
            elif not self._tracks_close:
                times.last_close = close_upto
            elif (self._close_heap and self._close_heap[0] <= close_upto) \
                    or not self._close_heap_complete or self._state.has_ends_upto(close_upto):
                self._close_up_to(close_upto, out)
            else:
                times.last_close = close_upto
            if not self._close_heap_complete and times.last_close >= self._unindexed_until:
                self._close_heap_complete = True  # every session from before the restart closed
            self._cap_expiry()
        if self._runner is not None:
            self._fire_on_time(w, out)

    # -- the open sessions as columns (the fast batch path) ------------------------------------

    def _open_table(self) -> OpenSessions:
        """The open sessions' table, loaded from the store on first use.

        Raises:
            NotColumnar: stored accumulators the fast path cannot hold exactly.
        """
        if self._table is None:
            assert self._columnar_kinds is not None
            last_close = self._times.last_close
            low = last_close + 1 if last_close < INT64_MAX else INT64_MAX
            rows = [(session, acc_of(raw))
                    for session, raw in self._state.find_sessions(low, INT64_MAX)]
            loaded = SessionRows.from_rows(self._columnar_kinds, rows,
                                           combined=self._result_names is not None)
            table = OpenSessions(self._columnar_kinds)
            keys, codes = unique_keys([session.key for session, _ in rows])
            table.insert(keys, codes, table.index.lookup(keys), loaded)
            self._state.evict()  # the table now answers for these keys; no view may go stale
            self._table = table
        return self._table

    def _leave_table(self) -> None:
        """Hand the open sessions back to the event path (the store already holds them)."""
        table = self._table
        if table is None:
            return
        self._table = None
        if self._tracks_close:
            self._close_heap.extend(table.live_ends().tolist())
            heapq.heapify(self._close_heap)
            self._close_heap_complete = True  # the table held every session not yet closed

    def _advance_table(self) -> SessionRows | None:
        """Close (and, with ON_WINDOW_CLOSE, return for emission, in store order) the table's
        sessions up to ``W - grace``; forget them; move the close cursor and the expiry cap."""
        table = self._table
        assert table is not None
        times = self._times
        upto = times.watermark - self.config.grace_ms
        if upto <= times.last_close:
            return None
        closed = table.close_upto(upto, rows=self._tracks_close)
        if closed is not None and len(closed):
            closed = closed.take(closed.store_order())
            self._metrics.emitted += len(closed)
            self._metrics.record_finals(times.watermark - (closed.ends_ms + self.config.grace_ms))
        times.last_close = upto
        self._cap_expiry()
        return closed

    def _close_up_to(self, upto: int, out: list[Emit]) -> None:
        """Emit every session with ``last_close < end <= upto`` as closed, in end order."""
        heap = self._close_heap
        while heap and heap[0] <= upto:
            heapq.heappop(heap)
        times = self._times
        grace = self.config.grace_ms
        result = self.aggregation.result
        metrics = self._metrics
        runner = self._runner
        if self._closes_in_cache:
            taken = self._state.take_closed_rows(times.last_close + 1, upto)
            if taken is not None:
                self._emit_taken(taken, out)
                times.last_close = upto
                return
        rows = list(self._state.find_sessions(times.last_close + 1, upto))
        if runner is None:
            # the records are decoded (and checked) one by one, the metrics counted once
            w = times.watermark
            latencies = []
            for session, raw in rows:
                out.append(make_emit(session, result(SessionRecord.from_wire(raw).acc)))
                latencies.append(max(0, w - (session.end + grace)))
            metrics.emitted += len(rows)
            metrics.record_finals(latencies)
        else:
            for session, raw in rows:
                runner.fire_closing(session, SessionRecord.from_wire(raw), out)
        times.last_close = upto

    def _emit_taken(self, taken: list[ClosedRow], out: list[Emit]) -> None:
        """Emit the closed sessions the cache handed from memory (its rows ``(end, key bytes,
        start, (key, start, end), value, changed)``), with the values a read from the store
        would give (:func:`~sessionstore.engine.record.as_stored`)."""
        if not taken:
            return
        result = self.aggregation.result
        w_grace = self._times.watermark - self.config.grace_ms
        append = out.append
        new_emit = _new_emit
        new_session = _new_session
        count = self._count
        for row in taken:
            acc = acc_of(row[4])
            if count and type(acc) is int:  # count's result is its accumulator
                append(new_emit((new_session(row[3]), acc, None, False, row[0] - 1)))
            else:
                if type(acc) is not int:
                    acc = as_stored(acc)
                append(new_emit((new_session(row[3]), result(acc), None, False, row[0] - 1)))
        # the rows are in end order; each latency is max(0, W - grace - end)
        n = len(taken)
        if taken[-1][0] <= w_grace:  # every latency >= 0 (always, when closing up to W - grace)
            total = n * w_grace - sum([row[0] for row in taken])
            top = w_grace - taken[0][0]
        else:
            latencies = [w_grace - row[0] for row in taken]
            total = sum([latency for latency in latencies if latency > 0])
            top = max(0, latencies[0])
        metrics = self._metrics
        metrics.emitted += n
        metrics.record_final_sum(n, total, top, [row[0] for row in taken], w_grace)

    def _fire_on_time(self, w: int, out: list[Emit]) -> None:
        times = self._times
        runner = self._runner
        assert runner is not None
        low = max(times.last_on_time, times.last_close) + 1
        if w < low:
            return
        if runner.on_time_due(w):
            for session, raw in list(self._state.find_sessions(low, w)):
                record = SessionRecord.from_wire(raw)
                if record.phase is Phase.EARLY:
                    runner.fire(session, record, PaneTiming.ON_TIME, False, out)
        times.last_on_time = w
