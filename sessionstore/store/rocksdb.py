"""The RocksDB session store: one column family per time segment, versioned by checkpoints.

Durability model
----------------
Writes go straight into a working copy of the database (``live/``) with the write-ahead log off,
so reads see them at once. ``commit()`` flushes and takes a RocksDB checkpoint (hard links of the
immutable SST files) into a temporary directory, writes the version's manifest into it, and then
points the ``COMMITTED`` file at the new version (written aside, fsynced, renamed over: the atomic
commit point), then renames the directory to ``checkpoints/v<version>``. Opening a store, and
``abort()``, rebuild ``live/`` from the version ``COMMITTED`` names, so a SIGKILL at any instant
reopens at exactly the last committed version, and a missing newest checkpoint is an error rather
than an older version.

Opening verifies the newest checkpoint (see ``checkpoint.py``): the manifest's own checksum, the
size and SHA-256 of every file, and RocksDB's sequence number and column families. Damage raises
:class:`~sessionstore.errors.StoreCorruptedError` naming the file and leaves the directory as it
was; so does a block checksum failure met by any later read. Nothing is ever unpickled: the
database is opened in raw mode and values go through msgpack (or the serde you pass).
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import itertools
import logging
import os
import shutil
import threading
from collections.abc import Callable, Container, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import rocksdict

from .. import keyschema
from ..arrays import ByteRows, sort_order
from ..errors import StoreCorruptedError, StoreLockedError
from ..fsutil import fsync_dir, remove_entry
from ..locking import FileLock, LockHeldError, holder_description
from ..packing import PackedValues
from ..serde import MsgpackSerde
from ..types import ValueSerde
from .base import BulkSessions, CommittedState, SegmentedSessionStore, StoredSessions, byte_rows
from .checkpoint import (
    CHECKPOINTS_DIR,
    DELETING_PREFIX,
    LEFTOVER_DIR,
    MANIFEST_NAME,
    POINTER_TEMP,
    SEGMENT_CF_PREFIX,
    STAGING_PREFIX,
    CheckpointContents,
    WrittenCandidate,
    check_database,
    committed_versions,
    copy_checkpoint,
    describe_files,
    encode_manifest,
    live_segment_families,
    locate_committed,
    open_read_only,
    publish_pointer,
    relocated,
    stage_pointer,
    translate_rocksdb_error,
    version_dir_name,
)
from .sstfile import WrittenTable, new_session_id, reused_buffer, write_table

__all__ = ["SessionStore", "fsync_dir", "scan_key", "scan_time", "version_dir_name"]

log = logging.getLogger(__name__)

_LIVE = "live"
# A bulk write's sessions of one segment are written through an SST file and an index block when
# there are at least this many of them (fewer go through a WriteBatch, both records each).
BULK_LAYOUT_MIN_SESSIONS = 1024
# A bulk write's SST file for a segment carries that segment's deferred removals when there are
# at most 1/FOLD_REMOVALS_RATIO as many as its sessions (more are written through a WriteBatch);
# 0: always (a tombstone costs the file writer what a record does, far less than a WriteBatch).
FOLD_REMOVALS_RATIO = 0
# the size at which RocksDB starts a new MANIFEST (see _open_live)
MAX_MANIFEST_BYTES = 256 << 10
# sorted runs of a segment (level-0 files and non-empty levels) that start a compaction
UNIVERSAL_COMPACTION_TRIGGER = 5
_NUM_LEVELS = 7  # RocksDB's default, which the store keeps
_INGEST_PREFIX = "sessionstore-ingest-"
_NEXT_LIVE = ".live-next"
_LOCK = "LOCK"
# sorts after the (end, start) of any key-first record: the start of a backward key scan
_HIGH_TIMES = b"\xff" * 16
# just above every key-first record: where a pass over them stops
_KEY_FIRST_END = bytes([keyschema.KEY_FIRST[0] + 1])
# The first entry of every SST file the store ingests: a deletion of a key that sorts before
# every record (all start with a tag byte, none with 0) and is never written, long enough to
# fill the file's first data block alone. Ingestion reads the first and last data blocks of a
# file for its key range; without it the first block is the index block's record (about 1 MB
# for 40k sessions), which RocksDB reads and checks (a table-driven CRC-32C in rocksdict's
# build, about 1 GB/s) at every ingestion: 0.8 ms of a 1.5 ms ingestion. Invisible to reads (a
# deletion of a key no one writes), dropped by compactions into the last level.
_FIRST_BLOCK_PAD = bytes(4096)
# the first bytes of an ingested file that identify it beside its inode (see describe_files):
# the pad's block, its sequence number 0 included, and the start of the index block's record
_HEAD_BYTES = 8192


def _housekeep(root: Path, doomed: list[Path] | None, db: Any, expired: dict[int, Any],
               failed: dict[int, Any]) -> None:
    """After a commit: fsync the checkpoints directory ``root`` and delete the renamed-away
    versions ``doomed`` (None: after an open, neither), then drop the column families of the
    segments in ``expired`` (the version committed last records them as expired); a drop that
    fails is logged and left in ``failed`` for the owner."""
    if doomed is not None:
        try:
            fsync_dir(root)
        except OSError as exc:  # the commit is durable without it; the next open repeats it
            log.warning("could not fsync %s after a commit: %s", root, exc)
        for path in doomed:
            shutil.rmtree(path, ignore_errors=True)
    # last: rocksdict holds the GIL through a drop (RocksDB syncs its MANIFEST and OPTIONS
    # files), so the owner's thread gets the time the fsync above waits first
    for segment in sorted(expired):
        try:
            db.drop_column_family(_cf_name(segment))
        except Exception as exc:  # noqa: BLE001 - recorded as expired: the next commit retries
            # the message only: a handler that keeps records would keep, through the
            # traceback's frames, the column families and so the database open
            log.warning("could not drop expired segment %d of %s: %s", segment, root, str(exc))
            failed[segment] = expired[segment]


def _cf_name(segment: int) -> str:
    return f"{SEGMENT_CF_PREFIX}{segment}"


def _segments_between(cfs: dict[int, Any], first: int, last: int | None) -> list[Any]:
    """Column families of segments ``first..last`` (no upper bound for None), in time order.

    Copies the dict first: a reader thread may scan while the owner drops expired segments.
    """
    held = cfs.copy()
    return [held[segment] for segment in sorted(held)
            if segment >= first and (last is None or segment <= last)]


def _raise_corruption(exc: Exception, where: Path) -> NoReturn:
    """Re-raise a RocksDB error as StoreCorruptedError (or OSError for a full disk and the like);
    anything else unchanged."""
    error = translate_rocksdb_error(exc, where)
    if error is None:
        raise exc
    raise error from None


def scan_key(
    cfs: dict[int, Any], interval: int, encoded_key: bytes, earliest_end: int, latest_start: int,
    where: Path, backward: bool = False,
) -> Iterator[tuple[int, int, bytes]]:
    """Key-first scan over segment column families: ``(end, start, value)`` by end, start
    (by end, then start, both descending when ``backward``).

    Raises:
        StoreCorruptedError: RocksDB met a damaged block or a missing file (``where`` is named
            when RocksDB does not name the file). A RocksDB iterator stops at an error as it
            stops at the end, so the status is checked whenever it stops on its own.
    """
    first = earliest_end // interval
    prefix = keyschema.key_first_prefix(encoded_key)
    prefix_len = len(prefix)
    split = keyschema.split_key_first
    segments = _segments_between(cfs, first, None)
    if backward:
        segments.reverse()
        bound = prefix + _HIGH_TIMES  # above every record of the key: seek_for_prev lands
    else:
        bound = keyschema.key_first_seek(encoded_key, earliest_end)
    try:
        for cf in segments:
            it = cf.iter()
            if backward:
                it.seek_for_prev(bound)
            else:
                it.seek(bound)
            step = it.prev if backward else it.next
            while it.valid():
                record = it.key()
                if not record.startswith(prefix):
                    break
                end, start = split(record, prefix_len)
                if end < earliest_end:  # only backward: forward starts at earliest_end
                    break
                if start <= latest_start:
                    yield end, start, it.value()
                step()
            else:
                it.status()
            del step, it
    except Exception as exc:  # noqa: BLE001 - only RocksDB's errors are translated
        _raise_corruption(exc, where)


def scan_time(
    cfs: dict[int, Any], interval: int, earliest_end: int, latest_end: int, where: Path,
    backward: bool = False,
    blocks: dict[int, dict[bytes, keyschema.IndexBlock]] | None = None,
) -> Iterator[tuple[int, bytes, int, bytes]]:
    """Time-first scan: ``(end, encoded_key, start, value)`` by end, key bytes, start (all three
    descending when ``backward``).

    A segment's sessions are listed by its time-first records and its index blocks (written by
    large bulk writes); each value is read from the session's key-first record, and a listed
    session without one (removed since) is skipped. ``blocks`` caches decoded index blocks by
    segment and block key (the writer's; blocks never change once written).

    Raises:
        StoreCorruptedError: as :func:`scan_key`; also an index block that does not decode.
    """
    if earliest_end > latest_end:
        return
    first, last = earliest_end // interval, latest_end // interval
    held = cfs.copy()  # a reader thread may scan while the owner drops expired segments
    try:
        for segment in sorted((s for s in held if first <= s <= last), reverse=backward):
            cf = held[segment]
            if earliest_end <= segment * interval and (segment + 1) * interval - 1 <= latest_end:
                # every session of the segment is wanted (a cold start reading all open
                # sessions): one pass over its key-first records, sorted here, instead of one
                # lookup per listed session
                yield from _segment_by_time(cf, backward)
                continue
            listed = _block_rows(cf, segment, earliest_end, latest_end, where, blocks)
            if not listed:
                yield from _scan_time_records(cf, earliest_end, latest_end, backward)
                continue
            listed.extend(_time_records(cf, earliest_end, latest_end))
            listed.sort(reverse=backward)  # runs already in order: timsort merges them
            previous = None
            get = cf.get
            for row in listed:
                if row == previous:
                    continue  # written twice (in two blocks, or a block and a record)
                previous = row
                end, encoded, start = row
                data = get(keyschema.key_first(encoded, end, start))
                if data is not None:
                    yield end, encoded, start, data
    except Exception as exc:  # noqa: BLE001 - only RocksDB's errors are translated
        _raise_corruption(exc, where)


def _segment_by_time(cf: Any, backward: bool) -> list[tuple[int, bytes, int, bytes]]:
    """Every session of one segment, from its key-first records (the sessions it holds: a
    removed session has none), as ``(end, key, start, value)`` in time-first order (reversed
    when ``backward``)."""
    tag = keyschema.KEY_FIRST
    split = keyschema.split_key_first_record
    rows = []
    it = cf.iter()
    it.seek(tag)
    while it.valid():
        record = it.key()
        if not record.startswith(tag):
            break
        end, encoded, start = split(record)
        rows.append((end, encoded, start, it.value()))
        it.next()
    else:
        it.status()
    del it
    rows.sort(reverse=backward)  # (end, key, start) is unique: values are never compared
    return rows


def read_key_first_columns(cfs: dict[int, Any], interval: int, earliest_end: int, where: Path,
                           msgpack_values: bool) -> StoredSessions | None:
    """Every session ending at or after ``earliest_end``, from one pass over the key-first
    records of each segment that may hold one (the sessions a segment holds: a removed session
    has none), cut into columns without a Python object per session beyond the bytes RocksDB
    hands over. In segment order, then key-first order within a segment.

    Returns:
        The sessions; None when a record is not a key-first record (a damaged store: the caller
        reads row by row, which names the damage).

    Raises:
        StoreCorruptedError: RocksDB met a damaged block or a missing file (see
            :func:`scan_key`).
    """
    first = earliest_end // interval
    held = cfs.copy()  # a reader thread may scan while the owner drops expired segments
    records: list[bytes] = []
    values: list[bytes] = []
    add_record, add_value = records.append, values.append
    try:
        for segment in sorted(s for s in held if s >= first):
            options = rocksdict.ReadOptions()
            options.set_iterate_upper_bound(_KEY_FIRST_END)
            it = held[segment].iter(options)
            it.seek(keyschema.KEY_FIRST)
            valid, key, value, step = it.valid, it.key, it.value, it.next
            while valid():
                add_record(key())
                add_value(value())
                step()
            it.status()  # a read error ends the iteration as the end does
            del valid, key, value, step, it
    except Exception as exc:  # noqa: BLE001 - only RocksDB's errors are translated
        _raise_corruption(exc, where)
    data, offsets = byte_rows(records)
    del records
    split = keyschema.split_key_first_records(data, offsets)
    if split is None:
        return None
    key_first, key_stop, ends, starts = split
    value_bytes, value_offsets = byte_rows(values)
    del values
    value_first, value_stop = value_offsets[:-1], value_offsets[1:]
    if len(ends) and ends.min() < earliest_end:  # the first segment's earlier sessions
        keep = np.flatnonzero(ends >= earliest_end)
        key_first, key_stop, ends, starts, value_first, value_stop = (
            key_first[keep], key_stop[keep], ends[keep], starts[keep], value_first[keep],
            value_stop[keep])
    return StoredSessions(data, key_first, key_stop, starts, ends, value_bytes, value_first,
                          value_stop, msgpack_values)


def _time_rows(cf: Any, earliest_end: int, latest_end: int, backward: bool = False
               ) -> Iterator[tuple[int, bytes, int, bytes]]:
    """One segment's time-first records in the range, as ``(end, key, start, record)``, in
    order (reversed when ``backward``)."""
    split = keyschema.split_time_first
    tag = keyschema.TIME_FIRST
    it = cf.iter()
    if backward:
        # above every index key ending at latest_end: the byte after the end is the first byte
        # of a key length below 2**24 (MAX_KEY_BYTES), so 0x00
        it.seek_for_prev(keyschema.time_first_seek(latest_end) + b"\xff")
    else:
        it.seek(keyschema.time_first_seek(earliest_end))
    step = it.prev if backward else it.next
    while it.valid():
        record = it.key()
        if not record.startswith(tag):
            break
        end, encoded, start = split(record)
        if end > latest_end or end < earliest_end:
            break
        yield end, encoded, start, record
        step()
    else:
        it.status()
    del step, it


def _scan_time_records(cf: Any, earliest_end: int, latest_end: int, backward: bool = False
                       ) -> Iterator[tuple[int, bytes, int, bytes]]:
    """The sessions of one segment's time-first records, with their values, streamed (in
    reverse order when ``backward``)."""
    to_key_first = keyschema.time_first_to_key_first
    get = cf.get
    for end, encoded, start, record in _time_rows(cf, earliest_end, latest_end, backward):
        data = get(to_key_first(record))
        # None: removed since it was listed (a large removal leaves the time-first record; a
        # reader's iterator reads a snapshot, get() the present); damage fails the checksums.
        if data is not None:
            yield end, encoded, start, data


def _time_records(cf: Any, earliest_end: int, latest_end: int) -> list[tuple[int, bytes, int]]:
    """One segment's time-first records in the range, as ``(end, key, start)``."""
    return [(end, encoded, start)
            for end, encoded, start, _ in _time_rows(cf, earliest_end, latest_end)]


