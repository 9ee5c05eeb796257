"""A StateStoreProvider-style, versioned, per-partition session store for Spark executors.

One :class:`~sessionstore.SessionStore` lives on the executor's local disk per (state location,
operator, partition). Version ``b`` is the state after micro-batch ``b``:

* :meth:`SessionStoreProvider.load` opens exactly version ``batch_id - 1``. It reuses the local
  working copy when that copy is at that version and otherwise restores the snapshot from the
  state location; it never loads "latest", and a missing snapshot is an error.
* :meth:`SessionStoreProvider.commit` commits version ``batch_id`` locally and writes its snapshot.

Snapshots live under ``<state_location>/<operator>/<partition>/`` on any ``pyarrow.fs`` file
system (local, HDFS, S3)::

    sst/<name>-<unique>.sst         immutable RocksDB files, shared between versions
    manifests/<batch>.json          one per version, written last and atomically

A manifest lists the SST objects of its version and carries the few small mutable RocksDB files
inline, so that writing it is the single atomic step that publishes a version. Maintenance keeps
the newest ``keep_versions`` manifests and deletes SST objects no kept manifest references.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs

from sessionstore import SessionStore
from sessionstore.store.rocksdb import version_dir_name

log = logging.getLogger(__name__)

SNAPSHOT_FORMAT = 1
SPARK_METADATA_KEY = "spark"
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_MANIFEST_NAME = re.compile(r"^(\d{1,19})\.json$")
_SST_MAP = "sst-map.json"
_OPEN_STORES: dict[Path, SessionStore] = {}  # per worker process: closes handles a failed task left


class SnapshotError(ValueError):
    """A snapshot is missing, corrupted or of an unknown format."""


def check_name(value: Any, name: str) -> str:
    """Operator ids and the like must be plain names: no path can escape the state location."""
    if not isinstance(value, str) or not _SAFE_NAME.match(value) or ".." in value:
        raise ValueError(
            f"{name} must be 1-128 characters of letters, digits, '_', '-' or '.', "
            f"not starting with a dot and without '..', got {value!r}"
        )
    return value


def check_partition(value: Any) -> int:
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


class SessionStoreProvider:
    """Versioned snapshots of one partition's session store. See the module docstring.

    Args:
        state_location: path or ``pyarrow.fs`` URI shared by driver and executors.
        operator: the operator's id (a plain name).
        partition: the Spark partition id.
        local_root: where executors keep working copies.
        retention_ms, segment_interval_ms: passed to :class:`~sessionstore.SessionStore`.
        keep_versions: how many versions maintenance keeps (Spark's ``minBatchesToRetain``).
        filesystem: an explicit ``pyarrow.fs.FileSystem`` (then ``state_location`` is its path).
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
    ) -> None:
        self.operator = check_name(operator, "operator")
        self.partition = check_partition(partition)
        if filesystem is not None:
            self.fs, base = filesystem, state_location.rstrip("/")
        else:
            self.fs, base = open_filesystem(state_location)
        if isinstance(keep_versions, bool) or not isinstance(keep_versions, int) \
                or keep_versions < 1:
            raise ValueError(f"keep_versions must be an int >= 1, got {keep_versions!r}")
        self.keep_versions = keep_versions
        self.base = f"{base}/{self.operator}/{self.partition}"
        location_id = hashlib.sha1(state_location.encode()).hexdigest()[:16]
        root = Path(local_root) if local_root is not None else default_local_root()
        self.local = root / location_id / self.operator / str(self.partition)
        self.retention_ms = retention_ms
        self.segment_interval_ms = segment_interval_ms
        self.store: SessionStore | None = None

    # -- loading ----------------------------------------------------------------------------

    def load(self, version: int) -> SessionStore:
        """Open exactly ``version`` (the state after that batch; -1 is the empty state).

        Raises:
            SnapshotError: the snapshot of ``version`` is missing or corrupted.
        """
        stale = _OPEN_STORES.pop(self.local, None)
        if stale is not None:
            stale.close()
        store = self._reuse_local(version)
        if store is None:
            store = self._restore(version)
        _OPEN_STORES[self.local] = store
        self.store = store
        return store

    def _open_local(self) -> SessionStore:
        return SessionStore(self.local / "store", retention_ms=self.retention_ms,
                            segment_interval_ms=self.segment_interval_ms)

    def _reuse_local(self, version: int) -> SessionStore | None:
        if not (self.local / "store").is_dir():
            return None
        try:
            store = self._open_local()
        except ValueError as exc:
            log.warning("discarding the local copy %s: %s", self.local, exc)
            return None
        if batch_of(store.committed_metadata) == version:
            return store
        store.close()
        return None

    def _restore(self, version: int) -> SessionStore:
        if self.local.exists():
            shutil.rmtree(self.local)
        (self.local / "store").mkdir(parents=True)
        if version < 0:
            self._write_sst_map({})
            return self._open_local()
        manifest = self.read_manifest(version)
        checkpoint = self.local / "store" / "checkpoints" / version_dir_name(manifest["store_version"])
        checkpoint.mkdir(parents=True)
        sst_map = {}
        for local_name, remote in manifest["sst"].items():
            target = checkpoint / check_file_name(local_name)
            self._download(f"{self.base}/sst/{check_file_name(remote)}", target, version)
            sst_map[local_name] = remote
        for local_name, payload in manifest["files"].items():
            (checkpoint / check_file_name(local_name)).write_bytes(base64.b64decode(payload))
        self._write_sst_map(sst_map)
        store = self._open_local()
        if batch_of(store.committed_metadata) != version:
            store.close()
            raise SnapshotError(
                f"snapshot {self._manifest_path(version)} restores batch "
                f"{batch_of(store.committed_metadata)}, not {version}"
            )
        log.info("restored %s partition %d at batch %d from %s", self.operator, self.partition,
                 version, self.base)
        return store

    def _download(self, source: str, target: Path, version: int) -> None:
        try:
            with self.fs.open_input_file(source) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
        except FileNotFoundError:
            raise SnapshotError(
                f"snapshot of batch {version} references {source}, which is missing"
            ) from None
        except OSError as exc:
            raise SnapshotError(f"cannot read {source}: {exc}") from None

    def _manifest_path(self, version: int) -> str:
        return f"{self.base}/manifests/{version}.json"

    def read_manifest(self, version: int) -> dict[str, Any]:
        """The validated manifest of ``version``. Raises SnapshotError."""
        path = self._manifest_path(version)
        try:
            with self.fs.open_input_file(path) as handle:
                raw = handle.read()
        except FileNotFoundError:
            raise SnapshotError(
                f"no snapshot of batch {version} for operator {self.operator!r} partition "
                f"{self.partition} at {path}: the state location is incomplete or wrong"
            ) from None
        try:
            manifest = json.loads(raw)
            fmt = manifest["format"]
        except (ValueError, KeyError, TypeError) as exc:
            raise SnapshotError(f"corrupted snapshot manifest {path}: {exc}") from None
        if fmt != SNAPSHOT_FORMAT:
            raise SnapshotError(
                f"snapshot manifest {path} has format {fmt!r}; this version reads "
                f"{SNAPSHOT_FORMAT}"
            )
        if not (isinstance(manifest.get("sst"), dict) and isinstance(manifest.get("files"), dict)
                and manifest.get("batch") == version
                and isinstance(manifest.get("store_version"), int)):
            raise SnapshotError(f"corrupted snapshot manifest {path}: missing fields")
        return dict(manifest)

    # -- committing -------------------------------------------------------------------------

    def commit(self, engine_commit: Any, version: int, extra: dict[str, Any] | None = None) -> None:
        """Commit ``version`` through ``engine_commit(metadata)`` and publish its snapshot."""
        assert self.store is not None, "load() first"
        metadata = {SPARK_METADATA_KEY: {"batch": version, **(extra or {})}}
        engine_commit(metadata)
        self._upload(version, metadata[SPARK_METADATA_KEY])
        if version % 10 == 0:
            self.maintenance()

    def _upload(self, version: int, spark_metadata: dict[str, Any]) -> None:
        assert self.store is not None
        checkpoint = self.store.checkpoint_path()
        sst_map = self._read_sst_map()
        self.fs.create_dir(f"{self.base}/sst", recursive=True)
        self.fs.create_dir(f"{self.base}/manifests", recursive=True)
        listed: dict[str, str] = {}
        inline: dict[str, str] = {}
        for entry in sorted(os.scandir(checkpoint), key=lambda e: e.name):
            if entry.name.endswith((".sst", ".blob")):
                remote = sst_map.get(entry.name)
                if remote is None:
                    stem, dot, ext = entry.name.rpartition(".")
                    remote = f"{stem}-{uuid.uuid4().hex[:12]}{dot}{ext}"
                    self._put_immutable(entry.path, f"{self.base}/sst/{remote}")
                    sst_map[entry.name] = remote
                listed[entry.name] = remote
            else:
                inline[entry.name] = base64.b64encode(Path(entry.path).read_bytes()).decode()
        manifest = {
            "format": SNAPSHOT_FORMAT,
            "batch": version,
            "store_version": self.store.committed_version,
            "sst": listed,
            "files": inline,
            "spark": spark_metadata,
        }
        self._publish(self._manifest_path(version), json.dumps(manifest).encode())
        self._write_sst_map({k: v for k, v in sst_map.items() if k in listed})

    def _put_immutable(self, source: str, target: str) -> None:
        """Copy an immutable file to the state location; a hard link when both are local."""
        if isinstance(self.fs, pafs.LocalFileSystem):
            try:
                os.link(source, target)
                return
            except OSError:
                pass  # another file system, or links not allowed: copy
        with open(source, "rb") as src, self.fs.open_output_stream(target) as dst:
            shutil.copyfileobj(src, dst, 1 << 20)

    def _publish(self, path: str, data: bytes) -> None:
        """Write ``data`` so that readers see all of it or nothing."""
        if isinstance(self.fs, pafs.LocalFileSystem):
            tmp = f"{path}.{uuid.uuid4().hex}.tmp"
            with self.fs.open_output_stream(tmp) as handle:
                handle.write(data)
            os.replace(tmp, path)  # atomic on one local file system
        else:  # object stores: a single-object PUT is atomic
            with self.fs.open_output_stream(path) as handle:
                handle.write(data)

    def _read_sst_map(self) -> dict[str, str]:
        path = self.local / _SST_MAP
        if not path.exists():
            return {}
        loaded: dict[str, str] = json.loads(path.read_text())
        return loaded

    def _write_sst_map(self, sst_map: dict[str, str]) -> None:
        self.local.mkdir(parents=True, exist_ok=True)
        (self.local / _SST_MAP).write_text(json.dumps(sst_map))

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

    def maintenance(self) -> None:
        """Keep the newest ``keep_versions`` snapshots; delete older ones and orphaned SSTs."""
        versions = self.versions()
        for old in versions[: -self.keep_versions]:
            self.fs.delete_file(self._manifest_path(old))
        referenced: set[str] = set()
        for version in versions[-self.keep_versions:]:
            try:
                referenced.update(self.read_manifest(version)["sst"].values())
            except SnapshotError:
                return  # never delete files while a manifest cannot be read
        selector = pafs.FileSelector(f"{self.base}/sst", allow_not_found=True)
        for info in self.fs.get_file_info(selector):
            if info.base_name not in referenced:
                self.fs.delete_file(info.path)

    def close(self) -> None:
        if self.store is not None:
            _OPEN_STORES.pop(self.local, None)
            self.store.close()
            self.store = None


def check_file_name(name: Any) -> str:
    """A file name read from a manifest must be a plain name, never a path."""
    if not isinstance(name, str) or not _SAFE_NAME.match(name) or "/" in name or ".." in name:
        raise SnapshotError(f"corrupted snapshot manifest: bad file name {name!r}")
    return name


def batch_of(committed_metadata: Any) -> int | None:
    """The Spark batch a committed store holds, from the engine's user metadata."""
    if isinstance(committed_metadata, dict):
        user = committed_metadata.get("user")
        if isinstance(user, dict):
            spark = user.get(SPARK_METADATA_KEY)
            if isinstance(spark, dict) and isinstance(spark.get("batch"), int):
                return int(spark["batch"])
    return None


def default_local_root() -> Path:
    """Working copies go under SESSIONSTORE_SPARK_LOCAL_DIR, else the temp directory."""
    configured = os.environ.get("SESSIONSTORE_SPARK_LOCAL_DIR")
    return Path(configured) if configured else Path(tempfile.gettempdir()) / "sessionstore-spark"
