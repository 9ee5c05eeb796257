"""The read-only view: no lock, no writes into the store, scratch always cleaned up, and refresh
that survives the writer deleting what it was about to copy."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from sessionstore import ReadOnlySessionStore, Session, SessionStore, StoreCorruptedError
from sessionstore.store import committed_versions
from sessionstore.store import readonly as readonly_module
from tests.reliability.test_corruption import tree_digest

ROOT = Path(__file__).resolve().parents[2]


def write_version(store: SessionStore, version: int) -> None:
    """Version ``v`` holds sessions ``k0 .. k(10v - 1)``, one segment per 100 of them."""
    for i in range((version - 1) * 10, version * 10):
        store.put(Session(f"k{i}", i * 10, i * 10 + 5), i)
    store.commit({"n": version})


def assert_is_version(view: ReadOnlySessionStore, version: int) -> None:
    assert view.version == version
    assert view.metadata == {"n": version}
    rows = list(view)
    assert [value for _, value in rows] == list(range(version * 10))
    assert view.fetch(f"k{version * 10 - 1}")[0][1] == version * 10 - 1


def one_version_and_scratch(tmp_path: Path) -> tuple[Path, Path]:
    """A store at ``tmp_path/s`` holding version 1, and an empty ``tmp_path/scratch``."""
    path = tmp_path / "s"
    with SessionStore(path, retention_ms=10**9) as store:
        write_version(store, 1)
    scratch_root = tmp_path / "scratch"
    scratch_root.mkdir()
    return path, scratch_root


def test_opens_beside_a_running_writer_without_its_lock_and_changes_nothing(tmp_path):
    path = tmp_path / "s"
    writer = SessionStore(path, retention_ms=10**9, segment_interval_ms=1000)
    for version in (1, 2):
        write_version(writer, version)
    before = tree_digest(path / "checkpoints")
    with ReadOnlySessionStore(path, scratch_dir=tmp_path) as view:
        assert_is_version(view, 2)
        assert view.segment_interval_ms == 1000
        assert view.observed_stream_time == 195
        assert view.live_segments() == [0]
        assert view.path == path
        with pytest.raises(ValueError, match="already open"):  # the writer still holds it
            SessionStore(path, retention_ms=10**9)
    assert tree_digest(path / "checkpoints") == before
    assert committed_versions(path) == [1, 2]
    writer.close()


def test_scratch_is_removed_when_a_view_is_dropped_without_close(tmp_path):
    path, scratch_root = one_version_and_scratch(tmp_path)
    view = ReadOnlySessionStore(path, scratch_dir=scratch_root)
    assert_is_version(view, 1)
    assert len(list(scratch_root.iterdir())) == 1
    del view
    gc.collect()
    assert list(scratch_root.iterdir()) == []


def test_scratch_is_removed_when_the_interpreter_exits_with_the_view_open(tmp_path):
    path, scratch_root = one_version_and_scratch(tmp_path)
    script = textwrap.dedent(f"""
        from sessionstore import ReadOnlySessionStore
        VIEW = ReadOnlySessionStore({str(path)!r}, scratch_dir={str(scratch_root)!r})
        assert len(VIEW.fetch("k3")) == 1
    """)
    subprocess.run([sys.executable, "-c", script], check=True, cwd=ROOT,
                   env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert list(scratch_root.iterdir()) == []


def test_a_failed_open_leaves_no_scratch(tmp_path):
    path = tmp_path / "s"
    with SessionStore(path, retention_ms=10**9) as store:
        write_version(store, 1)
    (sst,) = (path / "checkpoints" / "v000000000001").glob("*.sst")
    sst.write_bytes(sst.read_bytes()[:-1])
    scratch_root = tmp_path / "scratch"
    scratch_root.mkdir()
    with pytest.raises(StoreCorruptedError, match=sst.name):
        ReadOnlySessionStore(path, scratch_dir=scratch_root)
    with pytest.raises(ValueError, match="no committed version"):
        ReadOnlySessionStore(tmp_path / "empty", scratch_dir=scratch_root)
    assert list(scratch_root.iterdir()) == []


@pytest.mark.parametrize("stage", ["read_manifest", "copy_checkpoint", "mid-copy"])
def test_refresh_retries_when_the_writer_deletes_the_checkpoint_mid_refresh(
        tmp_path, monkeypatch, stage):
    """The writer commits (keep_versions=1 deletes the older checkpoint) at the worst moment of
    each refresh stage; the view moves on to the newest version."""
    path = tmp_path / "s"
    writer = SessionStore(path, retention_ms=10**9, keep_versions=1)
    write_version(writer, 1)
    view = ReadOnlySessionStore(path, scratch_dir=tmp_path)
    write_version(writer, 2)
    target, name = (os, "link") if stage == "mid-copy" else (readonly_module, stage)
    original = getattr(target, name)
    raced = []

    def racing(*args, **kwargs):
        if not raced:
            raced.append(True)
            write_version(writer, 3)  # deletes v2, which this refresh is reading
        return original(*args, **kwargs)

    monkeypatch.setattr(target, name, racing)
    assert view.refresh() == 3
    monkeypatch.undo()
    assert raced and view.metrics["refresh-retries"] == 1
    assert_is_version(view, 3)
    view.close()
    writer.close()


def test_refresh_raises_on_damage_to_the_newest_version(tmp_path):
    """Only a superseded checkpoint may fail as a race; the newest one failing is real."""
    path = tmp_path / "s"
    writer = SessionStore(path, retention_ms=10**9)
    write_version(writer, 1)
    view = ReadOnlySessionStore(path, scratch_dir=tmp_path)
    write_version(writer, 2)
    writer.close()
    (path / "checkpoints" / "v000000000002" / "CURRENT").write_bytes(b"MANIFEST-000001\n")
    with pytest.raises(StoreCorruptedError, match="CURRENT"):
        view.refresh()
    assert_is_version(view, 1)  # still answering from the version it had
    assert view.metrics["refresh-retries"] == 0
    view.close()


WRITER = """
import sys
from sessionstore import Session, SessionStore
from tests.store.test_readonly import write_version
with SessionStore(sys.argv[1], retention_ms=10**9, keep_versions=1) as store:
    for version in range(store.committed_version + 1, int(sys.argv[2]) + 1):
        write_version(store, version)
