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

PySpark gives a task whichever idle worker comes first, so about half of a partition's tasks
land in another worker than the one keeping it. Such a task first offers its rows to the keeper
(:func:`relay`): a keeper that runs no micro-batch itself runs this one on the partition it
keeps, commits, keeps it again and sends the output back, so the state never moves; a keeper
that is busy, or keeps it under another configuration or version, declines, and the task asks
for the copy as above.

At most :data:`KEEP_MAX` partitions stay open per process, the least recently kept closed first.
Nothing here is needed for correctness; every path ends in the same committed state.

A worker that ran the engine holds far more objects than one that did not (pyarrow, numba and
its compiled kernels, the kept partitions), and PySpark's worker collects garbage after every
task over all of them; :func:`freeze_heap`, called as each ``mapInArrow`` task of ``sessionize``
starts (``arrow.task_entry``), and as each task of the processor engine unpickles its processor
(``processor.task_processor``), takes what the worker held before the task out of that
collection.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import hashlib
import io
import json
import logging
import os
import select
import socket
import stat
import struct
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from sessionstore import SessionAggregator

from .config import SessionizeConfig
from .provider import RELEASE_REQUEST, RELEASE_WAKEUP, SessionStoreProvider

log = logging.getLogger(__name__)
KEEP_MAX = 8  # partitions kept open per worker process
WATCH_INTERVAL_S = 0.005  # how often the watcher looks for release requests without a pipe
WATCH_IDLE_S = 1.0  # the longest the watcher sleeps on its pipes before it looks anyway
RELAY_RETRY_S = 0.05  # how soon the watcher tries again to offer a copy another process offered
RELAY_SUPPORTED = sys.platform.startswith("linux")  # relay sockets live in Linux's namespace

Key = tuple[Any, ...]


@dataclass
class OpenPartition:
    """A partition's provider (its store open at the version it committed last) and the engine
    that wrote it; ``config``, when set, the configuration its tasks ran under, so that this
    process may run the partition's next task for another worker (:func:`relay`)."""

    provider: SessionStoreProvider
    engine: SessionAggregator
    config: SessionizeConfig | None = None

    def close(self) -> None:
        with _TABLE_LOCK:
            in_use = [key for key, partition in _IN_USE.items() if partition is self]
            for key in in_use:
                del _IN_USE[key]
        if in_use:
            _withdraw()
        self.provider.close()


@dataclass(frozen=True)
class Assignment:
    """What a streaming task is: its query's state location, its partition and its batch."""

    location: str
    partition: int
    batch_id: int


_TABLE: OrderedDict[Key, OpenPartition] = OrderedDict()
_TABLE_LOCK = threading.RLock()  # the watcher and relay threads use the table too; reentrant:
# a partition closed under it (the watcher closes on request) takes it again
_WATCHER_PID: list[int] = []  # the process whose watcher runs (threads do not survive a fork)
_WAKE: list[int] = []  # the watcher's own pipe (read end, write end): the table gained an entry
_LOOKS = [0]  # how often this process's watcher looked at the release requests
_RUNNING = [0]  # micro-batches this process runs now (its own tasks' and relayed ones)
_RELAYS = {"served": 0, "declined": 0}  # by this process, for other workers
# taken back by a task of this process and not yet kept again or closed: still offered (a
# request for it is declined), so that another worker's next request finds the socket bound
_IN_USE: dict[Key, OpenPartition] = {}
_OFFERED: set[Key] = set()  # the kept partitions the watcher offers on a relay socket now
RELAY_HANDSHAKE_S = 10.0  # how long a task waits for a keeper's yes or no
_FRAME = struct.Struct(">cQ")  # a relay message: its kind and its length
_PEERCRED = struct.Struct("3i")  # SO_PEERCRED: pid, uid, gid


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
        if kept is not None:
            _IN_USE[key] = kept
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
        if _IN_USE.get(key) is partition:
            del _IN_USE[key]
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
        _withdraw()
        partition.close()


