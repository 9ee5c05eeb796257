"""A snapshot published between a segment's expiry and its drop from RocksDB (which the store
leaves to the housekeeping after the commit point): its manifest names the live segments only,
its files still include the expired segment's, and a restore from it (what an executor lost
right after the commit sees) opens without the expired segment and drops it before the next
snapshot.

Real RocksDB files, a local state location; no SparkSession.
"""

from __future__ import annotations

from pathlib import Path

from sessionstore import Session
from sessionstore.store.checkpoint import read_manifest
from spark_adapter import SessionStoreProvider

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
