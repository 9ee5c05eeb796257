"""What a commit's critical path no longer does, and what it still guarantees.

* A snapshot published between a segment's expiry and its drop from RocksDB (which the store
  leaves to the housekeeping after the commit point): its manifest names the live segments only,
  its files still include the expired segment's, and a restore from it (what an executor lost
  right after the commit sees) opens without the expired segment and drops it before the next
  snapshot.
* A commit uploads its new objects in parallel, and the directory entries of the objects are
  durable before the manifest that names them.

Real RocksDB files, a local state location; no SparkSession.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sessionstore import Session
from sessionstore.store.checkpoint import read_manifest
from spark_adapter import SessionStoreProvider
from spark_adapter import provider as provider_module

RETENTION_MS = 1_000
SEGMENT_MS = 500


def provider(tmp_path: Path, local: str) -> SessionStoreProvider:
    return SessionStoreProvider(str(tmp_path / "state"), "op", 0, local_root=tmp_path / local,
                                retention_ms=RETENTION_MS, segment_interval_ms=SEGMENT_MS,
                                maintenance_every=0)


def commit(p: SessionStoreProvider, store, batch: int) -> None:
    """Commit the bare store as the engine would: the provider's metadata under "user"."""
    p.commit(lambda metadata: store.commit({"user": metadata}), batch)


def sst_names(manifest: dict) -> set[str]:
    return {name for name, entry in manifest["files"].items() if "object" in entry}


def every_session(store) -> list:
    return [(tuple(s), v) for s, v in store.find_sessions(-(2**62), 2**62)]


def test_a_restore_between_expiry_and_drop_opens_without_the_expired_segment(tmp_path: Path):
    first = provider(tmp_path, "local-a")
    store = first.load(-1)
    store.put(Session("a", 0, 100), 1)
    store.put(Session("b", 600, 700), 2)
    commit(first, store, 0)
    store.put(Session("c", 2600, 2700), 3)  # expires segments 0 and 1
    commit(first, store, 1)
    first.close()
    m0, m1 = first.read_manifest(0), first.read_manifest(1)
    assert m0["segments"] == [0, 1]
    assert m1["segments"] == [5]
    # batch 1's checkpoint still holds segments 0 and 1 (their drop came after it), as files
    # this lineage uploaded with batch 0, and its store manifest records them as expired
    assert sst_names(m0) and sst_names(m0) <= sst_names(m1)
    assert m1["files"].keys() - m0["files"].keys()
    assert first.metrics["objects_reused"] >= len(sst_names(m0))

    # another executor restores batch 1: verified against the manifest's segment list
    second = provider(tmp_path, "local-b")
    restored = second.load(1)
    assert second.metrics["loads_restored"] == 1
    assert restored.live_segments() == [5]
    contents = read_manifest(restored.checkpoint_path())[1]
    assert contents.expired == ("seg0", "seg1")
    restored.cap_expiry_time(0)  # lowers the read floor: an expired segment back would show
    assert every_session(restored) == [(("c", 2600, 2700), 3)]
    restored.cap_expiry_time(None)
    restored.put(Session("c", 2600, 2800), 4)
    commit(second, restored, 2)
    second.close()
    m2 = second.read_manifest(2)
    assert m2["segments"] == [5]
    # the restored copy dropped them before batch 2's checkpoint: none of their files is left
    assert not sst_names(m0) & sst_names(m2)

    third = provider(tmp_path, "local-c")
    again = third.load(2)
    assert again.live_segments() == [5]
    assert every_session(again) == [(("c", 2600, 2700), 3), (("c", 2600, 2800), 4)]
    third.close()


def test_new_objects_are_durable_in_their_directory_before_the_manifest_names_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    events: list[tuple[str, str]] = []
    sync_dir, replace = provider_module.fsync_dir, os.replace

    def recording_sync(path: Path) -> None:
        events.append(("sync", str(path)))
        sync_dir(path)

    def recording_replace(source: str, target: str) -> None:
        events.append(("replace", str(target)))
        replace(source, target)

    monkeypatch.setattr(provider_module, "fsync_dir", recording_sync)
    monkeypatch.setattr(provider_module.os, "replace", recording_replace)
    p = provider(tmp_path, "local")
    store = p.load(-1)
    for segment in range(3):  # three segments written: three new SST files in the checkpoint
        store.put(Session("k", segment * SEGMENT_MS, segment * SEGMENT_MS + 10), segment)
    events.clear()
    commit(p, store, 0)
    manifest = p.read_manifest(0)
    objects = {entry["object"] for entry in manifest["files"].values() if "object" in entry}
    assert len(objects) >= 3
    assert p.metrics["objects_uploaded"] == len(objects)
    assert p.metrics["bytes_uploaded"] == sum(
        entry["size"] for entry in manifest["files"].values() if "object" in entry)
    assert set(os.listdir(tmp_path / "state" / "op" / "0" / "sst")) == objects
    published = events.index(("replace", p._manifest_path(0)))
    assert ("sync", p.base + "/sst") in events[:published]
    p.close()