def _index_block_records(cf: Any) -> Iterator[tuple[bytes, Any]]:
    """Each index block record of one segment, in key order: ``(record key, the RocksDB
    iterator positioned on it)``. A read error of the iterator raises once it ends."""
    tag = keyschema.INDEX_BLOCK
    it = cf.iter()
    it.seek(tag)
    while it.valid():
        record = it.key()
        if not record.startswith(tag):
            return
        yield record, it
        it.next()
    it.status()


def _block_rows(cf: Any, segment: int, earliest_end: int, latest_end: int, where: Path,
                blocks: dict[int, dict[bytes, keyschema.IndexBlock]] | None
                ) -> list[tuple[int, bytes, int]]:
    """The sessions that one segment's index blocks list in the range, as ``(end, key, start)``,
    one sorted run per block.

    Raises:
        StoreCorruptedError: a block key or value that does not decode (naming ``where``).
    """
    cached = None if blocks is None else blocks.get(segment)
    rows: list[tuple[int, bytes, int]] = []
    for record, it in _index_block_records(cf):
        try:
            low, high, _block_id = keyschema.split_index_block_key(record)
            if low <= latest_end and high >= earliest_end:
                block = None if cached is None else cached.get(record)
                if block is None:
                    block = keyschema.decode_index_block(it.value(), low, high)
                    if blocks is not None:
                        cached = blocks.setdefault(segment, {})
                        cached[record] = block
                rows += block.rows(earliest_end, latest_end)
        except ValueError as exc:
            raise StoreCorruptedError(
                where, f"segment {segment}: index block {record.hex()[:60]}: {exc}") from None
    return rows


