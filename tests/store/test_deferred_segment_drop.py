"""Expired segments leave reads and writes at once; RocksDB drops their column families after the
next commit's commit point, in the commit's housekeeping thread. The commit records them as
expired, so a crash between the commit and the drop reopens without them.

Real RocksDB files; the crash is a SIGKILL of a child process at the start of its housekeeping.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import rocksdict

from sessionstore import ReadOnlySessionStore, Session, SessionStore
from sessionstore.store.checkpoint import read_manifest

ROOT = Path(__file__).resolve().parents[2]
RETENTION = 1_000
INTERVAL = 500

# The child: two sessions in segment 0 and one in 1, committed (v1); a put at 2,600 expires
# segments 0..2 (min live segment (2600 - 1000) // 500 = 3); the commit (v2) passes its commit
# point, and the child is killed as its housekeeping thread starts, before any drop.
CHILD = """
import os, signal, sys
from sessionstore import Session, SessionStore
from sessionstore.store import rocksdb

housekeep = rocksdb._housekeep
calls = []

def killed(*args):
    calls.append(args)
    if len(calls) == 2:  # the second commit's
        os.kill(os.getpid(), signal.SIGKILL)
    housekeep(*args)

rocksdb._housekeep = killed
store = SessionStore(sys.argv[1], retention_ms=1000, segment_interval_ms=500)
store.put(Session("a", 0, 100), "a0")
store.put(Session("b", 50, 400), "b0")
store.put(Session("a", 600, 700), "a1")
store.commit({"step": 1})
store.put(Session("c", 2600, 2600), "c5")
store.commit({"step": 2})
print("not killed", flush=True)
"""


def committed_contents(store: SessionStore):
    return read_manifest(store.checkpoint_path())[1]


def rocksdb_families(store: SessionStore) -> set[str]:
    """The column families RocksDB itself holds in the working copy (read from its MANIFEST)."""
    return set(rocksdict.Rdict.list_cf(str(store.path / "live"),
                                       rocksdict.Options(raw_mode=True)))


def every_session(store) -> list[tuple[tuple[object, int, int], object]]:
    return [(tuple(s), v) for s, v in store.find_sessions(-(2**63), 2**63 - 1)]


def test_expiry_leaves_the_drop_to_the_commits_housekeeping(tmp_path: Path):
    with SessionStore(tmp_path / "s", retention_ms=RETENTION,
                      segment_interval_ms=INTERVAL) as store:
        store.put(Session("a", 0, 100), 1)
        store.put(Session("a", 600, 700), 2)
        store.commit()
        store.put(Session("b", 1600, 1700), 3)  # min live segment (1700 - 1000) // 500 = 1
        assert store.live_segments() == [1, 3]
        assert store.metrics["expired-segments"] == 1
        assert "seg0" in rocksdb_families(store)  # not dropped inside the batch
        store.commit()
        contents = committed_contents(store)
        # the version still holds the family, and says it is expired
        assert "seg0" in contents.column_families
        assert contents.expired == ("seg0",)
        store.put(Session("b", 1600, 1800), 4)
        store.commit()  # joins the previous housekeeping, which dropped seg0 after v2
        assert "seg0" not in rocksdb_families(store)
        contents = committed_contents(store)
        assert "seg0" not in contents.column_families
        assert contents.expired == ()
        assert store.live_segments() == [1, 3]
        # (a's session ending at 700 is still held, but below the read floor 1800 - 1000 + 1)
        assert every_session(store) == [(("b", 1600, 1700), 3), (("b", 1600, 1800), 4)]


def test_crash_after_the_commit_point_before_the_drop_reopens_without_expired(tmp_path: Path):
    path = tmp_path / "crash"
    child = subprocess.run([sys.executable, "-c", CHILD, str(path)], cwd=ROOT,
                           env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True,
                           text=True, timeout=120)
    assert child.returncode == -signal.SIGKILL, child.stderr
    with SessionStore(path, retention_ms=RETENTION, segment_interval_ms=INTERVAL) as store:
        assert store.committed_version == 2
        assert store.committed_metadata == {"step": 2}
        contents = committed_contents(store)
        # the commit went through before the drops: its checkpoint holds the families
        assert {"seg0", "seg1"} <= set(contents.column_families)
        assert contents.expired == ("seg0", "seg1")
        assert store.live_segments() == [5]
        assert every_session(store) == [(("c", 2600, 2600), "c5")]
        # a cap far below stream time lowers the read floor: an expired segment that came
        # back on reopen would show its sessions now
        store.cap_expiry_time(0)
        assert every_session(store) == [(("c", 2600, 2600), "c5")]
        assert list(store.fetch("a")) == []
        store.cap_expiry_time(None)
        with ReadOnlySessionStore(path) as view:
            assert view.live_segments() == [5]
        store.commit({"step": 3})  # the reopened writer drops what the crash left
    with SessionStore(path, retention_ms=RETENTION, segment_interval_ms=INTERVAL) as store:
        contents = committed_contents(store)
        assert not {"seg0", "seg1"} & set(contents.column_families)
        assert contents.expired == ()
        assert not {"seg0", "seg1"} & rocksdb_families(store)
        assert every_session(store) == [(("c", 2600, 2600), "c5")]


def test_abort_brings_back_a_segment_expired_since_the_commit(tmp_path: Path):
    path = tmp_path / "s"
    with SessionStore(path, retention_ms=RETENTION, segment_interval_ms=INTERVAL) as store:
        store.put(Session("a", 0, 100), 1)
        store.commit()
        store.put(Session("b", 2000, 2100), 2)  # expires segment 0
        assert store.live_segments() == [4]
        store.abort()
        assert store.live_segments() == [0]
        assert every_session(store) == [(("a", 0, 100), 1)]
        store.put(Session("a", 0, 150), 3)
        store.commit()  # segment 0 is live in this version, not expired
        assert committed_contents(store).expired == ()
    with SessionStore(path, retention_ms=RETENTION, segment_interval_ms=INTERVAL) as store:
        assert every_session(store) == [(("a", 0, 100), 1), (("a", 0, 150), 3)]


def test_a_segment_written_again_after_expiry_starts_empty(tmp_path: Path):
    path = tmp_path / "s"
    with SessionStore(path, retention_ms=RETENTION, segment_interval_ms=INTERVAL) as store:
        store.put(Session("a", 0, 100), "old")
        store.put(Session("b", 2000, 2100), "b")  # expires segment 0, not dropped yet
        store.cap_expiry_time(0)  # a lowered cap lets segment 0 take writes again
        assert store.put(Session("c", 10, 200), "new")
        assert store.live_segments() == [0, 4]
        # the expired family was dropped before it was created again: the old session is gone
        assert every_session(store) == [(("c", 10, 200), "new"), (("b", 2000, 2100), "b")]
        store.commit()
        assert committed_contents(store).expired == ()
    with SessionStore(path, retention_ms=RETENTION, segment_interval_ms=INTERVAL) as store:
        store.cap_expiry_time(0)
        assert every_session(store) == [(("c", 10, 200), "new"), (("b", 2000, 2100), "b")]


class _FailingFirstDrop:
    """Stands in for the database in the housekeeping thread: the first drop fails."""

    def __init__(self, db) -> None:
        self.db = db
        self.failed: list[str] = []

    def drop_column_family(self, name: str) -> None:
        if not self.failed:
            self.failed.append(name)
            raise Exception("IO error: injected drop failure")  # RocksDB's bare Exception
        self.db.drop_column_family(name)


def test_a_drop_that_fails_stays_recorded_as_expired_until_it_succeeds(tmp_path: Path,
                                                                       monkeypatch):
    from sessionstore.store import rocksdb

    housekeep = rocksdb._housekeep
    stand_ins: list[_FailingFirstDrop] = []

    def failing_once(root, doomed, db, expired, failed):
        if not stand_ins:
            stand_ins.append(_FailingFirstDrop(db))
            db = stand_ins[0]
        housekeep(root, doomed, db, expired, failed)

    monkeypatch.setattr(rocksdb, "_housekeep", failing_once)
    path = tmp_path / "s"
    with SessionStore(path, retention_ms=RETENTION, segment_interval_ms=INTERVAL) as store:
        store.put(Session("a", 0, 100), 1)
        store.put(Session("b", 2000, 2100), 2)  # expires segment 0
        store.commit()  # v1 holds segment 0, recorded as expired
        assert committed_contents(store).expired == ("seg0",)
        store.put(Session("b", 2000, 2200), 3)
        store.commit()  # the first drop failed: still held, still recorded as expired
        assert stand_ins[0].failed == ["seg0"]
        assert committed_contents(store).expired == ("seg0",)
        assert "seg0" in committed_contents(store).column_families
        store.put(Session("b", 2000, 2300), 4)
        store.commit()  # dropped after v2: gone from v3
        assert "seg0" not in committed_contents(store).column_families
        assert committed_contents(store).expired == ()
    with SessionStore(path, retention_ms=RETENTION, segment_interval_ms=INTERVAL) as store:
        store.cap_expiry_time(0)
        assert [s for s, _ in store.find_sessions(-(2**63), 2**63 - 1)] == [
            ("b", 2000, 2100), ("b", 2000, 2200), ("b", 2000, 2300)]
