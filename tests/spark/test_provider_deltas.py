"""Delta snapshots: a commit uploads only what its lineage has not uploaded, compaction output goes
up in the background, and a restore reads only what the working copy lacks.

Real RocksDB files; state locations on a local file system and on S3 (moto's server on loopback).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest

from sessionstore import EmitStrategy, SessionAggregator, SessionWindows, aggregations
from spark_adapter import SessionStoreProvider, SnapshotCorruptedError
from tests.oracle import sessionize
from tests.spark.s3_server import state_location

GAP_MS = 10
SEGMENT_MS = 100_000


def make_provider(state: str, local: Path, fs: pafs.FileSystem | None, **kwargs: Any
                  ) -> SessionStoreProvider:
    kwargs.setdefault("maintenance_every", 0)
    return SessionStoreProvider(state, "op", 0, local_root=local, retention_ms=10**7,
                                segment_interval_ms=SEGMENT_MS, filesystem=fs, **kwargs)


def batch_events(batch: int) -> list[tuple[str, int]]:
    """Each batch extends some users' sessions and opens others, all in one segment."""
    rng = random.Random(batch)
    return [(f"user{rng.randrange(60)}", batch * 7 + rng.randrange(9)) for _ in range(40)]


def oracle(batches: int) -> list[tuple[str, int, int, int]]:
    """(key, start, end, count) of every session after ``batches`` batches (no watermark moves:
    nothing is late), from the independent offline sessionizer."""
    steps = [("event", key, None, t) for batch in range(batches) for key, t in batch_events(batch)]
    found, _dropped = sessionize(steps, GAP_MS, out_of_orderness=None)
    return sorted((key, start, end, len(values)) for key, start, end, values in found)


def engine_on(store: Any) -> SessionAggregator:
    return SessionAggregator(store, SessionWindows(GAP_MS), aggregations.count(),
                             emit=EmitStrategy.ON_WINDOW_CLOSE, watermark="external")


def sessions(store: Any) -> list[tuple[str, int, int, int]]:
    return sorted((s.key, s.start, s.end, record[0])
                  for s, record in store.find_sessions(-(2**62), 2**62))


def run_batches(p: SessionStoreProvider, first: int, last: int) -> list[dict[str, int]]:
    """Batches ``first..last`` on one open provider (a kept partition): load once, then commit
    each. Returns each commit's counters."""
    engine = engine_on(p.load(first - 1))
    per_commit = []
    for batch in range(first, last + 1):
        before = dict(p.metrics)
        for key, t in batch_events(batch):
            engine.process(key, None, t)
        p.commit(engine.commit, batch)
        per_commit.append({name: p.metrics[name] - before[name] for name in p.metrics})
    p.close()
    return per_commit


def tree(path: Path) -> dict[str, bytes]:
    return {str(f.relative_to(path)): f.read_bytes() for f in sorted(path.rglob("*"))
            if f.is_file()}


@pytest.fixture(params=["local", "s3"])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[
        tuple[str, pafs.FileSystem | None]]:
    if request.param == "s3":
        pytest.importorskip("moto.server")
    with state_location(request.param, tmp_path) as found:
        yield found


def test_a_restore_links_what_the_working_copy_holds_and_downloads_the_rest(location, tmp_path):
    """Kills: restoring by downloading every object (counters), and a restore that mixes local
    and downloaded files wrongly (the sessions)."""
    state, fs = location
    run_batches(make_provider(state, tmp_path / "writer", fs), 0, 1)
    stale = make_provider(state, tmp_path / "stale", fs)
    stale.load(1)  # an executor that holds batch 1
    stale.close()
    run_batches(make_provider(state, tmp_path / "writer", fs), 2, 3)
    held = {f.name for f in (tmp_path / "stale").rglob("checkpoints/*/*.sst")}
    wanted = {name for name, entry in stale.read_manifest(3)["files"].items()
              if "object" in entry}
    assert held & wanted and wanted - held
    restored = make_provider(state, tmp_path / "stale", fs)
    assert sessions(restored.load(3)) == oracle(4)
    restored.close()
    assert restored.metrics["objects_linked_locally"] == len(held & wanted)
    assert restored.metrics["objects_downloaded"] == len(wanted - held)


