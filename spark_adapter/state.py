"""The state location of a sessionize query: where it lives, what it is pinned to, what it holds.

* :func:`query_state_location` derives a per-query location, so that two queries never share
  snapshots, from the streaming query's id as an executor task sees it.
* :func:`pin_layout` records, on first use, the facts a query's state depends on (``n_buckets``,
  the partition count, a digest of the configuration) and refuses a later run with other values.
* :func:`read_state_metrics` sums the committed running totals on the driver.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from dataclasses import asdict, dataclass
from typing import Any

import pyarrow.fs as pafs

from .provider import (
    SPARK_METADATA_KEY,
    SessionStoreProvider,
    SnapshotCorruptedError,
    check_name,
    open_filesystem,
    publish_object,
    read_object,
    seal,
    unseal,
)

LAYOUT_OBJECT = "layout.json"
QUERY_ID_PROPERTY = "sql.streaming.queryId"
_PINNED: set[tuple[str, StateLayout]] = set()  # per process: layouts already checked


class StateLayoutMismatchError(ValueError):
    """A run asks for a layout other than the one its state location was created with."""


@dataclass(frozen=True)
class StateLayout:
    """The facts that decide which store holds which key; they must not change between runs.

    Attributes:
        n_buckets: how many buckets keys are hashed into.
        num_partitions: how many partitions (and so per-partition stores) the query has.
        config_digest: a digest of every setting that shapes the state (see
            :func:`config_digest`).
        settings: those settings (:func:`canonical_settings`), so that a refused restart can
            name each one that changed with both values; "" when not known (then only the
            digests are named).
    """

    n_buckets: int
    num_partitions: int
    config_digest: str
    settings: str = ""  # the canonical JSON the digest was taken of ("": not recorded)

    def __post_init__(self) -> None:
        for name in ("n_buckets", "num_partitions"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if not isinstance(self.config_digest, str) or not self.config_digest:
            raise ValueError(f"config_digest must be a non-empty str, got {self.config_digest!r}")
        if not isinstance(self.settings, str):
            raise ValueError(f"settings must be a str, got {self.settings!r}")


def canonical_settings(settings: dict[str, Any]) -> str:
    """``settings`` (names to JSON-able values or values with a stable ``repr``) as one JSON
    text, the same in every process for equal settings."""
    return json.dumps(settings, sort_keys=True, separators=(",", ":"), default=repr)


def config_digest(settings: dict[str, Any]) -> str:
    """A stable 16-hex-digit digest of ``settings`` (see :func:`canonical_settings`); equal
    settings give equal digests in every process."""
    return hashlib.sha256(canonical_settings(settings).encode()).hexdigest()[:16]


def _changed_settings(recorded: str, current: str) -> list[str]:
    """Each setting that differs between two :func:`canonical_settings` texts, with both
    values; empty when either is unknown."""
    if not recorded or not current:
        return []
    try:
        before, after = json.loads(recorded), json.loads(current)
    except ValueError:
        return []
    if not isinstance(before, dict) or not isinstance(after, dict):
        return []
    return [f"{name}: the state location was created with "
            f"{json.dumps(before.get(name, '(not set)'), sort_keys=True)}, this run uses "
            f"{json.dumps(after.get(name, '(not set)'), sort_keys=True)}"
            for name in sorted(set(before) | set(after)) if before.get(name) != after.get(name)]


def pin_layout(state_location: str, layout: StateLayout, *,
               filesystem: pafs.FileSystem | None = None) -> StateLayout:
    """Record ``layout`` in ``state_location`` on first use; on every later use, check it.

    Safe to call from every task: a process checks each (location, layout) pair once. The record
    is a sealed object, ``<state_location>/layout.json``.

    Args:
        state_location: the query's state location (path or ``pyarrow.fs`` URI, or a path on
            ``filesystem``).
        layout: what this run uses.
        filesystem: an explicit ``pyarrow.fs.FileSystem``.

    Returns:
        The pinned layout (equal to ``layout``).

    Raises:
        StateLayoutMismatchError: the location was created with another layout; the message
            names each differing field with both values.
        SnapshotCorruptedError: the record is damaged (names it).
    """
    if not isinstance(layout, StateLayout):
        raise TypeError(f"layout must be a StateLayout, got {type(layout).__name__}")
    if filesystem is not None:
        fs, base = filesystem, state_location.rstrip("/")
    else:
        fs, base = open_filesystem(state_location)
    key = (f"{type(fs).__name__}:{base}", layout)
    if key in _PINNED:
        return layout
    path = f"{base}/{LAYOUT_OBJECT}"
    recorded = _read_layout(fs, path)
    if recorded is None:
        fs.create_dir(base, recursive=True)
        _create_once(fs, path, seal({"layout": asdict(layout)}))
        recorded = _read_layout(fs, path)  # another driver may have won a race: compare with it
        assert recorded is not None
    differences = [
        f"{name}: the state location was created with {getattr(recorded, name)!r}, this run "
        f"uses {getattr(layout, name)!r}"
        for name in ("n_buckets", "num_partitions", "config_digest")
        if getattr(recorded, name) != getattr(layout, name)
    ]
    if recorded.config_digest != layout.config_digest:
        differences += _changed_settings(recorded.settings, layout.settings)
    if differences:
        raise StateLayoutMismatchError(
            f"state location {base} does not fit this query ({'; '.join(differences)}); keys "
            f"would move between stores. Keep the original settings, or start the query with a "
            f"new checkpoint and state location"
        )
    _PINNED.add(key)
    return layout


def _read_layout(fs: pafs.FileSystem, path: str) -> StateLayout | None:
    try:
        raw = read_object(fs, path)
    except FileNotFoundError:
        return None
    body = unseal(raw, path).get("layout")
    try:
        assert isinstance(body, dict)
        return StateLayout(**body)
    except (AssertionError, TypeError, ValueError):
        raise SnapshotCorruptedError(path, f"not a layout record: {body!r}") from None


def _create_once(fs: pafs.FileSystem, path: str, data: bytes) -> None:
    """Create ``path`` unless it exists. Local: an exclusive link; object stores: a PUT after a
    check (a race between two first runs is caught by comparing the read-back record)."""
    if isinstance(fs, pafs.LocalFileSystem):
        tmp = f"{path}.{uuid.uuid4().hex}.tmp"
        publish_object(fs, tmp, data)
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
    elif fs.get_file_info(path).type == pafs.FileType.NotFound:
        publish_object(fs, path, data)


def current_query_id() -> str | None:
    """The id of the streaming query the calling Spark task belongs to, or None.

    Spark sets the local property ``sql.streaming.queryId`` on every task of a micro-batch
    (checked on PySpark 4.3 inside ``mapInArrow``). It is the query's ``id``, which Spark keeps in
    the checkpoint: a restart from the same checkpoint sees the same id, while ``runId``
    changes. It is None on the driver and outside streaming queries.
    """
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        return None
    value = context.getLocalProperty(QUERY_ID_PROPERTY)
    return str(value) if value else None


def query_state_location(base: str, query_id: str | None = None) -> str:
    """The state location of one streaming query: ``<base>/query-<query id>``.

    Two queries with the same arguments and the same ``base`` get different locations; a
    restart from the same checkpoint gets the same one.

    Args:
        base: a path or ``pyarrow.fs`` URI shared by driver and executors.
        query_id: the streaming query's id; default :func:`current_query_id` (call it inside a
            task then).

    Raises:
        ValueError: no query id is given and the caller is not a task of a streaming query, or
            the id is not a plain name.
    """
    if query_id is None:
        query_id = current_query_id()
        if query_id is None:
            raise ValueError(
                "query_state_location needs query_id outside a streaming task: the "
                f"{QUERY_ID_PROPERTY!r} task property is not set here"
            )
    check_name(query_id, "query_id")
    if not isinstance(base, str) or not base:
        raise ValueError(f"base must be a path or URI, got {base!r}")
    root, mark, options = base.partition("?") if "://" in base else (base, "", "")
    return f"{root.rstrip('/')}/query-{query_id}{mark}{options}"  # URI options stay last


def read_state_metrics(state_location: str) -> dict[str, int]:
    """Sum the running totals (records in, late records dropped) over every partition's newest
    snapshot under ``state_location``.

    The totals are committed with each partition's state, so they count each record once even
    across task retries and query restarts.

    Raises:
        SnapshotCorruptedError: a newest manifest is damaged (names it).
    """
    fs, base = open_filesystem(state_location)
    counters = ("records_in", "dropped_records", "null_times_dropped", "null_keys_dropped",
                "invalid_gaps_dropped")
    totals = dict.fromkeys(counters, 0) | {"partitions": 0}
    for operator in fs.get_file_info(pafs.FileSelector(base, allow_not_found=True)):
        if operator.type != pafs.FileType.Directory:
            continue
        for partition in fs.get_file_info(pafs.FileSelector(operator.path)):
            if not partition.base_name.isdigit():
                continue
            provider = SessionStoreProvider(state_location, operator.base_name,
                                            int(partition.base_name), retention_ms=1)
            versions = provider.versions()
            if not versions:
                continue
            spark = provider.read_manifest(versions[-1])[SPARK_METADATA_KEY]
            totals["partitions"] += 1
            for name in counters:
                totals[name] += int(spark.get(name, 0))
    return totals
