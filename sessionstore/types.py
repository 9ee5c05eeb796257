"""Public types and interfaces shared by every store and engine implementation."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple, Protocol, runtime_checkable


class Session(NamedTuple):
    """A session of one key: ``start`` and ``end`` are int64 milliseconds with ``start <= end``.

    In the engine, ``start`` is the first event time and ``end`` is exclusive: last event time
    plus the gap. The store itself only requires ``start <= end``.
    """

    key: Any
    start: int
    end: int


@runtime_checkable
class ValueSerde(Protocol):
    """Turns values into bytes and back. Must not be able to run code on ``loads``."""

    def dumps(self, value: Any) -> bytes: ...

    def loads(self, data: bytes) -> Any: ...


@runtime_checkable
class SessionStoreReader(Protocol):
    """The queries of a session store (KIP-94's interactive-query view)."""

    def fetch(self, key: Any) -> Iterator[tuple[Session, Any]]:
        """All sessions of ``key``, ordered by end, then start."""
        ...

    def fetch_session(self, key: Any, start_ms: int, end_ms: int) -> Any:
        """The value of exactly that session, or None."""
        ...

    def find_sessions_to_merge(
        self, key: Any, earliest_end_ms: int, latest_start_ms: int
    ) -> Iterator[tuple[Session, Any]]:
        """Sessions of ``key`` with ``end >= earliest_end_ms and start <= latest_start_ms``."""
        ...

    def find_sessions(
        self, earliest_end_ms: int, latest_end_ms: int
    ) -> Iterator[tuple[Session, Any]]:
        """Sessions of every key with ``earliest_end_ms <= end <= latest_end_ms``, by end."""
        ...


@runtime_checkable
class SessionStoreProtocol(SessionStoreReader, Protocol):
    """The full, writable, versioned session store contract (DESIGN.md section 3)."""

    @property
    def retention_ms(self) -> int: ...

    @property
    def segment_interval_ms(self) -> int: ...

    @property
    def observed_stream_time(self) -> int | None: ...

    @property
    def committed_version(self) -> int: ...

    @property
    def committed_metadata(self) -> Any: ...

    @property
    def metrics(self) -> Mapping[str, float]: ...

    def put(self, session: Session, value: Any) -> bool: ...

    def remove(self, session: Session) -> None: ...

    def segment_id(self, timestamp_ms: int) -> int: ...

    def is_expired(self, end_ms: int) -> bool: ...

    def expiry_boundary_ms(self, stream_time_ms: int) -> int | None: ...

    def commit(self, metadata: Any = None) -> int: ...

    def abort(self) -> None: ...

    def close(self) -> None: ...
