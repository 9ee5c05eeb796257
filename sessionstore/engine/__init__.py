"""The session-window engine: one core for the event path and the columnar batch path.

See :mod:`sessionstore.engine.aggregator` for how the modules fit together.
"""

from .aggregator import SessionAggregator
from .batch_windows import BatchAggregator
from .config import DEFAULT_CACHE_MAX_SESSIONS, EngineConfig, required_retention_ms
from .emit import Emit, EmitStrategy
from .lifecycle import ENGINE_METADATA_KEY, USER_METADATA_KEY

__all__ = [
    "DEFAULT_CACHE_MAX_SESSIONS",
    "ENGINE_METADATA_KEY",
    "USER_METADATA_KEY",
    "BatchAggregator",
    "Emit",
    "EmitStrategy",
    "EngineConfig",
    "SessionAggregator",
    "required_retention_ms",
]
