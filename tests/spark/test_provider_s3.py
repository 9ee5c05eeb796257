"""Snapshots on S3: moto serves a real S3 API on 127.0.0.1, pyarrow.fs talks to it."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow.fs as pafs
import pytest

from spark_adapter import SessionStoreProvider, SnapshotError
from tests.spark.s3_server import moto_s3
from tests.spark.test_provider import run_batch

pytest.importorskip("moto.server")


@pytest.fixture(scope="module")
def s3() -> Iterator[pafs.S3FileSystem]:
    with moto_s3() as fs:
        yield fs


def test_snapshots_round_trip_through_s3(s3, tmp_path):
    def provider(local: str) -> SessionStoreProvider:
        return SessionStoreProvider("sessions/state", "op", 0, local_root=tmp_path / local,
                                    retention_ms=10_000, filesystem=s3, keep_versions=2,
                                    orphan_grace_ms=0)

    p = provider("a")
    assert run_batch(p, 0, [("k", 0)]) == [(("k", 0, 10), [1, 0, 0, 0, None])]
    assert run_batch(p, 1, [("k", 5)]) == [(("k", 0, 15), [2, 0, 0, 0, None])]
    # another executor with an empty disk restores batch 1 from S3 alone
    other = provider("b")
    assert run_batch(other, 2, [("k", 12)]) == [(("k", 0, 22), [3, 0, 0, 0, None])]
    assert other.metrics["loads_restored"] == 1 and other.metrics["loads_reused"] == 0
    manifests = s3.get_file_info(pafs.FileSelector("sessions/state/op/0/manifests"))
    assert sorted(info.base_name for info in manifests) == ["0.json", "1.json", "2.json"]
    run = p.maintenance()
    assert run["manifests_deleted"] == 1
    manifests = s3.get_file_info(pafs.FileSelector("sessions/state/op/0/manifests"))
    assert sorted(info.base_name for info in manifests) == ["1.json", "2.json"]
    referenced = {entry["object"] for v in p.versions()
                  for entry in p.read_manifest(v)["files"].values() if "object" in entry}
    objects = {info.base_name for info in
               s3.get_file_info(pafs.FileSelector("sessions/state/op/0/sst"))}
    assert objects == referenced
    with pytest.raises(SnapshotError, match="no snapshot of batch 7"):
        provider("c").load(7)
