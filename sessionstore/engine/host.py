"""What the engine's paths need of the engine they run for, as a protocol.

The batch paths (:mod:`.batch`), the fused event step (:mod:`.fast_event`) and the maximum
duration step (:mod:`.max_duration`) are functions of the engine's state. They are typed against
:class:`EngineHost` rather than against :class:`~sessionstore.engine.SessionAggregator`, so that
none of them imports the module that imports them (no import circle in ``sessionstore/engine``;
``tests/engine/test_imports.py`` keeps it so). ``SessionAggregator`` satisfies the protocol.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from ..aggregations import Aggregation
from ..store.caching import CachingSessionStore
from ..triggers import AfterWatermark
from ..types import SessionStoreProtocol
from ..windows import SessionWindows
from .columnar import SessionRows
from .config import EngineConfig
from .emit import Emit, EngineMetrics
from .table import OpenSessions
from .time import TimeKeeper
from .triggers import TriggerRunner


class DurationStep(Protocol):
    """The maximum-duration step (:class:`~sessionstore.engine.max_duration.MaxDuration`)."""

    def process(self, key: Any, value: Any, t: int, own_end: int, out: list[Emit],
                log: Any = None) -> None: ...

    def process_many(self, keys: list[Any], values: list[Any], times: np.ndarray,
                     ends: np.ndarray, codes: np.ndarray, out: list[Emit],
                     log: Any) -> None: ...

    def emit_log(self, log: Any, out: list[Emit]) -> None: ...


class EngineHost(Protocol):
    """The engine state and steps the paths read and call (see the module docstring)."""

    store: SessionStoreProtocol
    windows: SessionWindows
    aggregation: Aggregation
    trigger: AfterWatermark | None
    config: EngineConfig
    write_cache: bool
    on_late: Callable[[Any, Any, int], None] | None
    _updates: bool
    _check_acc: bool
    _fixed_lean: bool
    _closes_in_cache: bool
    _state: CachingSessionStore
    _metrics: EngineMetrics
    _times: TimeKeeper
    _runner: TriggerRunner | None
    _table: OpenSessions | None
    _columnar_kinds: list[str] | None
    _columnar_columns: list[str | None]
    _result_names: list[str] | None
    _forwarded: list[Emit]
    _close_heap: list[int]
    _record_close_times: bool
    _new_close_times: list[int]

    @property
    def _max_duration(self) -> DurationStep | None: ...

    def process(self, key: Any, value: Any, timestamp_ms: Any,
                gap_ms: Any = None) -> list[Emit]: ...

    def _drain_forwarded(self) -> list[Emit]: ...

    def _drop(self, key: Any, value: Any, t: int) -> None: ...

    def _process_one(self, key: Any, value: Any, t: int, out: list[Emit],
                     gap: int | None = None) -> None: ...

    def _process_lean(self, key: Any, value: Any, t: int, out: list[Emit],
                      gap: int | None) -> None: ...

    def _on_watermark(self, out: list[Emit]) -> None: ...

    def _open_table(self) -> OpenSessions: ...

    def _leave_table(self) -> None: ...

    def _advance_table(self) -> SessionRows | None: ...