"""


def test_refresh_against_a_concurrent_writer_process(tmp_path):
    """A writer process commits as fast as it can, keeping one checkpoint; the view refreshes in
    a loop and must always show exactly one committed version."""
    path = tmp_path / "s"
    with SessionStore(path, retention_ms=10**9) as store:
        write_version(store, 1)
    versions = 150
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(versions)],
                              cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    seen = set()
    with ReadOnlySessionStore(path, scratch_dir=tmp_path) as view:
        deadline = time.monotonic() + 120
        while view.version < versions and time.monotonic() < deadline:
            version = view.refresh()
            assert_is_version(view, version)
            seen.add(version)
        retries = view.metrics["refresh-retries"]
    assert writer.wait(timeout=120) == 0
    assert max(seen) == versions
    assert len(seen) >= 5, seen
    print(f"refresh saw {len(seen)} versions, {retries} races retried")


def test_the_read_floor_follows_the_committed_expiry_cap(tmp_path):
    # An engine on an external watermark caps expiry (cap_expiry_time) below the stream time:
    # sessions it has not closed stay readable in the writer, and must stay so in a view of
    # the commit (issue 25: ignoring the cap hid them from the view only).
    path = tmp_path / "s"
    with SessionStore(path, retention_ms=100, segment_interval_ms=10) as writer:
        writer.cap_expiry_time(150)
        for i in range(40):
            writer.put(Session(f"k{i}", i * 10, i * 10 + 5), i)  # ends 5 .. 395
        writer.commit({"n": 1})
        expected = sorted((s.key, s.end) for s, _ in writer.find_sessions(-(2**63), 2**63 - 1))
        floor = writer.read_floor_ms
    assert floor == 150 - 100 + 1  # capped: the stream time (395) would give 296
    assert min(end for _, end in expected) == 55
    with ReadOnlySessionStore(path, scratch_dir=tmp_path) as view:
        assert view.read_floor_ms == floor
        assert sorted((s.key, s.end) for s, _ in view.find_sessions(-(2**63), 2**63 - 1)) \
            == expected
        assert [v for _, v in view.fetch("k6")] == [6]  # ends at 65: above the capped floor


def start_view_process(path: Path, scratch_root: Path) -> subprocess.Popen[str]:
    """A process holding a view open (under ``scratch_root``) until it is killed."""
    script = textwrap.dedent(f"""
        import time
        from sessionstore import ReadOnlySessionStore
        VIEW = ReadOnlySessionStore({str(path)!r}, scratch_dir={str(scratch_root)!r})
        print("open", flush=True)
        time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE,
                            text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.stdout is not None and proc.stdout.readline() == "open\n"
    return proc


def test_an_open_removes_the_scratch_of_a_view_killed_by_sigkill(tmp_path):
    # issue 25 item 4, for views: a SIGKILLed view's copy (hard links holding SST space) stayed
    # in the temp directory for ever. The next view under the same scratch_dir removes the
    # copies of dead views, and never the copy of a live one or anything else there.
    path, scratch_root = one_version_and_scratch(tmp_path)
    (scratch_root / "sessionstore-view-operator-notes").mkdir()  # not a view's: no lock
    killed = start_view_process(path, scratch_root)
    killed.kill()
    killed.wait()
    before = set(scratch_root.iterdir())
    (dead,) = before - {scratch_root / "sessionstore-view-operator-notes"}
    assert any(f.stat().st_nlink > 1 for f in dead.rglob("*.sst"))  # holding SST space
    live = start_view_process(path, scratch_root)
    try:
        (alive,) = set(scratch_root.iterdir()) - before
        with ReadOnlySessionStore(path, scratch_dir=scratch_root) as view:
            assert_is_version(view, 1)
            left = set(scratch_root.iterdir())
            assert dead not in left
            assert {alive, scratch_root / "sessionstore-view-operator-notes"} < left
            assert len(left) == 3  # and this view's own
    finally:
        live.kill()
        live.wait()
    assert set(scratch_root.iterdir()) == {alive, scratch_root / "sessionstore-view-operator-notes"}


def test_the_sweep_skips_a_scratch_it_may_not_look_into(tmp_path, monkeypatch):
    # another user's view in a shared temp directory (mkdtemp makes it 0700): probing it fails
    # with EACCES, which must not fail this view's open. Root ignores permissions, so the
    # probe's error is injected here.
    path, scratch_root = one_version_and_scratch(tmp_path)
    foreign = scratch_root / "sessionstore-view-another-user"
    foreign.mkdir()
    (foreign / "HELD").touch()

    def denied(lock: Path) -> bool:
        raise PermissionError(13, "Permission denied", str(lock))

    monkeypatch.setattr(readonly_module, "is_locked", denied)
    with ReadOnlySessionStore(path, scratch_dir=scratch_root) as view:
        assert_is_version(view, 1)
    assert [p.name for p in scratch_root.iterdir()] == [foreign.name]
