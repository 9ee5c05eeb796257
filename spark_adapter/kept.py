"""Partitions kept open in a Python worker between micro-batches (the streaming Arrow engine).

PySpark reuses its Python workers, so a partition's next task often runs in the worker that ran
its last one. Reopening the partition's store there, and reading its open sessions back into the
engine, cost more than the engine's own work on a micro-batch of 100k rows (a profile at 250k
rows a micro-batch: about 200 ms and 265 ms of a task's 800 ms). So a task that committed leaves
its provider and engine here, and the partition's next task in this worker takes them back if
they hold exactly the version it would load: :meth:`SessionStoreProvider.resume` checks that the
published snapshot of ``batchId - 1`` is the one this process committed (its unique id and
files). Anything else (a replay, a retry that published from another executor, another
configuration, a working copy deleted under it) closes them, and the task loads afresh.

A kept partition holds its working copy's locks. A task of the same partition in another worker
process on this host asks for the copy (the provider's ``RELEASE_REQUEST`` file, written while it
waits for the lock, and a byte on the copy's ``RELEASE_WAKEUP`` pipe); this module's watcher thread
sleeps on those pipes and closes an idle kept partition so asked as soon as it wakes. It costs
nothing while nobody asks: no timer polls (only a wake-up every :data:`WATCH_IDLE_S` as a safety
net, or every :data:`WATCH_INTERVAL_S` where a pipe cannot be made). A partition in use by a
running task is not in the table, so it is never closed under that task: the waiting task times
out with ``StateLockedError`` as before.

At most :data:`KEEP_MAX` partitions stay open per process, the least recently kept closed first.
Nothing here is needed for correctness; every path ends in the same committed state.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import stat
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sessionstore import SessionAggregator

from .config import SessionizeConfig
from .provider import RELEASE_REQUEST, RELEASE_WAKEUP, SessionStoreProvider

log = logging.getLogger(__name__)
KEEP_MAX = 8  # partitions kept open per worker process
WATCH_INTERVAL_S = 0.005  # how often the watcher looks for release requests without a pipe
WATCH_IDLE_S = 1.0  # the longest the watcher sleeps on its pipes before it looks anyway

Key = tuple[Any, ...]


@dataclass
class OpenPartition:
    """A partition's provider (its store open at the version it committed last) and the engine
    that wrote it."""

    provider: SessionStoreProvider
    engine: SessionAggregator

    def close(self) -> None:
        self.provider.close()


_TABLE: OrderedDict[Key, OpenPartition] = OrderedDict()
_TABLE_LOCK = threading.Lock()  # the watcher thread reads the table too
_WATCHER_PID: list[int] = []  # the process whose watcher runs (threads do not survive a fork)
_WAKE: list[int] = []  # the watcher's own pipe (read end, write end): the table gained an entry
_LOOKS = [0]  # how often this process's watcher looked at the release requests


def key_of(config: SessionizeConfig, location: str, partition: int) -> Key:
    """Everything an open partition's engine and provider were built from: a task of another
    configuration never takes it (the digest covers the engine's settings)."""
    return (location, config.operator, partition, config.local_dir, config.layout_digest,
            config.delay_ms, config.retention_us, config.keep_versions)


def take(key: Key, version: int) -> OpenPartition | None:
    """The partition kept for ``key`` if it may go on from ``version`` (removed from the table),
    else None; a kept partition that may not is closed."""
    with _TABLE_LOCK:
        kept = _TABLE.pop(key, None)
    if kept is None:
        return None
    try:
        if kept.provider.resume(version):
            return kept
    except BaseException:
        kept.close()
        raise
    kept.close()
    return None


def keep(key: Key, partition: OpenPartition) -> None:
    """Keep a partition that just committed for its next task in this process."""
    with _TABLE_LOCK:
        previous = _TABLE.pop(key, None)
        _TABLE[key] = partition
        evicted = [_TABLE.popitem(last=False)[1] for _ in range(len(_TABLE) - KEEP_MAX)]
        if not _WATCHER_PID or _WATCHER_PID[0] != os.getpid():
            _WATCHER_PID[:] = [os.getpid()]
            _WAKE[:] = os.pipe()
            for end in _WAKE:
                os.set_blocking(end, False)
            threading.Thread(target=_watch, args=(_WAKE[0],), name="sessionstore-kept",
                             daemon=True).start()
        wake = _WAKE[1]
    _poke(wake)  # the watcher listens for this partition now, and looks for a request at once
    stale = evicted if previous is None or previous is partition else [previous, *evicted]
    for partition_out in stale:
        partition_out.close()


def discard(key: Key) -> None:
    """Close the partition kept for ``key``, if any."""
    with _TABLE_LOCK:
        partition = _TABLE.pop(key, None)
    if partition is not None:
        partition.close()


def holds(key: Key) -> bool:
    """Whether a partition is kept for ``key`` in this process."""
    with _TABLE_LOCK:
        return key in _TABLE


def close_all() -> None:
    """Close every kept partition of this process."""
    with _TABLE_LOCK:
        kept = list(_TABLE.values())
        _TABLE.clear()
    for partition in kept:
        partition.close()


def kept_count() -> int:
    """How many partitions this process keeps open."""
    with _TABLE_LOCK:
        return len(_TABLE)


def watcher_looks() -> int:
    """How many times this process's watcher has looked at the release requests: once per
    wake-up, so it stays put while nobody asks for a kept copy."""
    return _LOOKS[0]


def _poke(fd: int) -> None:
    with contextlib.suppress(BlockingIOError):  # full: the watcher has wake-ups pending already
        os.write(fd, b"\0")


def _listen(local: Path) -> int | None:
    """A descriptor of the working copy's wake-up pipe (made if missing), open for reading and
    writing so that it never reports a hang-up; None if no pipe can be had there."""
    path = local / RELEASE_WAKEUP
    try:
        with contextlib.suppress(FileExistsError):
            os.mkfifo(path, 0o600)
        fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)
    except OSError:
        return None
    if not stat.S_ISFIFO(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


def _drain(fd: int) -> None:
    with contextlib.suppress(BlockingIOError, OSError):
        while os.read(fd, 4096):
            pass


def _watch(wake: int) -> None:
    """Close each kept partition whose working copy another process asked for.

    Sleeps until a waiter writes to a kept copy's wake-up pipe or :func:`keep` adds a partition
    (then it listens on the new copy's pipe too), and looks at the release requests then."""
    listening: dict[Key, int] = {}
    while True:
        with _TABLE_LOCK:
            copies = {key: kept.provider.local for key, kept in _TABLE.items()}
        for key in [k for k in listening if k not in copies]:
            os.close(listening.pop(key))
        unheard = False
        for key, local in copies.items():
            if key not in listening:
                fd = _listen(local)
                if fd is None:
                    unheard = True
                else:
                    listening[key] = fd
        _close_requested()
        _LOOKS[0] += 1
        ready, _, _ = select.select([wake, *listening.values()], [], [],
                                    WATCH_INTERVAL_S if unheard else WATCH_IDLE_S)
        for fd in ready:
            _drain(fd)


def _close_requested() -> None:
    """Close each kept partition whose working copy has a release request."""
    # closed under the lock: a task of this process taking the same key waits for it, and
    # never opens the working copy while this thread still closes it
    with _TABLE_LOCK:
        wanted = [key for key, kept in _TABLE.items()
                  if (kept.provider.local / RELEASE_REQUEST).exists()]
        for key in wanted:
            try:
                _TABLE.pop(key).close()
            except Exception:  # noqa: BLE001 - the watcher must outlive one failed close
                log.exception("closing a kept partition on request failed")
