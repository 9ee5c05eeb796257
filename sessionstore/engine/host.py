"""What the engine's paths need of the engine they run for, as a protocol.

The engine's state is one object, :class:`~sessionstore.engine.core.EngineCore`, which
:class:`~sessionstore.engine.SessionAggregator` (the public façade) holds and every path is
handed: the event step (:mod:`.event`, and its fused form :mod:`.fast_event`), closing
(:mod:`.closing`), the lifecycle (:mod:`.lifecycle`), the batch paths (:mod:`.batch`,
:mod:`.fast_batch`, :mod:`.tables`) and the maximum duration step (:mod:`.max_duration`). They are
typed against :class:`EngineHost` rather than against the core, which imports them (its steps
are their functions), so that no import circle forms in ``sessionstore/engine``
(``tests/engine/test_imports.py`` keeps it so). Every member here is public: no module reaches
into another's private names (``tests/test_private_members.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from ..aggregations import Aggregation
from ..store.caching import CachingSessionStore
from ..store.metered import MeteredSessionStore
from ..triggers import AfterWatermark
from ..types import Session, SessionStoreProtocol
from ..windows import SessionWindows
from .columnar import SessionRows
from .config import EngineConfig
from .emit import Emit, EngineMetrics
from .record import SessionRecord
from .table import OpenSessions
from .time import TimeKeeper
from .triggers import TriggerRunner


class DurationStep(Protocol):
    """The maximum-duration step (:class:`~sessionstore.engine.max_duration.MaxDuration`)."""

    recut_events: int
    recut_steps: int

    def process(self, key: Any, value: Any, t: int, own_end: int, out: list[Emit],
                log: Any = None) -> None: ...

    def process_many(self, keys: list[Any], values: list[Any], times: np.ndarray,
                     ends: np.ndarray, codes: np.ndarray, out: list[Emit],
                     log: Any) -> None: ...

    def emit_log(self, log: Any, out: list[Emit]) -> None: ...

    def write_upto(self, upto: int, out: list[Emit]) -> None: ...

    def before_watermark(self, to_ms: int, out: list[Emit]) -> None: ...

    def write_all(self, out: list[Emit], log: Any = None) -> None: ...

    def write_key(self, key: Any) -> None: ...

    def forget(self) -> None: ...


class EngineHost(Protocol):
    """The engine state and steps the paths read and call. The attributes are documented
    where they are set, in :class:`~sessionstore.engine.core.EngineCore`."""

    # the options, as given and validated
    store: SessionStoreProtocol
    windows: SessionWindows
    aggregation: Aggregation
    trigger: AfterWatermark | None
    config: EngineConfig
    write_cache: bool
    on_late: Callable[[Any, Any, int], None] | None
    clock: Callable[[], int]
    # what the options imply, decided once
    updates: bool
    tracks_close: bool
    check_acc: bool
    lean: bool
    is_count: bool
    fixed_lean: bool
    closes_in_cache: bool
    max_timestamp_ms: int
    max_gap_ms: int
    grace_ms: int
    inclusive_gap: bool
    event_time: bool
    max_out_of_orderness_ms: int
    columnar_kinds: list[str] | None
    columnar_columns: list[str | None]
    result_names: list[str] | None
    # the state
    cache: CachingSessionStore
    metered: MeteredSessionStore
    held_keys: Any
    metrics: EngineMetrics
    times: TimeKeeper
    runner: TriggerRunner | None
    forwarded: list[Emit]
    table: OpenSessions | None
    table_columns: tuple[list[str], Any] | None
    close_heap: list[int]
    close_heap_complete: bool
    unindexed_until: int
    record_close_times: bool
    new_close_times: list[int]

    @property
    def max_duration(self) -> DurationStep | None: ...

    def process(self, key: Any, value: Any, timestamp_ms: Any,
                gap_ms: Any = None) -> list[Emit]: ...

    def process_one(self, key: Any, value: Any, t: int, out: list[Emit],
                    gap: int | None = None) -> None: ...

    def process_lean(self, key: Any, value: Any, t: int, out: list[Emit],
                     gap: int | None) -> None: ...

    def drop(self, key: Any, value: Any, t: int) -> None: ...

    def on_watermark(self, out: list[Emit]) -> None: ...

    def cap_expiry(self) -> None: ...

    def reset_indexes(self) -> None: ...

    def restore(self) -> None: ...

    def flush(self) -> list[Emit]: ...

    def drain_forwarded(self) -> list[Emit]: ...

    def put_record(self, session: Session, record: SessionRecord) -> None: ...

    def get_record(self, session: Session) -> SessionRecord | None: ...

    def open_table(self) -> OpenSessions: ...

    def leave_table(self) -> None: ...

    def advance_table(self) -> SessionRows | None: ...
