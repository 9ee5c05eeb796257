"""KIP "BatchWindows": each event joins the window holding the observed stream time."""

from __future__ import annotations

from typing import Any

from .. import batch as columns
from .. import keyschema
from ..aggregations import Aggregation
from ..gap_boundary import first_open_end
from ..timeutil import INT64_MAX, INT64_MIN, check_int64
from ..timeutil import timestamp_ms as to_timestamp_ms
from ..types import Session, SessionStoreProtocol
from ..windows import BatchWindows
from .config import NO_WATERMARK
from .core import check_aggregation, check_store
from .emit import Emit, EngineMetrics, make_emit
from .lifecycle import ENGINE_METADATA_KEY, USER_METADATA_KEY
from .record import SessionRecord, check_encodable, first_unencodable
from .time import final_latency_ms


class BatchAggregator:
    """KIP "BatchWindows": each event joins the window holding the observed stream time.

    Same ``process`` / ``advance_watermark`` / ``process_batch`` API as
    :class:`~sessionstore.engine.SessionAggregator`. Stream time is the largest event time seen
    (or the value given to :meth:`advance_watermark`); nothing is ever late, and each window is
    emitted once, when stream time reaches its end.

    Raises:
        TypeError / ValueError: bad arguments, naming the argument.
    """

    def __init__(
        self, store: SessionStoreProtocol, windows: BatchWindows, aggregation: Aggregation
    ) -> None:
        check_store(store)
        if not isinstance(windows, BatchWindows):
            raise TypeError(f"windows must be BatchWindows, got {type(windows).__name__}")
        check_aggregation(aggregation)
        if store.retention_ms < windows.size_ms:
            raise ValueError(
                f"store retention_ms={store.retention_ms} must be >= size_ms={windows.size_ms}"
            )
        self.store = store
        self.windows = windows
        self.aggregation = aggregation
        self._metrics = EngineMetrics()
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
        """Add one event to the current window of its key.

        Raises:
            TypeError / ValueError: a bad key, time or value (nothing changes).
        """
        t = to_timestamp_ms(timestamp_ms, "timestamp_ms")
        keyschema.encode_key(key)
        check_encodable(value, "value")
        self._check_window_fits(t, t, "timestamp_ms")
        out: list[Emit] = []
        self._process_one(key, value, t, out)
        return out

    def process_batch(self, keys: Any, values: Any, timestamps_ms: Any) -> list[Emit]:
        """A batch of events, equal to a loop of :meth:`process`; validated as a whole first.

        Raises:
            TypeError / ValueError: naming the argument and the row; nothing changes then.
        """
        key_list = columns.as_list(keys, "keys")
        times = columns.timestamps(timestamps_ms, len(key_list)).tolist()
        value_list = columns.as_list(values, "values")
        if len(value_list) != len(key_list):
            raise ValueError(f"values has {len(value_list)} rows, keys has {len(key_list)}")
        columns.factorize_keys(key_list)
        first_unencodable(value_list, "values")
        if times:
            self._check_window_fits(times[0], max(times), "timestamps_ms")
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
        check_encodable(metadata, "metadata")
        state = {
            "watermark": self._stream_time,
            "max_event_time": None,
            "last_close": self._last_close,
            "last_on_time": self._last_close,
            "seq": self._seq,
        }
        return self.store.commit({ENGINE_METADATA_KEY: state, USER_METADATA_KEY: metadata})

    def _check_window_fits(self, first: int, largest: int, name: str) -> None:
        """Refuse, before anything changes, events whose stream-time window would not fit in
        int64: the first event's window has the lowest start, the largest time's the latest end
        (stream time only grows)."""
        size = self.windows.size_ms
        for when in (max(self._stream_time, first), max(self._stream_time, largest)):
            start = self.windows.window_start(when)
            if start < INT64_MIN or start + size > INT64_MAX:
                raise ValueError(
                    f"{name}: the window [{start}, {start + size}) of stream time {when} "
                    f"(size_ms={size}) does not fit in int64 milliseconds"
                )

    def _process_one(self, key: Any, value: Any, t: int, out: list[Emit]) -> None:
        self._metrics.records_in += 1
        if t > self._stream_time:
            self._stream_time = t
            self._close(out)
        size = self.windows.size_ms
        start = self.windows.window_start(self._stream_time)
        window = Session(key, start, start + size)
        agg = self.aggregation
        raw = self.store.fetch_session(key, window.start, window.end)
        acc = agg.initial() if raw is None else SessionRecord.from_wire(raw).acc
        self._seq += 1
        self.store.put(window, SessionRecord(agg.add(key, value, t, self._seq, acc)).to_wire())

    def _close(self, out: list[Emit]) -> None:
        upto = self._stream_time
        if upto <= self._last_close:
            return
        result = self.aggregation.result
        for session, raw in list(self.store.find_sessions(first_open_end(self._last_close), upto)):
            out.append(make_emit(session, result(SessionRecord.from_wire(raw).acc)))
            self._metrics.emitted += 1
            self._metrics.record_final(final_latency_ms(upto, session.end, 0))  # no grace
        self._last_close = upto
