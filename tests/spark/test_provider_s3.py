"""Snapshots on S3: moto serves a real S3 API on 127.0.0.1, pyarrow.fs talks to it."""

from __future__ import annotations

import socket

import pyarrow.fs as pafs
import pytest

from tests.spark.test_provider import run_batch

moto_server = pytest.importorskip("moto.server")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def s3():
    port = free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    fs = pafs.S3FileSystem(access_key="test", secret_key="test", region="us-east-1",
                           endpoint_override=f"127.0.0.1:{port}", scheme="http",
                           allow_bucket_creation=True)
    fs.create_dir("sessions")
    yield fs
    server.stop()


def test_snapshots_round_trip_through_s3(s3, tmp_path):
    from spark_adapter import SessionStoreProvider, SnapshotError

    def provider(local: str) -> SessionStoreProvider:
        return SessionStoreProvider("sessions/state", "op", 0, local_root=tmp_path / local,
                                    retention_ms=10_000, filesystem=s3, keep_versions=2)

    p = provider("a")
    assert run_batch(p, 0, [("k", 0)]) == [(("k", 0, 10), [1, 0, 0, 0, None])]
    assert run_batch(p, 1, [("k", 5)]) == [(("k", 0, 15), [2, 0, 0, 0, None])]
    # another executor with an empty disk restores batch 1 from S3 alone
    assert run_batch(provider("b"), 2, [("k", 12)]) == [(("k", 0, 22), [3, 0, 0, 0, None])]
    manifests = s3.get_file_info(pafs.FileSelector("sessions/state/op/0/manifests"))
    assert sorted(info.base_name for info in manifests) == ["0.json", "1.json", "2.json"]
    p.maintenance()
    manifests = s3.get_file_info(pafs.FileSelector("sessions/state/op/0/manifests"))
    assert sorted(info.base_name for info in manifests) == ["1.json", "2.json"]
    with pytest.raises(SnapshotError, match="no snapshot of batch 7"):
        provider("c").load(7)
