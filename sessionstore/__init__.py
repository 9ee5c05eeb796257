"""sessionstore: session windows on a segmented RocksDB session store.

The store (KIP-94 / KIP-825), the aggregation engine and its triggers are importable from here.
"""

from . import aggregations, triggers
from .bounded import sessionize
from .engine import BatchAggregator, Emit, EmitStrategy, SessionAggregator
from .errors import StoreCorruptedError
from .store import InMemorySessionStore, ReadOnlySessionStore, SegmentedSessionStore, SessionStore
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

__all__ = [
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
    "sessionize",
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