def _withdraw() -> None:
    """Wake this process's watcher after a partition left the table, so that it stops offering
    it to other workers (:func:`relay`) at once."""
    with _TABLE_LOCK:
        wake = _WAKE[1] if os.getpid() in _WATCHER_PID else None
    if wake is not None:
        _poke(wake)


def holds(key: Key) -> bool:
    """Whether a partition is kept for ``key`` in this process."""
    with _TABLE_LOCK:
        return key in _TABLE


def close_all() -> None:
    """Close every kept partition of this process."""
    with _TABLE_LOCK:
        kept = list(_TABLE.values())
        _TABLE.clear()
    _withdraw()
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


def freeze_heap() -> bool:
    """Take every object this process holds now out of the cyclic garbage collector's sight
    (:func:`gc.freeze`), unless the process runs a micro-batch now (a relayed one); called as
    each ``mapInArrow`` task of ``sessionize`` starts, static or streaming
    (``arrow.task_entry``), and as each task of the processor engine unpickles its processor
    (``processor.task_processor``). Returns whether it froze.

    PySpark's worker runs a full collection after every task (``gc.collect()`` in its daemon's
    loop), which visits every object the collector tracks. A worker that has run the engine
    tracks about 170k (pyarrow, numba and its compiled kernels, the kept partitions), and that
    collection took about 80 ms of CPU per task: more than the task's own work at 12k rows, and
    paid by every later task in the worker, of any query. What a task finds alive when it
    starts survived the collection after the previous task, so it is long-lived; frozen, the
    collection after a task visits only what the task allocated.

    A frozen object is still freed when its last reference goes; only a reference cycle among
    frozen objects would outlive its use. A kept partition holds none, so closing one frees it
    (``tests/spark/test_kept.py`` checks it with the collector off). A micro-batch that runs
    meanwhile holds objects it is about to drop, which must not be frozen: then the next task
    freezes instead. ``_claim`` and :func:`running` count a micro-batch under the table's lock,
    which this holds, so none starts during the freeze.
    """
    with _TABLE_LOCK:
        if _RUNNING[0]:
            return False
        gc.freeze()
        return True


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
    """Close each kept partition whose working copy another process asked for, and run a
    kept partition's micro-batch for another worker that asks (:func:`relay`).

    Sleeps until a waiter writes to a kept copy's wake-up pipe, another worker connects to a
    kept copy's relay socket, or :func:`keep` or :func:`take` changes the table (then it
    listens on the copies kept now), and looks at the release requests then."""
    listening: dict[Key, int] = {}
    offered: dict[Key, socket.socket] = {}
    while True:
        _close_requested()
        _LOOKS[0] += 1
        with _TABLE_LOCK:
            copies = {key: (kept.provider.local, kept.config is not None)
                      for key, kept in [*_IN_USE.items(), *_TABLE.items()]}
        for key in [k for k in listening if k not in copies]:
            os.close(listening.pop(key))
        for key in [k for k in offered if k not in copies]:
            offered.pop(key).close()
        unheard = unoffered = False
        for key, (local, relayable) in copies.items():
            if key not in listening:
                fd = _listen(local)
                if fd is None:
                    unheard = True
                else:
                    listening[key] = fd
            if relayable and key not in offered and RELAY_SUPPORTED:
                listener = _offer(local)
                if listener is None:  # the worker that kept it before has not let go yet
                    unoffered = True
                else:
                    offered[key] = listener
        timeout = WATCH_INTERVAL_S if unheard else WATCH_IDLE_S
        if unoffered:
            timeout = min(timeout, RELAY_RETRY_S)
        with _TABLE_LOCK:
            _OFFERED.clear()
            _OFFERED.update(key for key in offered if key in _TABLE)
        sockets = {listener.fileno(): listener for listener in offered.values()}
        ready, _, _ = select.select([wake, *listening.values(), *sockets], [], [], timeout)
        for fd in ready:
            if fd in sockets:
                _accept(sockets[fd])
            else:
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


