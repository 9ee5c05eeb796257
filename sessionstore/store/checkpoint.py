"""The on-disk form of a committed version, and the checks that keep damage from reading as less data.

A store directory holds ``checkpoints/v<12 digits>/``, one RocksDB checkpoint per committed
version, each with a ``SESSIONSTORE-MANIFEST``, and a ``COMMITTED`` pointer naming the latest
committed version. This module is the one place that knows that form:

* the pointer (``MAGIC || SHA-256(body) || body``, replaced atomically and fsynced) is the commit
  point: the store knows its latest version without trusting the directory listing, so a deleted
  or damaged newest checkpoint, or a pointer rolled back behind a newer checkpoint, is an error
  and never an older, smaller answer (:func:`locate_committed`);

* the manifest file is ``MAGIC || SHA-256(body) || body`` with a msgpack body, so a flipped bit or
  a truncation anywhere in it is detected before a single field is trusted;
* the manifest records what the version must contain (:class:`CheckpointContents`): the size and
  SHA-256 of every other file of the checkpoint, RocksDB's last sequence number and the column
  families. Opening checks all of it and, when a check fails, leaves the directory as it was;
* RocksDB errors met while reading (a block checksum mismatch, a missing file) become
  :class:`~sessionstore.errors.StoreCorruptedError` naming the file.

Every failure here is a ``StoreCorruptedError`` except a manifest of another format version, which
is a plain ``ValueError``: that store is not damaged, only unreadable by this release.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import rocksdict

from ..errors import StoreCorruptedError
from ..fsutil import fsync_dir
from .base import READABLE_FORMAT_VERSIONS, STORE_FORMAT_VERSION, CommittedState

MANIFEST_NAME = "SESSIONSTORE-MANIFEST"
CHECKPOINTS_DIR = "checkpoints"
STAGING_PREFIX = ".staging-"
DELETING_PREFIX = ".deleting-"
VERSION_DIR = re.compile(r"^v(\d{12})$")
# What a commit may leave behind when interrupted: a checkpoint being built or being deleted,
# and RocksDB's own work directory for a checkpoint it is building ("<target>.tmp", renamed to
# the target when done; a kill inside create_checkpoint leaves it, holding SSTs by hard link).
LEFTOVER_DIR = re.compile(r"^\.(?:staging|deleting)-v\d{12}(?:\.tmp)?$")
SEGMENT_CF_PREFIX = "seg"
POINTER_NAME = "COMMITTED"
POINTER_TEMP = "COMMITTED.tmp"

_MAGIC = b"SSMF"
_DIGEST_SIZE = 32  # SHA-256
_HEADER = len(_MAGIC) + _DIGEST_SIZE
_POINTER_MAGIC = b"SSCV"
_POINTER_FORMAT = 1
_READ_CHUNK = 1 << 20
# RocksDB names the damaged file in its message; the path is what the operator needs.
_ROCKSDB_FILE = re.compile(r"(/[^\s:]*?\.(?:sst|blob|log)|/[^\s:]*?MANIFEST-\d+|/[^\s:]*?CURRENT"
                           r"|/[^\s:]*?OPTIONS-\d+)\b")
_IMMUTABLE_SUFFIXES = (".sst", ".blob")
# RocksDB "IO error"s that say nothing about the files' contents.
_RESOURCE_ERRORS = ("No space left", "Read-only file system", "Permission denied",
                    "Too many open files", "Disk quota exceeded")


def version_dir_name(version: int) -> str:
    """The checkpoint directory name of a version."""
    return f"v{version:012d}"


def committed_versions(store_path: str | os.PathLike[str]) -> list[int]:
    """The versions with a checkpoint directory under ``store_path``, ascending.

    Only lists: other entries in ``checkpoints/`` (an interrupted commit, an operator's backup)
    are left alone.
    """
    root = Path(store_path) / CHECKPOINTS_DIR
    if not root.is_dir():
        return []
    found = []
    for entry in os.scandir(root):
        match = VERSION_DIR.match(entry.name)
        if match:
            found.append(int(match.group(1)))
    return sorted(found)


def file_digest(path: str | os.PathLike[str]) -> bytes:
    """SHA-256 of a file's bytes (about 1 GB/s on this machine kind, with SHA extensions)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_READ_CHUNK):
            digest.update(chunk)
    return digest.digest()


@dataclass(frozen=True)
class CheckpointContents:
    """What one committed version must contain, recorded in its manifest and checked on open.

    Attributes:
        sequence: RocksDB's last sequence number at the checkpoint. A RocksDB MANIFEST that lost
            records (truncated, or an older copy) opens with a smaller one.
        column_families: every column family, ``default`` and one ``seg<id>`` per live segment.
        files: every file of the checkpoint except the manifest: name -> (size, SHA-256).
        pointer: the version was committed through the ``COMMITTED`` pointer, so the store must
            have one (False for stores written before the pointer existed).
        expired: the column families of ``column_families`` that hold expired segments: expiry
            removed them before the commit, and the writer drops them from RocksDB after it (off
            the commit's path), so the checkpoint may still hold them. Opening never counts
            them as live (see :func:`live_segment_families`).
    """

    sequence: int
    column_families: tuple[str, ...]
    files: Mapping[str, tuple[int, bytes]]
    pointer: bool = False
    expired: tuple[str, ...] = ()

    def to_record(self) -> dict[str, Any]:
        record: dict[str, Any] = {
            "sequence": self.sequence,
            "column_families": list(self.column_families),
            "files": {name: [size, digest] for name, (size, digest) in self.files.items()},
        }
        if self.pointer:
            record["pointer"] = True
        if self.expired:  # absent when there are none: such manifests read as before
            record["expired"] = list(self.expired)
        return record

    @classmethod
    def from_record(cls, record: Any, source: Path) -> CheckpointContents:
        """Validate a decoded record. Raises StoreCorruptedError naming ``source``."""
        try:
            sequence = record["sequence"]
            families = record["column_families"]
            files = record["files"]
            if type(sequence) is not int or sequence < 0:
                raise TypeError(f"sequence {sequence!r}")
            if not isinstance(families, list) or not all(isinstance(n, str) for n in families):
                raise TypeError("column_families")
            pointer = record.get("pointer", False)
            if type(pointer) is not bool:
                raise TypeError(f"pointer {pointer!r}")
            expired = record.get("expired", [])
            if not isinstance(expired, list) or not all(
                    isinstance(n, str) and n in families and segment_of_cf(n) is not None
                    for n in expired):
                raise TypeError(f"expired {expired!r} (each must be a segment's column family "
                                f"of column_families)")
            checked: dict[str, tuple[int, bytes]] = {}
            for name, entry in files.items():
                size, digest = entry
                if not (isinstance(name, str) and type(size) is int and size >= 0
                        and isinstance(digest, bytes) and len(digest) == _DIGEST_SIZE):
                    raise TypeError(f"files entry {name!r}")
                checked[name] = (size, digest)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise StoreCorruptedError(source, f"bad contents record: {exc}") from None
        return cls(sequence, tuple(families), checked, pointer, tuple(expired))


WrittenCandidate = tuple[bytes, bytes] | tuple[bytes, bytes, tuple[int, int], bytes]
"""An SST file the store wrote (see :func:`describe_files`): ``(last bytes, SHA-256)``, or
``(last bytes, SHA-256, (st_dev, st_ino), first bytes)``."""


def describe_files(
    directory: Path, known: Mapping[str, tuple[int, bytes]] | None = None,
    written: Mapping[int, Sequence[WrittenCandidate]] | None = None,
) -> dict[str, tuple[int, bytes]]:
    """Size and SHA-256 of every file in ``directory`` except the manifest.

    SST and blob files never change once written and RocksDB never reuses a file number, so an
    immutable file already in ``known`` with the same size keeps its recorded digest: a commit
    hashes only the files it added, and a file damaged since it was recorded still fails the
    check on open.

    ``written`` lists SST files the writer built itself since ``known`` was recorded, by size:
    ``(last bytes, SHA-256)`` pairs, the digest computed from the buffer the file was written
    from (see :class:`~sessionstore.store.sstfile.WrittenTable`). RocksDB ingests such a file
    under a name of its own and never changes it; an SST file of a listed size whose last bytes
    are a listed tail (which holds the file's own random session id) is that file, and gets
    its digest without being read whole. A pair may carry two more items, the ``(st_dev,
    st_ino)`` of the file written and its first bytes: RocksDB links the file it ingests, so a
    file of a listed size and inode that starts with the listed first bytes is that file even
    when its last bytes differ (damaged since it was written; the first bytes guard against an
    inode freed by a compaction and reused). The digest is of the bytes written, so a file
    damaged since it was written, last bytes included, fails the check on open, as one
    damaged since a commit does.
    """
    described: dict[str, tuple[int, bytes]] = {}
    for entry in os.scandir(directory):
        if entry.name == MANIFEST_NAME:
            continue
        stat = entry.stat()
        size = stat.st_size
        previous = known.get(entry.name) if known is not None else None
        immutable = entry.name.endswith(_IMMUTABLE_SUFFIXES)
        if previous is not None and previous[0] == size and immutable:
            described[entry.name] = previous
            continue
        digest = None
        if written and immutable and size in written:
            digest = _written_digest(entry.path, size, written[size],
                                     (stat.st_dev, entry.inode()))
        described[entry.name] = (size, digest if digest is not None
                                 else file_digest(entry.path))
    return described


def _written_digest(path: str, size: int, candidates: Sequence[WrittenCandidate],
                    file_id: tuple[int, int]) -> bytes | None:
    """The digest of the candidate whose tail ends the file at ``path`` (of ``size`` bytes and
    ``(st_dev, st_ino)`` ``file_id``), else of the one written as that very file, its inode
    and first bytes (its last bytes damaged since), or None."""
    linked = None
    with open(path, "rb", buffering=0) as handle:
        ends: dict[int, bytes] = {}
        for candidate in candidates:
            tail, digest = candidate[0], candidate[1]
            if len(candidate) == 4 and candidate[2] == file_id:
                handle.seek(0)
                if handle.read(len(candidate[3])) == candidate[3]:
                    linked = digest
            if len(tail) > size:
                continue
            if len(tail) not in ends:
                handle.seek(size - len(tail))
                ends[len(tail)] = handle.read(len(tail))
            if ends[len(tail)] == tail:
                return digest
    return linked


def encode_manifest(state: CommittedState, segment_interval_ms: int,
                    contents: CheckpointContents) -> bytes:
    """The bytes of a manifest: magic, SHA-256 of the body, msgpack body."""
    payload = state.to_manifest(segment_interval_ms)
    payload["contents"] = contents.to_record()
    body: bytes = msgpack.packb(payload, use_bin_type=True)
    return _MAGIC + hashlib.sha256(body).digest() + body


def decode_manifest(raw: bytes, source: Path) -> tuple[CommittedState, CheckpointContents]:
    """Check and decode manifest bytes read from ``source``.

    Raises:
        StoreCorruptedError: bad magic, checksum mismatch, truncation, or invalid fields.
        ValueError: a manifest of another format version (not damage: another release).
    """
    if raw[:len(_MAGIC)] != _MAGIC:
        legacy = _legacy_format(raw)
        if legacy is not None:
            raise ValueError(
                f"store manifest {source} has format version {legacy!r}; this sessionstore "
                f"reads format {STORE_FORMAT_VERSION} (it was written by another release)"
            )
        raise StoreCorruptedError(source, "not a sessionstore manifest (bad magic bytes)")
    if len(raw) < _HEADER:
        raise StoreCorruptedError(source, f"truncated manifest ({len(raw)} bytes)")
    body = raw[_HEADER:]
    if hashlib.sha256(body).digest() != raw[len(_MAGIC):_HEADER]:
        raise StoreCorruptedError(source, "manifest checksum mismatch (damaged or truncated)")
    try:
        decoded = msgpack.unpackb(body, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise StoreCorruptedError(source, f"undecodable manifest: {exc}") from None
    state = CommittedState.from_manifest(decoded, str(source))
    return state, CheckpointContents.from_record(decoded.get("contents"), source)


def _legacy_format(raw: bytes) -> Any:
    """The format number of a manifest written before checksums existed (a bare msgpack map)."""
    try:
        decoded = msgpack.unpackb(raw, raw=False, strict_map_key=False)
    except Exception:  # garbage: not a legacy manifest either
        return None
    if isinstance(decoded, dict) and type(decoded.get("format")) is int \
            and decoded["format"] not in READABLE_FORMAT_VERSIONS:
        return decoded["format"]
    return None


def read_manifest(checkpoint: Path) -> tuple[CommittedState, CheckpointContents]:
    """Read, check and decode the manifest of one checkpoint directory.

    Raises:
        StoreCorruptedError: the manifest is missing, truncated or damaged.
        ValueError: a manifest of another format version.
    """
    path = checkpoint / MANIFEST_NAME
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise StoreCorruptedError(path, "missing store manifest") from None
    state, contents = decode_manifest(raw, path)
    expected = VERSION_DIR.match(checkpoint.name)
    if expected is not None and int(expected.group(1)) != state.version:
        raise StoreCorruptedError(path, f"checkpoint {checkpoint.name} claims version "
                                        f"{state.version}")
    return state, contents


def verify_files(directory: Path, contents: CheckpointContents) -> None:
    """Check that ``directory`` holds exactly the recorded files, with their sizes and digests.

    An extra file is refused too: RocksDB would replay a stray log file, changing the data.

    Raises:
        StoreCorruptedError: naming the first file that is missing, extra, resized or changed.
        FileNotFoundError: a file vanished while it was being read (a concurrent deletion).
    """
    present = {entry.name: entry for entry in os.scandir(directory) if entry.name != MANIFEST_NAME}
    for name in sorted(contents.files):
        if name not in present:
            raise StoreCorruptedError(directory / name, "missing: the manifest lists it")
    for name in sorted(present):
        if name not in contents.files:
            raise StoreCorruptedError(directory / name, "not part of the committed version")
    for name, (size, digest) in sorted(contents.files.items()):
        actual = present[name].stat().st_size
        if actual != size:
            raise StoreCorruptedError(directory / name,
                                      f"{actual} bytes where the manifest records {size}")
        if file_digest(present[name].path) != digest:
            raise StoreCorruptedError(directory / name, "SHA-256 differs from the manifest's")


def translate_rocksdb_error(exc: BaseException, fallback: Path) -> Exception | None:
    """What a RocksDB error means for the caller, or None if ``exc`` is not one.

    rocksdict raises a bare ``Exception`` whose message starts with RocksDB's status
    ("Corruption: ...", "IO error: ..."), naming the file when RocksDB knows it. A full disk and
    the like become an ``OSError`` (nothing is damaged); the rest is a StoreCorruptedError.
    """
    if type(exc) is not Exception:
        return None
    message = str(exc).strip()
    if not message.startswith(("Corruption", "IO error", "Invalid argument", "Not found")):
        return None
    if any(reason in message for reason in _RESOURCE_ERRORS):
        return OSError(message)
    named = _ROCKSDB_FILE.search(message)
    return StoreCorruptedError(named.group(1) if named else fallback, message)


def relocated(error: StoreCorruptedError, copy: Path, original: Path) -> StoreCorruptedError:
    """``error`` found in a private copy of ``original``, re-pointed at the original's file."""
    path = Path(error.path)
    if path == copy or copy in path.parents:
        return StoreCorruptedError(original / path.relative_to(copy), error.detail)
    return error


def open_read_only(directory: Path) -> tuple[Any, list[str]]:
    """Open a database directory with RocksDB's read-only mode.

    Never on a checkpoint itself, only on a copy: rocksdict rewrites its ``rocksdict-config.json``
    in every directory it opens, read-only included (a kill in that moment truncates it).

    Returns:
        ``(db, column family names)``.

    Raises:
        StoreCorruptedError: RocksDB refuses to open it.
    """
    options = rocksdict.Options(raw_mode=True)
    options.set_paranoid_checks(True)
    try:
        names = rocksdict.Rdict.list_cf(str(directory), options)
        db = rocksdict.Rdict(
            str(directory), options=options,
            column_families={name: rocksdict.Options(raw_mode=True) for name in names},
            access_type=rocksdict.AccessType.read_only(),
        )
    except Exception as exc:
        error = translate_rocksdb_error(exc, directory)
        raise (error or StoreCorruptedError(directory, str(exc))) from None
    return db, names


def check_database(db: Any, names: Iterable[str], contents: CheckpointContents,
                   where: Path) -> None:
    """Check an opened database against what its version must contain.

    Raises:
        StoreCorruptedError: another sequence number or another set of column families.
    """
    sequence = db.latest_sequence_number()
    if sequence != contents.sequence:
        raise StoreCorruptedError(
            where, f"RocksDB sequence number {sequence} where the manifest records "
                   f"{contents.sequence} (a damaged or replaced RocksDB MANIFEST)")
    found = sorted(names)
    if found != sorted(contents.column_families):
        raise StoreCorruptedError(
            where, f"column families {found} where the manifest records "
                   f"{sorted(contents.column_families)}")


def segment_of_cf(name: str) -> int | None:
    """The segment id of a column family name, or None for ``default`` and the like."""
    if name.startswith(SEGMENT_CF_PREFIX):
        try:
            return int(name[len(SEGMENT_CF_PREFIX):])
        except ValueError:
            return None
    return None


def live_segment_families(names: Iterable[str], contents: CheckpointContents | None
                          ) -> tuple[dict[int, str], dict[int, str]]:
    """Split a checkpoint's column family names into the live segments' and the expired ones'
    (recorded in ``contents.expired``: left for the writer to drop), both by segment id.

    The one rule for which segments a committed version holds: the writer's open, the read-only
    view and a Spark snapshot's restore all go through it, so an expired segment is never read
    again, whether or not its drop happened before a crash.
    """
    expired = set(contents.expired) if contents is not None else set()
    live: dict[int, str] = {}
    gone: dict[int, str] = {}
    for name in names:
        segment = segment_of_cf(name)
        if segment is not None:
            (gone if name in expired else live)[segment] = name
    return live, gone


def copy_checkpoint(source: Path, target: Path) -> None:
    """Materialise a checkpoint as a database directory: SSTs hard-linked, the rest copied.

    SST and blob files are immutable in RocksDB, so sharing them is safe; the MANIFEST, OPTIONS
    and log files change, so they are copied.
    """
    target.mkdir(parents=True)
    for entry in os.scandir(source):
        if entry.name == MANIFEST_NAME:
            continue
        destination = target / entry.name
        if entry.name.endswith(_IMMUTABLE_SUFFIXES):
            try:
                os.link(entry.path, destination)
            except OSError:
                shutil.copy2(entry.path, destination)
        else:
            shutil.copy2(entry.path, destination)


# -- the COMMITTED pointer -----------------------------------------------------------------------


def encode_pointer(version: int) -> bytes:
    """The bytes of a ``COMMITTED`` pointer naming ``version``: magic, SHA-256 of body, body."""
    body: bytes = msgpack.packb({"format": _POINTER_FORMAT, "version": version},
                                use_bin_type=True)
    return _POINTER_MAGIC + hashlib.sha256(body).digest() + body


def decode_pointer(raw: bytes, source: Path) -> int:
    """The version a pointer's bytes name.

    Raises:
        StoreCorruptedError: bad magic, truncation, checksum mismatch or invalid fields, naming
            ``source``.
    """
    if raw[:len(_POINTER_MAGIC)] != _POINTER_MAGIC:
        raise StoreCorruptedError(source, "not a sessionstore COMMITTED pointer (bad magic bytes)")
    if len(raw) < _HEADER:
        raise StoreCorruptedError(source, f"truncated COMMITTED pointer ({len(raw)} bytes)")
    body = raw[_HEADER:]
    if hashlib.sha256(body).digest() != raw[len(_POINTER_MAGIC):_HEADER]:
        raise StoreCorruptedError(source, "COMMITTED pointer checksum mismatch (damaged or "
                                          "truncated)")
    try:
        decoded = msgpack.unpackb(body, raw=False, strict_map_key=False)
        fmt, version = decoded["format"], decoded["version"]
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise StoreCorruptedError(source, f"undecodable COMMITTED pointer: {exc}") from None
    if fmt != _POINTER_FORMAT:
        raise ValueError(f"COMMITTED pointer {source} has format {fmt!r}; this sessionstore "
                         f"reads format {_POINTER_FORMAT} (it was written by another release)")
    if type(version) is not int or not 1 <= version < 10**12:
        raise StoreCorruptedError(source, f"COMMITTED pointer names version {version!r}")
    return version


def read_pointer(store_path: str | os.PathLike[str]) -> int | None:
    """The version the store's ``COMMITTED`` pointer names, or None when there is none.

    Raises:
        StoreCorruptedError: the pointer is damaged (see :func:`decode_pointer`).
    """
    path = Path(store_path) / POINTER_NAME
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise StoreCorruptedError(path, "the COMMITTED pointer is a directory, not a file") from None
    return decode_pointer(raw, path)


def write_pointer(store_path: str | os.PathLike[str], version: int) -> None:
    """Point ``COMMITTED`` at ``version``, atomically and durably: this is a commit's commit point.

    :func:`stage_pointer`, then :func:`publish_pointer`. A crash leaves the old pointer or the new
    one, never a mix; a leftover ``COMMITTED.tmp`` is the writer's to delete.
    """
    stage_pointer(store_path, version)
    publish_pointer(store_path)


def stage_pointer(store_path: str | os.PathLike[str], version: int) -> None:
    """Write ``COMMITTED.tmp`` naming ``version`` and sync its data (``fdatasync``: a new file,
    whose size is the only metadata a read needs). It means nothing until
    :func:`publish_pointer` renames it, so it may be written while other syncs of the same
    commit run."""
    temp = Path(store_path) / POINTER_TEMP
    with open(temp, "wb") as handle:
        handle.write(encode_pointer(version))
        handle.flush()
        os.fdatasync(handle.fileno())


def publish_pointer(store_path: str | os.PathLike[str]) -> None:
    """Rename the staged ``COMMITTED.tmp`` over ``COMMITTED`` and fsync the store directory: the
    commit point. Everything the new version needs must be durable before this is called."""
    root = Path(store_path)
    os.rename(root / POINTER_TEMP, root / POINTER_NAME)
    fsync_dir(root)


@dataclass(frozen=True)
class LatestCommitted:
    """The latest committed version of a store, checked.

    Attributes:
        version: the committed version.
        directory: where its files are: ``checkpoints/v<version>``, or
            ``checkpoints/.staging-v<version>`` when a commit was interrupted between moving the
            pointer and renaming its checkpoint (the writer finishes that rename once it opened).
        state, contents: its manifest.
    """

    version: int
    directory: Path
    state: CommittedState
    contents: CheckpointContents

    @property
    def rename_pending(self) -> bool:
        """The checkpoint is still under its staging name."""
        return self.directory.name != version_dir_name(self.version)


def _missing_pointer(store: Path, versions: list[int]) -> None:
    """Refuse a store whose pointer vanished: its newest checkpoint says it was committed with one.

    Stores written before the pointer existed have none and open from the listing.
    """
    newest = store / CHECKPOINTS_DIR / version_dir_name(versions[-1])
    _state, contents = read_manifest(newest)
    if contents.pointer:
        raise StoreCorruptedError(
            store / POINTER_NAME,
            f"missing: {CHECKPOINTS_DIR}/{newest.name} was committed with a COMMITTED pointer")


def _rolled_back(store: Path, pointer: int, newest: int) -> StoreCorruptedError:
    return StoreCorruptedError(
        store / POINTER_NAME,
        f"names version {pointer}, but {CHECKPOINTS_DIR}/{version_dir_name(newest)} is newer "
        f"(an older or replaced pointer)")


def locate_committed(store_path: str | os.PathLike[str]) -> LatestCommitted | None:
    """Find and verify the latest committed version, for the writer (which holds the lock).

    The ``COMMITTED`` pointer says which version that is; the checkpoint listing only has to agree.
    A store without a pointer, written before it existed, opens at its newest checkpoint.

    Returns:
        None for a store that never committed.

    Raises:
        StoreCorruptedError: naming the path at fault: the pointer damaged, missing (when the
            newest checkpoint says it was committed with one) or older than a checkpoint; the
            checkpoint it names missing; or any damage :func:`read_manifest` and
            :func:`verify_files` find. Nothing on disk is changed.
        ValueError: a manifest or pointer of another format version.
    """
    store = Path(store_path)
    root = store / CHECKPOINTS_DIR
    pointer = read_pointer(store)
    versions = committed_versions(store)
    if pointer is None:
        if not versions:
            return None
        _missing_pointer(store, versions)
        directory = root / version_dir_name(versions[-1])
    else:
        if versions and versions[-1] > pointer:
            raise _rolled_back(store, pointer, versions[-1])
        directory = root / version_dir_name(pointer)
        if not directory.is_dir():
            staging = root / f"{STAGING_PREFIX}{version_dir_name(pointer)}"
            if not staging.is_dir():
                raise StoreCorruptedError(
                    directory, f"missing: {POINTER_NAME} names version {pointer} as the latest "
                               f"committed")
            directory = staging  # interrupted after its commit point, before the rename
    state, contents = read_manifest(directory)
    if pointer is not None and state.version != pointer:
        raise StoreCorruptedError(directory / MANIFEST_NAME,
                                  f"claims version {state.version}; {POINTER_NAME} names {pointer}")
    verify_files(directory, contents)
    return LatestCommitted(state.version, directory, state, contents)


def newest_committed_version(store_path: str | os.PathLike[str], attempts: int = 5) -> int | None:
    """The newest version a reader without the lock can open now, or None if none was committed.

    A writer may be committing meanwhile: between its pointer and its rename the pointer is one
    ahead of the listing (the previous checkpoint is still there), and a commit between reading
    the pointer and listing makes the listing look newer (the pointer is read again).

    Raises:
        StoreCorruptedError: as :func:`locate_committed`, for the pointer and the listing (the
            checkpoint's own files are checked by whoever opens it).
    """
    store = Path(store_path)
    root = store / CHECKPOINTS_DIR
    for _attempt in range(attempts):
        pointer = read_pointer(store)
        versions = committed_versions(store)
        if pointer is None:
            if not versions:
                return None
            _missing_pointer(store, versions)
            return versions[-1]
        if versions and versions[-1] > pointer:
            if read_pointer(store) != pointer:
                continue  # a commit in between
            raise _rolled_back(store, pointer, versions[-1])
        if versions and versions[-1] == pointer:
            return pointer
        if (root / f"{STAGING_PREFIX}{version_dir_name(pointer)}").is_dir():
            # the writer is between its pointer and its rename: the previous version is whole
            return versions[-1] if versions else None
        if read_pointer(store) != pointer or committed_versions(store) != versions:
            continue
        raise StoreCorruptedError(
            root / version_dir_name(pointer),
            f"missing: {POINTER_NAME} names version {pointer} as the latest committed")
    raise ValueError(f"could not find the committed version of {store}: the writer committed "
                     f"{attempts} times while it was looked up")
