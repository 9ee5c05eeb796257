"""The one lock file implementation: an exclusive, non-blocking lock held by one process.

A :class:`FileLock` is an advisory ``flock`` on a file. It is

* exclusive: a second holder is refused, whether it is another process or another open in the
  same process (the lock belongs to the open file, not to the process);
* non-blocking: :meth:`FileLock.acquire` fails at once with :class:`LockHeldError`, which names
  the lock file and, where the file records it, the holder's process id; a caller that wants to
  wait retries;
* released by :meth:`FileLock.release` (``close``), and by the kernel when the holder dies,
  however it dies (SIGKILL included): no stale lock outlives its process.

The holder writes its process id into the file after taking the lock, for error messages only:
nothing trusts the file's contents, which a crash or another process may have left behind (in
another PID namespace the id means nothing here). A forked child shares its parent's open file,
and so its lock, until both close it.

The session store (``LOCK`` in its directory), the CLI's sweep of dead runs' temporary stores,
the read-only view's scratch copy (swept the same way when its process died) and the Spark
provider's partition lock all use this module; no other module locks files.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from pathlib import Path
from types import TracebackType

__all__ = ["FileLock", "LockHeldError", "holder_description", "holder_pid", "is_locked"]

_PID_BYTES = 32  # far more than any process id's digits and newline


class LockHeldError(RuntimeError):
    """Another holder has the lock file.

    Attributes:
        path: the lock file.
        holder_pid: the process id the holder recorded in it, or None when unknown.
    """

    def __init__(self, path: str | os.PathLike[str], holder_pid: int | None,
                 message: str | None = None) -> None:
        self.path = Path(path)
        self.holder_pid = holder_pid
        super().__init__(message or f"the lock file {self.path} is held by "
                                    f"{holder_description(holder_pid)}")

    def __reduce__(self) -> tuple[type[LockHeldError], tuple[Path, int | None, str]]:
        # rebuilt from all three (as when an error crosses to another process), not from args
        return type(self), (self.path, self.holder_pid, str(self))


def holder_description(pid: int | None) -> str:
    """``"process 1234"`` for a known holder, ``"another process (its id unknown)"`` otherwise:
    the phrase every lock error uses for its holder."""
    return "another process (its id unknown)" if pid is None else f"process {pid}"


def holder_pid(path: str | os.PathLike[str]) -> int | None:
    """The process id recorded in the lock file ``path``, or None when there is none (a missing,
    empty or garbled file: its contents are never trusted)."""
    try:
        with open(path, "rb") as handle:
            text = handle.read(_PID_BYTES).strip()
    except OSError:
        return None
    return int(text) if text.isdigit() and 0 < int(text) < 1 << 31 else None


class FileLock:
    """An exclusive, non-blocking lock on the file ``path`` (created if missing, never deleted).

    Use :meth:`acquire` and :meth:`release`, or ``with FileLock(path):``. One object holds the
    lock at most once; a second :meth:`acquire` on it while held raises ``RuntimeError``.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        """Whether this object holds the lock (acquired and not released)."""
        return self._fd is not None

    def acquire(self) -> FileLock:
        """Take the lock, or fail at once. Returns ``self``.

        Raises:
            LockHeldError: another holder has it (naming the file and, if recorded, its pid);
                nothing is changed then.
            OSError: the file cannot be opened or created (its directory is missing, say).
            RuntimeError: this object already holds it.
        """
        if self._fd is not None:
            raise RuntimeError(f"the lock file {self.path} is already held by this FileLock")
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise LockHeldError(self.path, holder_pid(self.path)) from None
        with contextlib.suppress(OSError):  # for others' error messages; the lock stands alone
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        """Give the lock up (idempotent). The recorded pid is cleared first, so a later error
        never names a process that has let go."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        os.close(fd)  # closing the last descriptor of the open file releases the flock

    close = release

    def guards(self) -> bool:
        """Whether the lock is held *and* ``path`` is still the file that was locked (not
        deleted or replaced since, say by an operator clearing a directory): only then does it
        keep another process out."""
        if self._fd is None:
            return False
        try:
            now, locked = os.stat(self.path), os.fstat(self._fd)
        except OSError:
            return False
        return (now.st_dev, now.st_ino) == (locked.st_dev, locked.st_ino)

    def __enter__(self) -> FileLock:
        return self.acquire()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()

    def __del__(self) -> None:
        if self._fd is not None:  # a dropped lock releases, as a dropped file object would
            self.release()

    def __repr__(self) -> str:
        return f"FileLock({str(self.path)!r}, held={self.held})"


def is_locked(path: str | os.PathLike[str]) -> bool:
    """Whether some holder has the lock file ``path`` now (False for a missing file). A probe:
    it takes the lock for an instant when nobody has it, and gives it straight back."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # also releases the probe's own lock, without touching the recorded pid
    return False
