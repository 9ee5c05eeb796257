"""Session-window aggregation on a session store: merge, lateness, emission and triggers.

One engine runs every emission mode. ``EmitStrategy.ON_WINDOW_UPDATE`` and
``EmitStrategy.ON_WINDOW_CLOSE`` (KIP-825) are presets; a Beam ``AfterWatermark`` trigger with an
accumulation mode is the general case. The semantics are DESIGN.md section 2, restated with
examples in docs/semantics.md.

Each stored session value is a record ``[acc, n_new, pane_index, phase, pt_target]``:

* ``acc``: the aggregation's accumulator (since the last firing, in DISCARDING mode);
* ``n_new``: elements since the last firing (for AfterCount and "fire only if something new");
* ``pane_index``: the index the next pane of this window gets;
* ``phase``: 0 before the ON_TIME pane, 1 after it (late phase);
* ``pt_target``: the processing-time target of an AfterProcessingTime sub-trigger, or None.
"""

from __future__ import annotations

import enum
import heapq
import logging
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from . import batch as columns
from . import keyschema
from .aggregations import Aggregation
from .timeutil import INT64_MAX, INT64_MIN, check_int64, duration_ms
from .timeutil import timestamp_ms as to_timestamp_ms
from .triggers import (
    AccumulationMode,
    AfterCount,
    AfterProcessingTime,
    AfterWatermark,
    ManualClock,
    Pane,
    PaneTiming,
    system_clock,
)
from .types import Session, SessionStoreProtocol
from .windows import BatchWindows, SessionWindows

log = logging.getLogger(__name__)

NO_WATERMARK = INT64_MIN
ENGINE_METADATA_KEY = "sessionstore.engine"
USER_METADATA_KEY = "user"
_EARLY, _LATE_PHASE = 0, 1
_MIN_RUN_BATCH = 64  # shorter stretches are cheaper event by event
_ACC, _NEW, _INDEX, _PHASE, _TARGET = range(5)


class EmitStrategy(enum.Enum):
    """KIP-825: emit every update, or each session once when it closes."""

    ON_WINDOW_UPDATE = "ON_WINDOW_UPDATE"
    ON_WINDOW_CLOSE = "ON_WINDOW_CLOSE"


class Emit(NamedTuple):
    """One output record.

    ``session.end`` is exclusive (last event + gap) and ``timestamp`` is ``end - 1``.
    ``retraction`` marks a session that a merge replaced (ON_WINDOW_UPDATE only); its ``value``
    is the last value emitted for it. ``pane`` is set when a trigger is configured.
    """

    session: Session
    value: Any
    pane: Pane | None
    retraction: bool
    timestamp: int


def _emit(session: Session, value: Any, pane: Pane | None = None, retraction: bool = False) -> Emit:
    return Emit(session, value, pane, retraction, session.end - 1)


