"""The versioned per-partition provider, without Spark: snapshots, restores, maintenance, locks."""

from __future__ import annotations

import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sessionstore import (
    EmitStrategy,
    Session,
    SessionAggregator,
    SessionWindows,
    StoreCorruptedError,
    aggregations,
)
from sessionstore.locking import LockHeldError, holder_pid
from spark_adapter import (
    SessionStoreProvider,
    SnapshotCorruptedError,
    SnapshotError,
    StateLockedError,
)
from spark_adapter.provider import seal, unseal
from tests.lock_holder import held_elsewhere

ROOT = Path(__file__).resolve().parents[2]


def provider(tmp_path: Path, local: str = "local", **kwargs) -> SessionStoreProvider:
    return SessionStoreProvider(str(tmp_path / "state"), "op", 3, local_root=tmp_path / local,
                                retention_ms=10_000, **kwargs)


def run_batch(p: SessionStoreProvider, batch: int, events: list[tuple[str, int]],
              key: str = "k") -> list:
    """One micro-batch as an executor runs it: load ``batch - 1``, process, commit ``batch``.
    Returns the sessions of ``key`` after the batch."""
    store = p.load(batch - 1)
    engine = SessionAggregator(store, SessionWindows(10), aggregations.count(),
                               emit=EmitStrategy.ON_WINDOW_CLOSE, watermark="external")
    for k, t in events:
        engine.process(k, 1, t)
    p.commit(engine.commit, batch)
    result = [(tuple(s), v) for s, v in store.fetch(key)]
    p.close()
    return result


def partition_dir(tmp_path: Path) -> Path:
    return tmp_path / "state" / "op" / "3"


def test_versions_restore_exactly_and_reuse_the_local_copy(tmp_path):
    p = provider(tmp_path)
    assert run_batch(p, 0, [("k", 0)]) == [(("k", 0, 10), [1, 0, 0, 0, None])]
    assert run_batch(p, 1, [("k", 5)]) == [(("k", 0, 15), [2, 0, 0, 0, None])]
    assert p.versions() == [0, 1]
    assert (p.metrics["loads_restored"], p.metrics["loads_reused"]) == (1, 1)
    # a retried batch 1 reloads version 0 from the snapshot (the local copy is at 1)
    assert run_batch(p, 1, [("k", 5)]) == [(("k", 0, 15), [2, 0, 0, 0, None])]
    assert (p.metrics["loads_restored"], p.metrics["local_copies_discarded"]) == (2, 1)
    # another executor, with no local copy, restores from the snapshots
    other = provider(tmp_path, local="elsewhere")
    assert run_batch(other, 2, [("k", 12)]) == [(("k", 0, 22), [3, 0, 0, 0, None])]


def test_each_version_has_a_unique_id_and_names_its_parent(tmp_path):
    p = provider(tmp_path)
    run_batch(p, 0, [("k", 0)])
    run_batch(p, 1, [("k", 50)])
    first, second = p.read_manifest(0), p.read_manifest(1)
    assert first["parent"] is None and second["parent"] == first["id"]
    run_batch(p, 1, [("k", 50)])  # a retry of batch 1 publishes a new id on the same parent
    retried = p.read_manifest(1)
    assert retried["id"] not in (first["id"], second["id"])
    assert retried["parent"] == first["id"]


def test_a_local_copy_of_another_attempt_is_restored_not_reused(tmp_path):
    a, b = provider(tmp_path, "A"), provider(tmp_path, "B")
    run_batch(a, 0, [("k", 0)])
    run_batch(b, 0, [("k", 0)])  # the retry of batch 0 on B publishes last
    store = a.load(0)
    assert a.metrics["loads_restored"] == 2 and a.metrics["loads_reused"] == 0
    assert store.committed_metadata["user"]["spark"]["id"] == b.read_manifest(0)["id"]
    a.close()