def sorted_runs(cf: Any) -> int:
    """How many sorted runs one segment's column family holds: its level-0 files, and each
    other level that holds files (what a read may have to search)."""
    runs = cf.property_int_value("rocksdb.num-files-at-level0")
    for level in range(1, _NUM_LEVELS):
        runs += cf.property_int_value(f"rocksdb.num-files-at-level{level}") > 0
    return int(runs)


def max_block_id(cfs: dict[int, Any]) -> int:
    """The largest index block id in any segment, or -1 when there is none."""
    found = -1
    for cf in cfs.values():
        for record, _ in _index_block_records(cf):
            with contextlib.suppress(ValueError):  # reported by the read that meets it
                found = max(found, keyschema.split_index_block_key(record)[2])
    return found


class SessionStore(SegmentedSessionStore):
    """A KIP-94 segmented session store on RocksDB (through rocksdict, raw mode).

    Args:
        path: directory of the store; created if missing.
        retention_ms: how long, in stream time, a session stays after its end.
        segment_interval_ms: width of a segment; default ``max(retention_ms // 2, 60_000)``.
            A store remembers its interval, and reopening it with a different one raises.
        value_serde: an object with ``dumps``/``loads``; msgpack by default. Never pickle.
        keep_versions: how many committed checkpoints to keep on disk (at least 1).
        auto_compaction: True lets RocksDB compact in its own threads whenever it likes; False
            leaves every file a commit flushes in place until :meth:`compact_segments` is
            called, so that the files a version adds are the data it changed (what a caller
            copying versions elsewhere wants: see ``spark_adapter.provider``).

    Raises:
        StoreCorruptedError: the newest checkpoint is damaged: a file missing, extra, resized or
            changed, a damaged manifest, or a RocksDB MANIFEST that does not hold the committed
            version. Nothing on disk is changed.
        StoreLockedError: the store is already open, in this process or another (a
            ``ValueError``; names the lock file and the holder's process id when known).
        ValueError: bad arguments; a manifest of another format version.
    """

    # bulk writes take packed values as byte rows: they go into the SST files as they are
    _TAKES_PACKED_VALUES = True

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        retention_ms: int,
        segment_interval_ms: int | None = None,
        value_serde: ValueSerde | None = None,
        keep_versions: int = 2,
        auto_compaction: bool = True,
    ) -> None:
        super().__init__(
            retention_ms=retention_ms,
            segment_interval_ms=segment_interval_ms,
            value_serde=value_serde,
        )
        if isinstance(keep_versions, bool) or not isinstance(keep_versions, int) \
                or keep_versions < 1:
            raise ValueError(f"keep_versions must be an int >= 1, got {keep_versions!r}")
        if not isinstance(auto_compaction, bool):
            raise ValueError(f"auto_compaction must be a bool, got {auto_compaction!r}")
        if path is None or (isinstance(path, str) and not path):
            raise ValueError(f"path must name a directory, got {path!r}")
        self._path = Path(path)
        self._live_path = self._path / _LIVE  # named in errors; built once, not per read
        self._keep_versions = keep_versions
        self._explicit_interval = segment_interval_ms is not None
        self._db: Any = None
        self._cfs: dict[int, Any] = {}
        self._contents: CheckpointContents | None = None
        self._pending: Path | None = None  # a committed checkpoint still under its staging name
        self._auto_compaction = auto_compaction
        self._cf_options = self._family_options()
        # held while compact_segments runs (possibly in another thread) and while the database
        # is closed: a compaction never runs on a closed database
        self._compaction_lock = threading.Lock()
        self._ingest_options = rocksdict.IngestExternalFileOptions()
        self._ingest_options.set_move_files(True)  # hard-linked into live/, not copied
        # the SST files ingested since the last commit, by size: (their last bytes, SHA-256),
        # computed as they were written (see describe_files)
        self._written: dict[int, list[WrittenCandidate]] = {}
        # decoded index blocks by segment and block key (blocks never change once written)
        self._blocks: dict[int, dict[bytes, keyschema.IndexBlock]] = {}
        self._next_block_id = 0
        # removals not yet in RocksDB, by segment: the records to delete, in call order (see
        # _delete_many); every other hook writes them first, except _write_many, which carries
        # them as tombstones in the SST files it ingests
        self._removals: dict[int, list[bytes]] = {}
        self._matrix_of: tuple[list[bytes], keyschema.KeyMatrix | None] | None = None
        self._housekeeping: threading.Thread | None = None
        # column families of expired segments, by segment: gone for every read and write (see
        # _drop_segments_below), still in RocksDB until the housekeeping after the next commit
        # drops them (that commit's manifest records them as expired); and those handed to the
        # running housekeeping, with the drops of those that failed
        self._expired_cfs: dict[int, Any] = {}
        self._dropping: dict[int, Any] = {}
        self._drops_failed: dict[int, Any] = {}
        self._sync_pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._write_options = rocksdict.WriteOptions()
        # rocksdict's stub declares a method, but at run time this is a property. Commits do not
        # need the WAL: they flush and checkpoint, and a crash goes back to the last checkpoint.
        setattr(self._write_options, "disable_wal", True)  # noqa: B010
        self._path.mkdir(parents=True, exist_ok=True)
        self._lock_handle: FileLock | None = self._acquire_lock()
        try:
            self._apply_committed(self._load_committed())
            self._open_live()
            self._finish_interrupted_commit()
            self._remove_own_leftovers()
        except BaseException:
            self._unlock()
            raise

    @property
    def path(self) -> Path:
        """The store's directory."""
        return self._path

    def checkpoint_path(self, version: int | None = None) -> Path:
        """The directory of a committed version (default: the last one)."""
        return self._path / CHECKPOINTS_DIR / version_dir_name(
            self.committed_version if version is None else version
        )

    def live_segments(self) -> list[int]:
        """Ids of the segments currently held, ascending."""
        return sorted(self._cfs)

    # -- opening ----------------------------------------------------------------------------

    def _acquire_lock(self) -> FileLock:
        lock = FileLock(self._path / _LOCK)
        try:
            return lock.acquire()
        except LockHeldError as exc:
            raise StoreLockedError(
                exc.path, exc.holder_pid,
                f"session store {self._path} is already open: its lock file {exc.path} is held "
                f"by {holder_description(exc.holder_pid)}") from None

    def _unlock(self) -> None:
        if self._lock_handle is not None:
            self._lock_handle.release()
            self._lock_handle = None

    def _load_committed(self) -> CommittedState:
        latest = locate_committed(self._path)
        if latest is None:
            return CommittedState()
        state, contents = latest.state, latest.contents
        self._pending = latest.directory if latest.rename_pending else None
        stored_interval = state.segment_interval_ms
        assert stored_interval is not None
        if stored_interval != self._interval:
            if self._explicit_interval:
                raise ValueError(
                    f"segment_interval_ms={self._interval} differs from the store's "
                    f"{stored_interval}; a store keeps the interval it was created with"
                )
            self._interval = stored_interval
        self._contents = contents
        return state

    def _finish_interrupted_commit(self) -> None:
        """Rename a checkpoint committed (the pointer names it) but left under its staging name."""
        if self._pending is not None:
            os.rename(self._pending, self.checkpoint_path())
            fsync_dir(self._pending.parent)
            self._pending = None

    def _remove_own_leftovers(self) -> None:
        """Delete what an interrupted commit left: ``.staging-v<digits>``, ``.deleting-v<digits>``.

        Called once the open succeeded, so a failed open changes nothing; any other entry (an
        operator's backup, say) is never touched.
        """
        root = self._path / CHECKPOINTS_DIR
        if root.is_dir():
            for entry in os.scandir(root):
                if LEFTOVER_DIR.match(entry.name):
                    remove_entry(entry.path)
        remove_entry(self._path / POINTER_TEMP)

    def _open_live(self) -> None:
        live = self._path / _LIVE
        if self._committed.version > 0:
            # Built beside the old working copy and checked there, so that a failed check
            # leaves the directory as it was. Opening the checkpoint itself is no option:
            # rocksdict rewrites its config file in any directory it opens, read-only or not.
            fresh = self._path / _NEXT_LIVE
            remove_entry(fresh)
            source = self._pending or self.checkpoint_path()
            copy_checkpoint(source, fresh)
            try:
                if self._contents is not None:
                    db, names = open_read_only(fresh)
                    try:
                        check_database(db, names, self._contents, source)
                    finally:
                        db.close()
            except StoreCorruptedError as exc:
                shutil.rmtree(fresh, ignore_errors=True)
                raise relocated(exc, fresh, source) from None
            except BaseException:
                shutil.rmtree(fresh, ignore_errors=True)
                raise
            remove_entry(live)
            os.rename(fresh, live)
        else:
            remove_entry(live)
        options = rocksdict.Options(raw_mode=True)
        options.create_if_missing(True)
        options.create_missing_column_families(True)
        options.set_paranoid_checks(True)
        # A commit's checkpoint flushes every column family whose memtable holds writes (3-10
        # of them per task in the Spark benchmark): one flush job with one MANIFEST record for
        # all of them, instead of a job each with its own directory and MANIFEST syncs (for six
        # families, 12 syncs instead of 27).
        options.set_atomic_flush(True)
        # Every commit copies RocksDB's MANIFEST into its checkpoint and hashes it, and the
        # MANIFEST only grows (a record per ingestion, flush and compaction: about 7 KB a commit
        # in a stream) until it reaches this size, when RocksDB starts a new one holding the
        # current state alone (a few KB). At RocksDB's default (1 GiB) the commits of a stream
        # got slower for ever: 4.3 MB after 600 commits, about 2 ms more CPU per commit.
        options.set_max_manifest_file_size(MAX_MANIFEST_BYTES)
        try:
            names = rocksdict.Rdict.list_cf(str(live), options) if live.exists() \
                else ["default"]
            self._db = rocksdict.Rdict(
                str(live),
                options=options,
                column_families={name: self._family_options() for name in names},
            )
        except Exception as exc:  # noqa: BLE001 - RocksDB's errors are bare Exceptions
            _raise_corruption(exc, live)
        self._db.set_write_options(self._write_options)
        # a segment the committed version records as expired was removed before that commit,
        # and its drop had not happened (or not before a crash): dropped after the next commit
        live_names, expired_names = live_segment_families(names, self._contents)
        self._cfs = {s: self._db.get_column_family(n) for s, n in live_names.items()}
        self._expired_cfs = {s: self._db.get_column_family(n) for s, n in expired_names.items()}
        self._blocks = {}
        self._removals = {}
        try:
            self._next_block_id = max_block_id(self._cfs) + 1
        except Exception as exc:  # noqa: BLE001 - RocksDB's errors are bare Exceptions
            _raise_corruption(exc, live)
        if self._expired_cfs:  # dropped before the next commit's checkpoint (which waits)
            self._start_housekeeping(None)

    def _family_options(self) -> Any:
        options = rocksdict.Options(raw_mode=True)
        # Universal compaction: a segment's sorted runs merge with runs of similar size, and its
        # largest run is rewritten only when the others add up to twice its size (RocksDB's
        # default size amplification, 200%). Under leveled compaction (RocksDB's default) each
        # level-0 file a batch adds overlaps the whole segment, so every compaction rewrote all
        # the sessions the segment retains: a batch of 10k changes cost 2-3x the CPU at 1M
        # retained sessions as at 10k. The trigger counts every sorted run, the largest one
        # too: 5 keeps at most as many runs to search as leveled's trigger of 4 level-0 files
        # above one level. Stores written under either style open under the other (each level
        # is a sorted run); see docs/operations.md.
        options.set_compaction_style(rocksdict.DBCompactionStyle.universal())
        options.set_level_zero_file_num_compaction_trigger(UNIVERSAL_COMPACTION_TRIGGER)
        if not self._auto_compaction:
            options.set_disable_auto_compactions(True)
        return options

    def _close_db(self) -> None:
        self._join_housekeeping()  # it may be dropping column families of this database
        with self._compaction_lock:
            self._cfs.clear()
            self._expired_cfs.clear()  # the committed version records them (if it must)
            self._removals.clear()  # not written: uncommitted, as the rest of live/
            self._written = {}  # so are the files it ingested
            if self._db is not None:
                self._db.close()
                self._db = None

    def compact_segments(self, min_level0_files: int) -> list[int]:
        """Compact every segment holding at least ``min_level0_files`` sorted runs (one per
        commit that wrote to it, with ``auto_compaction=False``) into one sorted run.

        A sorted run is a level-0 file or a level holding files: under universal compaction an
        ingested file lands in the lowest empty level above the segment's data, and at level 0
        only once the levels above are taken.

        Safe to call from another thread while the owner reads, writes and commits (RocksDB
        compacts beside them, and the data does not change); :meth:`close` and ``abort()``
        wait for it. The next commit's checkpoint holds the compacted files.

        Args:
            min_level0_files: the threshold (>= 1).

        Returns:
            The segments compacted, ascending.

        Raises:
            StoreCorruptedError: RocksDB met damage while compacting (names the file).
        """
        if isinstance(min_level0_files, bool) or not isinstance(min_level0_files, int) \
                or min_level0_files < 1:
            raise ValueError(f"min_level0_files must be an int >= 1, got {min_level0_files!r}")
        compacted = []
        with self._compaction_lock:
            if self._db is None:
                return []
            for segment, cf in sorted(self._cfs.copy().items()):
                try:
                    if sorted_runs(cf) < min_level0_files:
                        continue
                    cf.compact_range(None, None)
                except Exception as exc:  # noqa: BLE001 - RocksDB's errors are bare Exceptions
                    if segment not in self._cfs:
                        continue  # expired (dropped) meanwhile by the owner
                    _raise_corruption(exc, self._live_path)
                compacted.append(segment)
        return compacted

    def live_files(self) -> list[Path]:
        """The immutable (SST) files of the working copy as it stands, by name: what the next
        commit's checkpoint can contain besides the files it flushes."""
        return sorted(Path(entry.path) for entry in os.scandir(self._live_path)
                      if entry.name.endswith((".sst", ".blob"))
                      and not entry.name.startswith(_INGEST_PREFIX))

    # -- hooks ------------------------------------------------------------------------------

    def _segment(self, segment: int) -> Any:
        cf = self._cfs.get(segment)
        if cf is None:
            if segment in self._expired_cfs or segment in self._dropping:
                self._drop_expired_now()  # expired, then written again (a lowered cap)
            cf = self._db.create_column_family(_cf_name(segment), self._cf_options)
            self._cfs[segment] = cf
        return cf

    def _write(self, encoded_key: bytes, end: int, start: int, data: bytes) -> None:
        if self._removals:  # tested here: the event path's puts and gets are hot
            self._apply_removals()
        cf = self._segment(end // self._interval)
        cf[keyschema.key_first(encoded_key, end, start)] = data
        cf[keyschema.time_first(encoded_key, end, start)] = b""

    def _key_ranks(self, encoded: Sequence[bytes], matrix: keyschema.KeyMatrix | None = None
                   ) -> Any:
        """Byte-order ranks, keeping the keys' :class:`~sessionstore.keyschema.KeyMatrix` (the
        one given, or built here) for the record builders of the same call."""
        assert isinstance(encoded, list)  # this store keeps no byte rows: bulk calls cut them
        if matrix is None:
            matrix = keyschema.key_matrix(encoded)
        self._matrix_of = (encoded, matrix)
        return keyschema.key_order(encoded, matrix)

    def _take_matrix(self, encoded: Sequence[bytes]) -> keyschema.KeyMatrix | None:
        """The matrix :meth:`_key_ranks` built for ``encoded`` (the same list), once."""
        held, self._matrix_of = self._matrix_of, None
        return held[1] if held is not None and held[0] is encoded else None

    def _write_many(self, sessions: BulkSessions) -> None:
        # put_many hands the sessions over by (key, end, start), each session once: already the
        # key-first order unless they span segments. A segment that receives at least
        # BULK_LAYOUT_MIN_SESSIONS sessions gets them as one SST file ingested into its column
        # family (key-first records plus one index block); smaller ones go through a WriteBatch
        # (key-first and time-first records), as single puts do.
        encoded, key_rank, index, starts, ends, values = sessions
        matrix = self._take_matrix(encoded)
        # the values as byte rows (packed values come as rows already); session i's is row
        # value_row[i]
        if type(values) is PackedValues:
            value_rows = values.rows()
        else:
            joined, offsets = byte_rows(list(values))
            value_rows = ByteRows(joined, offsets[:-1], offsets[1:])
        value_row = np.arange(len(index), dtype=np.int64)
        segments = ends // self._interval
        if segments.min() != segments.max():
            order = sort_order([segments, key_rank[index], ends, starts], distinct=True)
            segments, index, starts, ends, value_row = (
                segments[order], index[order], starts[order], ends[order], order)
        bounds = np.flatnonzero(np.diff(segments)).tolist()
        firsts = [0] + [b + 1 for b in bounds]
        stops = [b + 1 for b in bounds] + [len(segments)]
        big = [(first, stop) for first, stop in zip(firsts, stops, strict=True)
               if stop - first >= BULK_LAYOUT_MIN_SESSIONS]
        # A segment's removals travel in its file (see FOLD_REMOVALS_RATIO): the file's writer
        # merges them in with the records at the cost of a record each, where a WriteBatch
        # costs about 0.5 us each and the memtable flush that it brings.
        self._apply_removals(keep={
            int(segments[first]) for first, stop in big
            if len(self._removals.get(int(segments[first]), ())) * FOLD_REMOVALS_RATIO
            <= stop - first})
        if len(big) != len(firsts):
            small = np.ones(len(segments), dtype=np.bool_)
            for first, stop in big:
                small[first:stop] = False
            rows = np.flatnonzero(small)
            picked = value_rows.tolist(value_row[rows])
            self._write_batch(encoded, key_rank, index[rows], starts[rows], ends[rows], picked,
                              matrix)
        if big:
            # every file is built before any is ingested: a full disk fails before any change
            staged = [self._stage_segment(int(segments[first]), encoded, index[first:stop],
                                          starts[first:stop], ends[first:stop],
                                          value_rows, value_row[first:stop], matrix)
                      for first, stop in big]
            try:
                for segment, path, block_key, block, written in staged:
                    linked = path.stat()  # RocksDB links the file: the inode it ingests
                    with open(path, "rb") as handle:  # the pad's block and then some
                        head = handle.read(_HEAD_BYTES)
                    try:
                        self._segment(segment).ingest_external_file(
                            [str(path)], self._ingest_options)
                    except Exception as exc:  # noqa: BLE001 - RocksDB's errors are bare
                        _raise_corruption(exc, path)
                    self._blocks.setdefault(segment, {})[block_key] = block
                    self._removals.pop(segment, None)  # written, as tombstones of the file
                    # RocksDB keeps the file as it is (it records the sequence number in its
                    # MANIFEST, never in the file), under a name of its own: the next commit
                    # finds it by its size and inode or last bytes, and records this digest
                    self._written.setdefault(written.size, []).append(
                        (written.tail, written.sha256, (linked.st_dev, linked.st_ino), head))
            finally:
                for _segment, path, _key, _block, _written in staged:
                    path.unlink(missing_ok=True)

    def _stage_segment(self, segment: int, encoded: Sequence[bytes], index: Any, starts: Any,
                       ends: Any, value_rows: ByteRows, value_row: Any,
                       matrix: keyschema.KeyMatrix | None) -> tuple[int, Path, bytes, Any,
                                                                    WrittenTable]:
        """Write one segment's sessions (in key-first order; session ``i``'s value is row
        ``value_row[i]`` of ``value_rows``) as an SST file to ingest: one index block, then
        the key-first records, with a tombstone for each removal deferred in the segment (a
        removal of a session written here is dropped: the write comes after it).
        The file is written from whole buffers in one compiled pass (:mod:`.sstfile`), not a
        call per record, from buffers the thread reuses from one file to the next.
        Returns ``(segment, file, block key, block, what was written)``."""
        records, record_offsets = keyschema.key_first_rows(encoded, index, ends, starts, matrix)
        # (end, key, start): the input is by (key, end, start), so a stable sort on the end
        by_time = sort_order([ends])
        data, block = keyschema.encode_index_block(encoded, index[by_time], ends[by_time],
                                                   starts[by_time], matrix)
        block_id = self._next_block_id
        self._next_block_id += 1
        block_key = keyschema.index_block_key(int(ends[by_time[0]]), int(ends[by_time[-1]]),
                                              block_id)
        # tombstones are key-first or time-first records, sorted in with the records; they come
        # in a few sorted runs, which a sort of the list merges (a set would scatter them)
        removed, removed_offsets = byte_rows([_FIRST_BLOCK_PAD, *sorted(dict.fromkeys(
            self._removals.get(segment, ())))])
        # one buffer of keys: the block's record first (its tag sorts before the key-first
        # records'), the records, then the tombstones
        head = len(block_key)
        n_put = len(record_offsets)  # the block and the records
        n_gone = len(removed_offsets) - 1
        puts_end = head + len(records)
        keys = reused_buffer("keys", puts_end + len(removed), np.uint8)
        keys[:head] = np.frombuffer(block_key, dtype=np.uint8)
        keys[head:puts_end] = records
        keys[puts_end:] = removed
        key_offsets = reused_buffer("key_offsets", n_put + n_gone + 1, np.int64)
        key_offsets[0] = 0
        np.add(record_offsets, head, out=key_offsets[1:n_put + 1])
        np.add(removed_offsets[1:], puts_end, out=key_offsets[n_put + 1:])
        values_end = len(data) + len(value_rows.data)
        value_bytes = reused_buffer("values", values_end, np.uint8)
        value_bytes[:len(data)] = np.frombuffer(data, dtype=np.uint8)
        value_bytes[len(data):] = value_rows.data
        value_first = reused_buffer("value_first", n_put, np.int64)
        value_stop = reused_buffer("value_stop", n_put, np.int64)
        value_first[0], value_stop[0] = 0, len(data)
        np.add(value_rows.first[value_row], len(data), out=value_first[1:])
        np.add(value_rows.stop[value_row], len(data), out=value_stop[1:])
        path = self._live_path / f"{_INGEST_PREFIX}{block_id}.sst"
        # A session id of its own: RocksDB's block cache keys come from a file's unique id (its
        # session id and number), and an abort reuses block ids. A failure leaves no file.
        written = write_table(path, keys, key_offsets, n_put, value_bytes, value_first,
                              value_stop, session_id=new_session_id(), file_number=1)
        return segment, path, block_key, block, written

    def _write_batch(self, encoded: Sequence[bytes], key_rank: Any, index: Any, starts: Any,
                     ends: Any, values: Sequence[bytes], matrix: keyschema.KeyMatrix | None
                     ) -> None:
        """Both records of each session through one WriteBatch, each layout inserted in its
        on-disk order: RocksDB's memtable takes sorted keys several times faster than random
        ones. The sessions come by (segment, key, end, start), each once."""
        if not len(index):
            return
        segments = ends // self._interval
        rank = key_rank[index]
        batch = rocksdict.WriteBatch(raw_mode=True)
        self._fill_batch(batch, segments, keyschema.records_many(
            keyschema.KEY_FIRST, encoded, index, ends, starts, matrix), values)
        # Time-first records go in one sorted run per key width: building them grouped by width
        # costs about 0.17 us less a record than scattering them into one sorted run, and the
        # few runs insert nearly as fast.
        widths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))[index]
        by_time = sort_order([segments, widths, ends, rank, starts], distinct=True)
        self._fill_batch(
            batch, segments[by_time],
            keyschema.records_many(keyschema.TIME_FIRST, encoded, index[by_time], ends[by_time],
                                   starts[by_time], matrix),
            None)
        self._db.write(batch)

    def _fill_batch(self, batch: Any, segments: Any, records: list[bytes],
                    values: Sequence[bytes] | None) -> None:
        """Add ``records`` (grouped by segment) to ``batch``; None values mean empty ones."""
        bounds = np.flatnonzero(np.diff(segments)).tolist()
        firsts = [0] + [b + 1 for b in bounds]
        stops = [b + 1 for b in bounds] + [len(records)]
        for first, stop in zip(firsts, stops, strict=True):
            segment = int(segments[first])
            if values is not None:
                self._segment(segment)  # creates the column family on first use
            batch.set_default_column_family(
                self._db.get_column_family_handle(_cf_name(segment)))
            whole = first == 0 and stop == len(records)
            chunk = records if whole else records[first:stop]
            if values is None:
                collections.deque(map(batch.put, chunk, itertools.repeat(b"")), maxlen=0)
            else:
                chunk_values = values if whole else values[first:stop]
                collections.deque(map(batch.put, chunk, chunk_values), maxlen=0)

    def _delete_many(self, sessions: BulkSessions) -> None:
        encoded, key_rank, index, starts, ends, _ = sessions
        matrix = self._take_matrix(encoded)
        segments = ends // self._interval
        live = np.flatnonzero(
            np.isin(segments, np.fromiter(self._cfs, dtype=np.int64, count=len(self._cfs))))
        if not len(live):
            return
        index, starts, ends, segments = index[live], starts[live], ends[live], segments[live]
        rank = key_rank[index]
        layouts = [(keyschema.KEY_FIRST, sort_order([segments, rank, ends, starts]))]
        if len(live) < BULK_LAYOUT_MIN_SESSIONS:
            layouts.append((keyschema.TIME_FIRST, sort_order([segments, ends, rank, starts])))
        # else: a large removal deletes the key-first records alone. What it removes was written
        # by large bulk writes, which write index blocks instead of time-first records, and a
        # time-first entry whose key-first record is gone is skipped by every reader.
        for tag, order in layouts:
            ordered = segments[order]
            records = keyschema.records_many(tag, encoded, index[order], ends[order],
                                             starts[order], matrix)
            cuts = (np.flatnonzero(np.diff(ordered)) + 1).tolist()
            for first, stop in zip([0, *cuts], [*cuts, len(order)], strict=True):
                self._removals.setdefault(int(ordered[first]), []).extend(records[first:stop])
        # Deferred: the engine removes the sessions a batch merged away just before writing the
        # batch's sessions, and an ingestion flushes a memtable holding removals in its segment
        # first, a second level-0 file per batch (twice the compactions). Every other hook, and
        # an iterator already open (it reads RocksDB as it goes), writes them at once.
        if self._open_iterators:
            self._apply_removals()

    def _apply_removals(self, keep: Container[int] = ()) -> None:
        """Write the deferred removals of every segment not in ``keep`` to RocksDB, in one
        WriteBatch."""
        if not self._removals:
            return
        segments = [segment for segment in self._removals if segment not in keep]
        if not segments:
            return
        batch = rocksdict.WriteBatch(raw_mode=True)
        for segment in segments:
            batch.set_default_column_family(
                self._db.get_column_family_handle(_cf_name(segment)))
            # sorted: RocksDB's memtable takes sorted keys several times faster
            collections.deque(map(batch.delete, sorted(self._removals[segment])), maxlen=0)
        self._db.write(batch)
        for segment in segments:
            del self._removals[segment]

    def _delete(self, encoded_key: bytes, end: int, start: int) -> None:
        if self._removals:  # tested here: the event path's puts and gets are hot
            self._apply_removals()
        cf = self._cfs.get(end // self._interval)
        if cf is not None:
            cf.delete(keyschema.key_first(encoded_key, end, start))
            cf.delete(keyschema.time_first(encoded_key, end, start))

    def _get(self, encoded_key: bytes, end: int, start: int) -> bytes | None:
        if self._removals:  # tested here: the event path's puts and gets are hot
            self._apply_removals()
        cf = self._cfs.get(end // self._interval)
        if cf is None:
            return None
        try:
            data: bytes | None = cf.get(keyschema.key_first(encoded_key, end, start))
        except Exception as exc:  # noqa: BLE001 - RocksDB's errors are bare Exceptions
            _raise_corruption(exc, self._live_path)
        return data

    def _scan_key(
        self, encoded_key: bytes, earliest_end: int, latest_start: int, backward: bool = False
    ) -> Iterator[tuple[int, int, bytes]]:
        self._apply_removals()
        return scan_key(self._cfs, self._interval, encoded_key, earliest_end, latest_start,
                        self._live_path, backward)

    def _scan_time(
        self, earliest_end: int, latest_end: int, backward: bool = False
    ) -> Iterator[tuple[int, bytes, int, bytes]]:
        self._apply_removals()
        return scan_time(self._cfs, self._interval, earliest_end, latest_end, self._live_path,
                         backward, self._blocks)

    def _read_columns(self, earliest: int) -> StoredSessions | None:
        self._apply_removals()
        return read_key_first_columns(self._cfs, self._interval, earliest, self._live_path,
                                      type(self._serde) is MsgpackSerde)

    def _drop_segments_below(self, segment: int) -> int:
        """Expire the segments below ``segment``: gone at once for reads and writes, dropped
        from RocksDB later, off the commit's path. RocksDB syncs its MANIFEST and OPTIONS files
        for each drop (30-90 ms a segment measured inside a loaded Spark task), so the next
        commit records them as expired in its manifest and its housekeeping thread drops them
        once the commit point has passed. A crash before then reopens a version whose manifest
        says they are expired: opening drops them from the view again (see
        :func:`~sessionstore.store.checkpoint.live_segment_families`)."""
        doomed = [s for s in self._cfs if s < segment]
        for s in doomed:
            self._expired_cfs[s] = self._cfs.pop(s)
            self._blocks.pop(s, None)
            self._removals.pop(s, None)
        if doomed:
            log.debug("expired segments %s of %s", doomed, self._path)
        return len(doomed)

    def _drop_expired_now(self) -> None:
        """Drop every expired segment's column family in this thread, once the housekeeping
        has ended: before one of them is created again."""
        self._join_housekeeping()
        for segment in sorted(self._expired_cfs):
            try:
                self._db.drop_column_family(_cf_name(segment))
            except Exception as exc:  # noqa: BLE001 - RocksDB's errors are bare Exceptions
                _raise_corruption(exc, self._live_path)
            del self._expired_cfs[segment]

    def _commit_state(self, state: CommittedState) -> None:
        # the previous commit's housekeeping ends first: the segments it failed to drop are
        # recorded as expired again, and no drop runs while RocksDB takes the checkpoint (a
        # family dropped meanwhile could be in the checkpoint without being recorded as expired,
        # and a reopen would count it live)
        self._join_housekeeping()
        root = self._path / CHECKPOINTS_DIR
        root.mkdir(exist_ok=True)
        final = root / version_dir_name(state.version)
        staging = root / f"{STAGING_PREFIX}{version_dir_name(state.version)}"
        if staging.exists():
            shutil.rmtree(staging)
        if final.exists():  # left by an earlier process that crashed before reopening
            shutil.rmtree(final)
        self._apply_removals()
        self._db.flush()
        rocksdict.Checkpoint(self._db).create_checkpoint(str(staging))
        families = tuple(sorted(rocksdict.Rdict.list_cf(
            str(staging), rocksdict.Options(raw_mode=True))))
        contents = CheckpointContents(
            sequence=self._db.latest_sequence_number(),
            column_families=families,
            files=describe_files(
                staging, None if self._contents is None else self._contents.files,
                self._written),
            pointer=True,
            expired=tuple(sorted({_cf_name(s) for s in self._expired_cfs} & set(families))),
        )
        # Four independent syncs must all end before the pointer names the version: the
        # manifest's bytes, its entry in the staging directory, the staging directory's entry
        # in checkpoints/ (RocksDB syncs the checkpoint's own files and directory, not its
        # parent), and the new pointer's temporary file (meaningless until renamed). They run
        # at once (the waits overlap, and a journaling file system commits them together),
        # then the pointer moves: see docs/operations.md.
        manifest = os.open(staging / MANIFEST_NAME, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            data = encode_manifest(state, self._interval, contents)
            if os.write(manifest, data) != len(data):
                raise OSError(f"short write of {staging / MANIFEST_NAME}")
            self._sync_all([(os.fdatasync, manifest), (fsync_dir, staging), (fsync_dir, root),
                            (lambda version: stage_pointer(self._path, version), state.version)])
        finally:
            os.close(manifest)
        publish_pointer(self._path)  # the commit point
        os.rename(staging, final)
        self._contents = contents
        self._written = {}  # recorded in contents.files, which the next commit starts from
        doomed = []
        for old in committed_versions(self._path)[: -self._keep_versions]:
            # Renamed first, so that no reader (nor a crash) ever sees half a version.
            doomed.append(root / f"{DELETING_PREFIX}{version_dir_name(old)}")
            os.rename(root / version_dir_name(old), doomed[-1])
        # The rest is housekeeping, done by a thread off the commit path: making the rename to
        # v<N> durable (the pointer already is: a crash before this reopens from the staging
        # name), deleting old versions (a crash leaves .deleting-* for the next open), and
        # dropping the expired segments (version N records them as expired).
        self._start_housekeeping(doomed)

    def _start_housekeeping(self, doomed: list[Path] | None) -> None:
        """Start :func:`_housekeep` in a thread, handing it the expired segments to drop."""
        self._dropping, self._expired_cfs = self._expired_cfs, {}
        self._housekeeping = threading.Thread(
            target=_housekeep, name="sessionstore-commit-housekeeping", daemon=True,
            args=(self._path / CHECKPOINTS_DIR, doomed, self._db, self._dropping,
                  self._drops_failed))
        self._housekeeping.start()

    def _sync_all(self, syncs: list[tuple[Callable[[Any], None], Any]]) -> None:
        """Run independent fsyncs at once (each waits in the kernel without the GIL); raise the
        first error once all have ended."""
        if self._sync_pool is None:
            self._sync_pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=3, thread_name_prefix="sessionstore-commit-sync")
        futures = [self._sync_pool.submit(sync, target) for sync, target in syncs[1:]]
        errors: list[BaseException] = []
        try:
            syncs[0][0](syncs[0][1])  # the first in this thread
        except BaseException as exc:  # noqa: BLE001 - re-raised below, after the others end
            errors.append(exc)
        for future in futures:
            error = future.exception()
            if error is not None:
                errors.append(error)
        if errors:
            raise errors[0]

    def _join_housekeeping(self) -> None:
        """Wait for the previous commit's housekeeping (at most one runs at a time); the
        segments it could not drop are expired segments to drop again."""
        if self._housekeeping is not None:
            self._housekeeping.join()
            self._housekeeping = None
            self._expired_cfs.update(self._drops_failed)
            self._drops_failed.clear()
            self._dropping = {}

    def _restore_committed(self) -> None:
        self._close_db()
        self._open_live()

    def _release(self) -> None:
        try:
            self._join_housekeeping()
            if self._sync_pool is not None:
                self._sync_pool.shutdown()
                self._sync_pool = None
            self._close_db()
        finally:
            self._unlock()
