"""The COMMITTED pointer: the store knows its latest version without trusting the listing.

Deleting or damaging the newest checkpoint, or the pointer itself, is a StoreCorruptedError naming
the missing or damaged path, with the directory left exactly as it was (the writer and the
read-only view both refuse); it never opens at the previous, smaller version. A crash at either
side of the pointer's rename opens at the old or the new version (processes killed at the exact
instant, with ``os._exit`` inside the commit).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sessionstore import ReadOnlySessionStore, Session, SessionStore
from sessionstore.store.checkpoint import (
    MANIFEST_NAME,
    POINTER_NAME,
    CheckpointContents,
    encode_manifest,
    encode_pointer,
    read_manifest,
    read_pointer,
    version_dir_name,
)
from tests.reliability.test_corruption import assert_refused, tree_digest

ROOT = Path(__file__).resolve().parents[2]
RETENTION = 10**9


def put_step(store: SessionStore, step: int) -> None:
    """Step ``step``'s writes: 30 new sessions and the removal of one of the step before."""
    for i in range(30):
        store.put(Session(f"k{i % 7}", step * 1000 + i * 20, step * 1000 + i * 20 + 5),
                  {"step": step, "i": i})
    if step > 1:
        store.remove(Session("k0", (step - 1) * 1000, (step - 1) * 1000 + 5))


def everything(store: SessionStore | ReadOnlySessionStore) -> list[object]:
    return [(tuple(s), v) for s, v in store.find_sessions(-(2**63), 2**63 - 1)]


def store_with_commits(path: Path, commits: int = 3) -> list[list[object]]:
    """A store with ``commits`` commits (two checkpoints kept); the contents after each."""
    after = []
    with SessionStore(path, retention_ms=RETENTION, keep_versions=2) as store:
        for step in range(1, commits + 1):
            put_step(store, step)
            store.commit({"step": step})
            after.append(everything(store))
    return after


def checkpoint(path: Path, version: int) -> Path:
    return path / "checkpoints" / version_dir_name(version)


def test_each_commit_moves_the_pointer(tmp_path: Path) -> None:
    path = tmp_path / "s"
    store_with_commits(path)
    assert read_pointer(path) == 3
    assert sorted(p.name for p in (path / "checkpoints").iterdir()) == [
        version_dir_name(2), version_dir_name(3)]
    assert not (path / "COMMITTED.tmp").exists()


def test_deleted_newest_checkpoint_is_refused_not_the_previous_version(tmp_path: Path) -> None:
    path = tmp_path / "s"
    store_with_commits(path)
    shutil.rmtree(checkpoint(path, 3))
    assert_refused(path, f"checkpoints/{version_dir_name(3)}", "missing")


def test_deleted_checkpoints_folder_is_refused_not_an_empty_store(tmp_path: Path) -> None:
    path = tmp_path / "s"
    store_with_commits(path)
    shutil.rmtree(path / "checkpoints")
    assert_refused(path, f"checkpoints/{version_dir_name(3)}", "missing")


def test_deleted_newest_manifest_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s"
    store_with_commits(path)
    (checkpoint(path, 3) / MANIFEST_NAME).unlink()
    assert_refused(path, f"{version_dir_name(3)}/{MANIFEST_NAME}", "missing store manifest")


@pytest.mark.parametrize("keep", [0, 1, 4, 20, 36, -1])
def test_truncated_pointer_is_refused(tmp_path: Path, keep: int) -> None:
    path = tmp_path / "s"
    store_with_commits(path)
    pointer = path / POINTER_NAME
    raw = pointer.read_bytes()
    pointer.write_bytes(raw[:keep] if keep >= 0 else raw[:len(raw) - 1])
    assert_refused(path, POINTER_NAME)


def test_pointer_rolled_back_to_an_older_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s"
    store_with_commits(path)
    (path / POINTER_NAME).write_bytes(encode_pointer(2))  # well formed, checksum valid
    assert_refused(path, POINTER_NAME, "newer")


def test_pointer_ahead_of_every_checkpoint_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s"
    store_with_commits(path)
    (path / POINTER_NAME).write_bytes(encode_pointer(7))
    assert_refused(path, f"checkpoints/{version_dir_name(7)}", "missing")


