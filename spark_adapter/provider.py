"""A StateStoreProvider-style, versioned, per-partition session store for Spark executors.

One :class:`~sessionstore.SessionStore` lives on the executor's local disk per (state location,
operator, partition). Version ``b`` is the state after micro-batch ``b``:

* :meth:`SessionStoreProvider.load` opens exactly version ``batch_id - 1``. It reuses the local
  working copy only when that copy *is* the published version (same batch and same unique id) and
  otherwise restores the snapshot from the state location; it never loads "latest", and a missing
  snapshot is an error.
* :meth:`SessionStoreProvider.commit` commits version ``batch_id`` locally and publishes its
  snapshot under a fresh unique id.

Snapshots live under ``<state_location>/<operator>/<partition>/`` on any ``pyarrow.fs`` file
system (local, HDFS, S3)::

    sst/<name>-<unique>.sst         immutable RocksDB files, shared between versions
    manifests/<batch>.json          one per version, sealed, written last and atomically

Lineage. Every published version carries a unique id (like the checkpoint ids of Spark 4's state
stores) and the id of the version it was built on. Two attempts of one batch (a retry on another
executor, a speculative copy) publish two different ids; the manifest written last is the
published one, and an executor whose local copy carries the other id restores instead of reusing
it. The map from local SST names to uploaded objects is never kept on the side: it is rebuilt
from the manifest that was loaded, so it cannot point at another attempt's (possibly deleted)
objects.

Integrity. A manifest starts with a header line carrying the SHA-256 and size of its body; the
body records the size and SHA-256 of every file of the version (SST objects, and the small mutable
RocksDB files it carries inline), the store version, the segments and the lineage ids. A restore
verifies all of it in a staging directory and only then replaces the local copy, so a damaged
snapshot raises :class:`SnapshotCorruptedError` naming the object and changes nothing, locally or
remotely.

Deltas. The store runs with RocksDB's own compaction off, so a commit's checkpoint adds only the
files its batch flushed, and those are all the commit uploads. After a commit is published, a
background thread compacts the segments that reached ``compact_level0_files`` sorted runs (one
per commit that wrote to it; see ``SessionStore.compact_segments``) and uploads the output; the next commit waits for it and references those objects. A manifest is
written only once every object it names is stored, so every published version is restorable
from the state location alone. A restore links the SST files the working copy already holds
(same name, size and SHA-256) and downloads only the rest, several at a time.

Maintenance keeps the newest ``keep_versions`` manifests and deletes an SST object only when no
kept manifest references it *and* it is older than ``orphan_grace_ms``: an object that was just
uploaded may belong to an attempt whose manifest is not written yet (or to a background
compaction whose commit is not written yet).
"""

from __future__ import annotations

import base64
import binascii
import concurrent.futures
import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import stat
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs

from sessionstore import SessionStore, StoreCorruptedError
from sessionstore.locking import FileLock, LockHeldError, holder_description
from sessionstore.store.checkpoint import (
    CHECKPOINTS_DIR,
    committed_versions,
    file_digest,
    version_dir_name,
    write_pointer,
)
from sessionstore.store.checkpoint import read_manifest as read_store_manifest
from sessionstore.store.rocksdb import fsync_dir

log = logging.getLogger(__name__)

SNAPSHOT_FORMAT = 2
SPARK_METADATA_KEY = "spark"
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_MANIFEST_NAME = re.compile(r"^(\d{1,19})\.json$")
_SEAL = re.compile(rb"^sessionstore-sealed (\d+) sha256=([0-9a-f]{64}) size=(\d{1,12})$")
_IMMUTABLE_SUFFIXES = (".sst", ".blob")
_STORE_DIR = "store"
_LOCK_FILE = "provider.lock"
#: Left beside the lock by a process that waits for it: "close your idle copy, I need it". A
#: process that keeps committed providers open between tasks (``spark_adapter.kept``) watches
#: for it; nothing else reads it.
RELEASE_REQUEST = "release-requested"
#: A named pipe beside the lock: a waiter writes a byte to it after leaving the request, which
#: wakes the process keeping the copy (its watcher sleeps on the pipe, not on a timer). Without a
#: reader the write is skipped; the request file alone still says what is wanted.
RELEASE_WAKEUP = "release-wakeup"
_LOCK_POLL_S = 0.01
_STAGING_PREFIX = "staging-"
_CHUNK = 1 << 20
_DOWNLOAD_THREADS = 8  # parallel object reads of one restore (each waits on the network)
# parallel object writes of one commit: each waits on the network, or on a local file system on
# its fsync (a commit's checkpoint adds a file per segment its batch wrote, 3-10 in the Spark
# benchmark, whose syncs then overlap instead of queueing)
_UPLOAD_THREADS = 8
# A working copy closed before its next commit loses its background compaction (a reopen starts
# from the committed checkpoint), so sorted runs could pile up; at this many times
# compact_level0_files, a commit compacts before its checkpoint (and uploads the output itself).
_FOREGROUND_COMPACTION_FACTOR = 4
_OPEN_STORES: dict[Path, SessionStore] = {}  # per worker process: closes handles a failed task left
_HELD_LOCKS: dict[Path, FileLock] = {}  # per worker process: the same, for partition locks


