"""The corruption matrix: bit flips, truncations and extensions of every file of a committed store.

Trials come in groups, one per store configuration drawn from a seeded RNG (segment interval
down to 1 ms, retention down to 0, write cache on or off, 2 to 4 commits with expiry between them,
``keep_versions`` 1 to 3); the first groups are pinned to the extremes (1 ms segments, retention
0) so that every run covers them. Each group builds a pristine store, checks it against an
in-memory model fed the same operations (an independent oracle), and each trial damages one file
of a copy, then opens it (the writer's SessionStore and, for a share of trials, the
ReadOnlySessionStore) and reads everything back. Outcomes:

* detected: ``StoreCorruptedError`` naming the damaged file, with the directory left exactly as it
  was (hashed before and after);
* harmless: the store opens and returns exactly the committed version, metadata and sessions
  (damage to files a commit does not depend on: older checkpoints, the working copy, the lock);
* silent: anything else, a smaller answer or another exception type. Must be 0.

CI runs ``SESSIONSTORE_MATRIX_GROUPS`` groups (4) and about ``SESSIONSTORE_MATRIX_TRIALS`` trials
(700) in all: per group, every (file kind, mutation) pair once, then a seeded sample of offsets
(always including first and last bytes in the candidates). ``SESSIONSTORE_MATRIX_SEED`` draws
other configurations. ``SESSIONSTORE_SOAK=1`` runs every byte offset and every truncation length
of every file of each group's newest checkpoint (``make soak``; hours with 4 groups).
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

from sessionstore import (
    InMemorySessionStore,
    ReadOnlySessionStore,
    Session,
    SessionStore,
    StoreCorruptedError,
)
from sessionstore.store import committed_versions
from sessionstore.store.caching import CachingSessionStore
from tests.reliability.test_corruption import tree_digest

SOAK = os.environ.get("SESSIONSTORE_SOAK") == "1"
# Offsets flipped per file of the newest checkpoint when not in soak mode (a quarter as many
# truncation lengths besides 0, half and all but one byte); raise it for a longer run.
SAMPLED_FLIPS = int(os.environ.get("SESSIONSTORE_MATRIX_FLIPS", "24"))
GROUPS = int(os.environ.get("SESSIONSTORE_MATRIX_GROUPS", "4"))
TRIAL_BUDGET = int(os.environ.get("SESSIONSTORE_MATRIX_TRIALS", "700"))
SEED = int(os.environ.get("SESSIONSTORE_MATRIX_SEED", "13"))
KEYS = [f"user{i}" for i in range(12)] + [7, b"\x00bin", ("t", 1)]
UNTRUSTED_KINDS = ("older checkpoint", "working copy (live/)", "LOCK")


@dataclass(frozen=True)
class StoreConfig:
    """One drawn store configuration and the shape of the writes that build it."""

    segment_interval_ms: int
    retention_ms: int
    keep_versions: int
    commits: int
    cache_sessions: int | None  # None: no write cache
    sessions_per_commit: int
    segments_per_commit: int  # how many segment widths one commit's writes span

    @classmethod
    def draw(cls, group: int, rng: random.Random) -> StoreConfig:
        interval = 1 if group == 0 else rng.choice([1, 2, 3, 10, 50, 400, 5000])
        retention = 0 if group == 1 else rng.choice(
            [0, 1, interval, 2 * interval, 5 * interval, 10**9])
        return cls(
            segment_interval_ms=interval,
            retention_ms=retention,
            keep_versions=rng.randint(1, 3),
            commits=rng.randint(2, 4),
            cache_sessions=rng.choice([0, 5, 64]) if group % 2 == 0 else None,
            sessions_per_commit=rng.randint(25, 60),
            segments_per_commit=rng.randint(2, 5),
        )


Op = tuple[str, Session, object]  # ("put", session, value) or ("remove", session, None)


def workload(config: StoreConfig, rng: random.Random) -> list[list[Op]]:
    """Each commit's operations: sessions moving forward in time, some late, some removed.

    Each commit's writes span a few segment widths past the previous commit's, so segments
    expire between commits whenever retention is short.
    """
    span = config.segment_interval_ms * config.segments_per_commit
    steps: list[list[Op]] = []
    written: list[Session] = []
    for commit in range(config.commits):
        base = commit * span
        ops: list[Op] = []
        for n in range(config.sessions_per_commit):
            late = rng.random() < 0.15 and base > 0
            end = rng.randrange(0, base) if late else base + rng.randrange(span)
            start = end - rng.randrange(min(span, 3 * config.segment_interval_ms) + 1)
            session = Session(rng.choice(KEYS), start, end)
            value: object = {"c": commit, "n": n, "pad": "x" * (n % 9)} if n % 2 else [n]
            ops.append(("put", session, value))
            written.append(session)
            if written and rng.random() < 0.1:
                ops.append(("remove", rng.choice(written), None))
        steps.append(ops)
    return steps


def apply_ops(store: object, ops: list[Op]) -> None:
    for op, session, value in ops:
        if op == "put":
            store.put(session, value)  # type: ignore[attr-defined]
        else:
            store.remove(session)  # type: ignore[attr-defined]


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


def build_store(path: Path, config: StoreConfig, steps: list[list[Op]]) -> dict[str, object]:
    """Commit each step (through the write cache if drawn), then leave uncommitted writes in
    live/. Returns what the committed store must read back, from an in-memory model fed the
    same operations through the same cache."""
    store = SessionStore(path, retention_ms=config.retention_ms,
                         segment_interval_ms=config.segment_interval_ms,
                         keep_versions=config.keep_versions)
    model_store = InMemorySessionStore(retention_ms=config.retention_ms,
                                       segment_interval_ms=config.segment_interval_ms)
    writer: object = store
    model: object = model_store
    if config.cache_sessions is not None:
        writer = CachingSessionStore(store, config.cache_sessions)
        model = CachingSessionStore(model_store, config.cache_sessions)
    try:
        for commit, ops in enumerate(steps, start=1):
            apply_ops(writer, ops)
            apply_ops(model, ops)
            metadata = {"offset": commit, "note": "x" * commit}
            writer.commit(metadata)  # type: ignore[attr-defined]
            model.commit(metadata)  # type: ignore[attr-defined]
        store.put(Session("uncommitted", 0, 1), 0)
    finally:
        store.close()
    return {
        "version": len(steps),
        "metadata": {"offset": len(steps), "note": "x" * len(steps)},
        "sessions": [(tuple(s), v) for s, v in model_store.find_sessions(-(2**63), 2**63 - 1)],
        "by_key": [[(tuple(s), v) for s, v in model_store.fetch(k)] for k in KEYS],
    }


def read_everything_writable(path: Path, retention_ms: int) -> dict[str, object]:
    with SessionStore(path, retention_ms=retention_ms) as store:
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
        in_newest = file_kind(relpath, newest) not in UNTRUSTED_KINDS
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


def sampled(candidates: list[Trial], newest: str, budget: int,
            rng: random.Random) -> list[Trial]:
    """Every (file kind, mutation) pair once, then a seeded sample up to ``budget`` trials."""
    if SOAK:
        return candidates
    by_pair: dict[tuple[str, str], list[Trial]] = {}
    for trial in candidates:
        by_pair.setdefault((file_kind(trial.relpath, newest), trial.kind), []).append(trial)
    chosen = {rng.choice(group) for group in by_pair.values()}
    rest = [t for t in candidates if t not in chosen]
    chosen.update(rng.sample(rest, min(len(rest), max(budget - len(chosen), 0))))
    return [t for t in candidates if t in chosen]


def test_corruption_matrix(tmp_path: Path) -> None:
    outcomes: Counter[tuple[str, str]] = Counter()
    silent: list[str] = []
    view_trials = 0
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    for group in range(GROUPS):
        rng = random.Random(SEED * 1000 + group)
        config = StoreConfig.draw(group, rng)
        print(f"group {group}: {config}", flush=True)
        view_trials += run_group(tmp_path / f"g{group}", scratch, config, rng, outcomes,
                                 [f"group {group} {config}"], silent)
    assert list(scratch.iterdir()) == [], "the view left scratch copies behind"
    report(outcomes, view_trials)
    assert not silent, "\n".join(silent[:20])
    newest_kinds = {k for k, _ in outcomes} - set(UNTRUSTED_KINDS)
    assert {"SST", "RocksDB MANIFEST", "CURRENT", "OPTIONS", "SESSIONSTORE-MANIFEST",
            "WAL (.log)", "rocksdict config", "COMMITTED"} <= newest_kinds, newest_kinds
    for kind in newest_kinds:  # every change to a file of the committed version is caught
        assert outcomes[(kind, "harmless")] == 0, kind


def run_group(base: Path, scratch: Path, config: StoreConfig, rng: random.Random,
              outcomes: Counter[tuple[str, str]], where: list[str], silent: list[str]) -> int:
    """Build one configuration's pristine store and run its trials; returns the view trials."""
    pristine = base / "pristine"
    expected = build_store(pristine, config, workload(config, rng))
    # the oracle check: the undamaged store reads back exactly what the model holds
    assert read_everything_writable(pristine, config.retention_ms) == expected, where[0]
    assert read_everything_view(pristine, scratch) == expected, where[0]
    # retention 0: every session ends before stream time - retention + 1, so reads skip them
    # all (Kafka's rule); the damage is still found by opening (every file is checksummed)
    assert expected["sessions"] or config.retention_ms == 0, where[0]
    newest = f"v{committed_versions(pristine)[-1]:012d}"
    work = base / "work"
    view_trials = 0
    shutil.copytree(pristine, work, symlinks=True)
    candidates = list(trials(pristine, newest, rng))
    chosen = sampled(candidates, newest, TRIAL_BUDGET // max(GROUPS, 1), rng)
    for index, trial in enumerate(chosen):
        if index and index % 10_000 == 0:
            print(f"... {index} trials, {sum(outcomes.values())} classified", flush=True)
        trial_id = f"{where[0]}: {trial}"
        trial.apply(work)
        before = tree_digest(work)
        kind = file_kind(trial.relpath, newest)
        outcome = "detected"
        try:
            got = read_everything_writable(work, config.retention_ms)
        except StoreCorruptedError as exc:
            if tree_digest(work) != before:
                silent.append(f"{trial_id}: the failed open changed the directory")
            if not exc.path.endswith(trial.relpath):
                silent.append(f"{trial_id}: the error names {exc.path}, not the damaged file")
        except Exception as exc:  # noqa: BLE001 - every other outcome is a finding
            outcome = "silent"
            silent.append(f"{trial_id}: {type(exc).__name__}: {exc}")
        else:
            outcome = "harmless" if got == expected else "silent"
            if outcome == "silent":
                silent.append(f"{trial_id}: opened with different data")
        if SOAK or index % 4 == 0:  # the view reads the same files through its own copy
            view_trials += 1
            try:
                seen = read_everything_view(work, scratch)
                if seen != expected:
                    silent.append(f"{trial_id}: the view answered with different data")
                elif outcome == "detected":
                    silent.append(f"{trial_id}: the view accepted what the writer refused")
            except StoreCorruptedError:
                if outcome == "harmless":
                    silent.append(f"{trial_id}: the view refused what the writer accepted")
            except Exception as exc:  # noqa: BLE001
                silent.append(f"{trial_id}: view: {type(exc).__name__}: {exc}")
        outcomes[(kind, outcome)] += 1
        if outcome == "detected" and tree_digest(work) == before:
            shutil.copyfile(pristine / trial.relpath, work / trial.relpath)
        else:  # the open rebuilt live/: start again from the pristine copy
            shutil.rmtree(work)
            shutil.copytree(pristine, work, symlinks=True)
    shutil.rmtree(base)
    return view_trials


def report(outcomes: Counter[tuple[str, str]], view_trials: int) -> None:
    kinds = sorted({k for k, _ in outcomes})
    scope = (f"soak, exhaustive, {GROUPS} configurations" if SOAK
             else f"{GROUPS} configurations, about {TRIAL_BUDGET} trials")
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
