"""The corruption matrix: bit flips, truncations and extensions of every file of a committed store.

Each trial damages one file of a pristine committed store, then opens it (the writer's
SessionStore and, for a share of trials, the ReadOnlySessionStore) and reads everything back.
Outcomes:

* detected: ``StoreCorruptedError`` naming the damaged file, with the directory left exactly as it
  was (hashed before and after);
* harmless: the store opens and returns exactly the committed version, metadata and sessions
  (damage to files a commit does not depend on: older checkpoints, the working copy, the lock);
* silent: anything else, a smaller answer or another exception type. Must be 0.

CI runs a sample of offsets per file (seeded, always including the first and last byte);
``SESSIONSTORE_MATRIX_FLIPS=n`` samples n offsets a file instead. ``SESSIONSTORE_SOAK=1`` runs
every byte offset and every truncation length of every file of the newest checkpoint
(``make soak``; about 150,000 trials, most of an hour).
"""

from __future__ import annotations

import os
import random
import shutil
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sessionstore import ReadOnlySessionStore, Session, SessionStore, StoreCorruptedError
from sessionstore.store import committed_versions
from tests.reliability.test_corruption import tree_digest

SOAK = os.environ.get("SESSIONSTORE_SOAK") == "1"
# Offsets flipped per file of the newest checkpoint when not in soak mode (a quarter as many
# truncation lengths besides 0, half and all but one byte); raise it for a longer run.
SAMPLED_FLIPS = int(os.environ.get("SESSIONSTORE_MATRIX_FLIPS", "24"))
RETENTION_MS = 10**9
INTERVAL_MS = 400
KEYS = [f"user{i}" for i in range(12)] + [7, b"\x00bin", ("t", 1)]


@dataclass(frozen=True)
class Trial:
    relpath: str  # the damaged file, relative to the store
    kind: str  # "flip", "truncate" or "extend"
    at: int  # byte offset flipped, length truncated to, or bytes appended

    def apply(self, store: Path) -> None:
        target = store / self.relpath
        raw = bytearray(target.read_bytes())
        if self.kind == "flip":
            raw[self.at] ^= 1 << (self.at % 8)
        elif self.kind == "truncate":
            del raw[self.at:]
        else:
            raw += bytes((0xA5 + i) % 256 for i in range(self.at))
        # in place, as a disk would: the inode, and so every hard link to it, changes
        with open(target, "r+b") as handle:
            handle.write(raw)
            handle.truncate(len(raw))


def file_kind(relpath: str, newest: str) -> str:
    parts = Path(relpath).parts
    name = parts[-1]
    if parts[0] == "live":
        return "working copy (live/)"
    if parts[0] != "checkpoints":
        return name  # LOCK
    if parts[1] != newest:
        return "older checkpoint"
    for prefix, kind in [("SESSIONSTORE-MANIFEST", "SESSIONSTORE-MANIFEST"),
                         ("MANIFEST-", "RocksDB MANIFEST"), ("CURRENT", "CURRENT"),
                         ("OPTIONS-", "OPTIONS"), ("rocksdict-config", "rocksdict config")]:
        if name.startswith(prefix):
            return kind
    if name.endswith(".sst"):
        return "SST"
    if name.endswith(".log"):
        return "WAL (.log)"
    return "other"


def build_store(path: Path) -> dict[str, object]:
    """Two commits over several segments, then uncommitted writes left in live/."""
    with SessionStore(path, retention_ms=RETENTION_MS, segment_interval_ms=INTERVAL_MS,
                      keep_versions=2) as store:
        for n, key in enumerate(KEYS * 4):
            store.put(Session(key, n * 37, n * 37 + 25), {"n": n, "pad": "x" * (n % 9)})
        store.commit({"offset": 1})
        for n, key in enumerate(KEYS * 2):
            store.put(Session(key, 5000 + n * 41, 5000 + n * 41 + 30), [n, str(key)])
        store.remove(Session(KEYS[0], 0, 25))
        store.commit({"offset": 2, "note": "two"})
        store.put(Session("uncommitted", 0, 1), 0)
    return read_everything_writable(path)


def read_everything_writable(path: Path) -> dict[str, object]:
    with SessionStore(path, retention_ms=RETENTION_MS) as store:
        return {
            "version": store.committed_version,
            "metadata": store.committed_metadata,
            "sessions": [(tuple(s), v) for s, v in store.find_sessions(-(2**63), 2**63 - 1)],
            "by_key": [[(tuple(s), v) for s, v in store.fetch(k)] for k in KEYS],
        }


def read_everything_view(path: Path, scratch: Path) -> dict[str, object]:
    with ReadOnlySessionStore(path, scratch_dir=scratch) as view:
        return {
            "version": view.version,
            "metadata": view.metadata,
            "sessions": [(tuple(s), v) for s, v in view],
            "by_key": [[(tuple(s), v) for s, v in view.fetch(k)] for k in KEYS],
        }


