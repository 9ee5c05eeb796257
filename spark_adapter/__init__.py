"""PySpark integration for sessionstore: ``sessionize(df, ...)`` and its versioned state store.

Importing this package imports pyspark; ``sessionstore`` itself never does.
"""

from .progress import progress_counters, progress_json
from .provider import (
    SessionStoreProvider,
    SnapshotCorruptedError,
    SnapshotError,
    StateLockedError,
)
from .sessionize import sessionize
from .state import (
    StateLayout,
    StateLayoutMismatchError,
    config_digest,
    pin_layout,
    query_state_location,
    read_state_metrics,
)

__all__ = [
    "SessionStoreProvider",
    "SnapshotCorruptedError",
    "SnapshotError",
    "StateLayout",
    "StateLayoutMismatchError",
    "StateLockedError",
    "config_digest",
    "pin_layout",
    "progress_counters",
    "progress_json",
    "query_state_location",
    "read_state_metrics",
    "sessionize",
]
