"""A lock file held by another process, through :mod:`sessionstore.locking`, for as long as the
test needs it (``with held_elsewhere(path) as child``), or until the test kills that process."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_HOLD = (
    "import sys\n"
    "from sessionstore.locking import FileLock\n"
    "lock = FileLock(sys.argv[1]).acquire()\n"
    "print('held', flush=True)\n"
    "sys.stdin.read()\n"  # until the test closes our stdin (or kills us)
    "lock.release()\n"
)


@contextlib.contextmanager
def held_elsewhere(path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A child process that holds the lock file ``path`` until the block ends (or it is killed);
    yields the child (its ``pid`` is the holder's)."""
    child = subprocess.Popen([sys.executable, "-c", _HOLD, str(path)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, env={"PYTHONPATH": str(ROOT)})
    try:
        assert child.stdout is not None and child.stdout.readline() == b"held\n"
        yield child
    finally:
        if child.poll() is None:  # still holding: let go cleanly (release, then exit)
            assert child.stdin is not None
            child.stdin.close()
            try:
                child.wait(timeout=60)
            except subprocess.TimeoutExpired:
                child.kill()
        child.wait(timeout=60)
