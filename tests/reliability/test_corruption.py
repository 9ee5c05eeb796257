"""Corrupted, truncated, missing or newer-format state gives a clear error, never a reset."""

from __future__ import annotations

import contextlib
import os
import pickle
from pathlib import Path

import msgpack
import pytest
import rocksdict

from sessionstore import ReadOnlySessionStore, Session, SessionStore
from sessionstore.store.base import STORE_FORMAT_VERSION


def committed_store(path: Path) -> Path:
    with SessionStore(path, retention_ms=10**9) as store:
        for i in range(200):
            store.put(Session(f"k{i}", i, i + 10), {"n": i})
        store.commit({"offset": 200})
    return path


def manifest_of(path: Path) -> Path:
    (checkpoint,) = sorted((path / "checkpoints").iterdir())[-1:]
    return checkpoint / "SESSIONSTORE-MANIFEST"


def assert_untouched_after_error(path: Path, match: str) -> None:
    before = sorted(p.name for p in (path / "checkpoints").iterdir())
    with pytest.raises(ValueError, match=match):
        SessionStore(path, retention_ms=10**9)
    assert sorted(p.name for p in (path / "checkpoints").iterdir()) == before


def test_truncated_manifest(tmp_path):
    path = committed_store(tmp_path / "s")
    manifest = manifest_of(path)
    manifest.write_bytes(manifest.read_bytes()[:7])
    assert_untouched_after_error(path, "corrupted store manifest")


def test_garbled_manifest(tmp_path):
    path = committed_store(tmp_path / "s")
    manifest_of(path).write_bytes(os.urandom(64))
    assert_untouched_after_error(path, "store manifest")


def test_missing_manifest(tmp_path):
    path = committed_store(tmp_path / "s")
    manifest_of(path).unlink()
    assert_untouched_after_error(path, "missing store manifest")


def test_newer_format_version(tmp_path):
    path = committed_store(tmp_path / "s")
    manifest = manifest_of(path)
    data = msgpack.unpackb(manifest.read_bytes())
    data["format"] = STORE_FORMAT_VERSION + 1
    manifest.write_bytes(msgpack.packb(data))
    assert_untouched_after_error(path, "format version 2")


def test_missing_sst_file(tmp_path):
    path = committed_store(tmp_path / "s")
    checkpoint = manifest_of(path).parent
    ssts = list(checkpoint.glob("*.sst"))
    assert ssts
    ssts[0].unlink()
    assert_untouched_after_error(path, "cannot open session store|missing")


def test_format_version_is_recorded(tmp_path):
    path = committed_store(tmp_path / "s")
    assert msgpack.unpackb(manifest_of(path).read_bytes())["format"] == STORE_FORMAT_VERSION


class Boom:
    """Unpickling this creates a marker file: the proof that code ran."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_crafted_pickle_payloads_never_run(tmp_path):
    marker = tmp_path / "code-ran"
    payload = pickle.dumps(Boom(str(marker)))
    path = committed_store(tmp_path / "s")
    checkpoint = manifest_of(path).parent
    # a pickle where a value belongs, written behind the store's back
    db = rocksdict.Rdict(str(checkpoint), options=rocksdict.Options(raw_mode=True),
                         column_families={n: rocksdict.Options(raw_mode=True) for n in
                                          rocksdict.Rdict.list_cf(str(checkpoint),
                                                                  rocksdict.Options(raw_mode=True))})
    cf_name = next(n for n in rocksdict.Rdict.list_cf(str(checkpoint),
                                                      rocksdict.Options(raw_mode=True))
                   if n.startswith("seg"))
    cf = db.get_column_family(cf_name)
    key = next(k for k in cf.keys() if k.startswith(b"K"))  # noqa: SIM118 - an Rdict
    cf[key] = payload
    del cf
    db.close()
    # and rocksdict's own config flipped to its pickling mode
    (checkpoint / "rocksdict-config.json").write_text('{"raw_mode":false,"prefix_extractors":{}}')
    try:
        with SessionStore(path, retention_ms=10**9) as store:
            for _session, _value in _read_all_tolerating_garbage(store):
                pass
    except ValueError:
        pass  # refusing the tampered store is fine; running code is not
    view_error = None
    try:
        with ReadOnlySessionStore(path) as view:
            list(view)
    except ValueError as exc:
        view_error = exc
    # a pickle where the manifest belongs
    manifest_of(path).write_bytes(payload)
    with pytest.raises(ValueError):
        SessionStore(path, retention_ms=10**9)
    assert not marker.exists(), "opening or reading the store ran code"
    assert view_error is None or isinstance(view_error, ValueError)


def _read_all_tolerating_garbage(store):
    out = []
    for key in [f"k{i}" for i in range(200)]:
        # msgpack refuses the pickle bytes with a ValueError: a clear error, and no code runs
        with contextlib.suppress(ValueError):
            out.extend(store.fetch(key))
    return out
