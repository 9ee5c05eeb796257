"""The engine's lifecycle: restore from the store's last commit, commit, abort, the expiry cap,
and the handover of the open sessions between the event path and the columnar table.

The invariant every path keeps: *close first, then write, then expire*. Expiry is capped at the
close cursor (every session ending at or before it was emitted) plus retention
(:func:`cap_expiry`), so no write or flush, mid-batch or on cache eviction, can let the store
expire a session nobody emitted.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Any

from ..gap_boundary import first_open_end
from ..timeutil import INT64_MAX, INT64_MIN
from .columnar import SessionRows
from .config import expiry_cap_ms
from .record import SessionRecord, check_encodable
from .table import OpenSessions
from .table_load import load_open_sessions
from .time import TimeKeeper, final_latencies_ms

if TYPE_CHECKING:
    from .host import EngineHost

#: The key of the engine's cursors in the store's commit metadata.
ENGINE_METADATA_KEY = "sessionstore.engine"
#: The key of the user's ``metadata`` (of :meth:`SessionAggregator.commit`) in it.
USER_METADATA_KEY = "user"


# -- restore, commit, abort ------------------------------------------------------------------

def restore(engine: EngineHost) -> None:
    """Take the cursors of the store's last commit, cap expiry, and index what closing needs
    (with a trigger: every open session's close time and pane state)."""
    committed = engine.store.committed_metadata
    state = committed.get(ENGINE_METADATA_KEY) if isinstance(committed, dict) else None
    if state is not None:
        engine.times.restore(state)
    cap_expiry(engine)
    if not engine.tracks_close or state is None:
        return
    if engine.runner is None:
        # ON_WINDOW_CLOSE needs no scan: until the heap knows every open session again,
        # each watermark advance asks the store (one range query) instead of the heap
        engine.close_heap_complete = False
        observed = engine.store.observed_stream_time
        engine.unindexed_until = INT64_MIN if observed is None else observed
        return
    start = first_open_end(engine.times.last_close)
    for session, raw in engine.cache.find_sessions(start, INT64_MAX):
        heapq.heappush(engine.close_heap, session.end)
        engine.runner.index(session, SessionRecord.from_wire(raw))


def cap_expiry(engine: EngineHost) -> None:
    """Keep the store from expiring what the engine has not emitted (the invariant)."""
    engine.cache.cap_expiry_time(expiry_cap_ms(engine.times.last_close,
                                               engine.store.retention_ms))


def commit(engine: EngineHost, metadata: Any) -> int:
    """Commit the store with the engine's cursors and ``metadata``; return the new version.
    See :meth:`SessionAggregator.commit` for the contract."""
    check_encodable(metadata, "metadata")
    if engine.max_duration is not None:
        engine.max_duration.write_all([])  # a commit holds every session
    if engine.write_cache and engine.cache.dirty_count:
        raise ValueError("flush() the write cache and deliver its emits before commit()")
    engine_state = engine.times.to_state()
    return engine.cache.commit({ENGINE_METADATA_KEY: engine_state, USER_METADATA_KEY: metadata})


def abort(engine: EngineHost) -> None:
    """Discard everything since the last commit: state, cursors and the write cache. The
    engine's clock object is replaced, so a step that holds it must be bound again."""
    engine.table = None
    engine.cache.abort()
    if engine.max_duration is not None:
        engine.max_duration.forget()
    engine.forwarded.clear()
    engine.times = TimeKeeper(engine.config)
    if engine.runner is not None:
        engine.runner.times = engine.times
    engine.reset_indexes()
    restore(engine)


def committed_metadata(engine: EngineHost) -> Any:
    """The ``metadata`` of the last commit (None before any)."""
    committed = engine.store.committed_metadata
    if isinstance(committed, dict):
        return committed.get(USER_METADATA_KEY)
    return None


# -- the open sessions as columns (the fast batch path) ---------------------------------------

def open_table(self: EngineHost) -> OpenSessions:
    """The open sessions' table, loaded from the store on first use.

    Raises:
        NotColumnar: stored accumulators the fast path cannot hold exactly.
    """
    if self.table is None:
        assert self.columnar_kinds is not None
        low = first_open_end(self.times.last_close)
        self.table = load_open_sessions(self.cache, low, self.columnar_kinds,
                                        combined=self.result_names is not None)
        self.cache.evict()  # the table now answers for these keys; no view may go stale
    return self.table


def leave_table(engine: EngineHost) -> None:
    """Hand the open sessions back to the event path (the store already holds them)."""
    table = engine.table
    if table is None:
        return
    engine.table = None
    if engine.tracks_close:
        engine.close_heap.extend(table.live_ends().tolist())
        heapq.heapify(engine.close_heap)
        engine.close_heap_complete = True  # the table held every session not yet closed


def advance_table(engine: EngineHost) -> SessionRows | None:
    """Close (and, with ON_WINDOW_CLOSE, return for emission, in store order) the table's
    sessions up to ``W - grace``; forget them; move the close cursor and the expiry cap."""
    table = engine.table
    assert table is not None
    times = engine.times
    upto = times.watermark - engine.config.grace_ms
    if upto <= times.last_close:
        return None
    closed = table.close_upto(upto, rows=engine.tracks_close)
    if closed is not None and len(closed):
        closed = closed.take(closed.store_order())
        engine.metrics.emitted += len(closed)
        engine.metrics.record_finals(final_latencies_ms(times.watermark, closed.ends_ms,
                                                        engine.config.grace_ms))
    times.last_close = upto
    cap_expiry(engine)
    return closed