def test_a_damaged_local_file_is_downloaded_not_linked(tmp_path):
    """Kills: linking a local file on name and size alone (the flipped bit would then fail the
    restored store's own checks, blamed on the snapshot)."""
    state = str(tmp_path / "state")
    run_batches(make_provider(state, tmp_path / "writer", None), 0, 1)
    stale = make_provider(state, tmp_path / "stale", None)
    stale.load(1)
    stale.close()
    run_batches(make_provider(state, tmp_path / "writer", None), 2, 2)
    held = sorted((tmp_path / "stale").rglob("checkpoints/*/*.sst"))
    damaged = bytearray(held[0].read_bytes())
    damaged[len(damaged) // 2] ^= 0x10
    held[0].write_bytes(bytes(damaged))
    p = make_provider(state, tmp_path / "stale", None)
    assert sessions(p.load(2)) == oracle(3)
    p.close()
    assert p.metrics["objects_linked_locally"] == len(held) - 1
    assert p.metrics["objects_downloaded"] >= 1


def test_a_manifest_naming_an_absent_delta_fails_by_name_and_changes_nothing(location,
                                                                             tmp_path):
    """The newest version's own delta is gone: an executor holding the version before it (so it
    links everything else) must name the missing object and change nothing."""
    state, fs = location
    run_batches(make_provider(state, tmp_path / "writer", fs), 0, 1)
    stale = make_provider(state, tmp_path / "stale", fs)
    stale.load(1)
    stale.close()
    run_batches(make_provider(state, tmp_path / "writer", fs), 2, 2)
    before, after = stale.read_manifest(1)["files"], stale.read_manifest(2)["files"]
    delta = sorted(entry["object"] for name, entry in after.items()
                   if "object" in entry and name not in before)
    assert delta
    missing = f"{stale.base}/sst/{delta[0]}"
    (fs or pafs.LocalFileSystem()).delete_file(missing)
    local_before = tree(tmp_path / "stale")
    p = make_provider(state, tmp_path / "stale", fs)
    with pytest.raises(SnapshotCorruptedError, match="missing, but the snapshot of batch 2") \
            as caught:
        p.load(2)
    p.close()
    assert caught.value.path == missing
    assert tree(tmp_path / "stale") == local_before


def test_compaction_output_goes_up_in_the_background_and_every_version_restores(location,
                                                                                tmp_path):
    """Kills: a commit that uploads the compaction output again (objects_preuploaded and the
    per-commit object counts), RocksDB compacting on its own (a commit then uploads its output),
    and a manifest referencing an object not yet uploaded (every version restores exactly)."""
    state, fs = location
    writer = make_provider(state, tmp_path / "writer", fs, compact_level0_files=3)
    per_commit = run_batches(writer, 0, 8)
    # the compaction after the last commit went up too, referenced by no version (yet)
    assert 0 < writer.metrics["objects_preuploaded"] \
        <= writer.metrics["background_objects_uploaded"]
    # each commit uploads what its batch flushed: one file per segment written (one here)
    assert [c["objects_uploaded"] for c in per_commit] == [1] * 9
    for version in range(9):
        reader = make_provider(state, tmp_path / f"reader{version}", fs)
        assert sessions(reader.load(version)) == oracle(version + 1)
        reader.close()


def test_a_failed_background_upload_is_made_by_the_next_commit(tmp_path, monkeypatch):
    """Kills: recording an object before its upload succeeded."""
    state = str(tmp_path / "state")
    upload = SessionStoreProvider._upload_object

    def failing(self: SessionStoreProvider, source: str, name: str, counters: str = ""
                ) -> dict[str, Any]:
        if counters:
            raise OSError("the store refused the upload")
        return upload(self, source, name, counters)

    monkeypatch.setattr(SessionStoreProvider, "_upload_object", failing)
    writer = make_provider(state, tmp_path / "writer", None, compact_level0_files=2)
    per_commit = run_batches(writer, 0, 4)
    assert writer.metrics["background_failed"] > 0
    assert writer.metrics["objects_preuploaded"] == 0
    assert max(c["objects_uploaded"] for c in per_commit) > 1  # the compaction output, too
    reader = make_provider(state, tmp_path / "reader", None)
    assert sessions(reader.load(4)) == oracle(5)
    reader.close()


def test_a_background_upload_older_than_half_the_orphan_grace_is_uploaded_again(tmp_path):
    """Maintenance may delete an unreferenced object once it is ``orphan_grace_ms`` old. Kills:
    referencing a background upload however old it is (with no grace at all, none is fresh)."""
    state = str(tmp_path / "state")
    writer = make_provider(state, tmp_path / "writer", None, compact_level0_files=2,
                           orphan_grace_ms=0)
    run_batches(writer, 0, 4)
    assert writer.metrics["background_objects_uploaded"] > 0
    assert writer.metrics["objects_preuploaded"] == 0
    reader = make_provider(state, tmp_path / "reader", None)
    assert sessions(reader.load(4)) == oracle(5)
    reader.close()


@pytest.mark.parametrize("value", [-1, True, 1.5])
def test_compact_level0_files_is_checked(tmp_path, value):
    with pytest.raises(ValueError, match="compact_level0_files"):
        SessionStoreProvider(str(tmp_path), "op", 0, retention_ms=10, compact_level0_files=value)


def test_without_a_due_compaction_every_commit_uploads_only_its_flush(tmp_path):
    """Kills: leaving RocksDB's own compaction on (after four flushes into a segment it
    compacts them, and the next commit uploads that output)."""
    writer = make_provider(str(tmp_path / "state"), tmp_path / "writer", None,
                           compact_level0_files=100)
    per_commit = run_batches(writer, 0, 9)
    assert [c["objects_uploaded"] for c in per_commit] == [1] * 10
    assert writer.metrics["background_objects_uploaded"] == 0


def test_a_partition_closed_after_every_commit_keeps_its_files_bounded(tmp_path):
    """Closed after each commit, a working copy loses every background compaction (it reopens
    from the checkpoint); past four times the threshold a commit compacts first. Kills: no
    foreground compaction (the files of a version then grow by one per batch)."""
    state = str(tmp_path / "state")
    for batch in range(14):
        run_batches(make_provider(state, tmp_path / "writer", None, compact_level0_files=2),
                    batch, batch)
    reader = make_provider(state, tmp_path / "reader", None)
    counts = [sum(1 for name in reader.read_manifest(v)["files"] if name.endswith(".sst"))
              for v in range(14)]
    assert max(counts) <= 4 * 2
    assert sessions(reader.load(13)) == oracle(14)
    reader.close()
