"""pytest-benchmark suites for the store and the engine (not part of ``make test``).

Run with ``pytest benchmarks/ --benchmark-only``. They report timings; they assert nothing about
them. The standalone scripts (``store_bench``, ``engine_bench``, ``spark_bench``, ``peers``)
produce the figures in docs/benchmarks.md.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sessionstore import (
    EmitStrategy,
    InMemorySessionStore,
    Session,
    SessionAggregator,
    SessionStore,
    SessionWindows,
    aggregations,
)
from sessionstore.sample import bid_stream

SESSIONS = 200_000


@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SessionStore]:
    store = SessionStore(tmp_path_factory.mktemp("bench") / "s", retention_ms=10**12)
    for i in range(SESSIONS):
        store.put(Session(f"user{i % 20_000}", i * 10, i * 10 + 500), i)
    store.commit()
    yield store
    store.close()


def test_put(benchmark: Any, tmp_path: Path) -> None:
    store = SessionStore(tmp_path / "s", retention_ms=10**12)
    counter = itertools.count()

    def put() -> None:
        i = next(counter)
        store.put(Session(f"user{i % 20_000}", i, i + 100), i)

    benchmark(put)
    store.close()


def test_find_sessions_to_merge(benchmark: Any, filled: SessionStore) -> None:
    counter = itertools.count()

    def find() -> list[Any]:
        i = next(counter) % SESSIONS
        return list(filled.find_sessions_to_merge(f"user{i % 20_000}", i * 10, i * 10 + 500))

    benchmark(find)


def test_find_sessions_range(benchmark: Any, filled: SessionStore) -> None:
    counter = itertools.count()

    def scan() -> int:
        lo = (next(counter) * 7919) % (SESSIONS * 10)
        return sum(1 for _ in filled.find_sessions(lo, lo + 1_000))

    benchmark(scan)


def test_segment_expiry(benchmark: Any, tmp_path: Path) -> None:
    rounds = itertools.count()

    def setup() -> tuple[tuple[SessionStore], dict[str, Any]]:
        store = SessionStore(tmp_path / f"e{next(rounds)}", retention_ms=1_000,
                             segment_interval_ms=10_000)
        for i in range(20_000):
            store.put(Session(f"k{i}", 0, 5_000), i)
        return (store,), {}

    def expire(store: SessionStore) -> None:
        store.put(Session("late", 100_000, 100_000), 0)  # drops the segment of 20k sessions
        store.close()

    benchmark.pedantic(expire, setup=setup, rounds=5)


@pytest.mark.parametrize("store_kind", ["rocksdb", "memory"])
@pytest.mark.parametrize("path", ["process", "process_batch"])
def test_q11_engine(benchmark: Any, tmp_path: Path, store_kind: str, path: str) -> None:
    bidders, times = bid_stream(100_000)
    keys, stamps = bidders.tolist(), times.tolist()
    rounds = itertools.count()

    def run() -> None:
        windows = SessionWindows(10_000)
        retention = windows.retention_ms + 200
        store = (SessionStore(tmp_path / f"q{next(rounds)}", retention_ms=retention)
                 if store_kind == "rocksdb" else InMemorySessionStore(retention_ms=retention))
        engine = SessionAggregator(store, windows, aggregations.count(),
                                   emit=EmitStrategy.ON_WINDOW_CLOSE, max_out_of_orderness_ms=200)
        if path == "process":
            for key, t in zip(keys, stamps, strict=True):
                engine.process(key, None, t)
        else:
            engine.process_batch(keys, [None] * len(keys), stamps)
        store.close()

    benchmark.pedantic(run, rounds=3)
