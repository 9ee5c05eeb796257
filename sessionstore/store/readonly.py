"""A read-only, thread-safe view of a store's last committed version (KIP-94's interactive
queries).

The view opens a private copy of the newest checkpoint (SST files hard-linked, so it costs
milliseconds and no space) in RocksDB's read-only mode. The writer keeps writing to its own
working copy and may delete old checkpoints; the view is unaffected. Every query answers from one
committed version, so results are consistent with each other and with ``version``/``metadata``;
:meth:`ReadOnlySessionStore.refresh` moves the view to the newest commit.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import rocksdict

from .. import keyschema
from ..serde import DEFAULT_SERDE
from ..timeutil import INT64_MAX, INT64_MIN, check_int64
from ..types import Session, ValueSerde
from .base import check_session
from .rocksdb import (
    _CF_PREFIX,
    _CHECKPOINTS,
    _VERSION_DIR,
    copy_checkpoint,
    read_manifest,
    scan_key,
    scan_time,
    version_dir_name,
)


class ReadOnlySessionStore:
    """Queries on the last committed version of the store at ``path``; safe from any thread.

    Raises:
        ValueError: ``path`` holds no committed version, or its manifest is corrupted.
    """

    def __init__(self, path: str | os.PathLike[str], *, value_serde: ValueSerde | None = None
                 ) -> None:
        self._path = Path(path)
        self._serde = value_serde or DEFAULT_SERDE
        self._lock = threading.RLock()
        self._scratch = Path(tempfile.mkdtemp(prefix="sessionstore-view-"))
        self._db: Any = None
        self._cfs: dict[int, Any] = {}
        self._version = 0
        self._metadata: Any = None
        self._interval = 1
        self._closed = False
        if self.refresh() == 0:
            self.close()
            raise ValueError(f"{str(self._path)!r} holds no committed version to read")

    @property
    def version(self) -> int:
        """The committed version this view answers from."""
        return self._version

    @property
    def metadata(self) -> Any:
        """The metadata committed with that version."""
        return self._metadata

    def refresh(self) -> int:
        """Move to the newest committed version; return it."""
        with self._lock:
            self._check_open()
            root = self._path / _CHECKPOINTS
            versions = sorted(
                int(m.group(1)) for m in (_VERSION_DIR.match(p.name) for p in
                                          (root.iterdir() if root.is_dir() else [])) if m
            )
            if not versions or versions[-1] == self._version:
                return self._version
            newest = versions[-1]
            source = root / version_dir_name(newest)
            state = read_manifest(source)
            target = self._scratch / version_dir_name(newest)
            try:
                copy_checkpoint(source, target)
            except FileNotFoundError:  # the writer deleted it meanwhile: a newer one exists
                shutil.rmtree(target, ignore_errors=True)
                return self.refresh()
            options = rocksdict.Options(raw_mode=True)
            names = rocksdict.Rdict.list_cf(str(target), options)
            db = rocksdict.Rdict(
                str(target), options=options,
                column_families={n: rocksdict.Options(raw_mode=True) for n in names},
                access_type=rocksdict.AccessType.read_only(),
            )
            cfs = {int(n[len(_CF_PREFIX):]): db.get_column_family(n)
                   for n in names if n.startswith(_CF_PREFIX)}
            old_db, old_dir = self._db, self._scratch / version_dir_name(self._version)
            self._db, self._cfs = db, cfs
            self._version = state.version
            self._metadata = state.metadata
            assert state.segment_interval_ms is not None
            self._interval = state.segment_interval_ms
            if old_db is not None:
                old_db.close()
                shutil.rmtree(old_dir, ignore_errors=True)
            return self._version

    def fetch(self, key: Any) -> list[tuple[Session, Any]]:
        """All committed sessions of ``key``, by end then start."""
        return self.find_sessions_to_merge(key, INT64_MIN, INT64_MAX)

    def fetch_session(self, key: Any, start_ms: int, end_ms: int) -> Any:
        """The committed value of one session, or None."""
        encoded, start, end = check_session((key, start_ms, end_ms))
        with self._lock:
            self._check_open()
            cf = self._cfs.get(end // self._interval)
            data = None if cf is None else cf.get(keyschema.key_first(encoded, end, start))
            return None if data is None else self._serde.loads(data)

    def find_sessions_to_merge(self, key: Any, earliest_end_ms: int, latest_start_ms: int
                               ) -> list[tuple[Session, Any]]:
        """As :meth:`SessionStore.find_sessions_to_merge`, on the committed version."""
        encoded = keyschema.encode_key(key)
        earliest = check_int64(earliest_end_ms, "earliest_end_ms")
        latest = check_int64(latest_start_ms, "latest_start_ms")
        with self._lock:
            self._check_open()
            loads = self._serde.loads
            return [(Session(key, start, end), loads(data)) for end, start, data in
                    scan_key(self._cfs, self._interval, encoded, earliest, latest)]

    def find_sessions(self, earliest_end_ms: int, latest_end_ms: int
                      ) -> list[tuple[Session, Any]]:
        """As :meth:`SessionStore.find_sessions`, on the committed version."""
        earliest = check_int64(earliest_end_ms, "earliest_end_ms")
        latest = check_int64(latest_end_ms, "latest_end_ms")
        with self._lock:
            self._check_open()
            loads, decode = self._serde.loads, keyschema.decode_key
            return [(Session(decode(encoded), start, end), loads(data)) for end, encoded, start,
                    data in scan_time(self._cfs, self._interval, earliest, latest)]

    def __iter__(self) -> Iterator[tuple[Session, Any]]:
        return iter(self.find_sessions(INT64_MIN, INT64_MAX))

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("the read-only view is closed")

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._cfs = {}
            if self._db is not None:
                self._db.close()
                self._db = None
            shutil.rmtree(self._scratch, ignore_errors=True)

    def __enter__(self) -> ReadOnlySessionStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