def test_missing_and_corrupted_manifests_fail_loudly(tmp_path):
    run_batch(provider(tmp_path), 0, [("k", 0)])
    with pytest.raises(SnapshotError, match="no snapshot of batch 4"):
        provider(tmp_path, local="other").load(4)
    manifest = partition_dir(tmp_path) / "manifests" / "0.json"
    raw = manifest.read_bytes()
    manifest.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(SnapshotCorruptedError, match="body is") as caught:
        provider(tmp_path, local="third").load(0)
    assert caught.value.path == str(manifest)
    assert isinstance(caught.value, StoreCorruptedError) and isinstance(caught.value, ValueError)
    manifest.write_bytes(raw.replace(b"sessionstore-sealed 2 ", b"sessionstore-sealed 99 ", 1))
    with pytest.raises(SnapshotCorruptedError, match="format 99"):
        provider(tmp_path, local="fourth").load(0)


def test_missing_sst_is_reported_by_name(tmp_path):
    p = provider(tmp_path)
    run_batch(p, 0, [(f"k{i}", i) for i in range(50)])
    objects = sorted((partition_dir(tmp_path) / "sst").iterdir())
    assert objects
    objects[0].unlink()
    with pytest.raises(SnapshotCorruptedError, match="missing") as caught:
        provider(tmp_path, local="other").load(0)
    assert caught.value.path.endswith(objects[0].name)


def test_maintenance_keeps_the_last_versions_and_deletes_orphans_after_grace(tmp_path):
    p = provider(tmp_path, keep_versions=2, maintenance_every=0)
    for batch in range(5):
        run_batch(p, batch, [("k", batch * 100 + i) for i in range(3)])
    run_batch(p, 4, [("k", 400 + i) for i in range(3)])  # a retry: the first attempt's SSTs
    sst_dir = partition_dir(tmp_path) / "sst"            # are now referenced by no manifest
    before = {f.name for f in sst_dir.iterdir()}
    run = p.maintenance()  # default grace: the orphans were written a moment ago
    assert p.versions() == [3, 4]
    assert run["manifests_deleted"] == 3 and run["orphans_deleted"] == 0
    assert run["orphans_in_grace"] > 0
    assert {f.name for f in sst_dir.iterdir()} == before
    run = p.maintenance(now_ms=p.orphan_grace_ms + 10**13)  # far later: the grace has passed
    referenced = {e["object"] for v in p.versions()
                  for e in p.read_manifest(v)["files"].values() if "object" in e}
    assert {f.name for f in sst_dir.iterdir()} == referenced
    assert run["orphans_deleted"] == len(before - referenced) > 0
    restored = run_batch(provider(tmp_path, local="x"), 5, [])
    assert restored == [(("k", b * 100, b * 100 + 12), [3, 0, 0, 0, None]) for b in range(5)]


def test_maintenance_deletes_nothing_while_a_kept_manifest_is_damaged(tmp_path):
    p = provider(tmp_path, keep_versions=2, orphan_grace_ms=0, maintenance_every=0)
    for batch in range(4):
        run_batch(p, batch, [("k", batch * 100)])
    manifest = partition_dir(tmp_path) / "manifests" / "3.json"
    manifest.write_bytes(manifest.read_bytes()[:-3])
    listing = sorted(str(f) for f in partition_dir(tmp_path).rglob("*"))
    run = p.maintenance()
    assert run == {"manifests_deleted": 0, "orphans_deleted": 0, "orphans_in_grace": 0}
    assert p.metrics["maintenance_skipped"] == 1
    assert sorted(str(f) for f in partition_dir(tmp_path).rglob("*")) == listing


@pytest.mark.parametrize("operator", ["../escape", "a/b", "", ".hidden", "x" * 200, None])
def test_operator_names_cannot_escape_the_state_location(tmp_path, operator):
    with pytest.raises(ValueError, match="operator"):
        SessionStoreProvider(str(tmp_path), operator, 0, retention_ms=10)


@pytest.mark.parametrize("partition", [-1, "0", 1.5, True])
def test_partition_ids_are_checked(tmp_path, partition):
    with pytest.raises(ValueError, match="partition"):
        SessionStoreProvider(str(tmp_path), "op", partition, retention_ms=10)


