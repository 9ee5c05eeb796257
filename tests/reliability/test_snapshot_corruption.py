"""Snapshot corruption matrix: bit flips and truncations of every kind of snapshot object.

A snapshot of batch 2 is published (real RocksDB files) on a local file system and on S3 (moto's
server on loopback). Each trial damages one object, then an executor whose working copy holds
batch 1 loads batch 2. That executor links the SST files it already holds (checked by size and
SHA-256) instead of reading their objects, so the trials on those objects run on an executor with
an empty disk, which reads every object. A trial is

* detected: ``SnapshotCorruptedError`` naming the damaged object, with the executor's working copy
  and every remote object exactly as before the load;
* harmless: the load returns exactly the sessions of the clean snapshot;
* silent: anything else (other sessions, fewer sessions, another exception). Must be 0.

Object kinds: SST objects; the snapshot manifest (its body, and its sealed header); the
RocksDB ``CURRENT``, ``MANIFEST-*``, ``OPTIONS-*`` files and the store's
``SESSIONSTORE-MANIFEST``, which the snapshot manifest carries inline ("as uploaded": damaged in
place in the manifest's bytes, and, separately, damaged before sealing so that the manifest's own
checksum holds and only the per-file checksum can catch it); and the layout record.

CI runs a seeded sample (under a minute); ``SESSIONSTORE_SOAK=1`` flips one bit of every byte of
every object on the local file system (512 evenly spaced bytes per object on S3, where a trial
costs a dozen requests) and truncates every object at 256 evenly spaced lengths.
"""

from __future__ import annotations

import base64
import json
import os
import random
import shutil
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest

from sessionstore import EmitStrategy, SessionAggregator, SessionWindows, aggregations
from spark_adapter import SnapshotCorruptedError, StateLayout, pin_layout
from spark_adapter import state as state_module
from spark_adapter.provider import SessionStoreProvider, seal, unseal
from tests.spark.s3_server import moto_s3

SOAK = os.environ.get("SESSIONSTORE_SOAK") == "1"
SAMPLE_FLIPS = {"local": 10, "s3": 4}  # per object kind, in CI
SAMPLE_CUTS = {"local": 3, "s3": 2}
SOAK_CAP = {"local": None, "s3": 512}  # soak: flip positions per object (None: every byte)
LAYOUT = StateLayout(n_buckets=8, num_partitions=2, config_digest="0123456789abcdef")
VERSION = 2
INLINE = {"CURRENT": "CURRENT", "MANIFEST": "MANIFEST-", "OPTIONS": "OPTIONS-",
          "SESSIONSTORE-MANIFEST": "SESSIONSTORE-MANIFEST"}


def provider(fs: pafs.FileSystem, state: str, local: Path) -> SessionStoreProvider:
    return SessionStoreProvider(state, "op", 0, local_root=local, retention_ms=10**7,
                                segment_interval_ms=100_000, filesystem=fs,
                                maintenance_every=0)


def publish(fs: pafs.FileSystem, state: str, local: Path) -> None:
    """Batches 0..2, several segments, so that the snapshot has several SST objects."""
    p = provider(fs, state, local)
    rng = random.Random(1)
    for batch in range(VERSION + 1):
        store = p.load(batch - 1)
        engine = SessionAggregator(store, SessionWindows(50), aggregations.count(),
                                   emit=EmitStrategy.ON_WINDOW_CLOSE, watermark="external")
        for _ in range(300):
            engine.process(f"user{rng.randrange(40)}", None,
                           batch * 150_000 + rng.randrange(120_000))
        p.commit(engine.commit, batch)
        p.close()


def sessions(store: Any) -> list[tuple[Any, ...]]:
    return sorted((s.key, s.start, s.end, record[0])
                  for s, record in store.find_sessions(-(2**63), 2**63 - 1))


def tree(path: Path) -> dict[str, bytes]:
    return {str(f.relative_to(path)): f.read_bytes() for f in sorted(path.rglob("*"))
            if f.is_file()}


def remote_listing(fs: pafs.FileSystem, base: str) -> dict[str, tuple[int, int]]:
    """(size, mtime) of every object: any write, delete or new object changes it."""
    return {info.path: (info.size, info.mtime_ns or 0)
            for info in fs.get_file_info(pafs.FileSelector(base, recursive=True))
            if info.type == pafs.FileType.File}


def write(fs: pafs.FileSystem, path: str, data: bytes) -> None:
    with fs.open_output_stream(path) as handle:
        handle.write(data)