def wake_keeper(local: Path) -> None:
    """Wake the process that keeps the working copy ``local`` open between tasks, if one listens
    on its :data:`RELEASE_WAKEUP` pipe, to look at the release request; never blocks."""
    try:
        fd = os.open(local / RELEASE_WAKEUP, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:  # no pipe, or nobody reads it (ENXIO): no process keeps the copy idle
        return
    try:
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            os.write(fd, b"\0")
    except OSError:  # full: the keeper has wake-ups pending already
        pass
    finally:
        os.close(fd)


class SnapshotError(ValueError):
    """A snapshot is missing, unreadable or of an unknown format."""


class SnapshotCorruptedError(StoreCorruptedError, SnapshotError):
    """A snapshot object is damaged: a checksum, a size or a recorded fact does not match.

    ``path`` names the damaged object. Raised before anything local or remote is changed.
    """


class StateLockedError(LockHeldError):
    """Another process holds this partition's local working copy (``path`` is its lock file,
    ``holder_pid`` the holder's recorded process id or None)."""


def check_name(value: Any, name: str) -> str:
    """Operator ids and the like must be plain names: no path can escape the state location."""
    if not isinstance(value, str) or not _SAFE_NAME.match(value) or ".." in value:
        raise ValueError(
            f"{name} must be 1-128 characters of letters, digits, '_', '-' or '.', "
            f"not starting with a dot and without '..', got {value!r}"
        )
    return value


def check_partition(value: Any) -> int:
    """A partition id: an int >= 0 (raises ValueError naming the value)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"partition must be an int >= 0, got {value!r}")
    return value


def open_filesystem(state_location: str) -> tuple[pafs.FileSystem, str]:
    """``pyarrow.fs`` file system and base path of a state location (a path or a URI)."""
    if not isinstance(state_location, str) or not state_location:
        raise ValueError(f"state_location must be a path or URI, got {state_location!r}")
    if "://" not in state_location:
        return pafs.LocalFileSystem(), os.path.abspath(state_location)
    try:
        fs, path = pafs.FileSystem.from_uri(state_location)
    except Exception as exc:  # pyarrow raises several types for bad URIs
        raise ValueError(f"state_location {state_location!r} is not usable: {exc}") from None
    return fs, path.rstrip("/")


# -- sealed objects ---------------------------------------------------------------------------


def seal(body: dict[str, Any]) -> bytes:
    """Encode ``body`` as JSON behind a header line holding its format, SHA-256 and size."""
    data = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    digest = hashlib.sha256(data).hexdigest()
    return f"sessionstore-sealed {SNAPSHOT_FORMAT} sha256={digest} size={len(data)}\n".encode() \
        + data


def unseal(raw: bytes, path: str) -> dict[str, Any]:
    """Decode what :func:`seal` wrote, verifying the header first.

    Raises:
        SnapshotCorruptedError: naming ``path``, for a bad header, size, checksum or body.
    """
    header, newline, data = raw.partition(b"\n")
    match = _SEAL.match(header) if newline else None
    if match is None:
        raise SnapshotCorruptedError(path, "no valid sealed header (truncated or garbled)")
    fmt = int(match.group(1))
    if fmt != SNAPSHOT_FORMAT:
        raise SnapshotCorruptedError(
            path, f"format {fmt}; this version reads format {SNAPSHOT_FORMAT}")
    if len(data) != int(match.group(3)):
        raise SnapshotCorruptedError(
            path, f"body is {len(data)} bytes, the header records {int(match.group(3))}")
    if hashlib.sha256(data).hexdigest() != match.group(2).decode():
        raise SnapshotCorruptedError(path, "SHA-256 of the body does not match its header")
    try:
        body = json.loads(data)
    except ValueError as exc:  # checksum matched, so the writer itself was wrong
        raise SnapshotCorruptedError(path, f"body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise SnapshotCorruptedError(path, "body is not a JSON object")
    return body


def read_object(fs: pafs.FileSystem, path: str) -> bytes:
    """All bytes of one object. Raises FileNotFoundError, or SnapshotError for other I/O errors."""
    try:
        with fs.open_input_file(path) as handle:
            data: bytes = handle.read()
            return data
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise SnapshotError(f"cannot read {path}: {exc}") from None


def publish_object(fs: pafs.FileSystem, path: str, data: bytes,
                   sync_dirs: tuple[str, ...] = ()) -> None:
    """Write ``data`` to ``path`` so that readers see all of it or nothing.

    Local files go through a synced temporary file and a rename; an object store's single PUT is
    atomic on its own. ``sync_dirs``: local directories whose entries must be durable before
    ``path`` is (where the objects it names were created); synced while the temporary file is,
    all before the rename.
    """
    if isinstance(fs, pafs.LocalFileSystem):
        tmp = f"{path}.{uuid.uuid4().hex}.tmp"
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            if sync_dirs:
                with concurrent.futures.ThreadPoolExecutor(
                        max_workers=len(sync_dirs),
                        thread_name_prefix="sessionstore-publish-sync") as pool:
                    synced = [pool.submit(fsync_dir, Path(d)) for d in sync_dirs]
                    os.fsync(handle.fileno())
                for future in synced:
                    future.result()
            else:
                os.fsync(handle.fileno())
        os.replace(tmp, path)
        fsync_dir(Path(os.path.dirname(path)))
    else:
        with fs.open_output_stream(path) as handle:
            handle.write(data)


# -- manifests --------------------------------------------------------------------------------


def validate_manifest(body: dict[str, Any], path: str, batch: int) -> dict[str, Any]:
    """Check the fields of an unsealed snapshot manifest of ``batch``.

    Raises:
        SnapshotCorruptedError: naming ``path``, for a missing or ill-typed field, another batch,
            or a file name that is not a plain name.
    """
    def bad(detail: str) -> SnapshotCorruptedError:
        return SnapshotCorruptedError(path, detail)

    if body.get("batch") != batch:
        raise bad(f"holds batch {body.get('batch')!r}, not {batch}")
    if not isinstance(body.get("id"), str) or not body["id"]:
        raise bad("has no version id")
    if body.get("parent") is not None and not isinstance(body["parent"], str):
        raise bad("has a bad parent id")
    store_version = body.get("store_version")
    if isinstance(store_version, bool) or not isinstance(store_version, int) or store_version < 1:
        raise bad(f"has a bad store_version {store_version!r}")
    segments = body.get("segments")
    if not isinstance(segments, list) or not all(
            isinstance(s, int) and not isinstance(s, bool) for s in segments):
        raise bad("has a bad segment list")
    files = body.get("files")
    if not isinstance(files, dict) or not files:
        raise bad("lists no files")
    for name, entry in files.items():
        if not isinstance(name, str) or not _SAFE_NAME.match(name) or ".." in name:
            raise bad(f"bad file name {name!r}")
        if not isinstance(entry, dict) or not isinstance(entry.get("sha256"), str) \
                or isinstance(entry.get("size"), bool) or not isinstance(entry.get("size"), int):
            raise bad(f"bad entry for {name!r}")
        if ("object" in entry) == ("data" in entry):
            raise bad(f"entry for {name!r} must hold exactly one of 'object' and 'data'")
        if "object" in entry and (not isinstance(entry["object"], str)
                                  or not _SAFE_NAME.match(entry["object"])
                                  or ".." in entry["object"]):
            raise bad(f"bad object name {entry['object']!r} for {name!r}")
        if "data" in entry and not isinstance(entry["data"], str):
            raise bad(f"bad inline data for {name!r}")
    if not isinstance(body.get(SPARK_METADATA_KEY), dict):
        raise bad("has no spark metadata")
    return body


def spark_metadata(committed_metadata: Any) -> dict[str, Any]:
    """The provider's part of a store's committed metadata (empty if there is none)."""
    if isinstance(committed_metadata, dict):
        user = committed_metadata.get("user")
        if isinstance(user, dict):
            spark = user.get(SPARK_METADATA_KEY)
            if isinstance(spark, dict):
                return spark
    return {}


def batch_of(committed_metadata: Any) -> int | None:
    """The Spark batch a committed store holds, from the engine's user metadata."""
    batch = spark_metadata(committed_metadata).get("batch")
    return batch if isinstance(batch, int) and not isinstance(batch, bool) else None


class SessionStoreProvider:
    """Versioned snapshots of one partition's session store. See the module docstring.

    Args:
        state_location: path or ``pyarrow.fs`` URI shared by driver and executors.
        operator: the operator's id (a plain name).
        partition: the Spark partition id.
        local_root: where executors keep working copies (default: see
            :func:`default_local_root`).
        retention_ms, segment_interval_ms: passed to :class:`~sessionstore.SessionStore`.
        keep_versions: how many versions maintenance keeps (Spark's ``minBatchesToRetain``).
        filesystem: an explicit ``pyarrow.fs.FileSystem`` (then ``state_location`` is its path).
        orphan_grace_ms: maintenance deletes an unreferenced SST object only once it is at least
            this old, so that an attempt still uploading (its manifest not yet written) or a
            reader still restoring an overwritten manifest keeps its files.
        lock_timeout_ms: how long :meth:`load` waits for another process to release this
            partition's working copy before raising :class:`StateLockedError`.
        maintenance_every: :meth:`commit` runs :meth:`maintenance` after every batch that is a
            multiple of this (0: never).
        compact_level0_files: RocksDB's own compaction is off; once a commit is published, a
            background thread compacts each segment holding at least this many sorted runs
            (one per commit that wrote to it; the parameter keeps its older name) and uploads the output, which the next commit
            then references without uploading it (see :meth:`commit`). 0: RocksDB compacts
            on its own, and the commit that first holds the output uploads it.

    Attributes:
        metrics: counters of what the provider did (``loads_reused``, ``loads_restored``,
            ``loads_resumed`` (see :meth:`resume`), ``local_copies_discarded``,
            ``objects_uploaded``, ``bytes_uploaded`` (both by commits), ``objects_reused``,
            ``objects_preuploaded`` (referenced by a commit, uploaded before it in the
            background), ``background_objects_uploaded``, ``background_bytes_uploaded``,
            ``background_failed``, ``objects_downloaded``, ``bytes_downloaded``,
            ``objects_linked_locally`` (restored from the working copy's own files),
            ``manifests_deleted``, ``orphans_deleted``, ``orphans_in_grace``,
            ``maintenance_skipped``, ``maintenance_failed``).
    """

    def __init__(
        self,
        state_location: str,
        operator: str,
        partition: int,
        *,
        local_root: str | os.PathLike[str] | None = None,
        retention_ms: int,
        segment_interval_ms: int | None = None,
        keep_versions: int = 100,
        filesystem: pafs.FileSystem | None = None,
        orphan_grace_ms: int = 600_000,
        lock_timeout_ms: int = 10_000,
        maintenance_every: int = 10,
        compact_level0_files: int = 8,
    ) -> None:
        self.operator = check_name(operator, "operator")
        self.partition = check_partition(partition)
        if filesystem is not None:
            self.fs, base = filesystem, state_location.rstrip("/")
        else:
            self.fs, base = open_filesystem(state_location)
        for name, value, low in (("keep_versions", keep_versions, 1),
                                 ("orphan_grace_ms", orphan_grace_ms, 0),
                                 ("lock_timeout_ms", lock_timeout_ms, 0),
                                 ("maintenance_every", maintenance_every, 0),
                                 ("compact_level0_files", compact_level0_files, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        self.keep_versions = keep_versions
        self.orphan_grace_ms = orphan_grace_ms
        self.lock_timeout_ms = lock_timeout_ms
        self.maintenance_every = maintenance_every
        self.compact_level0_files = compact_level0_files
        self.base = f"{base}/{self.operator}/{self.partition}"
        self._local_fs = isinstance(self.fs, pafs.LocalFileSystem)
        location_id = hashlib.sha1(state_location.encode()).hexdigest()[:16]
        root = Path(local_root) if local_root is not None else default_local_root()
        self.local = root / location_id / self.operator / str(self.partition)
        self.retention_ms = retention_ms
        self.segment_interval_ms = segment_interval_ms
        self.store: SessionStore | None = None
        self.metrics: dict[str, int] = dict.fromkeys(
            ("loads_reused", "loads_restored", "loads_resumed", "local_copies_discarded",
             "objects_uploaded", "bytes_uploaded", "objects_reused", "objects_preuploaded",
             "background_objects_uploaded", "background_bytes_uploaded", "background_failed",
             "objects_downloaded", "bytes_downloaded", "objects_linked_locally",
             "manifests_deleted", "orphans_deleted", "orphans_in_grace", "maintenance_skipped",
             "maintenance_failed"),
            0)
        self._loaded: dict[str, Any] | None = None  # the manifest the open store descends from
        self._loaded_batch: int | None = None
        self._lock_handle: FileLock | None = None
        # the compaction and upload started after the last commit, and what it uploaded:
        # local SST name -> (manifest entry, monotonic time the upload ended)
        self._background: threading.Thread | None = None
        self._stop_background = threading.Event()
        self._preuploaded: dict[str, tuple[dict[str, Any], float]] = {}

    # -- loading ----------------------------------------------------------------------------

    def load(self, version: int) -> SessionStore:
        """Open exactly ``version`` (the state after that batch; -1 is the empty state).

        Takes this partition's local lock for the provider's lifetime (until :meth:`close`).

        Raises:
            SnapshotError: there is no snapshot of ``version``.
            SnapshotCorruptedError: the snapshot is damaged (names the object); nothing local or
                remote has been changed.
            StateLockedError: another process holds this partition's working copy.
        """
        if isinstance(version, bool) or not isinstance(version, int) or version < -1:
            raise ValueError(f"version must be an int >= -1, got {version!r}")
        self._stop_background.set()
        self._join_background()
        self._preuploaded.clear()
        stale = _OPEN_STORES.pop(self.local, None)
        if stale is not None:
            stale.close()
        self._lock()
        try:
            self._clear_staging()
            manifest = self.read_manifest(version) if version >= 0 else None
            store = self._reuse_local(version, manifest) if manifest is not None else None
            if store is None:
                store = self._restore(version, manifest)
                self.metrics["loads_restored"] += 1
            else:
                self.metrics["loads_reused"] += 1
        except BaseException:
            self._unlock()
            raise
        _OPEN_STORES[self.local] = store
        self.store = store
        self._loaded = manifest
        self._loaded_batch = version
        return store

    def _lock(self) -> None:
        """Take the partition's lock, so that no other process restores over this working copy.

        While it waits, a :data:`RELEASE_REQUEST` file asks a process that only keeps the copy
        open between tasks to close it; a process working on it is never interrupted.
        """
        path = self.local / _LOCK_FILE
        stale = _HELD_LOCKS.pop(path, None)
        if stale is not None:  # a task of this worker process that failed without close()
            stale.close()
        self.local.mkdir(parents=True, exist_ok=True)
        lock = FileLock(path)
        deadline = time.monotonic() + self.lock_timeout_ms / 1000
        request = self.local / RELEASE_REQUEST
        try:
            while True:
                try:
                    lock.acquire()
                    break
                except LockHeldError as exc:
                    if time.monotonic() >= deadline:
                        raise StateLockedError(
                            exc.path, exc.holder_pid,
                            f"the working copy {self.local} of operator {self.operator!r} "
                            f"partition {self.partition} is held by another process "
                            f"({holder_description(exc.holder_pid)}, lock file {exc.path}; "
                            f"waited {self.lock_timeout_ms} ms); two tasks of one partition "
                            f"run on this host at once, and neither may touch the other's "
                            f"files") from None
                    # asked again on every poll: another waiter that got the lock first has
                    # withdrawn the request, and will keep the copy idle once its task is done
                    if not request.exists():
                        request.touch()
                    wake_keeper(self.local)
                    time.sleep(_LOCK_POLL_S)
        finally:
            # withdrawn whether this process asked or not: one left by a waiter that died would
            # make every kept copy close at once; a waiter still waiting asks again
            request.unlink(missing_ok=True)
        _HELD_LOCKS[path] = lock
        self._lock_handle = lock

    def holds_lock(self) -> bool:
        """Whether this provider's lock still guards its working copy: it holds one, and the lock
        file is the one it locked (not deleted since, say by an operator clearing the local
        directory)."""
        return self._lock_handle is not None and self._lock_handle.guards()

    def resume(self, version: int) -> bool:
        """Whether a provider kept open since it committed ``version`` may go on from its open
        store, exactly as if it had loaded ``version`` afresh.

        True only if it holds its lock, its store is open at ``version``, and the published
        snapshot of ``version`` is the one it committed: the same unique id (another attempt
        that published later makes it False) and the same files. False changes nothing; the
        caller then closes it and loads afresh, which raises any error the snapshot has.
        """
        store = self.store
        if store is None or self._loaded is None or self._loaded_batch != version \
                or version < 0 or not self.holds_lock():
            return False
        try:
            manifest = self.read_manifest(version)
        except SnapshotError:
            return False
        reason = self._lineage_mismatch(store.committed_metadata, store.committed_version,
                                        version, manifest) or self._files_mismatch(store, manifest)
        if reason is not None:
            log.info("not resuming the open store of %s partition %d: %s", self.operator,
                     self.partition, reason)
            return False
        self._loaded = manifest
        self.metrics["loads_resumed"] += 1
        return True

    def _unlock(self) -> None:
        if self._lock_handle is not None:
            path = self.local / _LOCK_FILE
            if _HELD_LOCKS.get(path) is self._lock_handle:  # not if a later task took it over
                del _HELD_LOCKS[path]
            self._lock_handle.release()
            self._lock_handle = None

    def _clear_staging(self) -> None:
        """Staging directories left by a killed restore; ours, since we hold the lock."""
        for entry in self.local.iterdir():
            if entry.name.startswith(_STAGING_PREFIX) and entry.is_dir():
                shutil.rmtree(entry)

    def _open_local(self, path: Path | None = None) -> SessionStore:
        return SessionStore(path or self.local / _STORE_DIR, retention_ms=self.retention_ms,
                            segment_interval_ms=self.segment_interval_ms,
                            auto_compaction=self.compact_level0_files == 0)

    def _reuse_local(self, version: int, manifest: dict[str, Any]) -> SessionStore | None:
        """The local copy, if it is exactly the published ``version``; else None.

        The copy's newest commit is read without opening RocksDB, so that a copy that is not
        reused is left exactly as it was until a verified restore replaces it.
        """
        versions = committed_versions(self.local / _STORE_DIR)
        if not versions:
            return None
        try:
            committed, _ = read_store_manifest(
                self.local / _STORE_DIR / CHECKPOINTS_DIR / version_dir_name(versions[-1]))
        except ValueError as exc:  # includes StoreCorruptedError: a restore replaces it
            log.warning("not reusing the local copy %s: %s", self.local, exc)
            self.metrics["local_copies_discarded"] += 1
            return None
        reason = self._lineage_mismatch(committed.metadata, committed.version, version, manifest)
        store = None
        if reason is None:
            try:
                store = self._open_local()
            except ValueError as exc:
                reason = str(exc)
        if reason is None:
            assert store is not None
            reason = self._files_mismatch(store, manifest)
            if reason is None:
                return store
            store.close()
        log.info("not reusing the local copy of %s partition %d: %s", self.operator,
                 self.partition, reason)
        self.metrics["local_copies_discarded"] += 1
        return None

    @staticmethod
    def _lineage_mismatch(metadata: Any, store_version: int, version: int,
                          manifest: dict[str, Any]) -> str | None:
        meta = spark_metadata(metadata)
        if meta.get("batch") != version:
            return f"it holds batch {meta.get('batch')!r}, not {version}"
        if meta.get("id") != manifest["id"]:
            return (f"it holds version id {meta.get('id')!r}, but {manifest['id']!r} is "
                    f"published (another attempt of batch {version} published last)")
        if store_version != manifest["store_version"]:
            return f"store version {store_version} != {manifest['store_version']}"
        return None

    @staticmethod
    def _files_mismatch(store: SessionStore, manifest: dict[str, Any]) -> str | None:
        expected = {name: entry["size"] for name, entry in manifest["files"].items()
                    if "object" in entry}
        present = {entry.name: entry.stat().st_size for entry in os.scandir(
            store.checkpoint_path()) if entry.name.endswith(_IMMUTABLE_SUFFIXES)}
        if present != expected:
            return "its SST files differ from the manifest's"
        return None

    def _restore(self, version: int, manifest: dict[str, Any] | None) -> SessionStore:
        """Build ``version`` in a staging directory, verify it, then swap it in."""
        staging = self.local / f"{_STAGING_PREFIX}{uuid.uuid4().hex}"
        try:
            staged = staging / _STORE_DIR
            staged.mkdir(parents=True)
            if manifest is not None:
                self._stage_files(version, manifest, staged)
                self._verify_staged(version, manifest, staged)
            current = self.local / _STORE_DIR
            if current.exists():
                shutil.rmtree(current)
            os.rename(staged, current)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        if manifest is not None:
            log.info("restored %s partition %d at batch %d (id %s) from %s", self.operator,
                     self.partition, version, manifest["id"], self.base)
        return self._open_local()

    def _stage_files(self, version: int, manifest: dict[str, Any], staged: Path) -> None:
        """Write every file of ``version`` into ``staged``: SST files the working copy already
        holds (same name, size and SHA-256) are linked from it, the others downloaded (in
        parallel), the small mutable files decoded from the manifest. All verified."""
        checkpoint = staged / CHECKPOINTS_DIR / version_dir_name(manifest["store_version"])
        checkpoint.mkdir(parents=True)
        manifest_path = self._manifest_path(version)
        held = self._local_immutable_files()
        downloads = []
        for name, entry in sorted(manifest["files"].items()):
            target = checkpoint / name
            if "object" in entry:
                if not self._link_local(held.get(name), entry, target):
                    downloads.append((self._object_path(entry["object"]), entry, target))
            else:
                try:
                    data = base64.b64decode(entry["data"], validate=True)
                except (binascii.Error, ValueError):
                    raise SnapshotCorruptedError(
                        manifest_path, f"inline file {name} is not valid base64") from None
                if len(data) != entry["size"] or hashlib.sha256(data).hexdigest() \
                        != entry["sha256"]:
                    raise SnapshotCorruptedError(
                        manifest_path, f"inline file {name} does not match its recorded size "
                                       f"and SHA-256")
                target.write_bytes(data)
        self._download_all(downloads, version)
        # the snapshot is the store's committed version: point the restored store at it
        if manifest["store_version"] > 0:
            write_pointer(staged, manifest["store_version"])

    def _local_immutable_files(self) -> dict[str, Path]:
        """The SST files of the working copy's committed versions, by name (read, never
        changed: a restore that fails leaves the working copy as it was)."""
        store = self.local / _STORE_DIR
        held: dict[str, Path] = {}
        for committed in committed_versions(store):
            with contextlib.suppress(OSError):
                for entry in os.scandir(store / CHECKPOINTS_DIR / version_dir_name(committed)):
                    if entry.name.endswith(_IMMUTABLE_SUFFIXES):
                        held[entry.name] = Path(entry.path)
        return held

    def _link_local(self, source: Path | None, entry: dict[str, Any], target: Path) -> bool:
        """Link ``source`` to ``target`` if its size and SHA-256 are the manifest's ``entry``
        (the same bytes, whatever lineage wrote them); False (nothing done) otherwise, and for
        a damaged local file, which the restore then downloads instead."""
        if source is None:
            return False
        try:
            if source.stat().st_size != entry["size"] \
                    or file_digest(source).hex() != entry["sha256"]:
                return False
            try:
                os.link(source, target)
            except OSError:  # another file system, or no hard links: a copy will do
                shutil.copyfile(source, target)
        except OSError:
            return False
        self.metrics["objects_linked_locally"] += 1
        return True

    def _download_all(self, downloads: list[tuple[str, dict[str, Any], Path]],
                      version: int) -> None:
        """Download and verify objects, a few at a time; raise the error of the first one (in
        the manifest's order) that failed, once every download has ended."""
        if not downloads:
            return
        workers = min(_DOWNLOAD_THREADS, len(downloads))
        with concurrent.futures.ThreadPoolExecutor(
                max_workers=workers, thread_name_prefix="sessionstore-restore") as pool:
            futures = [pool.submit(self._download_verified, source, entry, target, version)
                       for source, entry, target in downloads]
        for future in futures:
            error = future.exception()
            if error is not None:
                raise error
        self.metrics["objects_downloaded"] += len(downloads)
        self.metrics["bytes_downloaded"] += sum(entry["size"] for _, entry, _ in downloads)

    def _download_verified(self, source: str, entry: dict[str, Any], target: Path,
                           version: int) -> None:
        digest = hashlib.sha256()
        size = 0
        try:
            with self.fs.open_input_file(source) as src, open(target, "wb") as dst:
                while chunk := src.read(_CHUNK):
                    digest.update(chunk)
                    size += len(chunk)
                    dst.write(chunk)
        except FileNotFoundError:
            raise SnapshotCorruptedError(
                source, f"missing, but the snapshot of batch {version} references it") from None
        except OSError as exc:
            raise SnapshotError(f"cannot read {source}: {exc}") from None
        if size != entry["size"]:
            raise SnapshotCorruptedError(
                source, f"{size} bytes, the manifest of batch {version} records {entry['size']}")
        if digest.hexdigest() != entry["sha256"]:
            raise SnapshotCorruptedError(
                source, f"SHA-256 differs from the one the manifest of batch {version} records")

    def _verify_staged(self, version: int, manifest: dict[str, Any], staged: Path) -> None:
        """Open the staged copy and check it holds what the manifest says it must."""
        manifest_path = self._manifest_path(version)
        try:
            store = self._open_local(staged)
        except StoreCorruptedError as exc:
            raise SnapshotCorruptedError(manifest_path, f"restores a damaged store: "
                                                        f"{exc.detail}") from None
        except ValueError as exc:
            raise SnapshotCorruptedError(manifest_path, f"restores a store that does not open: "
                                                        f"{exc}") from None
        try:
            meta = spark_metadata(store.committed_metadata)
            facts = {
                "batch": (meta.get("batch"), version),
                "version id": (meta.get("id"), manifest["id"]),
                "store version": (store.committed_version, manifest["store_version"]),
                "segments": (store.live_segments(), sorted(manifest["segments"])),
            }
            for fact, (found, recorded) in facts.items():
                if found != recorded:
                    raise SnapshotCorruptedError(
                        manifest_path, f"restores {fact} {found!r}, the manifest records "
                                       f"{recorded!r}")
        finally:
            store.close()

    def _manifest_path(self, version: int) -> str:
        return f"{self.base}/manifests/{version}.json"

    def _object_path(self, name: str) -> str:
        return f"{self.base}/sst/{name}"

    def read_manifest(self, version: int) -> dict[str, Any]:
        """The verified manifest of ``version``.

        Raises:
            SnapshotError: it does not exist (the state location is incomplete or wrong).
            SnapshotCorruptedError: it is damaged.
        """
        path = self._manifest_path(version)
        try:
            raw = read_object(self.fs, path)
        except FileNotFoundError:
            raise SnapshotError(
                f"no snapshot of batch {version} for operator {self.operator!r} partition "
                f"{self.partition} at {path}: the state location is incomplete or wrong"
            ) from None
        return validate_manifest(unseal(raw, path), path, version)

    # -- committing -------------------------------------------------------------------------

    def commit(self, engine_commit: Callable[[dict[str, Any]], Any], version: int,
               extra: dict[str, Any] | None = None) -> str:
        """Commit ``version`` through ``engine_commit(metadata)`` and publish its snapshot.

        The snapshot's manifest is written once every object it references is stored, so a
        version is restorable as soon as this returns. The commit uploads only the SST files
        that no earlier version of this lineage uploaded (the ones the batch flushed); files a
        background compaction wrote since the previous commit were uploaded by that
        compaction's thread, which this commit waits for first. Once the manifest is out, a
        new background compaction starts when a segment holds ``compact_level0_files``
        sorted runs.

        Args:
            engine_commit: commits the store with the given user metadata (for example
                ``SessionAggregator.commit``).
            version: the batch; must be one more than the version loaded.
            extra: more metadata to keep with the version (running totals and the like).

        Returns:
            The new version's unique id.
        """
        if self.store is None or self._loaded_batch is None:
            raise RuntimeError("commit() before load()")
        if version != self._loaded_batch + 1:
            raise ValueError(f"version must be {self._loaded_batch + 1} (one more than the "
                             f"version loaded), got {version!r}")
        self._join_background()
        if self.compact_level0_files:
            self.store.compact_segments(_FOREGROUND_COMPACTION_FACTOR * self.compact_level0_files)
        new_id = uuid.uuid4().hex
        parent = self._loaded["id"] if self._loaded is not None else None
        spark_meta = {**(extra or {}), "batch": version, "id": new_id, "parent": parent}
        engine_commit({SPARK_METADATA_KEY: spark_meta})
        try:
            self._loaded = self._upload(version, spark_meta)
        finally:
            self._preuploaded.clear()  # referenced now, or orphans for maintenance
        self._loaded_batch = version
        self._start_background()
        if self.maintenance_every and version % self.maintenance_every == 0:
            try:
                self.maintenance()
            except OSError as exc:  # the version is published; a later run cleans up instead
                log.warning("maintenance of %s failed: %s", self.base, exc)
                self.metrics["maintenance_failed"] += 1
        return new_id

    def _upload(self, version: int, spark_meta: dict[str, Any]) -> dict[str, Any]:
        assert self.store is not None
        checkpoint = self.store.checkpoint_path()
        known = self._loaded["files"] if self._loaded is not None else {}
        digests = read_store_manifest(checkpoint)[1].files if self._preuploaded else {}
        # maintenance deletes an unreferenced object once it is orphan_grace_ms old: an object
        # uploaded in the background is referenced only while it is well within that age
        fresh_after = time.monotonic() - self.orphan_grace_ms / 2000
        preuploaded_before = self.metrics["objects_preuploaded"]
        self.fs.create_dir(f"{self.base}/sst", recursive=True)
        self.fs.create_dir(f"{self.base}/manifests", recursive=True)
        files: dict[str, dict[str, Any]] = {}
        uploads: list[tuple[str, str]] = []  # (local path, name): copied below, in parallel
        for entry in sorted(os.scandir(checkpoint), key=lambda e: e.name):
            if not entry.is_file():
                raise SnapshotError(f"unexpected directory {entry.path} in a checkpoint")
            if entry.name.endswith(_IMMUTABLE_SUFFIXES):
                previous = known.get(entry.name)
                # RocksDB never reuses a file number within one lineage, and the loaded
                # manifest is this copy's own lineage, so a name (and size) match is the file
                early = self._preuploaded.get(entry.name)
                if previous is not None and "object" in previous \
                        and previous["size"] == entry.stat().st_size:
                    files[entry.name] = previous
                    self.metrics["objects_reused"] += 1
                elif early is not None and early[1] >= fresh_after \
                        and entry.name in digests \
                        and (early[0]["size"], early[0]["sha256"]) \
                        == (digests[entry.name][0], digests[entry.name][1].hex()):
                    # the bytes the checkpoint records, uploaded while the batch ran
                    files[entry.name] = early[0]
                    self.metrics["objects_preuploaded"] += 1
                else:
                    uploads.append((entry.path, entry.name))
            else:
                data = Path(entry.path).read_bytes()
                files[entry.name] = {"size": len(data),
                                     "sha256": hashlib.sha256(data).hexdigest(),
                                     "data": base64.b64encode(data).decode()}
        files.update(self._upload_objects(uploads))
        body = {
            "batch": version,
            "id": spark_meta["id"],
            "parent": spark_meta["parent"],
            "store_version": self.store.committed_version,
            "segments": self.store.live_segments(),
            "files": files,
            SPARK_METADATA_KEY: spark_meta,
        }
        # the new objects' directory entries are durable before the manifest naming them is
        fresh = uploads or self.metrics["objects_preuploaded"] > preuploaded_before
        publish_object(self.fs, self._manifest_path(version), seal(body),
                       (f"{self.base}/sst",) if fresh and self._local_fs else ())
        return body

    def _upload_objects(self, uploads: list[tuple[str, str]]) -> dict[str, dict[str, Any]]:
        """Upload ``(local path, name)`` pairs, a few at a time (their writes and syncs
        overlap); return each name's manifest entry once all are stored. Raises the error of
        the first that failed (in the given order), once every upload has ended."""
        if len(uploads) <= 1:
            return {name: self._upload_object(path, name) for path, name in uploads}
        with concurrent.futures.ThreadPoolExecutor(
                max_workers=min(_UPLOAD_THREADS, len(uploads)),
                thread_name_prefix="sessionstore-upload") as pool:
            futures = [(name, pool.submit(self._copy_object, path, name))
                       for path, name in uploads]
        entries = {name: future.result() for name, future in futures}
        self.metrics["objects_uploaded"] += len(entries)
        self.metrics["bytes_uploaded"] += sum(entry["size"] for entry in entries.values())
        return entries

    def _upload_object(self, source: str, name: str, counters: str = "") -> dict[str, Any]:
        """:meth:`_copy_object`, counted in ``metrics[counters + "objects_uploaded"]`` and
        ``...bytes_uploaded``."""
        entry = self._copy_object(source, name)
        self.metrics[f"{counters}objects_uploaded"] += 1
        self.metrics[f"{counters}bytes_uploaded"] += entry["size"]
        return entry

    def _copy_object(self, source: str, name: str) -> dict[str, Any]:
        """Copy an immutable file to a fresh object name, hashing it on the way (synced, on a
        local file system); return its manifest entry. Safe to run in several threads."""
        stem, dot, ext = name.rpartition(".")
        remote = f"{stem}-{uuid.uuid4().hex[:16]}{dot}{ext}"
        target = self._object_path(remote)
        digest = hashlib.sha256()
        size = 0
        local = self._local_fs
        # a copy, never a hard link: the snapshot must not share an inode with the working copy
        with open(source, "rb") as src, \
                (open(target, "wb") if local else self.fs.open_output_stream(target)) as dst:
            while chunk := src.read(_CHUNK):
                digest.update(chunk)
                size += len(chunk)
                dst.write(chunk)
            if local:
                dst.flush()
                os.fsync(dst.fileno())
        return {"object": remote, "size": size, "sha256": digest.hexdigest()}

    # -- background compaction ----------------------------------------------------------------

    def _start_background(self) -> None:
        """After a published commit: compact and upload in a thread (see :meth:`commit`)."""
        if self.compact_level0_files == 0 or self.store is None or self._loaded is None:
            return
        uploaded = {name for name, entry in self._loaded["files"].items() if "object" in entry}
        self._stop_background.clear()
        self._background = threading.Thread(
            target=self._compact_and_upload, args=(self.store, uploaded),
            name="sessionstore-snapshot-compaction", daemon=True)
        self._background.start()

    def _compact_and_upload(self, store: SessionStore, uploaded: set[str]) -> None:
        """Compact the segments that reached the threshold, then upload every SST file of the
        working copy that is not uploaded yet (the compaction's output). Only objects whose
        upload completed are recorded; a failure is logged and counted, and the next commit
        uploads what is missing itself."""
        try:
            if not store.compact_segments(self.compact_level0_files):
                return
            for path in store.live_files():
                if self._stop_background.is_set():
                    return  # closing: the working copy's reopen would discard this compaction
                if path.name in uploaded:
                    continue
                try:
                    entry = self._upload_object(str(path), path.name, "background_")
                except FileNotFoundError:  # compacted away meanwhile: nothing will need it
                    continue
                self._preuploaded[path.name] = (entry, time.monotonic())
        except Exception as exc:  # noqa: BLE001 - the next commit uploads what is missing
            log.warning("background compaction of %s failed: %s", self.base, exc)
            self.metrics["background_failed"] += 1

    def _join_background(self) -> None:
        """Wait for the background compaction and upload, if one runs."""
        if self._background is not None:
            self._background.join()
            self._background = None

    # -- maintenance ------------------------------------------------------------------------

    def versions(self) -> list[int]:
        """Batches with a published snapshot, ascending."""
        selector = pafs.FileSelector(f"{self.base}/manifests", allow_not_found=True)
        found = []
        for info in self.fs.get_file_info(selector):
            match = _MANIFEST_NAME.match(info.base_name)
            if match:
                found.append(int(match.group(1)))
        return sorted(found)

    def maintenance(self, now_ms: int | None = None) -> dict[str, int]:
        """Keep the newest ``keep_versions`` snapshots; delete older manifests, and SST objects
        that no kept manifest references once they are older than ``orphan_grace_ms``.

        Deletes nothing at all while a kept manifest cannot be read or verified (it is logged
        and counted in ``maintenance_skipped``): its references are unknown.

        Args:
            now_ms: the current wall-clock time in ms (default: now); object ages are measured
                against it.

        Returns:
            Counts of this run: ``manifests_deleted``, ``orphans_deleted``, ``orphans_in_grace``.
        """
        now = int(time.time() * 1000) if now_ms is None else now_ms
        run = {"manifests_deleted": 0, "orphans_deleted": 0, "orphans_in_grace": 0}
        versions = self.versions()
        kept = versions[-self.keep_versions:]
        referenced: set[str] = set()
        for version in kept:
            try:
                manifest = self.read_manifest(version)
            except SnapshotError as exc:
                log.warning("maintenance of %s skipped: %s", self.base, exc)
                self.metrics["maintenance_skipped"] += 1
                return run
            referenced.update(e["object"] for e in manifest["files"].values() if "object" in e)
        for old in versions[: -self.keep_versions]:
            with contextlib.suppress(FileNotFoundError):  # another maintainer was faster
                self.fs.delete_file(self._manifest_path(old))
                run["manifests_deleted"] += 1
        cutoff = now - self.orphan_grace_ms
        leftovers = [info for info in self.fs.get_file_info(
            pafs.FileSelector(f"{self.base}/manifests", allow_not_found=True))
            if info.base_name.endswith(".tmp")]
        candidates = [info for info in self.fs.get_file_info(
            pafs.FileSelector(f"{self.base}/sst", allow_not_found=True))
            if info.base_name not in referenced] + leftovers
        for info in candidates:
            mtime = info.mtime_ns // 1_000_000 if info.mtime_ns is not None else now
            if mtime > cutoff:
                run["orphans_in_grace"] += 1
                continue
            with contextlib.suppress(FileNotFoundError):
                self.fs.delete_file(info.path)
                run["orphans_deleted"] += 1
        for name, count in run.items():
            self.metrics[name] += count
        return run

    def close(self) -> None:
        """Close the store (uncommitted writes are discarded) and release the partition lock.

        Stops a background upload after its current object and waits for it (the compaction
        would be lost anyway: a reopen starts from the committed checkpoint)."""
        try:
            self._stop_background.set()
            self._join_background()
            self._preuploaded.clear()
            if self.store is not None:
                _OPEN_STORES.pop(self.local, None)
                self.store.close()
                self.store = None
        finally:
            self._unlock()


def default_local_root() -> Path:
    """Working copies go under SESSIONSTORE_SPARK_LOCAL_DIR, else the temp directory."""
    configured = os.environ.get("SESSIONSTORE_SPARK_LOCAL_DIR")
    return Path(configured) if configured else Path(tempfile.gettempdir()) / "sessionstore-spark"