@pytest.mark.parametrize(("name", "value"), [("keep_versions", 0), ("orphan_grace_ms", -1),
                                             ("lock_timeout_ms", 1.5),
                                             ("maintenance_every", True)])
def test_provider_settings_are_checked(tmp_path, name, value):
    with pytest.raises(ValueError, match=name):
        SessionStoreProvider(str(tmp_path), "op", 0, retention_ms=10, **{name: value})


def test_manifest_file_names_cannot_escape_even_when_sealed(tmp_path):
    run_batch(provider(tmp_path), 0, [("k", 0)])
    path = partition_dir(tmp_path) / "manifests" / "0.json"
    body = unseal(path.read_bytes(), str(path))
    body["files"]["../../evil"] = {"size": 0, "sha256": "0" * 64, "data": ""}
    path.write_bytes(seal(body))
    with pytest.raises(SnapshotCorruptedError, match="bad file name"):
        provider(tmp_path, local="other").load(0)
    assert not (tmp_path / "evil").exists()


def test_a_manifest_under_another_batch_number_is_refused_before_any_download(tmp_path,
                                                                              monkeypatch):
    run_batch(provider(tmp_path), 0, [(f"k{i}", i) for i in range(20)])
    manifests = partition_dir(tmp_path) / "manifests"
    (manifests / "1.json").write_bytes((manifests / "0.json").read_bytes())  # batch 0's, as 1

    def no_download(*args: object) -> None:
        raise AssertionError("a file was downloaded for a manifest of another batch")

    monkeypatch.setattr(SessionStoreProvider, "_stage_files", no_download)
    with pytest.raises(SnapshotCorruptedError, match="holds batch 0, not 1") as caught:
        provider(tmp_path, local="other").load(1)
    assert caught.value.path == str(manifests / "1.json")


@pytest.mark.parametrize("change", ["extra", "missing"])
def test_a_restore_whose_segments_differ_from_the_manifest_is_refused(tmp_path, change):
    run_batch(provider(tmp_path), 0, [(f"k{i}", i * 7_000) for i in range(20)])
    path = partition_dir(tmp_path) / "manifests" / "0.json"
    body = unseal(path.read_bytes(), str(path))
    assert body["segments"]
    body["segments"] = [*body["segments"], max(body["segments"]) + 1] if change == "extra" \
        else body["segments"][1:]
    path.write_bytes(seal(body))
    with pytest.raises(SnapshotCorruptedError, match="restores segments .* the manifest records"):
        provider(tmp_path, local="other").load(0)
    assert not (tmp_path / "other").exists() or not any(
        (tmp_path / "other").rglob("CURRENT"))  # nothing swapped in


def test_commit_must_follow_the_loaded_version(tmp_path):
    p = provider(tmp_path)
    with pytest.raises(RuntimeError, match="before load"):
        p.commit(lambda metadata: None, 0)
    p.load(-1)
    with pytest.raises(ValueError, match="version must be 0"):
        p.commit(lambda metadata: None, 5)
    p.close()


def test_session_type_roundtrip_through_snapshot(tmp_path):
    p = provider(tmp_path)
    store = p.load(-1)
    store.put(Session(("a", 1), 0, 5), {"x": [1, 2]})
    p.commit(lambda metadata: store.commit({"user": metadata}), 0)
    p.close()
    other = provider(tmp_path, local="other")
    restored = other.load(0)
    assert [(tuple(s), v) for s, v in restored.fetch(("a", 1))] == [((("a", 1), 0, 5),
                                                                      {"x": [1, 2]})]
    other.close()


HOLDER = """
import sys, time
from spark_adapter.provider import SessionStoreProvider
p = SessionStoreProvider(sys.argv[1], "op", 3, local_root=sys.argv[2], retention_ms=10_000,
                         lock_timeout_ms=200)
p.load(0)
print("held", flush=True)
time.sleep(60)
"""


