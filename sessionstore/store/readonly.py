"""A read-only, thread-safe view of a store's last committed version (KIP-94's interactive
queries).

The view opens a private copy of the newest checkpoint (SST files hard-linked, so it costs
milliseconds and no space) in RocksDB's read-only mode. It takes no lock and writes nothing into
the store directory, so it works beside a running writer (``sessionstore inspect`` uses it). The
writer keeps writing to its own working copy and may delete old checkpoints; the view is
unaffected. Every query answers from one committed version, so results are consistent with each
other and with ``version``/``metadata``; :meth:`ReadOnlySessionStore.refresh` moves the view to
the newest commit.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import weakref
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from .. import keyschema
from ..errors import StoreCorruptedError
from ..fsutil import remove_dead
from ..locking import FileLock, is_locked
from ..serde import DEFAULT_SERDE
from ..timeutil import INT64_MAX, INT64_MIN, check_int64
from ..types import Session, ValueSerde
from .base import CommittedState, check_session, read_floor
from .checkpoint import (
    CHECKPOINTS_DIR,
    check_database,
    copy_checkpoint,
    live_segment_families,
    newest_committed_version,
    open_read_only,
    read_manifest,
    relocated,
    translate_rocksdb_error,
    verify_files,
    version_dir_name,
)
from .rocksdb import scan_key, scan_time

log = logging.getLogger(__name__)

# A writer that commits faster than a view can copy could starve refresh(); after this many
# consecutive races the view reports the problem instead of spinning.
MAX_REFRESH_ATTEMPTS = 100


#: A view's scratch directory is named ``sessionstore-view-<random>`` ...
SCRATCH_PREFIX = "sessionstore-view-"
#: ... and holds ``LOCK`` (held while the view is open) and, once ``LOCK`` is held, ``HELD``.
#: A scratch directory with ``HELD`` whose ``LOCK`` nobody holds belongs to a view whose
#: process died without closing it (SIGKILL, power loss): :func:`remove_dead_scratch` removes it.
SCRATCH_LOCK, SCRATCH_HELD = "LOCK", "HELD"


def remove_dead_scratch(folder: Path) -> int:
    """Remove the scratch copies under ``folder`` of views whose process died without closing
    them; their hard links would hold SST space for ever. Returns how many were removed.

    Only a ``sessionstore-view-*`` directory holding ``HELD`` and an unheld ``LOCK`` is removed:
    never a live view's (its process holds the lock, however it shares the folder), one being
    created (no ``HELD`` yet), one this process may not look into (another user's, in a shared
    temp directory) or anything else in ``folder``.
    """
    def dead(entry: Path) -> bool:
        return (entry / SCRATCH_HELD).is_file() and not is_locked(entry / SCRATCH_LOCK)

    return remove_dead(folder, SCRATCH_PREFIX, dead)


def _release(handles: dict[str, Any], scratch: Path) -> None:
    """Close the database and delete the scratch copy, then give up its lock. Holds no
    reference to the view, so it can run as the view's finalizer when the view is dropped
    without ``close()``."""
    handles.pop("cfs", None)
    db = handles.pop("db", None)
    if db is not None:
        db.close()
    shutil.rmtree(scratch, ignore_errors=True)
    lock = handles.pop("lock", None)
    if lock is not None:
        lock.release()


def _read_floor(state: CommittedState) -> int | None:
    """The writer's read floor at a commit: ``min(stream time, expiry cap) - retention + 1``
    (:attr:`SegmentedSessionStore.read_floor_ms`); None when unknown."""
    if state.stream_time_ms is None or state.retention_ms is None:
        return None
    reference = state.stream_time_ms
    if state.expiry_cap_ms is not None:
        reference = min(reference, state.expiry_cap_ms)
    return read_floor(reference, state.retention_ms)


class ReadOnlySessionStore:
    """Queries on the last committed version of the store at ``path``; safe from any thread.

    Takes no lock and never writes into ``path``: open it while a writer runs, or on a store
    nobody has open. Its scratch copy (under ``scratch_dir``, default the temp directory) is
    deleted by :meth:`close`, or when the view is garbage-collected or the interpreter exits;
    the copy of a view whose process was killed is deleted by the next view opened with the same
    ``scratch_dir`` (:func:`remove_dead_scratch`).

    Args:
        path: the store's directory.
        value_serde: the serde the store was written with (msgpack by default).
        scratch_dir: where to put the private copy; on the store's file system the SST files
            are hard-linked, elsewhere they are copied.

    Raises:
        ValueError: ``path`` holds no committed version; its manifest is of another format.
        StoreCorruptedError: the newest checkpoint is damaged (naming the file).
    """

    def __init__(self, path: str | os.PathLike[str], *, value_serde: ValueSerde | None = None,
                 scratch_dir: str | os.PathLike[str] | None = None) -> None:
        self._path = Path(path)
        self._serde = value_serde or DEFAULT_SERDE
        self._lock = threading.RLock()
        self._scratch = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=scratch_dir))
        self._handles: dict[str, Any] = {}
        self._finalizer = weakref.finalize(self, _release, self._handles, self._scratch)
        try:
            self._handles["lock"] = FileLock(self._scratch / SCRATCH_LOCK).acquire()
            (self._scratch / SCRATCH_HELD).touch()
            remove_dead_scratch(self._scratch.parent)
        except BaseException:
            self._finalizer()
            raise
        self._cfs: dict[int, Any] = {}
        self._version = 0
        self._metadata: Any = None
        self._stream_time_ms: int | None = None
        self._read_floor_ms: int | None = None
        self._interval = 1
        self._retries = 0
        self._closed = False
        try:
            if self.refresh() == 0:
                raise ValueError(f"{str(self._path)!r} holds no committed version to read")
        except BaseException:
            self.close()
            raise

    @property
    def path(self) -> Path:
        """The store's directory."""
        return self._path

    @property
    def version(self) -> int:
        """The committed version this view answers from."""
        return self._version

    @property
    def metadata(self) -> Any:
        """The metadata committed with that version."""
        return self._metadata

    @property
    def segment_interval_ms(self) -> int:
        """The store's segment interval."""
        return self._interval

    @property
    def observed_stream_time(self) -> int | None:
        """The writer's observed stream time at that commit (None if nothing was put)."""
        return self._stream_time_ms

    @property
    def metrics(self) -> Mapping[str, float]:
        """``refresh-retries``: refreshes that lost a race with the writer's cleanup and retried."""
        return {"refresh-retries": self._retries}

    @property
    def read_floor_ms(self) -> int | None:
        """The smallest session end queries return: the writer's
        :attr:`~sessionstore.SessionStore.read_floor_ms` at that commit (sessions ending before
        it are expired, as Kafka's reads skip them). None when nothing was put, or for a
        version committed before the store recorded it (then only whole expired segments are
        missing)."""
        return self._read_floor_ms

    def live_segments(self) -> list[int]:
        """Ids of the segments the committed version holds, ascending."""
        with self._lock:
            return sorted(self._cfs)

    def refresh(self) -> int:
        """Move to the newest committed version; return it.

        The writer deletes old checkpoints after each commit, possibly while this copies one. A
        failure on a checkpoint that a newer commit has since superseded is such a race and is
        retried on the newer one; a failure on the newest checkpoint is real and raised.

        Raises:
            StoreCorruptedError: the newest checkpoint is damaged.
            ValueError: its manifest is of another format, or the writer won every one of
                ``MAX_REFRESH_ATTEMPTS`` races in a row.
        """
        with self._lock:
            self._check_open()
            for _attempt in range(MAX_REFRESH_ATTEMPTS):
                newest = newest_committed_version(self._path)
                if newest is None or newest == self._version:
                    return self._version
                try:
                    self._load(newest)
                    return self._version
                except (OSError, StoreCorruptedError) as exc:
                    if (newest_committed_version(self._path) or 0) <= newest:
                        raise  # nothing newer: the writer never deletes its newest version
                    self._retries += 1
                    log.debug("refresh of %s raced the writer (%s); retrying", self._path, exc)
            raise ValueError(f"could not read a committed version of {self._path}: the writer "
                             f"replaced it {MAX_REFRESH_ATTEMPTS} times while it was copied")

    def _load(self, version: int) -> None:
        source = self._path / CHECKPOINTS_DIR / version_dir_name(version)
        state, contents = read_manifest(source)
        target = self._scratch / version_dir_name(version)
        shutil.rmtree(target, ignore_errors=True)  # a previous attempt's partial copy
        db = None
        try:
            copy_checkpoint(source, target)
            verify_files(target, contents)  # the copy is what gets opened: check it
            db, names = open_read_only(target)
            check_database(db, names, contents, source)
        except BaseException as exc:
            if db is not None:
                db.close()
            shutil.rmtree(target, ignore_errors=True)
            if isinstance(exc, StoreCorruptedError):
                raise relocated(exc, target, source) from None
            raise
        # a segment the version records as expired is not part of it (its drop comes later)
        live, _expired = live_segment_families(names, contents)
        cfs = {segment: db.get_column_family(name) for segment, name in live.items()}
        old_db, old_dir = self._handles.get("db"), self._scratch / version_dir_name(self._version)
        self._handles["db"], self._cfs = db, cfs
        self._version = state.version
        self._metadata = state.metadata
        self._stream_time_ms = state.stream_time_ms
        self._read_floor_ms = _read_floor(state)
        assert state.segment_interval_ms is not None
        self._interval = state.segment_interval_ms
        if old_db is not None:
            old_db.close()
            shutil.rmtree(old_dir, ignore_errors=True)

    def fetch(self, key: Any, *, backward: bool = False) -> list[tuple[Session, Any]]:
        """All committed live sessions of ``key``, by end then start (both descending when
        ``backward``)."""
        return self.find_sessions_to_merge(key, INT64_MIN, INT64_MAX, backward=backward)

    def fetch_session(self, key: Any, start_ms: int, end_ms: int) -> Any:
        """The committed value of one session, or None (also when it ended before
        :attr:`read_floor_ms`: expired).

        Raises:
            StoreCorruptedError: RocksDB met damaged data.
        """
        encoded, start, end = check_session((key, start_ms, end_ms))
        with self._lock:
            self._check_open()
            floor = self._read_floor_ms
            if floor is not None and end < floor:
                return None
            cf = self._cfs.get(end // self._interval)
            try:
                data = None if cf is None else cf.get(keyschema.key_first(encoded, end, start))
            except Exception as exc:  # noqa: BLE001 - RocksDB's errors are bare Exceptions
                error = translate_rocksdb_error(exc, self._scratch)
                if error is None:
                    raise
                raise error from None
            return None if data is None else self._serde.loads(data)

    def find_sessions_to_merge(self, key: Any, earliest_end_ms: int, latest_start_ms: int,
                               *, backward: bool = False) -> list[tuple[Session, Any]]:
        """As :meth:`SessionStore.find_sessions_to_merge`, on the committed version."""
        encoded = keyschema.encode_key(key)
        earliest = check_int64(earliest_end_ms, "earliest_end_ms")
        latest = check_int64(latest_start_ms, "latest_start_ms")
        with self._lock:
            self._check_open()
            floor = self._read_floor_ms
            if floor is not None and floor > earliest:
                if floor > INT64_MAX:
                    return []
                earliest = floor
            loads = self._serde.loads
            return [(Session(key, start, end), loads(data)) for end, start, data in
                    scan_key(self._cfs, self._interval, encoded, earliest, latest,
                             self._scratch, backward)]

    def find_sessions(self, earliest_end_ms: int, latest_end_ms: int, *, backward: bool = False
                      ) -> list[tuple[Session, Any]]:
        """As :meth:`SessionStore.find_sessions`, on the committed version."""
        earliest = check_int64(earliest_end_ms, "earliest_end_ms")
        latest = check_int64(latest_end_ms, "latest_end_ms")
        with self._lock:
            self._check_open()
            floor = self._read_floor_ms
            if floor is not None and floor > earliest:
                if floor > latest:
                    return []
                earliest = floor
            loads, decode = self._serde.loads, keyschema.decode_key
            return [(Session(decode(encoded), start, end), loads(data)) for end, encoded, start,
                    data in scan_time(self._cfs, self._interval, earliest, latest,
                                      self._scratch, backward)]

    def __iter__(self) -> Iterator[tuple[Session, Any]]:
        return iter(self.find_sessions(INT64_MIN, INT64_MAX))

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("the read-only view is closed")

    def close(self) -> None:
        """Close the view and delete its scratch copy. Idempotent."""
        with self._lock:
            self._closed = True
            self._cfs = {}
            self._finalizer()

    def __enter__(self) -> ReadOnlySessionStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