class _Metrics:
    """Counters of one engine, including KIP-825's emit-final metrics."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.records_in = 0
        self.dropped = 0
        self.emitted = 0
        self.final_total = 0
        self.final_latency_sum = 0
        self.final_latency_max = 0
        self.force_closed = 0

    def record_final(self, latency_ms: int) -> None:
        self.final_total += 1
        self.final_latency_sum += latency_ms
        if latency_ms > self.final_latency_max:
            self.final_latency_max = latency_ms

    def snapshot(self, store_metrics: Any) -> dict[str, float]:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        return {
            "records-in": self.records_in,
            "dropped-records": self.dropped,
            "emitted-records": self.emitted,
            "emit-final-records-total": self.final_total,
            "emit-final-records-rate": self.final_total / elapsed,
            "emit-final-latency-max": self.final_latency_max,
            "emit-final-latency-avg": (
                self.final_latency_sum / self.final_total if self.final_total else 0.0
            ),
            "force-closed-records": self.force_closed,
            "store-dropped-records": store_metrics.get("dropped-records", 0),
            "expired-segments": store_metrics.get("expired-segments", 0),
        }


def _check_aggregation(aggregation: Any) -> None:
    if not isinstance(aggregation, Aggregation):
        raise TypeError(
            f"aggregation must be a sessionstore.aggregations object, "
            f"got {type(aggregation).__name__}"
        )


def _check_store(store: Any) -> None:
    for name in ("put", "remove", "find_sessions_to_merge", "find_sessions", "commit"):
        if not callable(getattr(store, name, None)):
            raise TypeError(f"store must be a session store, got {type(store).__name__}")


class _OpenSessions:
    """A write-back cache of the sessions of recently seen keys (the state side of KIP-63).

    For every key it holds, it holds *all* of that key's sessions that were not closed when the
    key was loaded, so merge candidates never need a store query. Changes reach the store once
    per session instead of once per event: on :meth:`flush`, and, for the sessions a closing
    query can return, on ``flush(upto=end)``. Fewer writes also mean fewer RocksDB tombstones for
    the seeks to skip.
    """

    def __init__(self, store: SessionStoreProtocol, max_sessions: int) -> None:
        self.store = store
        self.max_sessions = max_sessions
        # key -> {(start, end): [record, in_store]}
        self.by_key: dict[Any, dict[tuple[int, int], list[Any]]] = {}
        self.size = 0
        self.dirty: dict[Session, list[Any]] = {}
        self.deleted: set[Session] = set()
        self.pending: list[tuple[int, int, Session]] = []  # (end, seq, session) of changes
        self.held: list[Session] = []
        self.seq = 0

    def sessions_of(self, key: Any, closed_before: int) -> dict[tuple[int, int], list[Any]]:
        """Every session of ``key`` that may still change, loading the key on first use."""
        entry = self.by_key.get(key)
        if entry is None:
            if self.size >= self.max_sessions:
                self.flush()
                self.by_key.clear()
                self.size = 0
            low = closed_before + 1 if closed_before < INT64_MAX else INT64_MAX
            entry = {
                (s.start, s.end): [record, True]
                for s, record in self.store.find_sessions_to_merge(key, low, INT64_MAX)
            }
            self.by_key[key] = entry
            self.size += len(entry)
        elif len(entry) > 2:
            self._forget_closed(key, entry, closed_before)
        return entry

    def _forget_closed(self, key: Any, entry: dict[tuple[int, int], list[Any]],
                       closed_before: int) -> None:
        """Drop a key's closed sessions from memory (writing them first): they never change."""
        for bounds in [b for b in entry if b[1] <= closed_before]:
            session = Session(key, bounds[0], bounds[1])
            if session in self.dirty:
                self._write(session)
            del entry[bounds]
            self.size -= 1

    def get(self, session: Session) -> list[Any] | None:
        entry = self.by_key.get(session.key)
        if entry is not None:
            cached = entry.get((session.start, session.end))
            if cached is not None:
                return cached[0]  # type: ignore[no-any-return]
            if session in self.deleted:
                return None
        record: list[Any] | None = self.store.fetch_session(
            session.key, session.start, session.end
        )
        return record

    def _track(self, session: Session) -> None:
        self.seq += 1
        heapq.heappush(self.pending, (session.end, self.seq, session))

    def put(self, session: Session, record: list[Any]) -> None:
        entry = self.by_key.get(session.key)
        if entry is None:
            self.store.put(session, record)
            return
        bounds = (session.start, session.end)
        cached = entry.get(bounds)
        if cached is None:
            entry[bounds] = [record, False]
            self.size += 1
        else:
            cached[0] = record
        if session not in self.dirty:
            self._track(session)
        self.dirty[session] = record
        self.deleted.discard(session)

    def remove(self, session: Session) -> None:
        entry = self.by_key.get(session.key)
        if entry is None:
            self.store.remove(session)
            return
        cached = entry.pop((session.start, session.end), None)
        if cached is None:
            return
        self.size -= 1
        self.dirty.pop(session, None)
        if cached[1]:
            self.deleted.add(session)
            self._track(session)

    def _write(self, session: Session) -> None:
        if session in self.deleted:
            self.deleted.discard(session)
            self.store.remove(session)
            return
        record = self.dirty.pop(session, None)
        if record is None:
            return  # written already, or removed before it ever reached the store
        self.store.put(session, record)  # False only for a force-closed, expired session
        entry = self.by_key.get(session.key)
        cached = entry.get((session.start, session.end)) if entry is not None else None
        if cached is not None:
            cached[1] = True

    def find_sessions(self, earliest_end: int, latest_end: int) -> list[tuple[Session, Any]]:
        """``store.find_sessions`` as it would be with every change written, without writing
        the changes in the range yet: writing them first could let the store expire segments
        whose closed sessions have not been emitted. Call :meth:`flush` after using the rows.
        """
        self.flush(earliest_end - 1)
        held: dict[Session, list[Any] | None] = {}
        pending = self.pending
        while pending and pending[0][0] <= latest_end:
            session = heapq.heappop(pending)[2]
            if session in self.deleted:
                held[session] = None
            elif session in self.dirty:
                held[session] = self.dirty[session]
        self.held = list(held)
        rows = [
            (s, record) for s, record in self.store.find_sessions(earliest_end, latest_end)
            if s not in held
        ]
        extra = [(s, record) for s, record in held.items() if record is not None]
        if extra:
            rows.extend(extra)
            encode = keyschema.encode_key
            rows.sort(key=lambda row: (row[0].end, encode(row[0].key), row[0].start))
        return rows

    def flush_held(self) -> None:
        """Write the changes that :meth:`find_sessions` held back."""
        for session in self.held:
            self._write(session)
        self.held = []

    def flush(self, upto: int | None = None) -> None:
        """Write the changes of sessions ending at or before ``upto`` (all, by default)."""
        pending = self.pending
        if upto is None:
            for _, _, session in pending:
                self._write(session)
            pending.clear()
            return
        while pending and pending[0][0] <= upto:
            self._write(heapq.heappop(pending)[2])