def _tree(path: Path) -> dict[str, bytes]:
    return {str(f.relative_to(path)): f.read_bytes() for f in sorted(path.rglob("*"))
            if f.is_file()}


def test_lock_contention_fails_loudly_and_touches_nothing(tmp_path):
    """Another process holds the partition's working copy: load() raises StateLockedError and
    neither restores over nor deletes that process's files."""
    run_batch(provider(tmp_path), 0, [("k", 0)])
    run_batch(provider(tmp_path, local="writer"), 1, [("k", 5)])  # local copy "local" is stale
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(HOLDER), str(tmp_path / "state"),
         str(tmp_path / "local")],
        stdout=subprocess.PIPE, env={"PYTHONPATH": str(ROOT)},
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        p = provider(tmp_path, lock_timeout_ms=300)
        before = _tree(p.local)
        with pytest.raises(StateLockedError, match="held by another process"):
            p.load(1)  # would restore: the holder's copy is at batch 0
        assert _tree(p.local) == before
        assert p.store is None
    finally:
        holder.kill()
        holder.wait()
    assert run_batch(p, 2, [("k", 12)]) == [(("k", 0, 22), [3, 0, 0, 0, None])]


def test_a_partition_locked_through_the_locking_module_is_refused_naming_its_holder(tmp_path):
    """The provider's lock is ``sessionstore.locking``'s: kills a provider that keeps its own
    ``flock`` copy (its error named neither the lock file nor the holder's pid)."""
    p = provider(tmp_path, lock_timeout_ms=50)
    run_batch(p, 0, [("k", 0)])
    lock_file = p.local / "provider.lock"
    with held_elsewhere(lock_file) as child:
        with pytest.raises(StateLockedError, match="held by another process") as refused:
            p.load(0)
        assert isinstance(refused.value, LockHeldError)
        assert refused.value.path == lock_file and refused.value.holder_pid == child.pid
        assert f"(process {child.pid}, lock file {lock_file}; waited 50 ms)" \
            in str(refused.value)
        assert p.store is None and not p.holds_lock()
    copy = pickle.loads(pickle.dumps(refused.value))  # as when it crosses to another process
    assert type(copy) is StateLockedError and str(copy) == str(refused.value)
    assert (copy.path, copy.holder_pid) == (lock_file, child.pid)
    assert run_batch(p, 1, [("k", 5)]) == [(("k", 0, 15), [2, 0, 0, 0, None])]
    assert holder_pid(lock_file) is None  # closed cleanly: the file names no holder


def test_a_failing_maintenance_does_not_fail_the_published_batch(tmp_path):
    p = provider(tmp_path, orphan_grace_ms=0, maintenance_every=1)
    run_batch(p, 0, [("k", 0)])
    (partition_dir(tmp_path) / "sst" / "not-a-file.sst").mkdir()  # delete_file fails on it
    assert run_batch(p, 1, [("k", 5)]) == [(("k", 0, 15), [2, 0, 0, 0, None])]
    assert p.metrics["maintenance_failed"] == 1
    assert run_batch(provider(tmp_path, local="other"), 2, []) == \
        [(("k", 0, 15), [2, 0, 0, 0, None])]


def test_a_task_that_never_closed_does_not_block_the_next_in_the_same_worker(tmp_path):
    """Python workers are reused: a failed task may leave its store and lock open."""
    run_batch(provider(tmp_path), 0, [("k", 0)])
    failed = provider(tmp_path, lock_timeout_ms=0)
    failed.load(0)  # ...and the task dies without close()
    nxt = provider(tmp_path, lock_timeout_ms=0)
    nxt.load(0)
    failed.close()  # a late close of the abandoned provider must not release the next one's lock
    assert nxt.store is not None and nxt._lock_handle is not None
    assert nxt._lock_handle.held
    held = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(HOLDER), str(tmp_path / "state"),
         str(tmp_path / "local")],
        capture_output=True, env={"PYTHONPATH": str(ROOT)}, timeout=120,
    )
    assert b"StateLockedError" in held.stderr  # another process still finds it locked
    nxt.close()