# -- running a kept partition's micro-batch for another worker --------------------------------------
#
# PySpark hands a task to whichever of its idle workers comes first, so a partition's next task
# often lands in another worker than the one keeping it (about half of them with two). Instead of
# asking the keeper to close the partition and opening it again (the lock wait, opening RocksDB,
# reading the open sessions back), that task sends its rows to the keeper, which runs the
# micro-batch on the partition it keeps, commits, keeps it, and sends the output back: the work
# moves, the state stays. The keeper does it only while it runs no micro-batch itself (a worker
# that relays its own task counts as idle), so two partitions never share one process's CPU
# while another worker waits; otherwise it declines and the task loads the partition as before.
#
# Each kept partition is offered on a Unix socket in Linux's abstract namespace, named by its
# working copy, bound by the watcher while the partition is in the table. Messages are framed
# (a kind byte, a length): the request ("H", JSON), the answer ("A", JSON), the rows ("I", an
# Arrow IPC stream), each output batch ("B", an Arrow IPC stream), the end ("E", JSON: the
# counters, or the error). Nothing is pickled.


@contextlib.contextmanager
def running() -> Iterator[None]:
    """Marks a micro-batch this process runs itself (a keeper declines relays meanwhile)."""
    with _TABLE_LOCK:
        _RUNNING[0] += 1
    try:
        yield
    finally:
        with _TABLE_LOCK:
            _RUNNING[0] -= 1


def offers(key: Key) -> bool:
    """Whether this process offers the partition kept for ``key`` to other workers now (its
    watcher does so shortly after :func:`keep`)."""
    with _TABLE_LOCK:
        return key in _OFFERED and key in _TABLE


def relay_counts() -> dict[str, int]:
    """How many relayed micro-batches this process ran for other workers (``served``) and how
    many it declined (``declined``)."""
    with _TABLE_LOCK:
        return dict(_RELAYS)


def fingerprint(config: SessionizeConfig) -> str:
    """A digest of every setting of ``config`` but the aggregation object (the key's layout
    digest covers what it means): a keeper runs a relayed task only under a configuration
    equal to the task's own in everything a task reads, the output's names and types too."""
    def plain(value: Any) -> Any:
        if hasattr(value, "jsonValue"):  # Spark's types and fields
            return value.jsonValue()
        return repr(value)

    settings = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)
                if f.name != "aggregation"}
    text = json.dumps(settings, sort_keys=True, default=plain)
    return hashlib.sha256(text.encode()).hexdigest()


def _address(local: Path) -> str:
    return "\0sessionstore-kept-" + hashlib.sha256(str(local).encode()).hexdigest()[:40]


