"""The one lock file implementation (``sessionstore.locking``), and that every locking caller
(the session store, the CLI's sweep of dead runs, the Spark provider) goes through it."""

from __future__ import annotations

import ast
import os
import pickle
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from sessionstore import SessionStore
from sessionstore.errors import StoreLockedError
from sessionstore.locking import FileLock, LockHeldError, holder_pid, is_locked
from tests.lock_holder import held_elsewhere

ROOT = Path(__file__).resolve().parents[1]


def test_a_second_holder_in_another_process_is_refused_naming_file_and_pid(tmp_path):
    path = tmp_path / "the.lock"
    with held_elsewhere(path) as child:
        assert is_locked(path)
        with pytest.raises(LockHeldError) as refused:
            FileLock(path).acquire()
        assert refused.value.path == path and refused.value.holder_pid == child.pid
        assert str(refused.value) == f"the lock file {path} is held by process {child.pid}"
        assert holder_pid(path) == child.pid
    # the holder let go (cleanly): the lock is free and names nobody
    assert not is_locked(path) and holder_pid(path) is None
    with FileLock(path) as lock:
        assert lock.held and holder_pid(path) == os.getpid()
    assert not lock.held


def test_the_lock_is_released_when_its_holder_is_killed(tmp_path):
    path = tmp_path / "the.lock"
    with held_elsewhere(path) as child:
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(timeout=60) == -signal.SIGKILL
        assert not is_locked(path)
        lock = FileLock(path).acquire()  # the kernel released the dead holder's lock
        assert holder_pid(path) == os.getpid()  # its stale pid is overwritten
        lock.release()


def test_one_process_cannot_hold_it_twice_and_release_is_idempotent(tmp_path):
    path = tmp_path / "the.lock"
    first = FileLock(path).acquire()
    with pytest.raises(LockHeldError, match=f"held by process {os.getpid()}"):
        FileLock(path).acquire()  # a second open of the same process is a second holder
    with pytest.raises(RuntimeError, match="already held by this FileLock"):
        first.acquire()
    first.release()
    first.release()
    assert not is_locked(path)


def test_a_garbled_or_foreign_lock_file_names_no_holder_and_still_locks(tmp_path):
    path = tmp_path / "the.lock"
    path.write_bytes(b"\xff not a pid \x00")
    assert holder_pid(path) is None
    assert not is_locked(path)
    with FileLock(path):
        path.write_bytes(b"garbage")  # someone scribbles over a held lock file
        with pytest.raises(LockHeldError, match=r"another process \(its id unknown\)"):
            FileLock(path).acquire()
    assert holder_pid(tmp_path / "missing.lock") is None and not is_locked(tmp_path / "missing")


def test_guards_only_while_the_locked_file_is_still_at_its_path(tmp_path):
    path = tmp_path / "the.lock"
    lock = FileLock(path).acquire()
    assert lock.guards()
    path.unlink()  # an operator clears the directory: the lock no longer keeps anyone out
    assert not lock.guards()
    with FileLock(path):  # a newcomer locks the new file
        assert not lock.guards()
    lock.release()
    assert not lock.guards()


def test_the_errors_survive_a_trip_to_another_process(tmp_path):
    for error in (LockHeldError(tmp_path / "a", 12), StoreLockedError(tmp_path / "b", None, "m")):
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error) and str(copy) == str(error)
        assert (copy.path, copy.holder_pid) == (error.path, error.holder_pid)


def test_a_failed_acquire_changes_nothing(tmp_path):
    with pytest.raises(FileNotFoundError):
        FileLock(tmp_path / "no-such-dir" / "the.lock").acquire()
    assert not (tmp_path / "no-such-dir").exists()


# -- every caller goes through the module -------------------------------------------------------


def test_a_store_held_through_the_module_is_refused_naming_its_holder(tmp_path):
    """Kills a store that keeps its own lock: its error named neither the lock file nor pid."""
    path = tmp_path / "store"
    SessionStore(path, retention_ms=1000).close()
    with held_elsewhere(path / "LOCK") as child, pytest.raises(StoreLockedError) as refused:
        SessionStore(path, retention_ms=1000)
    assert isinstance(refused.value, ValueError) and isinstance(refused.value, LockHeldError)
    assert refused.value.holder_pid == child.pid
    assert str(refused.value) == (f"session store {path} is already open: its lock file "
                                  f"{path / 'LOCK'} is held by process {child.pid}")
    with SessionStore(path, retention_ms=1000) as store:  # free again once the holder is gone
        assert holder_pid(path / "LOCK") == os.getpid()
        assert is_locked(path / "LOCK")
        with pytest.raises(StoreLockedError, match=f"held by process {os.getpid()}"):
            SessionStore(path, retention_ms=1000)
        del store
    assert not is_locked(path / "LOCK")


def test_the_cli_sweep_spares_a_directory_whose_lock_is_held_through_the_module(tmp_path):
    from sessionstore.cli import sweep_stale_temp_states

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    folder = tmp_path / f"sessionstore-cli-{int(dead.stdout)}-x"
    folder.mkdir()
    with held_elsewhere(folder / "LOCK") as child:
        assert sweep_stale_temp_states(tmp_path) == 0 and folder.is_dir()
        child.kill()
        child.wait(timeout=60)
        assert sweep_stale_temp_states(tmp_path) == 1 and not folder.exists()


def _modules_importing(module: str) -> list[str]:
    found = []
    for package in ("sessionstore", "spark_adapter"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module or ""] if isinstance(node, ast.ImportFrom) else []
                if module in names:
                    found.append(str(path.relative_to(ROOT)))
    return found


def test_only_the_locking_module_locks_files():
    """Three copies (the CLI's probe, the store's, the provider's) were one too many: a caller
    that takes or probes a lock with ``fcntl`` itself, instead of through the module, fails."""
    assert _modules_importing("fcntl") == ["sessionstore/locking.py"]
    for caller in ("sessionstore/cli.py", "sessionstore/store/rocksdb.py",
                   "spark_adapter/provider.py"):
        text = (ROOT / caller).read_text(encoding="utf-8")
        assert "sessionstore.locking" in text or "..locking" in text or ".locking" in text, caller
        assert "flock" not in text and "lockf" not in text, caller
