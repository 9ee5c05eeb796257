"""PySpark integration for sessionstore: ``sessionize(df, ...)`` and its versioned state store.

Importing this package imports pyspark; ``sessionstore`` itself never does.
"""

from .provider import SessionStoreProvider, SnapshotError
from .sessionize import sessionize
from .state import read_state_metrics

__all__ = ["SessionStoreProvider", "SnapshotError", "read_state_metrics", "sessionize"]
