"""sessionstore: session windows on a segmented RocksDB session store.

``sessionstore.sessionize`` sessionizes data that is all there (a table, files) in one call.
The store (KIP-94 / KIP-825), the aggregation engine and its triggers are importable from here.

Every name is imported on first use, so that a program that needs only the bounded path (or
only the CLI's argument parsing) does not load the engine, RocksDB or numba.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from . import aggregations, triggers
    from .bounded import sessionize
    from .engine import BatchAggregator, Emit, EmitStrategy, SessionAggregator
    from .errors import StoreCorruptedError
    from .store import (
        InMemorySessionStore,
        ReadOnlySessionStore,
        SegmentedSessionStore,
        SessionStore,
    )
    from .triggers import (
        AccumulationMode,
        AfterCount,
        AfterProcessingTime,
        AfterWatermark,
        ManualClock,
        Pane,
        PaneTiming,
    )
    from .types import Session, SessionStoreProtocol, SessionStoreReader, ValueSerde
    from .windows import BatchWindows, SessionWindows

__version__ = "0.1.0"

#: Each public name and the module it comes from.
_LAZY = {
    "sessionize": ".bounded",
    "BatchAggregator": ".engine", "Emit": ".engine", "EmitStrategy": ".engine",
    "SessionAggregator": ".engine",
    "StoreCorruptedError": ".errors",
    "InMemorySessionStore": ".store", "ReadOnlySessionStore": ".store",
    "SegmentedSessionStore": ".store", "SessionStore": ".store",
    "AccumulationMode": ".triggers", "AfterCount": ".triggers",
    "AfterProcessingTime": ".triggers", "AfterWatermark": ".triggers",
    "ManualClock": ".triggers", "Pane": ".triggers", "PaneTiming": ".triggers",
    "Session": ".types", "SessionStoreProtocol": ".types", "SessionStoreReader": ".types",
    "ValueSerde": ".types",
    "BatchWindows": ".windows", "SessionWindows": ".windows",
}
_SUBMODULES = ("aggregations", "triggers")


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY, *_SUBMODULES])


__all__ = [
    "sessionize",
    "AccumulationMode",
    "AfterCount",
    "AfterProcessingTime",
    "AfterWatermark",
    "BatchAggregator",
    "BatchWindows",
    "Emit",
    "EmitStrategy",
    "ManualClock",
    "Pane",
    "PaneTiming",
    "SessionAggregator",
    "SessionWindows",
    "aggregations",
    "triggers",
    "InMemorySessionStore",
    "ReadOnlySessionStore",
    "SegmentedSessionStore",
    "Session",
    "SessionStore",
    "StoreCorruptedError",
    "SessionStoreProtocol",
    "SessionStoreReader",
    "ValueSerde",
    "__version__",
]
