"""sessionstore: session windows on a segmented RocksDB session store.

The store (KIP-94 / KIP-825), the aggregation engine and its triggers are importable from here.
"""

from .store import InMemorySessionStore, SegmentedSessionStore, SessionStore
from .types import ReadOnlySessionStore, Session, SessionStoreProtocol, ValueSerde

__version__ = "0.1.0"

__all__ = [
    "InMemorySessionStore",
    "ReadOnlySessionStore",
    "SegmentedSessionStore",
    "Session",
    "SessionStore",
    "SessionStoreProtocol",
    "ValueSerde",
    "__version__",
]
