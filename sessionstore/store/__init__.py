"""Session store backends: RocksDB (durable) and in-memory (the reference model)."""

from .base import SegmentedSessionStore, default_segment_interval_ms
from .checkpoint import committed_versions
from .memory import InMemorySessionStore
from .readonly import ReadOnlySessionStore
from .rocksdb import SessionStore

__all__ = [
    "InMemorySessionStore",
    "ReadOnlySessionStore",
    "SegmentedSessionStore",
    "SessionStore",
    "committed_versions",
    "default_segment_interval_ms",
]
