"""The event path's emit-on-close from the cache's memory (CachingSessionStore.take_closed)
against the path that writes each closing session and reads it back from the store.

``cache_max_sessions=0`` and a store with a custom serde always take the store-read path, so
they are the reference here; the oracle (tests/oracle.py) checks the sessions themselves."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import msgpack
import pytest

from sessionstore import (
    EmitStrategy,
    InMemorySessionStore,
    SessionAggregator,
    SessionStore,
    SessionWindows,
    aggregations,
)
from sessionstore.timeutil import INT64_MAX, INT64_MIN
from tests import oracle

GAP = 20
OOO = 15


class _Serde:
    """msgpack, but not the default serde object: the engine cannot assume what it returns."""

    def dumps(self, value: Any) -> bytes:
        return msgpack.packb(value, use_bin_type=True)  # type: ignore[no-any-return]

    def loads(self, data: bytes) -> Any:
        return msgpack.unpackb(data, raw=False, strict_map_key=False)


def _stream(seed: int, n: int = 1_500) -> list[tuple[Any, ...]]:
    """Events over int, str and tuple keys, up to ``OOO + GAP + 10`` ms out of order (some late),
    with a commit now and then."""
    rng = random.Random(seed)
    keys: list[Any] = [*range(12), *(f"k{i}" for i in range(12)), ("t", 1), ("t", -2)]
    steps: list[tuple[Any, ...]] = []
    for i in range(n):
        t = i // 3 - rng.randrange(0, OOO + GAP + 10)
        steps.append(("event", rng.choice(keys), i, t))
        if rng.random() < 0.006:
            steps.append(("commit",))
    return steps


def _open(kind: str, root: Path, name: str, serde: Any = None, segment: int | None = None
          ) -> Any:
    retention = GAP + OOO
    if kind == "memory":
        return InMemorySessionStore(retention_ms=retention, value_serde=serde,
                                    segment_interval_ms=segment)
    return SessionStore(root / name, retention_ms=retention, value_serde=serde,
                        segment_interval_ms=segment)


def _run(store: Any, steps: list[tuple[Any, ...]], cache: int, aggregation: Any,
         reopen: Any = None) -> tuple[list[Any], list[Any]]:
    """Emits and the store's final contents; ``reopen(store)`` returns a reopened store at
    every commit (None: keep going)."""
    def engine_on(s: Any) -> SessionAggregator:
        return SessionAggregator(s, SessionWindows(GAP), aggregation,
                                 emit=EmitStrategy.ON_WINDOW_CLOSE,
                                 max_out_of_orderness_ms=OOO, cache_max_sessions=cache)

    engine = engine_on(store)
    out: list[Any] = []
    for step in steps:
        if step[0] == "commit":
            engine.commit()
            if reopen is not None:
                store = reopen(store)
                engine = engine_on(store)
            continue
        out += engine.process(*step[1:])
    out += engine.advance_watermark(INT64_MAX)
    engine.commit()
    contents = list(store.find_sessions(INT64_MIN, INT64_MAX))
    store.close()
    return out, contents


@pytest.mark.parametrize("kind", ["memory", "rocksdb"])
@pytest.mark.parametrize("cache", [1, 2, 7, 100_000])
@pytest.mark.parametrize("seed", [1, 2])
def test_close_from_memory_equals_close_from_the_store(tmp_path: Path, kind: str, cache: int,
                                                       seed: int) -> None:
    steps = _stream(seed)
    agg = aggregations.collect()
    got, got_store = _run(_open(kind, tmp_path, "a"), steps, cache, agg)
    want, want_store = _run(_open(kind, tmp_path, "b"), steps, 0, agg)
    other, other_store = _run(_open(kind, tmp_path, "c", serde=_Serde()), steps, cache, agg)
    assert got == want == other  # same sessions, values, order and emitting calls
    assert got_store == want_store == other_store
    events = [s for s in steps if s[0] == "event"]
    sessions, late = oracle.sessionize(events, GAP, 0, True, OOO)
    assert late  # the stream does have late events
    rows = sorted(((e.session.key, e.session.start, e.session.end, e.value) for e in got),
                  key=lambda r: (repr(r[0]), r[1], r[2]))
    assert rows == sessions


@pytest.mark.parametrize("kind", ["memory", "rocksdb"])
def test_tiny_segments_expire_the_same_sessions(tmp_path: Path, kind: str) -> None:
    """Closed sessions wait for the next flush; those that expiry would have dropped by then
    are not written, and every session is still emitted."""
    steps = _stream(3)
    agg = aggregations.count()
    got, got_store = _run(_open(kind, tmp_path, "a", segment=1), steps, 100_000, agg)
    want, want_store = _run(_open(kind, tmp_path, "b", segment=1), steps, 0, agg)
    assert got == want
    assert got_store == want_store


def test_emitted_values_are_what_the_store_returns() -> None:
    """A custom accumulator holding tuples is emitted as the store returns it (lists), as
    before, and shares nothing with the engine's state."""
    agg = aggregations.aggregate(lambda: (0, ()), lambda k, v, acc: (acc[0] + 1, (k, v)),
                                 lambda k, a, b: (a[0] + b[0], b[1]))
    steps = _stream(4, 300)
    got, _ = _run(InMemorySessionStore(retention_ms=GAP + OOO), steps, 100_000, agg)
    want, _ = _run(InMemorySessionStore(retention_ms=GAP + OOO), steps, 0, agg)
    assert got == want
    assert all(type(e.value) is list and type(e.value[1]) is list for e in got)


def test_restart_at_every_commit_emits_the_same(tmp_path: Path) -> None:
    """Reopening the store at each commit: sessions from before the reopen are closed from
    the store until the cache knows every open session again."""
    steps = _stream(5)
    agg = aggregations.collect()

    def reopen(store: Any) -> Any:
        store.close()
        return SessionStore(tmp_path / "r", retention_ms=GAP + OOO)

    got, got_store = _run(SessionStore(tmp_path / "r", retention_ms=GAP + OOO), steps, 100_000,
                          agg, reopen=reopen)
    want, want_store = _run(_open("rocksdb", tmp_path, "w"), steps, 100_000, agg)
    assert got == want
    assert got_store == want_store


def test_interactive_queries_see_closed_sessions_before_the_flush() -> None:
    # retention beyond the minimum: reads skip sessions older than stream time - retention
    store = InMemorySessionStore(retention_ms=GAP + OOO + 100)
    engine = SessionAggregator(store, SessionWindows(GAP), aggregations.count(),
                               emit=EmitStrategy.ON_WINDOW_CLOSE, max_out_of_orderness_ms=OOO)
    engine.process("a", None, 0)
    engine.process("a", None, 5)
    out = engine.process("b", None, 100)  # closes a's session from memory
    assert [(tuple(e.session), e.value) for e in out] == [(("a", 0, 25), 2)]
    assert [(tuple(s), n) for s, n in engine.sessions("a")] == [(("a", 0, 25), 2)]
    engine.commit()
    assert [tuple(s) for s, _ in store.fetch("a")] == [("a", 0, 25)]