class SessionAggregator:
    """Session-window aggregation of a keyed event stream on a session store.

    Args:
        store: any session store (``SessionStore`` or ``InMemorySessionStore``). Its retention
            must be at least ``windows.retention_ms + max_out_of_orderness_ms``.
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
        write_cache: with ON_WINDOW_UPDATE, buffer and de-duplicate updates per session until
            :meth:`flush` (KIP-63).
        cache_max_sessions: how many open sessions the engine keeps in memory between store
            writes; they are written on commit, before closed sessions are queried, and when the
            cache is full. 0 writes through to the store on every event.

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
        cache_max_sessions: int = 100_000,
    ) -> None:
        _check_store(store)
        if isinstance(cache_max_sessions, bool) or not isinstance(cache_max_sessions, int) \
                or cache_max_sessions < 0:
            raise ValueError(f"cache_max_sessions must be an int >= 0, got {cache_max_sessions!r}")
        if not isinstance(windows, SessionWindows):
            raise TypeError(f"windows must be SessionWindows, got {type(windows).__name__}")
        _check_aggregation(aggregation)
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
        if watermark not in ("event_time", "external"):
            raise ValueError(f"watermark must be 'event_time' or 'external', got {watermark!r}")
        ooo = duration_ms(max_out_of_orderness_ms, "max_out_of_orderness_ms")
        if ooo < 0:
            raise ValueError(f"max_out_of_orderness_ms must be >= 0, got {ooo}")
        needed = windows.retention_ms + (ooo if watermark == "event_time" else 0)
        if store.retention_ms < needed:
            raise ValueError(
                f"store retention_ms={store.retention_ms} must be >= {needed} "
                f"(windows.retention_ms + max_out_of_orderness_ms), or closed sessions could "
                f"expire before they are emitted"
            )
        if on_late is not None and not callable(on_late):
            raise TypeError(f"on_late must be callable, got {type(on_late).__name__}")
        if clock is not None and not callable(clock):
            raise TypeError(f"clock must be callable, got {type(clock).__name__}")
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
        self.max_out_of_orderness_ms = ooo
        self.on_late = on_late
        self.clock: Callable[[], int] = clock or system_clock
        self._gap = windows.gap_ms
        self._grace = windows.grace_ms
        self._max_timestamp = INT64_MAX - windows.gap_ms - windows.grace_ms
        self._inclusive = windows.inclusive_gap
        self._updates = self.emit_strategy is EmitStrategy.ON_WINDOW_UPDATE
        self._discarding = trigger is not None and self.accumulation is AccumulationMode.DISCARDING
        self._early = trigger.early if trigger is not None else None
        self._late = trigger.late if trigger is not None else None
        self._tracks_close = not self._updates
        self._cache: dict[Session, Emit] | None = {} if write_cache else None
        self._cache_new: set[Session] = set()
        self._metrics = _Metrics()
        self._open = _OpenSessions(store, cache_max_sessions)
        # time progress and cursors, committed with the state
        self._watermark = NO_WATERMARK
        self._max_event_time: int | None = None
        self._last_close = NO_WATERMARK
        self._last_on_time = NO_WATERMARK
        self._seq = 0
        # in-memory indexes, rebuilt from the store on start: they only save store queries
        self._close_heap: list[int] = []
        self._expiry_checked_to = INT64_MIN  # the largest session end the boundary was checked for
        self._live_from = INT64_MIN  # the expiry boundary computed then
        self._close_heap_complete = True
        self._unindexed_until = INT64_MIN  # sessions ending up to here may be missing from it
        self._new_close_times: list[int] = []  # only kept once drain_close_times() is used
        self._record_close_times = False
        self._on_time_heap: list[int] = []
        self._timers: list[tuple[int, int, Any, int, int]] = []
        self._timer_seq = 0
        self._late_pending: dict[tuple[bytes, int, int], Session] = {}
        self._restore()

    # -- public API -------------------------------------------------------------------------

    @property
    def watermark(self) -> int:
        """The current watermark W (``INT64_MIN`` before any progress)."""
        return self._watermark

    def drain_close_times(self) -> list[int]:
        """Watermarks at which sessions changed since the last call close (and, with a trigger
        and no grace, fire their ON_TIME pane).

        A driver that wakes the engine on timers (the Spark adapter) registers these, so that
        every session gets a timer at or after its close time.
        """
        self._record_close_times = True
        grace = self._grace
        times = [end + grace for end in self._new_close_times]
        self._new_close_times = []
        return times

    @property
    def metrics(self) -> dict[str, float]:
        """``dropped-records``, ``emit-final-*`` (KIP-825) and store counters."""
        return self._metrics.snapshot(self.store.metrics)

    def process(self, key: Any, value: Any, timestamp_ms: Any) -> list[Emit]:
        """Add one event; return what it emits.

        Raises:
            ValueError: a None key or an out-of-range timestamp.
            TypeError: a key or timestamp of the wrong type, or an unserialisable accumulator.
        """
        t = timestamp_ms if type(timestamp_ms) is int else None
        if t is None or not INT64_MIN <= t <= self._max_timestamp:
            t = self._check_timestamp(timestamp_ms)
        keyschema.encode_key(key)  # validates the key before anything changes
        out: list[Emit] = []
        self._process_one(key, value, t, out)
        return out

    def process_batch(self, keys: Any, values: Any, timestamps_ms: Any) -> list[Emit]:
        """Add a batch of events in order; equal to a loop of :meth:`process` calls.

        ``keys``, ``values`` and ``timestamps_ms`` may be lists, numpy arrays, pandas Series or
        Arrow arrays of the same length. The whole batch is validated before any event is
        processed, so a bad row changes nothing.

        With ``ON_WINDOW_CLOSE``, the batch is processed by runs rather than event by event:
        lateness is computed for all events at once, events are sorted by key and time, and each
        run of a key's events is merged with that key's open sessions in one step. That equals the
        loop whenever no accepted event lands behind ``W - grace`` (it could then meet a session
        that closed earlier in the batch); such events, and every other mode, go through the
        event-at-a-time path in their place in the stream. (Only the ``emit-final-latency``
        metrics differ: runs close at the end of their segment.)
        """
        key_list = columns.as_list(keys, "keys")
        n = len(key_list)
        times = columns.timestamps(timestamps_ms, n)
        value_list = columns.as_list(values, "values")
        if len(value_list) != n:
            raise ValueError(f"values has {len(value_list)} rows, keys has {n}")
        if n and int(times.max()) > self._max_timestamp:
            raise ValueError(
                f"timestamps_ms value {int(times.max())} + gap_ms + grace_ms overflows int64"
            )
        codes, uniques = columns.factorize_keys(key_list)
        out: list[Emit] = []
        if self.emit_strategy is not EmitStrategy.ON_WINDOW_CLOSE or n < _MIN_RUN_BATCH \
                or int(times.min()) < INT64_MIN + self._gap + self._grace + \
                self.max_out_of_orderness_ms:
            self._loop(key_list, value_list, times.tolist(), 0, n, out)
            return out
        before = self._watermarks_before(times)
        late = before >= times + (self._gap + self._grace)
        closed_before = np.maximum(before - self._grace, self._last_close)
        behind = np.flatnonzero(~late & (times <= closed_before))
        if self.watermark_mode == "external":
            boundary = self.store.expiry_boundary_ms(int(times.max()) + self._gap)
            if boundary is not None and boundary - 1 > int(closed_before[0]):
                behind = np.arange(n)  # force-closing may happen: keep the exact loop
        time_list = times.tolist()
        start = 0
        for stop in [*behind.tolist(), n]:
            if stop - start >= _MIN_RUN_BATCH:
                self._process_runs(uniques, codes, value_list, times, late, start, stop, out)
            else:
                self._loop(key_list, value_list, time_list, start, stop, out)
            if stop < n:
                self._process_one(key_list[stop], value_list[stop], time_list[stop], out)
            start = stop + 1
        return out

    def _loop(self, keys: list[Any], values: list[Any], times: list[int], start: int, stop: int,
              out: list[Emit]) -> None:
        step = self._process_one
        for i in range(start, stop):
            step(keys[i], values[i], times[i], out)

    def _watermarks_before(self, times: np.ndarray) -> np.ndarray:
        """The watermark each event of the batch sees on arrival, as the loop would."""
        w0 = self._watermark
        if self.watermark_mode == "external" or len(times) == 0:
            return np.full(len(times), w0, dtype=np.int64)
        after = np.maximum(np.maximum.accumulate(times) - self.max_out_of_orderness_ms, w0)
        return np.concatenate(([w0], after[:-1])).astype(np.int64)

    def _process_runs(self, uniques: list[Any], codes: np.ndarray, values: list[Any],
                      times: np.ndarray, late: np.ndarray, start: int, stop: int,
                      out: list[Emit]) -> None:
        """ON_WINDOW_CLOSE on events ``[start, stop)``, none of which lands behind ``W - grace``."""
        metrics = self._metrics
        metrics.records_in += stop - start
        seg_late = late[start:stop]
        if seg_late.any():
            for i in (np.flatnonzero(seg_late) + start).tolist():
                self._drop(uniques[codes[i]], values[i], int(times[i]))
        accepted = np.flatnonzero(~seg_late) + start
        if len(accepted) == 0:
            return
        seqs = self._seq + 1 + np.arange(len(accepted), dtype=np.int64)
        self._seq += len(accepted)
        acc_times = times[accepted]
        found = columns.runs(codes[accepted], acc_times, seqs, self._gap,
                             self.windows.inclusive_gap)
        order = found.order
        rows = accepted[order].tolist()
        run_times = acc_times[order].tolist()
        run_seqs = seqs[order].tolist()
        bounds = found.bounds.tolist()
        run_codes = found.codes.tolist()
        firsts = found.first_ms.tolist()
        lasts = found.last_ms.tolist()
        closed_before = max(self._watermark - self._grace, self._last_close)
        gap, inclusive = self._gap, self.windows.inclusive_gap
        agg, cache, heap = self.aggregation, self._open, self._close_heap
        r, n_runs = 0, len(run_codes)
        while r < n_runs:
            code = run_codes[r]
            key = uniques[code]
            group_end = r
            while group_end < n_runs and run_codes[group_end] == code:
                group_end += 1
            # the key's open sessions and its runs, as intervals sorted by start
            items: list[tuple[int, int, int, Any]] = [
                (st, en, -1, cached[0])
                for (st, en), cached in cache.sessions_of(key, closed_before).items()
                if en > closed_before
            ]
            items.extend((firsts[j], lasts[j] + gap, j, None) for j in range(r, group_end))
            items.sort(key=lambda item: (item[0], item[1]))
            i = 0
            while i < len(items):
                lo, hi = items[i][0], items[i][1]
                members = [items[i]]
                i += 1
                while i < len(items) and (items[i][0] <= hi if inclusive else items[i][0] < hi):
                    members.append(items[i])
                    hi = max(hi, items[i][1])
                    i += 1
                if all(m[2] < 0 for m in members):
                    continue  # an open session no run touches
                new = Session(key, lo, hi)
                acc = agg.initial()
                for m in sorted((m for m in members if m[2] < 0), key=lambda m: (m[1], m[0])):
                    acc = agg.merge(key, acc, m[3][_ACC])
                    if m[0] != lo or m[1] != hi:
                        cache.remove(Session(key, m[0], m[1]))
                for m in members:
                    j = m[2]
                    if j >= 0:
                        a, b = bounds[j], bounds[j + 1]
                        run_acc = agg.add_run(key, [values[row] for row in rows[a:b]],
                                              run_times[a:b], run_seqs[a:b], agg.initial())
                        acc = agg.merge(key, acc, run_acc)
                cache.put(new, [acc, 0, 0, _EARLY, None])
                heapq.heappush(heap, hi)
                if self._record_close_times:
                    self._new_close_times.append(hi)
            r = group_end
        if self.watermark_mode == "event_time":
            top = int(acc_times.max())
            if self._max_event_time is None or top > self._max_event_time:
                self._max_event_time = top
            candidate = int(times[start:stop].max()) - self.max_out_of_orderness_ms
            if candidate > self._watermark:
                self._watermark = candidate
                self._on_watermark(out)

    def advance_watermark(self, to_ms: Any) -> list[Emit]:
        """Move W forward to ``to_ms`` (never back) and emit what that completes or closes."""
        to = check_int64(to_ms, "to_ms")
        out: list[Emit] = []
        if to > self._watermark:
            self._watermark = to
            self._cap_store_expiry()
            self._on_watermark(out)
        return out

    def _cap_store_expiry(self) -> None:
        """With an external watermark, keep the store from expiring sessions W has not closed.

        Expired then means ``end < W - grace``: closed, and emitted before the expiry can run.
        """
        if self.watermark_mode != "external":
            return
        self._expiry_checked_to = INT64_MIN  # a new cap moves the expiry boundary
        cap = getattr(self.store, "cap_expiry_time", None)
        if cap is not None:
            w = self._watermark
            cap(min(INT64_MAX, w - self._grace + self.store.retention_ms)
                if w > NO_WATERMARK else NO_WATERMARK)

    def advance_processing_time(self, to_ms: Any) -> list[Emit]:
        """Set the :class:`ManualClock` to ``to_ms`` and fire what is due."""
        if not isinstance(self.clock, ManualClock):
            raise TypeError("advance_processing_time needs clock=ManualClock(...)")
        self.clock.set(to_ms)
        return self.poll()

    def poll(self) -> list[Emit]:
        """Fire processing-time triggers that are due by the clock."""
        out: list[Emit] = []
        self._fire_timers(self.clock(), out)
        self._fire_late_pending(out)
        return out

    def flush(self) -> list[Emit]:
        """Emit and clear the write cache (ON_WINDOW_UPDATE with ``write_cache=True``)."""
        if not self._cache:
            return []
        out = [e for e in self._cache.values() if not (e.retraction and e.session in self._cache_new)]
        self._cache.clear()
        self._cache_new.clear()
        self._metrics.emitted += len(out)
        return out

    def commit(self, metadata: Any = None) -> int:
        """Commit the store together with the engine's cursors and ``metadata``.

        Deliver the emits you have before committing. Returns the new store version.

        Raises:
            ValueError: the write cache holds updates that :meth:`flush` has not returned.
        """
        if self._cache:
            raise ValueError("flush() the write cache and deliver its emits before commit()")
        engine_state = {
            "watermark": self._watermark,
            "max_event_time": self._max_event_time,
            "last_close": self._last_close,
            "last_on_time": self._last_on_time,
            "seq": self._seq,
        }
        self._open.flush()
        return self.store.commit({ENGINE_METADATA_KEY: engine_state, USER_METADATA_KEY: metadata})

    @property
    def committed_metadata(self) -> Any:
        """The ``metadata`` of the last :meth:`commit`."""
        committed = self.store.committed_metadata
        if isinstance(committed, dict):
            return committed.get(USER_METADATA_KEY)
        return None

    def sessions(self, key: Any) -> list[tuple[Session, Any]]:
        """The stored sessions of ``key`` with their current results (interactive query)."""
        self._open.flush()
        result = self.aggregation.result
        return [(s, result(rec[_ACC])) for s, rec in self.store.fetch(key)]

    # -- restore ----------------------------------------------------------------------------

    def _restore(self) -> None:
        committed = self.store.committed_metadata
        state = committed.get(ENGINE_METADATA_KEY) if isinstance(committed, dict) else None
        if state is not None:
            try:
                self._watermark = check_int64(state["watermark"], "watermark")
                self._max_event_time = state["max_event_time"]
                self._last_close = check_int64(state["last_close"], "last_close")
                self._last_on_time = check_int64(state["last_on_time"], "last_on_time")
                self._seq = check_int64(state["seq"], "seq")
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"corrupted engine metadata in the store: {exc}") from None
        self._cap_store_expiry()
        if not self._tracks_close or state is None:
            return
        if self.trigger is None:
            # ON_WINDOW_CLOSE needs no scan: until the heap knows every open session again,
            # each watermark advance asks the store (one range query) instead of the heap
            self._close_heap_complete = False
            self._unindexed_until = self.store.observed_stream_time or INT64_MIN
            return
        start = self._last_close + 1 if self._last_close < INT64_MAX else INT64_MAX
        for session, record in self.store.find_sessions(start, INT64_MAX):
            self._index(session, record)

    def _index(self, session: Session, record: list[Any]) -> None:
        heapq.heappush(self._close_heap, session.end)
        if self.trigger is None:
            return
        if record[_PHASE] == _EARLY:
            heapq.heappush(self._on_time_heap, session.end)
        if record[_TARGET] is not None:
            self._push_timer(record[_TARGET], session)
        if record[_PHASE] == _LATE_PHASE and record[_NEW] > 0 and self._late is not None:
            self._late_pending[self._identity(session)] = session

    @staticmethod
    def _identity(session: Session) -> tuple[bytes, int, int]:
        return keyschema.encode_key(session.key), session.start, session.end

    def _push_timer(self, target: int, session: Session) -> None:
        self._timer_seq += 1
        heapq.heappush(
            self._timers, (target, self._timer_seq, session.key, session.start, session.end)
        )

    # -- the core ---------------------------------------------------------------------------

    def _check_timestamp(self, value: Any) -> int:
        t = to_timestamp_ms(value, "timestamp_ms")
        if t > self._max_timestamp:
            raise ValueError(f"timestamp_ms {t} + gap_ms + grace_ms overflows int64")
        return t

    def _drop(self, key: Any, value: Any, t: int) -> None:
        self._metrics.dropped += 1
        if self.on_late is not None:
            self.on_late(key, value, t)

    def _process_one(self, key: Any, value: Any, t: int, out: list[Emit]) -> None:
        self._metrics.records_in += 1
        gap, grace, w = self._gap, self._grace, self._watermark
        if w >= t + gap + grace:  # the event's own window is already closed
            self._drop(key, value, t)
            return
        store = self.store
        own_end = t + gap
        if own_end > self._expiry_checked_to:
            # the write may let the store expire segments: emit what they hold first
            # (docs/semantics.md); the boundary only moves when stream time or W does
            self._expiry_checked_to = own_end
            boundary = store.expiry_boundary_ms(own_end)
            self._live_from = INT64_MIN if boundary is None else boundary
            if self._tracks_close and boundary is not None and boundary - 1 > self._last_close:
                w_after = w
                if self.watermark_mode == "event_time":
                    w_after = max(w, t - self.max_out_of_orderness_ms)
                self._close_up_to(boundary - 1, out, forced_above=w_after - grace)
        if self._inclusive:
            earliest_end, latest_start = t, own_end
        else:
            earliest_end, latest_start = t + 1, own_end - 1
        closed_before = w - grace  # sessions ending at or before this are final
        if self._last_close > closed_before:
            closed_before = self._last_close  # emitted (or force-closed) sessions are final too
        entry = self._open.sessions_of(key, closed_before)
        merged = [
            (Session(key, start, end), cached[0])
            for (start, end), cached in entry.items()
            if end >= earliest_end and start <= latest_start and end > closed_before
        ] if entry else []
        if len(merged) > 1:
            merged.sort(key=lambda item: (item[0].end, item[0].start))
        start, end = t, own_end
        for s, _ in merged:
            if s.start < start:
                start = s.start
            if s.end > end:
                end = s.end
        # Only with an external watermark far behind the data: the session would land in an
        # expired segment, or behind sessions already force-closed and emitted.
        if end <= self._last_close or (end < self._live_from and store.is_expired(end)):
            self._drop(key, value, t)
            return
        new = Session(key, start, end)
        agg = self.aggregation
        self._seq += 1
        same = len(merged) == 1 and merged[0][0] == new
        if self.trigger is None:
            acc = agg.initial()
            for _, rec in merged:
                acc = agg.merge(key, acc, rec[_ACC])
            record = [agg.add(key, value, t, self._seq, acc), 0, 0, _EARLY, None]
        else:
            record = self._trigger_record(key, value, t, merged, same, new)
        cache = self._open
        for s, _ in merged:
            if s != new:
                cache.remove(s)
        cache.put(new, record)
        if self._updates:
            self._emit_update(merged, new, record, out)
        elif self.trigger is not None:
            self._after_trigger_update(new, record, merged, same, out)
        else:
            heapq.heappush(self._close_heap, end)
            if self._record_close_times:
                self._new_close_times.append(end)
        if self.watermark_mode == "event_time":
            if self._max_event_time is None or t > self._max_event_time:
                self._max_event_time = t
            candidate = t - self.max_out_of_orderness_ms
            if candidate > self._watermark:
                self._watermark = candidate
                self._on_watermark(out)

    def _emit_update(
        self, merged: list[tuple[Session, Any]], new: Session, record: list[Any], out: list[Emit]
    ) -> None:
        result = self.aggregation.result
        produced = [
            _emit(s, result(rec[_ACC]), retraction=True) for s, rec in merged if s != new
        ]
        produced.append(_emit(new, result(record[_ACC])))
        if self._cache is None:
            out.extend(produced)
            self._metrics.emitted += len(produced)
            return
        for e in produced:
            if e.retraction:
                self._cache.pop(e.session, None)
                self._cache[e.session] = e
            else:
                if e.session not in self._cache:
                    self._cache_new.add(e.session)
                self._cache[e.session] = e

    # -- closing (ON_WINDOW_CLOSE and the closing pane of triggers) ---------------------------

    def _on_watermark(self, out: list[Emit]) -> None:
        if not self._tracks_close:
            return
        w = self._watermark
        close_upto = w - self._grace
        if close_upto > self._last_close:
            heap = self._close_heap
            if (heap and heap[0] <= close_upto) or not self._close_heap_complete:
                self._close_up_to(close_upto, out, forced_above=close_upto)
            else:
                self._last_close = close_upto
            if not self._close_heap_complete and self._last_close >= self._unindexed_until:
                self._close_heap_complete = True  # every session from before the restart closed
        if self.trigger is not None:
            self._fire_on_time(w, out)
            self._fire_late_pending(out)

    def _close_up_to(self, upto: int, out: list[Emit], forced_above: int) -> None:
        """Emit every session with ``last_close < end <= upto`` as closed, in end order.

        Sessions ending after ``forced_above`` are not closed by the watermark yet; they are
        emitted because their segment is about to expire (external watermark far behind).
        """
        heap = self._close_heap
        while heap and heap[0] <= upto:
            heapq.heappop(heap)
        w = self._watermark
        result = self.aggregation.result
        rows = self._open.find_sessions(self._last_close + 1, upto)
        for session, record in rows:
            if session.end > forced_above:
                self._metrics.force_closed += 1
                log.warning("emitting %s before the watermark closes it: its segment expires",
                            session)
            if self.trigger is None:
                out.append(_emit(session, result(record[_ACC])))
                self._metrics.emitted += 1
                self._metrics.record_final(max(0, w - (session.end + self._grace)))
            else:
                self._fire_closing(session, record, out)
        self._open.flush_held()
        self._last_close = upto

    # -- triggers ---------------------------------------------------------------------------

    def _trigger_record(
        self,
        key: Any,
        value: Any,
        t: int,
        merged: list[tuple[Session, Any]],
        same: bool,
        new: Session,
    ) -> list[Any]:
        agg = self.aggregation
        now = None
        if same:
            record = list(merged[0][1])
            record[_ACC] = agg.add(key, value, t, self._seq, record[_ACC])
            record[_NEW] += 1
            sub = self._early if record[_PHASE] == _EARLY else self._late
            if isinstance(sub, AfterProcessingTime) and record[_TARGET] is None:
                now = self.clock()
                record[_TARGET] = now + sub.delay_ms
            return record
        acc = agg.initial()
        n_new = 1
        targets = []
        for _, rec in merged:
            acc = agg.merge(key, acc, rec[_ACC])
            n_new += rec[_NEW]
            if rec[_TARGET] is not None:
                targets.append(rec[_TARGET])
        acc = agg.add(key, value, t, self._seq, acc)
        phase = _LATE_PHASE if new.end <= self._watermark else _EARLY
        target = None
        sub = self._early if phase == _EARLY else None
        if isinstance(sub, AfterProcessingTime):
            targets.append(self.clock() + sub.delay_ms)
            target = min(targets)
        return [acc, n_new, 0, phase, target]

    def _after_trigger_update(
        self,
        new: Session,
        record: list[Any],
        merged: list[tuple[Session, Any]],
        same: bool,
        out: list[Emit],
    ) -> None:
        for s, _ in merged:
            if s != new:
                self._late_pending.pop(self._identity(s), None)
        if not same:
            heapq.heappush(self._close_heap, new.end)
            if self._record_close_times:
                self._new_close_times.append(new.end)
            if record[_PHASE] == _EARLY:
                heapq.heappush(self._on_time_heap, new.end)
        if record[_TARGET] is not None and (not same or merged[0][1][_TARGET] is None):
            self._push_timer(record[_TARGET], new)
        if record[_PHASE] == _LATE_PHASE:
            if not same:  # a merge that lands behind the watermark fires at once
                self._fire(new, record, PaneTiming.LATE, False, out)
            elif self._late is not None:
                self._late_pending[self._identity(new)] = new
        elif isinstance(self._early, AfterCount) and record[_NEW] >= self._early.n:
            self._fire(new, record, PaneTiming.EARLY, False, out)

    def _fire(
        self, session: Session, record: list[Any], timing: PaneTiming, is_last: bool,
        out: list[Emit],
    ) -> None:
        """Emit a pane of ``session`` and reset its trigger state in the store."""
        index = record[_INDEX]
        pane = Pane(timing, index, index == 0, is_last)
        out.append(_emit(session, self.aggregation.result(record[_ACC]), pane))
        self._metrics.emitted += 1
        if is_last:
            self._metrics.record_final(max(0, self._watermark - (session.end + self._grace)))
        self._late_pending.pop(self._identity(session), None)
        if is_last:
            return
        updated = [
            self.aggregation.initial() if self._discarding else record[_ACC],
            0,
            index + 1,
            _LATE_PHASE if timing is not PaneTiming.EARLY else record[_PHASE],
            None,
        ]
        self._open.put(session, updated)
        record[:] = updated

    def _fire_closing(self, session: Session, record: list[Any], out: list[Emit]) -> None:
        if record[_PHASE] == _EARLY:
            self._fire(session, record, PaneTiming.ON_TIME, True, out)
        elif record[_NEW] > 0:
            self._fire(session, record, PaneTiming.LATE, True, out)

    def _fire_on_time(self, w: int, out: list[Emit]) -> None:
        low = max(self._last_on_time, self._last_close) + 1
        if w < low:
            return
        heap = self._on_time_heap
        if heap and heap[0] <= w:
            while heap and heap[0] <= w:
                heapq.heappop(heap)
            for session, record in self._open.find_sessions(low, w):
                if record[_PHASE] == _EARLY:
                    self._fire(session, record, PaneTiming.ON_TIME, False, out)
            self._open.flush_held()
        self._last_on_time = w

    def _fire_late_pending(self, out: list[Emit]) -> None:
        if not self._late_pending:
            return
        late = self._late
        now = self.clock() if isinstance(late, AfterProcessingTime) else None
        for ident, session in list(self._late_pending.items()):
            record = self._open.get(session)
            if record is None or record[_PHASE] != _LATE_PHASE or record[_NEW] == 0:
                self._late_pending.pop(ident, None)
                continue
            due = (
                record[_NEW] >= late.n
                if isinstance(late, AfterCount)
                else record[_TARGET] is not None and now is not None and now > record[_TARGET]
            )
            if due:
                self._fire(session, record, PaneTiming.LATE, False, out)

    def _fire_timers(self, now: int, out: list[Emit]) -> None:
        timers = self._timers
        while timers and timers[0][0] < now:
            target, _, key, start, end = heapq.heappop(timers)
            session = Session(key, start, end)
            record = self._open.get(session)
            if record is None or record[_TARGET] != target or record[_NEW] == 0:
                continue  # merged away, already fired, or re-targeted
            if session.end + self._grace <= self._watermark:
                continue  # closed: the closing pane took it
            timing = PaneTiming.EARLY if record[_PHASE] == _EARLY else PaneTiming.LATE
            self._fire(session, record, timing, False, out)


class BatchAggregator:
    """KIP "BatchWindows": each event joins the window holding the observed stream time.

    Same ``process`` / ``advance_watermark`` / ``process_batch`` API as
    :class:`SessionAggregator`. Stream time is the largest event time seen (or the value given to
    :meth:`advance_watermark`); nothing is ever late, and each window is emitted once, when stream
    time reaches its end.
    """

    def __init__(
        self, store: SessionStoreProtocol, windows: BatchWindows, aggregation: Aggregation
    ) -> None:
        _check_store(store)
        if not isinstance(windows, BatchWindows):
            raise TypeError(f"windows must be BatchWindows, got {type(windows).__name__}")
        _check_aggregation(aggregation)
        if store.retention_ms < windows.size_ms:
            raise ValueError(
                f"store retention_ms={store.retention_ms} must be >= size_ms={windows.size_ms}"
            )
        self.store = store
        self.windows = windows
        self.aggregation = aggregation
        self._metrics = _Metrics()
        self._stream_time = NO_WATERMARK
        self._last_close = NO_WATERMARK
        self._seq = 0
        committed = store.committed_metadata
        state = committed.get(ENGINE_METADATA_KEY) if isinstance(committed, dict) else None
        if state is not None:
            try:
                self._stream_time = check_int64(state["watermark"], "watermark")
                self._last_close = check_int64(state["last_close"], "last_close")
                self._seq = check_int64(state["seq"], "seq")
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"corrupted engine metadata in the store: {exc}") from None

    @property
    def stream_time(self) -> int:
        return self._stream_time

    @property
    def metrics(self) -> dict[str, float]:
        return self._metrics.snapshot(self.store.metrics)

    def process(self, key: Any, value: Any, timestamp_ms: Any) -> list[Emit]:
        """Add one event to the current window of its key."""
        t = to_timestamp_ms(timestamp_ms, "timestamp_ms")
        keyschema.encode_key(key)
        out: list[Emit] = []
        self._process_one(key, value, t, out)
        return out

    def process_batch(self, keys: Any, values: Any, timestamps_ms: Any) -> list[Emit]:
        """A batch of events, equal to a loop of :meth:`process`; validated as a whole first."""
        key_list = columns.as_list(keys, "keys")
        times = columns.timestamps(timestamps_ms, len(key_list)).tolist()
        value_list = columns.as_list(values, "values")
        if len(value_list) != len(key_list):
            raise ValueError(f"values has {len(value_list)} rows, keys has {len(key_list)}")
        columns.factorize_keys(key_list)
        out: list[Emit] = []
        for key, value, t in zip(key_list, value_list, times, strict=True):
            self._process_one(key, value, t, out)
        return out

    def advance_watermark(self, to_ms: Any) -> list[Emit]:
        """Move stream time forward and emit the windows that ends."""
        to = check_int64(to_ms, "to_ms")
        out: list[Emit] = []
        if to > self._stream_time:
            self._stream_time = to
            self._close(out)
        return out

    def flush(self) -> list[Emit]:
        return []

    def commit(self, metadata: Any = None) -> int:
        state = {
            "watermark": self._stream_time,
            "max_event_time": None,
            "last_close": self._last_close,
            "last_on_time": self._last_close,
            "seq": self._seq,
        }
        return self.store.commit({ENGINE_METADATA_KEY: state, USER_METADATA_KEY: metadata})

    def _process_one(self, key: Any, value: Any, t: int, out: list[Emit]) -> None:
        self._metrics.records_in += 1
        if t > self._stream_time:
            self._stream_time = t
            self._close(out)
        size = self.windows.size_ms
        start = self.windows.window_start(self._stream_time)
        window = Session(key, start, start + size)
        agg = self.aggregation
        record = self.store.fetch_session(key, window.start, window.end)
        acc = agg.initial() if record is None else record[_ACC]
        self._seq += 1
        self.store.put(window, [agg.add(key, value, t, self._seq, acc), 0, 0, _EARLY, None])

    def _close(self, out: list[Emit]) -> None:
        upto = self._stream_time
        if upto <= self._last_close:
            return
        result = self.aggregation.result
        for session, record in list(self.store.find_sessions(self._last_close + 1, upto)):
            out.append(_emit(session, result(record[_ACC])))
            self._metrics.emitted += 1
            self._metrics.record_final(upto - session.end)
        self._last_close = upto
