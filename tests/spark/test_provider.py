"""The versioned per-partition provider, without Spark: snapshots, restores, maintenance."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sessionstore import EmitStrategy, Session, SessionAggregator, SessionWindows, aggregations
from spark_adapter import SessionStoreProvider, SnapshotError


def provider(tmp_path: Path, local: str = "local", **kwargs) -> SessionStoreProvider:
    return SessionStoreProvider(str(tmp_path / "state"), "op", 3, local_root=tmp_path / local,
                                retention_ms=10_000, **kwargs)


def run_batch(p: SessionStoreProvider, batch: int, events: list[tuple[str, int]]) -> list:
    store = p.load(batch - 1)
    engine = SessionAggregator(store, SessionWindows(10), aggregations.count(),
                               emit=EmitStrategy.ON_WINDOW_CLOSE, watermark="external")
    for key, t in events:
        engine.process(key, 1, t)
    p.commit(engine.commit, batch)
    result = [(tuple(s), v) for s, v in store.fetch("k")]
    p.close()
    return result


def test_versions_restore_exactly_and_reuse_the_local_copy(tmp_path):
    p = provider(tmp_path)
    assert run_batch(p, 0, [("k", 0)]) == [(("k", 0, 10), [1, 0, 0, 0, None])]
    assert run_batch(p, 1, [("k", 5)]) == [(("k", 0, 15), [2, 0, 0, 0, None])]
    assert p.versions() == [0, 1]
    # a retried batch 1 reloads version 0 from the snapshot (the local copy is at 1)
    assert run_batch(p, 1, [("k", 5)]) == [(("k", 0, 15), [2, 0, 0, 0, None])]
    # another executor, with no local copy, restores from the snapshots
    other = provider(tmp_path, local="elsewhere")
    assert run_batch(other, 2, [("k", 12)]) == [(("k", 0, 22), [3, 0, 0, 0, None])]


def test_missing_and_corrupted_snapshots_fail_loudly(tmp_path):
    p = provider(tmp_path)
    run_batch(p, 0, [("k", 0)])
    fresh = provider(tmp_path, local="other")
    with pytest.raises(SnapshotError, match="no snapshot of batch 4"):
        fresh.load(4)
    manifest = tmp_path / "state" / "op" / "3" / "manifests" / "0.json"
    manifest.write_text(manifest.read_text()[:40])
    with pytest.raises(SnapshotError, match="corrupted snapshot manifest"):
        provider(tmp_path, local="third").load(0)
    manifest.write_text(json.dumps({"format": 99}))
    with pytest.raises(SnapshotError, match="format 99"):
        provider(tmp_path, local="fourth").load(0)


def test_missing_sst_is_reported(tmp_path):
    p = provider(tmp_path)
    run_batch(p, 0, [(f"k{i}", i) for i in range(50)])
    for sst in (tmp_path / "state" / "op" / "3" / "sst").iterdir():
        sst.unlink()
    with pytest.raises(SnapshotError, match="missing"):
        provider(tmp_path, local="other").load(0)


def test_maintenance_keeps_the_last_versions_and_deletes_orphans(tmp_path):
    p = provider(tmp_path, keep_versions=2)
    for batch in range(5):
        run_batch(p, batch, [("k", batch * 100 + i) for i in range(3)])
    p.maintenance()
    assert p.versions() == [3, 4]
    sst_dir = tmp_path / "state" / "op" / "3" / "sst"
    referenced = set()
    for version in p.versions():
        referenced |= set(p.read_manifest(version)["sst"].values())
    assert {f.name for f in sst_dir.iterdir()} == referenced
    restored = run_batch(provider(tmp_path, local="x"), 5, [])
    assert restored == [(("k", b * 100, b * 100 + 12), [3, 0, 0, 0, None]) for b in range(5)]


@pytest.mark.parametrize("operator", ["../escape", "a/b", "", ".hidden", "x" * 200, None])
def test_operator_names_cannot_escape_the_state_location(tmp_path, operator):
    with pytest.raises(ValueError, match="operator"):
        SessionStoreProvider(str(tmp_path), operator, 0, retention_ms=10)


@pytest.mark.parametrize("partition", [-1, "0", 1.5, True])
def test_partition_ids_are_checked(tmp_path, partition):
    with pytest.raises(ValueError, match="partition"):
        SessionStoreProvider(str(tmp_path), "op", partition, retention_ms=10)


def test_manifest_file_names_cannot_escape(tmp_path):
    p = provider(tmp_path)
    run_batch(p, 0, [("k", 0)])
    path = tmp_path / "state" / "op" / "3" / "manifests" / "0.json"
    manifest = json.loads(path.read_text())
    manifest["files"]["../../evil"] = ""
    path.write_text(json.dumps(manifest))
    with pytest.raises(SnapshotError, match="bad file name"):
        provider(tmp_path, local="other").load(0)
    assert not (tmp_path / "evil").exists()


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