def _offer(local: Path) -> socket.socket | None:
    """A listening socket for the kept copy ``local``; None while another process holds the
    name (it kept the copy before and has not closed its socket yet)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(_address(local))
        listener.listen(4)
        listener.setblocking(False)
    except OSError:
        listener.close()
        return None
    return listener


def same_user(connection: socket.socket) -> bool:
    """Whether the process at the other end of the Unix socket ``connection`` runs as this
    process's user (``SO_PEERCRED``). An abstract socket has no file permissions: any local
    user could bind or connect to its name, so neither side trusts a peer of another user
    with rows, output or state."""
    try:
        raw = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    except (OSError, AttributeError):
        return False
    _pid, uid, _gid = _PEERCRED.unpack(raw)
    return bool(uid == os.getuid())


def _accept(listener: socket.socket) -> None:
    with contextlib.suppress(BlockingIOError, OSError):
        connection, _ = listener.accept()
        if not same_user(connection):
            log.warning("refused a relay connection from another user's process")
            connection.close()
            return
        connection.setblocking(True)
        threading.Thread(target=_serve, args=(connection,), name="sessionstore-relay",
                         daemon=True).start()


def _send(stream: Any, kind: bytes, payload: bytes) -> None:
    stream.write(_FRAME.pack(kind, len(payload)))
    stream.write(payload)
    stream.flush()


def _receive(stream: Any, expected: bytes) -> bytes:
    """The payload of the next message, which must be of kind ``expected``.

    Raises:
        ConnectionError: the other side closed the connection or sent something else.
    """
    head = stream.read(_FRAME.size)
    if len(head) != _FRAME.size:
        raise ConnectionError("the other worker closed the relay connection")
    kind, size = _FRAME.unpack(head)
    payload = stream.read(size)
    if kind != expected or len(payload) != size:
        raise ConnectionError(f"relay protocol: expected a {expected!r} message, got {kind!r} "
                              f"({len(payload)} of {size} bytes)")
    return bytes(payload)


def _ipc(table: pa.Table | pa.RecordBatch) -> bytes:
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write(table)
    return sink.getvalue()


def _read_ipc(payload: bytes) -> pa.Table:
    return pa.ipc.open_stream(payload).read_all()


def relay(local: Path, key: Key, config: SessionizeConfig, task: Assignment,
          table: pa.Table) -> Iterator[pa.RecordBatch | dict[str, int]] | None:
    """Run the micro-batch ``task`` of the partition in the worker process that keeps it open
    (as :func:`spark_adapter.arrow.run_partition` would run it here), if one on this host keeps
    it under ``key`` and the same configuration, at version ``task.batch_id - 1``, and agrees.

    Args:
        local: the partition's working copy (names the keeper's socket).
        key: :func:`key_of` the task's configuration, location and partition.
        config: the task's configuration (its :func:`fingerprint` must be the keeper's).
        task: the task's location, partition and batch.
        table: the task's input rows.

    Returns:
        None if no process keeps the partition or the keeper declines (nothing happened: load
        it here). Otherwise the output, to be consumed to the end: each output batch, then the
        micro-batch's counters (a dict) once the keeper committed.

    Raises:
        RuntimeError: (while consuming) the keeper failed; the message carries its error. The
            keeper committed nothing then, and closed the partition.
        ConnectionError: (while consuming) the keeper went away; whether it committed is
            unknown, so the task must fail (a retry loads what was published).
    """
    if not RELAY_SUPPORTED:
        return None
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.settimeout(RELAY_HANDSHAKE_S)
        connection.connect(_address(local))
        if not same_user(connection):  # someone else holds the name: never send them rows
            log.warning("the relay socket of %s belongs to another user; loading here", local)
            connection.close()
            return None
        stream = connection.makefile("rwb")
        _send(stream, b"H", json.dumps({
            "key": list(key), "fingerprint": fingerprint(config), "location": task.location,
            "partition": task.partition, "batch_id": task.batch_id}).encode())
        answer = json.loads(_receive(stream, b"A"))
    except (OSError, ValueError):  # nobody offers it, or the keeper went away: load it here
        connection.close()
        return None
    if not answer.get("accepted"):
        connection.close()
        return None
    connection.settimeout(None)  # the keeper runs the micro-batch now: as long as it takes
    return _relayed(connection, stream, table)


def _relayed(connection: socket.socket, stream: Any, table: pa.Table
             ) -> Iterator[pa.RecordBatch | dict[str, int]]:
    with connection, stream:
        _send(stream, b"I", _ipc(table))
        while True:
            head = stream.read(_FRAME.size)
            if len(head) != _FRAME.size:
                raise ConnectionError("the worker keeping the partition went away during a "
                                      "relayed micro-batch; the task fails and its retry loads "
                                      "what was published")
            kind, size = _FRAME.unpack(head)
            payload = stream.read(size)
            if len(payload) != size:
                raise ConnectionError("the relay connection closed mid-message")
            if kind == b"B":
                yield from _read_ipc(payload).to_batches()
            elif kind == b"E":
                end = json.loads(payload)
                if "error" in end:
                    raise RuntimeError(f"the worker keeping the partition failed running this "
                                       f"micro-batch: {end['error']}")
                yield {str(k): int(v) for k, v in end["observed"].items()}
                return
            else:
                raise ConnectionError(f"relay protocol: unexpected message {kind!r}")


def _serve(connection: socket.socket) -> None:
    """Answer one relay request (see :func:`relay`); in a thread of the keeping process."""
    with connection, connection.makefile("rwb") as stream:
        try:
            request = json.loads(_receive(stream, b"H"))
            key: Key = tuple(request["key"])
            task = Assignment(str(request["location"]), int(request["partition"]),
                              int(request["batch_id"]))
        except (OSError, ValueError, KeyError, TypeError):
            return
        opened = _claim(key, str(request.get("fingerprint")), task.batch_id - 1)
        if opened is None:
            with contextlib.suppress(OSError):
                _send(stream, b"A", json.dumps({"accepted": False}).encode())
            return
        end = None
        try:
            try:
                _send(stream, b"A", json.dumps({"accepted": True}).encode())
            except OSError:
                keep(key, opened)  # untouched: still the committed version
                return
            end = _run_relayed(stream, opened, key, task)
        finally:
            with _TABLE_LOCK:
                _RUNNING[0] -= 1
        if end is not None:  # after the count: the task's next request must find us idle
            with contextlib.suppress(OSError):  # the task went away: Spark retries it
                _send(stream, b"E", end)


def _claim(key: Key, wanted: str, version: int) -> OpenPartition | None:
    """The partition kept under ``key`` if this process runs nothing now and it was kept
    under the configuration ``wanted`` at ``version`` (then counted as running here); else
    None, and it stays kept."""
    with _TABLE_LOCK:
        candidate = _TABLE.get(key)
        if _RUNNING[0] or candidate is None or candidate.config is None \
                or fingerprint(candidate.config) != wanted:
            _RELAYS["declined"] += 1
            return None
        _RUNNING[0] += 1
    opened = take(key, version)
    if opened is None:
        with _TABLE_LOCK:
            _RUNNING[0] -= 1
            _RELAYS["declined"] += 1
    return opened


#: What a keeper runs a relayed micro-batch with: ``(config, opened, key, task, table,
#: observed)`` -> the output batches, as a task runs its own micro-batch.
RelayRunner = Callable[[Any, "OpenPartition", Key, Assignment, pa.Table, dict[str, int]],
                       Generator[pa.RecordBatch, None, None]]
_RUNNER: list[RelayRunner] = []


def serve_with(runner: RelayRunner) -> None:
    """Set the function a keeper runs relayed micro-batches with: the task's own body,
    :func:`spark_adapter.arrow.run_partition`, which registers itself when its module loads
    (so this module imports nothing of ``arrow``, which imports it)."""
    _RUNNER[:] = [runner]


def _run_relayed(stream: Any, opened: OpenPartition, key: Key, task: Assignment
                 ) -> bytes | None:
    """Run a relayed micro-batch on ``opened`` and send its output; returns the end message
    (the counters, or the error) to send, or None if the rows never arrived."""
    if not _RUNNER:  # only arrow's tasks keep partitions, so arrow is loaded: never here
        opened.close()
        return json.dumps({"error": "RuntimeError: this worker has no relay runner"}).encode()
    run_partition = _RUNNER[0]
    config = opened.config
    assert config is not None
    try:
        table = _read_ipc(_receive(stream, b"I"))
    except (OSError, ValueError) as exc:
        opened.close()  # nothing changed; a load afresh finds the committed version
        log.info("a relayed micro-batch's rows did not arrive: %s", exc)
        return None
    observed: dict[str, int] = {}
    outputs = run_partition(config, opened, key, task, table, observed)
    try:
        for out in outputs:
            _send(stream, b"B", _ipc(out))
    except Exception as exc:  # noqa: BLE001 - reported to the task, which fails with it
        return json.dumps({"error": f"{type(exc).__name__}: {exc}"}).encode()
    finally:
        outputs.close()  # a task gone mid-way: the partition is closed uncommitted
    with _TABLE_LOCK:
        _RELAYS["served"] += 1
    return json.dumps({"observed": observed}).encode()
