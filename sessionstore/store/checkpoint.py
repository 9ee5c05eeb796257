"""The on-disk form of a committed version, and the checks that keep damage from reading as less data.

A store directory holds ``checkpoints/v<12 digits>/``, one RocksDB checkpoint per committed
version, each with a ``SESSIONSTORE-MANIFEST``. This module is the one place that knows that form:

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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import rocksdict

from ..errors import StoreCorruptedError
from .base import STORE_FORMAT_VERSION, CommittedState

MANIFEST_NAME = "SESSIONSTORE-MANIFEST"
CHECKPOINTS_DIR = "checkpoints"
STAGING_PREFIX = ".staging-"
DELETING_PREFIX = ".deleting-"
VERSION_DIR = re.compile(r"^v(\d{12})$")
# What a commit may leave behind when interrupted: a checkpoint being built or being deleted.
LEFTOVER_DIR = re.compile(r"^\.(?:staging|deleting)-v\d{12}$")
SEGMENT_CF_PREFIX = "seg"

_MAGIC = b"SSMF"
_DIGEST_SIZE = 32  # SHA-256
_HEADER = len(_MAGIC) + _DIGEST_SIZE
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
    """

    sequence: int
    column_families: tuple[str, ...]
    files: Mapping[str, tuple[int, bytes]]

    def to_record(self) -> dict[str, Any]:
        return {
            "sequence": self.sequence,
            "column_families": list(self.column_families),
            "files": {name: [size, digest] for name, (size, digest) in self.files.items()},
        }

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
            checked: dict[str, tuple[int, bytes]] = {}
            for name, entry in files.items():
                size, digest = entry
                if not (isinstance(name, str) and type(size) is int and size >= 0
                        and isinstance(digest, bytes) and len(digest) == _DIGEST_SIZE):
                    raise TypeError(f"files entry {name!r}")
                checked[name] = (size, digest)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise StoreCorruptedError(source, f"bad contents record: {exc}") from None
        return cls(sequence, tuple(families), checked)


def describe_files(
    directory: Path, known: Mapping[str, tuple[int, bytes]] | None = None
) -> dict[str, tuple[int, bytes]]:
    """Size and SHA-256 of every file in ``directory`` except the manifest.

    SST and blob files never change once written and RocksDB never reuses a file number, so an
    immutable file already in ``known`` with the same size keeps its recorded digest: a commit
    hashes only the files it added, and a file damaged since it was recorded still fails the
    check on open.
    """
    described: dict[str, tuple[int, bytes]] = {}
    for entry in os.scandir(directory):
        if entry.name == MANIFEST_NAME:
            continue
        size = entry.stat().st_size
        previous = known.get(entry.name) if known is not None else None
        if previous is not None and previous[0] == size and entry.name.endswith(
                _IMMUTABLE_SUFFIXES):
            described[entry.name] = previous
        else:
            described[entry.name] = (size, file_digest(entry.path))
    return described


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
            and decoded["format"] != STORE_FORMAT_VERSION:
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
