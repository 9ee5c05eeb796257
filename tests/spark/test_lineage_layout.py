"""Pinning a state location to its layout, and per-query state locations (no Spark session)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest

from spark_adapter import (
    SnapshotCorruptedError,
    StateLayout,
    StateLayoutMismatchError,
    config_digest,
    pin_layout,
    query_state_location,
)
from spark_adapter import state as state_module
from tests.spark.s3_server import state_location

LAYOUT = StateLayout(n_buckets=16, num_partitions=4, config_digest=config_digest({"gap_ms": 10}))


@pytest.fixture(autouse=True)
def forget_pinned() -> Iterator[None]:
    """Each test starts as a fresh process would: nothing checked yet."""
    state_module._PINNED.clear()
    yield
    state_module._PINNED.clear()


@pytest.fixture(params=["local", "s3"])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Any]]:
    with state_location(request.param, tmp_path) as found:
        yield found


def read(fs: pafs.FileSystem, path: str) -> bytes:
    with fs.open_input_file(path) as handle:
        data: bytes = handle.read()
        return data


def test_first_run_records_the_layout_and_a_restart_must_match(location):
    state, fs = location
    assert pin_layout(state, LAYOUT, filesystem=fs) == LAYOUT
    client = fs or pafs.LocalFileSystem()
    recorded = read(client, f"{state}/layout.json")
    state_module._PINNED.clear()  # a restart: a new process checks again
    assert pin_layout(state, LAYOUT, filesystem=fs) == LAYOUT
    for change, message in [
        ({"n_buckets": 8}, "n_buckets: the state location was created with 16, this run uses 8"),
        ({"num_partitions": 2},
         "num_partitions: the state location was created with 4, this run uses 2"),
        ({"config_digest": "0123456789abcdef"},
         f"config_digest: the state location was created with '{LAYOUT.config_digest}', this "
         f"run uses '0123456789abcdef'"),
    ]:
        other = StateLayout(**{**LAYOUT.__dict__, **change})
        with pytest.raises(StateLayoutMismatchError) as caught:
            pin_layout(state, other, filesystem=fs)
        assert message in str(caught.value)
        assert read(client, f"{state}/layout.json") == recorded  # the record is never rewritten


def test_all_differences_are_named_at_once(tmp_path):
    pin_layout(str(tmp_path), LAYOUT)
    with pytest.raises(StateLayoutMismatchError, match="n_buckets.*num_partitions"):
        pin_layout(str(tmp_path), StateLayout(1, 1, LAYOUT.config_digest))


def test_a_checked_layout_is_not_read_again_in_the_same_process(tmp_path):
    pin_layout(str(tmp_path), LAYOUT)
    (tmp_path / "layout.json").write_bytes(b"garbage")
    assert pin_layout(str(tmp_path), LAYOUT) == LAYOUT  # cached: no second read per task
    state_module._PINNED.clear()
    with pytest.raises(SnapshotCorruptedError) as caught:
        pin_layout(str(tmp_path), LAYOUT)
    assert caught.value.path == str(tmp_path / "layout.json")


@pytest.mark.parametrize("cut", [0, 10, -1])
def test_a_damaged_layout_record_is_refused_and_kept(tmp_path, cut):
    pin_layout(str(tmp_path), LAYOUT)
    path = tmp_path / "layout.json"
    damaged = path.read_bytes()[:cut]
    path.write_bytes(damaged)
    state_module._PINNED.clear()
    with pytest.raises(SnapshotCorruptedError):
        pin_layout(str(tmp_path), LAYOUT)
    assert path.read_bytes() == damaged


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"n_buckets": 0, "num_partitions": 1, "config_digest": "x"}, "n_buckets"),
    ({"n_buckets": 1, "num_partitions": True, "config_digest": "x"}, "num_partitions"),
    ({"n_buckets": 1, "num_partitions": 1, "config_digest": ""}, "config_digest"),
])
def test_layout_fields_are_checked(kwargs, name):
    with pytest.raises(ValueError, match=name):
        StateLayout(**kwargs)


def test_config_digest_is_stable_and_sensitive():
    a = config_digest({"gap_ms": 10, "keys": ["user"], "emit": "final"})
    assert a == config_digest({"emit": "final", "keys": ["user"], "gap_ms": 10})
    assert a != config_digest({"gap_ms": 11, "keys": ["user"], "emit": "final"})
    assert len(a) == 16


def test_query_state_location_is_per_query():
    one = query_state_location("s3://bucket/state/", "4d5e6f70-0000-4000-8000-000000000001")
    two = query_state_location("s3://bucket/state", "4d5e6f70-0000-4000-8000-000000000002")
    assert one == "s3://bucket/state/query-4d5e6f70-0000-4000-8000-000000000001"
    assert one != two


@pytest.mark.parametrize("query_id", ["../x", "a/b", ""])
def test_query_ids_cannot_escape(query_id):
    with pytest.raises(ValueError, match="query_id"):
        query_state_location("/state", query_id)


def test_query_state_location_needs_an_id_outside_a_task():
    with pytest.raises(ValueError, match="sql.streaming.queryId"):
        query_state_location("/state")