def trials(pristine: Path, newest: str, rng: random.Random) -> Iterator[Trial]:
    for full in sorted(p for p in pristine.rglob("*") if p.is_file()):
        relpath = str(full.relative_to(pristine))
        size = full.stat().st_size
        in_newest = file_kind(relpath, newest) not in (
            "older checkpoint", "working copy (live/)", "LOCK")
        if SOAK and in_newest:
            offsets: list[int] = list(range(size))
            lengths = list(range(size))
        elif in_newest:
            inner = rng.sample(range(1, size - 1), min(SAMPLED_FLIPS, max(size - 2, 0)))
            offsets = sorted({0, size - 1, *inner}) if size else []
            cuts = rng.sample(range(1, size - 1), min(SAMPLED_FLIPS // 4, max(size - 2, 0)))
            lengths = sorted({0, size // 2, size - 1, *cuts}) if size else []
        else:
            offsets = [rng.randrange(size)] if size else []
            lengths = [size // 2] if size else []
        for offset in offsets:
            yield Trial(relpath, "flip", offset)
        for length in lengths:
            yield Trial(relpath, "truncate", length)
        yield Trial(relpath, "extend", 1 + rng.randrange(64))


def test_corruption_matrix(tmp_path: Path) -> None:
    pristine = tmp_path / "pristine"
    expected = build_store(pristine)
    assert expected["version"] == 2 and len(expected["sessions"]) > 50  # type: ignore[arg-type]
    newest = f"v{committed_versions(pristine)[-1]:012d}"
    work = tmp_path / "work"
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    rng = random.Random(13)
    outcomes: Counter[tuple[str, str]] = Counter()
    silent: list[str] = []
    view_trials = 0
    shutil.copytree(pristine, work, symlinks=True)
    for index, trial in enumerate(trials(pristine, newest, rng)):
        if index and index % 10_000 == 0:
            print(f"... {index} trials, {sum(outcomes.values())} classified", flush=True)
        trial.apply(work)
        before = tree_digest(work)
        kind = file_kind(trial.relpath, newest)
        outcome = "detected"
        try:
            got = read_everything_writable(work)
        except StoreCorruptedError as exc:
            if tree_digest(work) != before:
                silent.append(f"{trial}: the failed open changed the directory")
            if not exc.path.endswith(trial.relpath):
                silent.append(f"{trial}: the error names {exc.path}, not the damaged file")
        except Exception as exc:  # noqa: BLE001 - every other outcome is a finding
            outcome = "silent"
            silent.append(f"{trial}: {type(exc).__name__}: {exc}")
        else:
            outcome = "harmless" if got == expected else "silent"
            if outcome == "silent":
                silent.append(f"{trial}: opened with different data")
        if SOAK or index % 4 == 0:  # the view reads the same files through its own copy
            view_trials += 1
            try:
                seen = read_everything_view(work, scratch)
                if seen != expected:
                    silent.append(f"{trial}: the view answered with different data")
                elif outcome == "detected":
                    silent.append(f"{trial}: the view accepted what the writer refused")
            except StoreCorruptedError:
                if outcome == "harmless":
                    silent.append(f"{trial}: the view refused what the writer accepted")
            except Exception as exc:  # noqa: BLE001
                silent.append(f"{trial}: view: {type(exc).__name__}: {exc}")
        outcomes[(kind, outcome)] += 1
        if outcome == "detected" and tree_digest(work) == before:
            shutil.copyfile(pristine / trial.relpath, work / trial.relpath)
        else:  # the open rebuilt live/: start again from the pristine copy
            shutil.rmtree(work)
            shutil.copytree(pristine, work, symlinks=True)
    assert list(scratch.iterdir()) == [], "the view left scratch copies behind"
    report(outcomes, view_trials)
    assert not silent, "\n".join(silent[:20])
    newest_kinds = {k for k, _ in outcomes} - {"older checkpoint", "working copy (live/)", "LOCK"}
    assert {"SST", "RocksDB MANIFEST", "CURRENT", "OPTIONS", "SESSIONSTORE-MANIFEST",
            "WAL (.log)", "rocksdict config"} <= newest_kinds, newest_kinds
    for kind in newest_kinds:  # every change to a file of the committed version is caught
        assert outcomes[(kind, "harmless")] == 0, kind


def report(outcomes: Counter[tuple[str, str]], view_trials: int) -> None:
    kinds = sorted({k for k, _ in outcomes})
    scope = "soak, exhaustive" if SOAK else f"{SAMPLED_FLIPS} offsets a file"
    lines = [f"corruption matrix ({scope}):",
             f"{'file kind':24} {'trials':>7} {'detected':>9} {'harmless':>9} {'silent':>7}"]
    for kind in kinds:
        row = [outcomes[(kind, o)] for o in ("detected", "harmless", "silent")]
        lines.append(f"{kind:24} {sum(row):>7} {row[0]:>9} {row[1]:>9} {row[2]:>7}")
    total = [sum(outcomes[(k, o)] for k in kinds) for o in ("detected", "harmless", "silent")]
    lines.append(f"{'total':24} {sum(total):>7} {total[0]:>9} {total[1]:>9} {total[2]:>7}")
    lines.append(f"read-only view re-checked on {view_trials} of them")
    print("\n".join(lines))


@pytest.mark.parametrize("kind", ["flip", "truncate", "extend"])
def test_trial_mutations_change_the_file(tmp_path: Path, kind: str) -> None:
    """The matrix is only as good as its mutations: each must really change the bytes."""
    target = tmp_path / "f"
    target.write_bytes(bytes(range(32)))
    before = target.read_bytes()
    Trial("f", kind, 5).apply(tmp_path)
    after = target.read_bytes()
    assert after != before
    assert len(after) == {"flip": 32, "truncate": 5, "extend": 37}[kind]
