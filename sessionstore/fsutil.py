"""Filesystem durability helpers shared by the store and the output writers (no heavy imports,
so that writing an output does not load the store)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (a new or renamed file) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (one of another user counts), for sweeping what runs
    killed mid-way left behind."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


def remove_entry(path: Path | str) -> None:
    """Remove ``path`` whatever its kind: a directory tree, a file, or a symlink (the link
    itself, never what it points to); nothing if it does not exist. For names the caller owns,
    where a leftover of the other kind (a file where a directory was expected) must go too
    rather than fail the caller with a bare ``IsADirectoryError``."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def remove_dead(folder: Path, prefix: str, dead: Callable[[Path], bool]) -> int:
    """Remove each entry of ``folder`` named ``prefix*`` that ``dead`` judges left by a process
    that died (SIGKILL, power loss); returns how many were removed. An entry ``dead`` cannot
    judge (it raises ``OSError``: another user's directory in a shared temp directory, or one
    gone meanwhile) is left alone: the sweep never fails its caller."""
    removed = 0
    for entry in folder.glob(prefix + "*"):
        try:
            gone = dead(entry)
        except OSError:
            continue
        if gone:
            shutil.rmtree(entry, ignore_errors=True)
            removed += 1
    return removed