def test_deleted_pointer_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s"
    store_with_commits(path)
    (path / POINTER_NAME).unlink()
    assert_refused(path, POINTER_NAME, "missing")


def make_legacy(path: Path) -> None:
    """What a release before the pointer wrote: no COMMITTED, manifests without the flag."""
    (path / POINTER_NAME).unlink()
    for version in (2, 3):
        directory = checkpoint(path, version)
        state, contents = read_manifest(directory)
        legacy = CheckpointContents(contents.sequence, contents.column_families, contents.files)
        assert state.segment_interval_ms is not None
        (directory / MANIFEST_NAME).write_bytes(
            encode_manifest(state, state.segment_interval_ms, legacy))


def test_store_from_before_the_pointer_opens_and_gains_one(tmp_path: Path) -> None:
    path = tmp_path / "s"
    after = store_with_commits(path)
    make_legacy(path)
    with ReadOnlySessionStore(path) as view:
        assert view.version == 3 and everything(view) == after[-1]
    with SessionStore(path, retention_ms=RETENTION) as store:
        assert store.committed_version == 3 and everything(store) == after[-1]
        assert read_pointer(path) is None  # opening writes nothing
        put_step(store, 4)
        store.commit({"step": 4})
        expected = everything(store)
    assert read_pointer(path) == 4
    shutil.rmtree(checkpoint(path, 4))  # from now on the pointer protects it
    assert_refused(path, f"checkpoints/{version_dir_name(4)}", "missing")
    shutil.rmtree(path)
    store_with_commits(path)
    make_legacy(path)
    with SessionStore(path, retention_ms=RETENTION) as store:
        put_step(store, 4)
        store.commit({"step": 4})
    with SessionStore(path, retention_ms=RETENTION) as store:
        assert everything(store) == expected


CRASH_CHILD = textwrap.dedent("""
    import os, sys
    from sessionstore import SessionStore
    from sessionstore.store import rocksdb
    from tests.reliability.test_commit_pointer import RETENTION, put_step

    path, when = sys.argv[1], sys.argv[2]
    real = rocksdb.publish_pointer  # the commit point: the pointer's rename

    def crashing(store_path):
        if when == "before":
            os._exit(9)
        real(store_path)
        os._exit(9)

    rocksdb.publish_pointer = crashing
    store = SessionStore(path, retention_ms=RETENTION, keep_versions=2)
    put_step(store, 4)
    store.commit({"step": 4})
""")


def expected_with_step_4(path: Path) -> list[object]:
    """What committing step 4 gives, computed on a copy by an uninterrupted commit."""
    copy = path.parent / "oracle"
    shutil.copytree(path, copy)
    with SessionStore(copy, retention_ms=RETENTION, keep_versions=2) as store:
        put_step(store, 4)
        store.commit({"step": 4})
    with SessionStore(copy, retention_ms=RETENTION) as store:
        return everything(store)


@pytest.mark.parametrize("when", ["before", "after"])
def test_crash_on_either_side_of_the_pointer(tmp_path: Path, when: str) -> None:
    path = tmp_path / "s"
    after = store_with_commits(path)
    with_step_4 = expected_with_step_4(path)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    child = subprocess.run([sys.executable, "-c", CRASH_CHILD, str(path), when], cwd=ROOT,
                           env=env, capture_output=True, text=True, timeout=120)
    assert child.returncode == 9, child.stderr
    staging = path / "checkpoints" / f".staging-{version_dir_name(4)}"
    assert staging.is_dir()
    assert read_pointer(path) == (3 if when == "before" else 4)
    # a reader meanwhile (the writer could be alive, mid-commit) reads the previous version
    # and changes nothing
    before = tree_digest(path)
    with ReadOnlySessionStore(path) as view:
        assert view.version == 3 and everything(view) == after[-1]
    assert tree_digest(path) == before
    with SessionStore(path, retention_ms=RETENTION) as store:
        if when == "before":
            assert store.committed_version == 3 and everything(store) == after[-1]
        else:
            assert store.committed_version == 4 and everything(store) == with_step_4
            assert store.committed_metadata == {"step": 4}
    assert not staging.exists()
    assert checkpoint(path, 4).is_dir() == (when == "after")
    with SessionStore(path, retention_ms=RETENTION) as store:  # and again, now settled
        assert store.committed_version == (3 if when == "before" else 4)