def flips(data: bytes, count: int | None, rng: random.Random,
          cap: int | None = None) -> Iterator[bytes]:
    """``count`` single-bit flips at random positions; with ``count=None``, one flip at every
    byte (every ``len // cap``-th byte when ``cap`` positions are fewer than the bytes)."""
    if count is None:
        positions: Any = range(0, len(data), max(1, len(data) // cap) if cap else 1)
    else:
        positions = [rng.randrange(len(data)) for _ in range(count)]
    for pos in positions:
        damaged = bytearray(data)
        damaged[pos] ^= 1 << rng.randrange(8)
        yield bytes(damaged)


def cuts(data: bytes, count: int | None, rng: random.Random) -> Iterator[bytes]:
    """Truncations: empty, one byte short, and ``count`` random lengths (soak: every step)."""
    lengths = {0, len(data) - 1}
    if count is None:
        lengths |= set(range(0, len(data), max(1, len(data) // 256)))
    else:
        lengths |= {rng.randrange(len(data)) for _ in range(count)}
    for length in sorted(lengths):
        yield data[:length]


class Matrix:
    """Runs trials against one published snapshot and keeps the figures."""

    def __init__(self, fs: pafs.FileSystem, state: str, work: Path, kind_of_fs: str) -> None:
        self.fs, self.state, self.work, self.kind_of_fs = fs, state, work, kind_of_fs
        publish(fs, state, work / "writer")
        clean = provider(fs, state, work / "clean")
        self.expected = sessions(clean.load(VERSION))
        clean.close()
        # executors whose working copy holds batch 1, and nothing (an empty store)
        self.templates = {name: self.executor(work / name, version)
                          for name, version in (("stale", VERSION - 1), ("empty", -1))}
        self.held = {f.name for f in (work / "stale").rglob("checkpoints/*/*.sst")}
        assert self.held  # batch 2 shares SST files with batch 1
        self.base = clean.base
        self.manifest_path = f"{self.base}/manifests/{VERSION}.json"
        self.figures: Counter[str] = Counter()
        self.by_kind: dict[str, Counter[str]] = {}
        self.failures: list[str] = []

    def executor(self, local: Path, version: int) -> tuple[Path, dict[str, bytes], Path]:
        """An executor's working copy at ``version``: (directory, its files, a pristine copy)."""
        template = provider(self.fs, self.state, local)
        template.load(version)
        template.close()
        copy = local.with_name(f"{local.name}-copy")
        shutil.copytree(local, copy)
        return local, tree(local), copy

    def objects(self) -> dict[str, str]:
        body = unseal(self.read(self.manifest_path), self.manifest_path)
        return {f"sst {name}": f"{self.base}/sst/{entry['object']}"
                for name, entry in sorted(body["files"].items()) if "object" in entry}

    def read(self, path: str) -> bytes:
        with self.fs.open_input_file(path) as handle:
            data: bytes = handle.read()
            return data

    def record(self, kind: str, outcome: str, detail: str = "") -> None:
        self.figures["tried"] += 1
        self.figures[outcome] += 1
        self.by_kind.setdefault(kind, Counter())[outcome] += 1
        if outcome not in ("detected", "harmless"):
            self.failures.append(f"{kind}: {outcome} {detail}")

    def load_trial(self, kind: str, path: str, damaged: bytes, executor: str = "stale") -> None:
        """Replace ``path`` with ``damaged``, load batch 2 on an executor (by default the one
        whose working copy holds batch 1), classify, and put the original bytes back."""
        local, local_tree, local_copy = self.templates[executor]
        original = self.read(path)
        write(self.fs, path, damaged)
        remote_before = remote_listing(self.fs, self.base)
        p = provider(self.fs, self.state, local)
        try:
            store = p.load(VERSION)
        except SnapshotCorruptedError as exc:
            p.close()
            if exc.path != path:
                self.record(kind, "misnamed", f"named {exc.path}, damaged {path}")
            elif tree(local) != local_tree:
                self.record(kind, "local_changed")
            elif remote_listing(self.fs, self.base) != remote_before:
                self.record(kind, "remote_changed")
            else:
                self.record(kind, "detected")
        except Exception as exc:  # noqa: BLE001 - any other failure is a finding, recorded
            p.close()
            self.record(kind, "wrong_error", repr(exc))
        else:
            found = sessions(store)
            p.close()
            self.record(kind, "harmless" if found == self.expected else "silent",
                        f"{len(found)} sessions instead of {len(self.expected)}")
        finally:
            write(self.fs, path, original)
        if tree(local) != local_tree:  # a load succeeded: back to where it was
            shutil.rmtree(local)
            shutil.copytree(local_copy, local)

    def run(self, n_flips: int | None, n_cuts: int | None, seed: int,
            cap: int | None = None) -> None:
        rng = random.Random(seed)
        targets: dict[str, tuple[str, bytes]] = {
            kind: (path, self.read(path)) for kind, path in self.objects().items()}
        manifest = self.read(self.manifest_path)
        header_end = manifest.index(b"\n") + 1
        # the sealed manifest as a whole, and its header alone
        for damaged in [*flips(manifest, n_flips, rng, cap), *cuts(manifest, n_cuts, rng)]:
            self.load_trial("snapshot manifest", self.manifest_path, damaged)
        for damaged in flips(manifest[:header_end], n_flips, rng):
            self.load_trial("manifest header", self.manifest_path,
                            damaged + manifest[header_end:])
        for kind, (path, data) in targets.items():
            executor = "empty" if kind.removeprefix("sst ") in self.held else "stale"
            for damaged in [*flips(data, n_flips, rng, cap), *cuts(data, n_cuts, rng)]:
                self.load_trial(kind, path, damaged, executor)
        body = unseal(manifest, self.manifest_path)
        for label, prefix in INLINE.items():
            [name] = [n for n in body["files"] if n.startswith(prefix)]
            payload = body["files"][name]["data"].encode()
            start = manifest.index(payload)
            # as stored: the inline bytes damaged in place inside the manifest
            for damaged in flips(payload, n_flips, rng, cap):
                self.load_trial(f"inline {label} (in place)", self.manifest_path,
                                manifest[:start] + damaged + manifest[start + len(payload):])
            # damaged before sealing: the manifest's checksum holds, the file's must not
            raw = base64.b64decode(payload)
            for damaged in [*flips(raw, n_flips, rng, cap), *cuts(raw, n_cuts, rng)]:
                resealed = json.loads(json.dumps(body))
                resealed["files"][name]["data"] = base64.b64encode(damaged).decode()
                self.load_trial(f"inline {label} (resealed)", self.manifest_path,
                                seal(resealed))
        self.layout_trials(n_flips, n_cuts, rng, cap)

    def layout_trials(self, n_flips: int | None, n_cuts: int | None, rng: random.Random,
                      cap: int | None) -> None:
        pin_layout(self.state, LAYOUT, filesystem=self.fs)
        path = f"{self.state}/layout.json"
        original = self.read(path)
        for damaged in [*flips(original, n_flips, rng, cap), *cuts(original, n_cuts, rng)]:
            write(self.fs, path, damaged)
            state_module._PINNED.clear()
            try:
                pin_layout(self.state, LAYOUT, filesystem=self.fs)
            except SnapshotCorruptedError as exc:
                unchanged = self.read(path) == damaged
                self.record("layout record", "detected" if exc.path == path and unchanged
                            else "misnamed", exc.path)
            except Exception as exc:  # noqa: BLE001 - recorded as a finding
                self.record("layout record", "wrong_error", repr(exc))
            else:
                self.record("layout record", "silent", "a damaged record was accepted")
            finally:
                write(self.fs, path, original)
                state_module._PINNED.clear()


@pytest.fixture(params=["local", "s3"])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[
        tuple[str, pafs.FileSystem, str]]:
    if request.param == "local":
        (tmp_path / "state").mkdir()
        yield "local", pafs.LocalFileSystem(), str(tmp_path / "state")
    else:
        pytest.importorskip("moto.server")
        with moto_s3() as fs:
            yield "s3", fs, "sessions/state"


def test_snapshot_corruption_matrix(location, tmp_path, record_property: Callable[..., None]):
    name, fs, state = location
    matrix = Matrix(fs, state, tmp_path, name)
    matrix.run(None if SOAK else SAMPLE_FLIPS[name], None if SOAK else SAMPLE_CUTS[name], seed=7,
               cap=SOAK_CAP[name])
    figures = dict(matrix.figures)
    record_property("figures", json.dumps(figures))
    print(f"\nsnapshot corruption matrix ({name}, {'exhaustive' if SOAK else 'sample'}): "
          f"{json.dumps(figures)}")
    for kind, counts in sorted(matrix.by_kind.items()):
        print(f"  {kind}: {dict(counts)}")
    assert matrix.failures == []
    assert figures.get("silent", 0) == 0
    assert figures["detected"] + figures.get("harmless", 0) == figures["tried"]
    assert len(matrix.by_kind) >= 12  # every object kind was tried
    assert all(counts["detected"] > 0 for counts in matrix.by_kind.values())
