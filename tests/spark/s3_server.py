"""moto's S3 server on 127.0.0.1 and a ``pyarrow.fs`` client for it: a real S3 API, no stand-in."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow.fs as pafs


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def moto_s3(bucket: str = "sessions") -> Iterator[pafs.S3FileSystem]:
    """Start a moto S3 server on a free loopback port, create ``bucket``, yield a client."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        fs = pafs.S3FileSystem(access_key="test", secret_key="test", region="us-east-1",
                               endpoint_override=f"127.0.0.1:{port}", scheme="http",
                               allow_bucket_creation=True)
        fs.create_dir(bucket)
        yield fs
    finally:
        server.stop()


@contextmanager
def state_location(kind: str, tmp_path: Path) -> Iterator[tuple[str, pafs.FileSystem | None]]:
    """A state location on a local file system (``kind="local"``: a path, no explicit file
    system) or on moto S3 (``"s3"``: a bucket path and its client)."""
    if kind == "local":
        yield str(tmp_path / "state"), None
    else:
        with moto_s3() as fs:
            yield "sessions/state", fs
