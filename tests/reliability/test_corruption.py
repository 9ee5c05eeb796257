"""Damaged, missing or foreign state is an error naming the file, never less data or a reset.

Every refusal is a StoreCorruptedError (a ValueError) and leaves the store directory exactly as it
was: each test hashes the whole tree before and after.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
import shutil
from pathlib import Path

import msgpack
import pytest
import rocksdict

from sessionstore import ReadOnlySessionStore, Session, SessionStore, StoreCorruptedError
from sessionstore.store import checkpoint as checkpoint_module
from sessionstore.store.base import STORE_FORMAT_VERSION
from sessionstore.store.checkpoint import (
    CheckpointContents,
    committed_versions,
    describe_files,
    encode_manifest,
    read_manifest,
    version_dir_name,
)

SESSIONS = 200


def committed_store(path: Path, sessions: int = SESSIONS) -> Path:
    with SessionStore(path, retention_ms=10**9) as store:
        for i in range(sessions):
            store.put(Session(f"k{i}", i, i + 10), {"n": i})
        store.commit({"offset": sessions})
    return path


def newest_checkpoint(path: Path) -> Path:
    return path / "checkpoints" / version_dir_name(committed_versions(path)[-1])


def manifest_of(path: Path) -> Path:
    return newest_checkpoint(path) / "SESSIONSTORE-MANIFEST"


def tree_digest(path: Path) -> dict[str, str]:
    """Every entry under ``path``: directories by name, files by SHA-256 of their bytes."""
    out = {}
    for root, dirs, files in os.walk(path):
        for name in dirs:
            out[os.path.relpath(os.path.join(root, name), path)] = "dir"
        for name in files:
            full = os.path.join(root, name)
            out[os.path.relpath(full, path)] = hashlib.sha256(Path(full).read_bytes()).hexdigest()
    return out


def assert_refused(path: Path, names: str, match: str | None = None) -> StoreCorruptedError:
    """Opening raises StoreCorruptedError whose path ends with ``names``; nothing changes."""
    before = tree_digest(path)
    with pytest.raises(StoreCorruptedError, match=match) as info:
        SessionStore(path, retention_ms=10**9)
    assert info.value.path.endswith(names), info.value
    assert tree_digest(path) == before, "a failed open changed the store directory"
    with pytest.raises(StoreCorruptedError):
        ReadOnlySessionStore(path)
    assert tree_digest(path) == before, "a failed read-only open changed the store directory"
    return info.value


def forge_manifest(path: Path, **changes: object) -> None:
    """Rewrite the newest manifest with a valid checksum and fresh file digests: what a
    careless repair would write. Only the RocksDB-level checks can catch what it hides."""
    checkpoint = newest_checkpoint(path)
    state, contents = read_manifest(checkpoint)
    fields = {"sequence": contents.sequence, "column_families": contents.column_families,
              "files": describe_files(checkpoint)}
    fields.update(changes)
    manifest = checkpoint / "SESSIONSTORE-MANIFEST"
    manifest.write_bytes(encode_manifest(state, state.segment_interval_ms or 1,
                                         CheckpointContents(**fields)))  # type: ignore[arg-type]


# -- the sessionstore manifest ------------------------------------------------------------------

def test_truncated_manifest(tmp_path):
    path = committed_store(tmp_path / "s")
    manifest = manifest_of(path)
    manifest.write_bytes(manifest.read_bytes()[:7])
    assert_refused(path, "SESSIONSTORE-MANIFEST", "truncated manifest")


def test_manifest_cut_short_anywhere_in_its_body(tmp_path):
    path = committed_store(tmp_path / "s")
    manifest = manifest_of(path)
    raw = manifest.read_bytes()
    manifest.write_bytes(raw[:-1])
    assert_refused(path, "SESSIONSTORE-MANIFEST", "checksum mismatch")


def test_single_bit_flip_in_manifest_metadata_is_detected(tmp_path):
    path = committed_store(tmp_path / "s")
    manifest = manifest_of(path)
    raw = bytearray(manifest.read_bytes())
    raw[raw.index(b"offset") + 1] ^= 0x01  # still valid msgpack, different metadata
    manifest.write_bytes(bytes(raw))
    assert_refused(path, "SESSIONSTORE-MANIFEST", "checksum mismatch")


def test_garbled_manifest(tmp_path):
    path = committed_store(tmp_path / "s")
    manifest_of(path).write_bytes(os.urandom(64))
    assert_refused(path, "SESSIONSTORE-MANIFEST")


def test_missing_manifest(tmp_path):
    path = committed_store(tmp_path / "s")
    manifest_of(path).unlink()
    assert_refused(path, "SESSIONSTORE-MANIFEST", "missing store manifest")


def test_other_format_versions_are_a_clear_value_error_not_damage(tmp_path):
    path = committed_store(tmp_path / "s")
    checkpoint = newest_checkpoint(path)
    state, contents = read_manifest(checkpoint)
    manifest = checkpoint / "SESSIONSTORE-MANIFEST"
    body = msgpack.unpackb(encode_manifest(state, state.segment_interval_ms or 1, contents)[36:],
                           strict_map_key=False)
    body["format"] = STORE_FORMAT_VERSION + 1  # a newer release's
    packed = msgpack.packb(body, use_bin_type=True)
    legacy = msgpack.packb({"format": 1, "version": 1})  # before checksums: a bare msgpack map
    for raw, match in [(b"SSMF" + hashlib.sha256(packed).digest() + packed,
                        f"format version {STORE_FORMAT_VERSION + 1}"),
                       (legacy, "format version 1")]:
        manifest.write_bytes(raw)
        before = tree_digest(path)
        with pytest.raises(ValueError, match=match) as info:
            SessionStore(path, retention_ms=10**9)
        assert not isinstance(info.value, StoreCorruptedError)
        assert tree_digest(path) == before


# -- RocksDB's files ----------------------------------------------------------------------------

def test_missing_sst_file(tmp_path):
    path = committed_store(tmp_path / "s")
    (sst,) = newest_checkpoint(path).glob("*.sst")
    sst.unlink()
    assert_refused(path, sst.name, "missing")


def test_half_truncated_rocksdb_manifest_never_opens_as_an_empty_store(tmp_path):
    path = committed_store(tmp_path / "s")
    (rocks_manifest,) = newest_checkpoint(path).glob("MANIFEST-*")
    raw = rocks_manifest.read_bytes()
    rocks_manifest.write_bytes(raw[: len(raw) // 2])
    assert_refused(path, rocks_manifest.name, "bytes where the manifest records")


def test_half_truncated_rocksdb_manifest_is_caught_by_the_sequence_number_too(tmp_path):
    """With file digests recomputed over the damage, RocksDB's own view must still disagree."""
    path = committed_store(tmp_path / "s")
    (rocks_manifest,) = newest_checkpoint(path).glob("MANIFEST-*")
    raw = rocks_manifest.read_bytes()
    rocks_manifest.write_bytes(raw[: len(raw) // 2])
    forge_manifest(path)
    error = assert_refused(path, newest_checkpoint(path).name)
    assert "RocksDB sequence number 0 where the manifest records" in error.detail, error


def test_a_recorded_column_family_that_is_missing_is_refused(tmp_path):
    path = committed_store(tmp_path / "s")
    _state, contents = read_manifest(newest_checkpoint(path))
    forge_manifest(path, column_families=(*contents.column_families, "seg999"))
    assert_refused(path, newest_checkpoint(path).name, "column families")


def test_deleted_rocksdb_manifest_and_corrupted_current(tmp_path):
    path = committed_store(tmp_path / "s")
    current = newest_checkpoint(path) / "CURRENT"
    current.write_bytes(b"MANIFEST-999999\n")
    assert_refused(path, "CURRENT", "SHA-256")
    path2 = committed_store(tmp_path / "s2")
    (rocks_manifest,) = newest_checkpoint(path2).glob("MANIFEST-*")
    rocks_manifest.unlink()
    assert_refused(path2, rocks_manifest.name, "missing")


def test_a_stray_file_in_a_checkpoint_is_refused(tmp_path):
    """RocksDB would replay a stray write-ahead log found in the directory it opens."""
    path = committed_store(tmp_path / "s")
    (newest_checkpoint(path) / "999999.log").write_bytes(b"\x00" * 32)
    assert_refused(path, "999999.log", "not part of the committed version")


# -- damage met while reading -------------------------------------------------------------------

def damage_data_blocks(directory: Path) -> list[Path]:
    """Flip one byte every 512 in the first 80% of each SST (data blocks come first)."""
    damaged = []
    for sst in sorted(directory.glob("*.sst")):
        raw = bytearray(sst.read_bytes())
        for offset in range(16, len(raw) * 4 // 5, 512):
            raw[offset] ^= 0x40
        with open(sst, "r+b") as handle:  # in place: the open store's file, same inode
            handle.write(raw)
        damaged.append(sst)
    return damaged


def test_a_scan_over_a_damaged_block_raises_instead_of_ending_early(tmp_path):
    path = committed_store(tmp_path / "s", sessions=5_000)
    with SessionStore(path, retention_ms=10**9) as store:
        damaged = damage_data_blocks(path / "live")
        assert damaged
        calls = [
            lambda: list(store.find_sessions(-(2**63), 2**63 - 1)),
            lambda: list(store.fetch("k2500")),
            lambda: list(store.find_sessions_to_merge("k4000", 0, 10**6)),
            lambda: store.fetch_session("k1234", 1234, 1244),
            lambda: store.find_sessions_columns(-(2**63)),  # the engine's bulk read
        ]
        for call in calls:
            with pytest.raises(StoreCorruptedError) as info:
                call()
            assert info.value.path.endswith(".sst"), info.value


def test_the_read_only_view_raises_on_a_damaged_block(tmp_path):
    path = committed_store(tmp_path / "s", sessions=5_000)
    with ReadOnlySessionStore(path) as view:
        # the version's copy (beside the view's LOCK and HELD files)
        (scratch_dir,) = [p for p in view._scratch.iterdir() if p.is_dir()]
        damage_data_blocks(scratch_dir)
        with pytest.raises(StoreCorruptedError):
            list(view)
        with pytest.raises(StoreCorruptedError):
            view.fetch("k2500")


# -- opening never deletes what it did not create -----------------------------------------------

def test_a_failed_open_deletes_nothing_in_checkpoints(tmp_path):
    path = committed_store(tmp_path / "s")
    backup = path / "checkpoints" / "operator-backup"
    backup.mkdir()
    (backup / "notes.txt").write_text("keep me")
    (path / "checkpoints" / "v12").mkdir()
    (path / "checkpoints" / ".staging-mine").mkdir()
    manifest_of(path).write_bytes(b"garbage")
    assert_refused(path, "SESSIONSTORE-MANIFEST")
    assert (backup / "notes.txt").read_text() == "keep me"


def test_a_successful_open_removes_only_its_own_leftovers(tmp_path):
    path = committed_store(tmp_path / "s")
    root = path / "checkpoints"
    for name in ("operator-backup", "v12", ".staging-mine", ".staging-v000000000009",
                 ".deleting-v000000000001"):
        (root / name).mkdir()
    with SessionStore(path, retention_ms=10**9) as store:
        assert store.committed_metadata == {"offset": SESSIONS}
    assert sorted(p.name for p in root.iterdir()) == [
        ".staging-mine", "operator-backup", "v000000000001", "v12"]


# -- nothing is unpickled -----------------------------------------------------------------------

class Boom:
    """Unpickling this creates a marker file: the proof that code ran."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_crafted_pickle_payloads_never_run(tmp_path):
    marker = tmp_path / "code-ran"
    payload = pickle.dumps(Boom(str(marker)))
    path = committed_store(tmp_path / "s")
    checkpoint = manifest_of(path).parent
    # a pickle where a value belongs, written behind the store's back
    db = rocksdict.Rdict(str(checkpoint), options=rocksdict.Options(raw_mode=True),
                         column_families={n: rocksdict.Options(raw_mode=True) for n in
                                          rocksdict.Rdict.list_cf(str(checkpoint),
                                                                  rocksdict.Options(raw_mode=True))})
    cf_name = next(n for n in rocksdict.Rdict.list_cf(str(checkpoint),
                                                      rocksdict.Options(raw_mode=True))
                   if n.startswith("seg"))
    cf = db.get_column_family(cf_name)
    key = next(k for k in cf.keys() if k.startswith(b"K"))  # noqa: SIM118 - an Rdict
    cf[key] = payload
    del cf
    db.close()
    # and rocksdict's own config flipped to its pickling mode
    (checkpoint / "rocksdict-config.json").write_text('{"raw_mode":false,"prefix_extractors":{}}')
    try:
        with SessionStore(path, retention_ms=10**9) as store:
            for _session, _value in _read_all_tolerating_garbage(store):
                pass
    except ValueError:
        pass  # refusing the tampered store is fine; running code is not
    view_error = None
    try:
        with ReadOnlySessionStore(path) as view:
            list(view)
    except ValueError as exc:
        view_error = exc
    # a pickle where the manifest belongs
    manifest_of(path).write_bytes(payload)
    with pytest.raises(ValueError):
        SessionStore(path, retention_ms=10**9)
    assert not marker.exists(), "opening or reading the store ran code"
    assert view_error is None or isinstance(view_error, ValueError)


def _read_all_tolerating_garbage(store):
    out = []
    for key in [f"k{i}" for i in range(SESSIONS)]:
        # msgpack refuses the pickle bytes with a ValueError: a clear error, and no code runs
        with contextlib.suppress(ValueError):
            out.extend(store.fetch(key))
    return out


def test_rocksdb_errors_are_classified_by_their_status():
    translate = checkpoint_module.translate_rocksdb_error
    fallback = Path("/store/live")
    bad_block = translate(Exception(
        "Corruption: block checksum mismatch: stored = 1, computed = 2, type = 4  in "
        "/store/live/000010.sst offset 0 size 1320"), fallback)
    assert isinstance(bad_block, StoreCorruptedError) and bad_block.path == "/store/live/000010.sst"
    missing = translate(Exception("IO error: No such file or directory: While open a file for "
                                  "random read: /store/live/000012.sst: No such file"), fallback)
    assert isinstance(missing, StoreCorruptedError) and missing.path.endswith("000012.sst")
    unnamed = translate(Exception("Corruption: bad record"), fallback)
    assert isinstance(unnamed, StoreCorruptedError) and unnamed.path == str(fallback)
    full = translate(Exception("IO error: No space left on device: While appending to file: "
                               "/store/live/000013.sst"), fallback)
    assert type(full) is OSError and "No space left" in str(full)
    assert translate(ValueError("Corruption: not from RocksDB"), fallback) is None
    assert translate(Exception("something else"), fallback) is None


def test_an_open_removes_the_work_directory_of_an_interrupted_rocksdb_checkpoint(tmp_path):
    # RocksDB builds a checkpoint in "<target>.tmp" and renames it when done: a SIGKILL during
    # create_checkpoint leaves ".staging-v<N>.tmp", whose hard links hold SST space (issue 25)
    path = committed_store(tmp_path / "s")
    root = path / "checkpoints"
    leftover = root / f".staging-{version_dir_name(2)}.tmp"
    db = rocksdict.Rdict(str(tmp_path / "live"), options=rocksdict.Options(raw_mode=True))
    try:
        for i in range(100):
            db[f"k{i}".encode()] = bytes(100)
        db.flush()
        rocksdict.Checkpoint(db).create_checkpoint(str(leftover))
    finally:
        db.close()
    assert any(p.suffix == ".sst" for p in leftover.iterdir())
    with SessionStore(path, retention_ms=10**9) as store:
        assert store.committed_version == 1
        assert store.committed_metadata == {"offset": SESSIONS}
    assert sorted(p.name for p in root.iterdir()) == [version_dir_name(1)]


def test_an_open_removes_every_leftover_of_its_own_naming(tmp_path):
    # issue 25 item 4, every name at once: a stale COMMITTED.tmp (a SIGKILL between staging the
    # pointer and publishing it) and a partial ".live-next" copy (a SIGKILL during an open)
    # besides the checkpoint leftovers. Kills: the open not removing COMMITTED.tmp, or not
    # removing ".live-next" before copying into it (both survived the project's tests).
    path = committed_store(tmp_path / "s")
    (path / "COMMITTED.tmp").write_bytes(b"a stale pointer, never published")
    (path / ".live-next").mkdir()
    (path / ".live-next" / "000009.sst").write_bytes(b"half a copy")
    for name in (".staging-v000000000002", ".staging-v000000000002.tmp",
                 ".deleting-v000000000001"):
        (path / "checkpoints" / name).mkdir()
        (path / "checkpoints" / name / "000009.sst").write_bytes(b"held")
    with SessionStore(path, retention_ms=10**9) as store:
        assert store.committed_version == 1
        assert len(list(store.find_sessions(-(2**63), 2**63 - 1))) == SESSIONS
    assert sorted(p.name for p in path.iterdir()) == ["COMMITTED", "LOCK", "checkpoints", "live"]
    assert [p.name for p in (path / "checkpoints").iterdir()] == [version_dir_name(1)]
    assert not (path / "live" / "000009.sst").exists()


@pytest.mark.parametrize("name", ["COMMITTED.tmp", ".live-next", "live",
                                  "checkpoints/.staging-v000000000002",
                                  "checkpoints/.staging-v000000000002.tmp",
                                  "checkpoints/.deleting-v000000000001"])
@pytest.mark.parametrize("kind", ["other kind", "symlink"])
def test_an_own_leftover_of_the_other_kind_is_removed_too(tmp_path, name, kind):
    # A name the store owns holding the other kind of entry (a file where a directory is
    # written, a directory where a file is): the open used to fail with a bare
    # IsADirectoryError / NotADirectoryError after it had already rebuilt live/. A symlink is
    # removed as a link; what it points to is never touched.
    path = committed_store(tmp_path / "s")
    entry = path / name
    if entry.is_dir():
        shutil.rmtree(entry)
    target = tmp_path / "outside"
    target.mkdir()
    (target / "keep.sst").write_bytes(b"not the store's")
    if kind == "symlink":
        entry.symlink_to(target, target_is_directory=True)
    elif name == "COMMITTED.tmp":
        entry.mkdir()
        (entry / "x").write_bytes(b"a directory where a file is written")
    else:
        entry.write_bytes(b"a file where a directory is written")
    with SessionStore(path, retention_ms=10**9) as store:
        assert store.committed_version == 1
        assert len(list(store.find_sessions(-(2**63), 2**63 - 1))) == SESSIONS
    assert sorted(p.name for p in path.iterdir()) == ["COMMITTED", "LOCK", "checkpoints", "live"]
    assert [p.name for p in (path / "checkpoints").iterdir()] == [version_dir_name(1)]
    assert (path / "live").is_dir() and not (path / "live").is_symlink()
    assert (target / "keep.sst").read_bytes() == b"not the store's"


def test_a_committed_pointer_that_is_a_directory_is_refused_by_name(tmp_path):
    path = committed_store(tmp_path / "s")
    (path / "COMMITTED").unlink()
    (path / "COMMITTED").mkdir()
    with pytest.raises(StoreCorruptedError, match="COMMITTED"):
        SessionStore(path, retention_ms=10**9)
    assert (path / "COMMITTED").is_dir()  # a refused open changes nothing


def test_an_ingested_file_damaged_before_its_commit_fails_the_next_open(tmp_path):
    # The commit records the digest of the bytes the store wrote, computed from its buffer,
    # not of what the file holds by then: damage between the write and the commit (which a
    # read-back would have recorded as the truth, opening cleanly) fails the next open, naming
    # the file. Kills: the commit hashing the ingested file again instead.
    import numpy as np

    from sessionstore.store import rocksdb as rocksdb_module

    path = tmp_path / "s"
    n = 4 * rocksdb_module.BULK_LAYOUT_MIN_SESSIONS
    with SessionStore(path, retention_ms=10**9) as store:
        store.put_many([f"k{i}" for i in range(n)], np.zeros(n, np.int64),
                       np.arange(n, dtype=np.int64), list(range(n)))
        (sst,) = (path / "live").glob("*.sst")
        with open(sst, "r+b") as handle:  # in place: the checkpoint links this very file
            handle.seek(sst.stat().st_size // 2)  # among the records, before the tail
            byte = handle.read(1)
            handle.seek(-1, os.SEEK_CUR)
            handle.write(bytes([byte[0] ^ 0x01]))
        store.commit()
    assert_refused(path, sst.name, "SHA-256")
