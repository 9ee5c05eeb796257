"""Every transcript, on both stores, through ``process`` and through ``process_batch``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sessionstore import InMemorySessionStore, Session, SessionStore
from tests.conformance.player import (
    EngineHarness,
    describe,
    engine_options,
    expected,
    fill_pane_wildcards,
    load,
)

ENGINE_FILES = ["blog_sessions.yaml", "engine_sessions.yaml", "blog_triggers.yaml",
                "beam_sessions.yaml", "dynamic_gap_sessions.yaml", "max_duration_sessions.yaml",
                "peer_sessions.yaml"]
SCENARIOS = [
    pytest.param(scenario, id=f"{name.split('.')[0]}:{scenario['name']}")
    for name in ENGINE_FILES
    if (Path(__file__).parent / name).exists()
    for scenario in load(name)
]


def store_opener(backend: str, tmp_path: Path, retention_ms: int):
    state: dict[str, Any] = {}

    def open_store(reopen: bool) -> Any:
        if backend == "memory":
            if reopen:
                state["store"].abort()  # the model: back to the last commit
                return state["store"]
            state["store"] = InMemorySessionStore(retention_ms=retention_ms)
            return state["store"]
        if reopen:
            state["store"].close()
        state["store"] = SessionStore(tmp_path / "state", retention_ms=retention_ms)
        return state["store"]

    return open_store, state


def play(scenario, backend, tmp_path, batched, write_cache=False):
    retention = engine_options(scenario)["windows"].retention_ms
    open_store, state = store_opener(backend, tmp_path, retention)
    harness = EngineHarness(scenario, open_store, batched, write_cache)
    try:
        return harness.run(), harness
    finally:
        state["store"].close()


@pytest.mark.parametrize("batched", [False, True], ids=["process", "process_batch"])
@pytest.mark.parametrize("backend", ["rocksdb", "memory"])
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_transcript(scenario, backend, batched, tmp_path):
    emits, harness = play(scenario, backend, tmp_path / "run", batched)
    want = expected(scenario)
    if batched and scenario.get("emit") == "update":
        # the batch path equals the event path with its write cache flushed per batch
        reference, _ = play(scenario, backend, tmp_path / "reference", False, write_cache=True)
        want = describe(reference, with_pane=False)
    got = describe(emits, with_pane=any("pane" in row for row in want))
    fill_pane_wildcards(got, want)
    assert got == want
    assert harness.dropped == scenario.get("dropped", 0)
    if not any("commit_and_reopen" in step or "reopen_without_commit" in step
               for step in scenario["steps"]):  # metrics are per engine instance
        metrics = harness.engine.metrics
        invalid = scenario.get("dropped_invalid_gap", 0)
        assert metrics["dropped-invalid-gap-records"] == invalid
        assert metrics["dropped-records"] == invalid + scenario.get("dropped", 0)


@pytest.mark.parametrize("scenario", load("kip94_store.yaml"), ids=lambda s: s["name"])
@pytest.mark.parametrize("backend", ["rocksdb", "memory"])
def test_store_transcript(scenario, backend, tmp_path):
    kwargs = scenario["store"]
    store = (SessionStore(tmp_path / "s", **kwargs) if backend == "rocksdb"
             else InMemorySessionStore(**kwargs))
    with store:
        for step in scenario["steps"]:
            if "put" in step:
                store.put(Session(*step["put"]), step["put"])  # a None value would delete
            elif "find_sessions_to_merge" in step:
                got = [list(s) for s, _ in store.find_sessions_to_merge(*step["find_sessions_to_merge"])]
                assert got == step["expect"]
            elif "find_sessions" in step:
                got = [list(s) for s, _ in store.find_sessions(*step["find_sessions"])]
                assert got == step["expect"]
            elif "segment_id" in step:
                assert [store.segment_id(t) for t in step["segment_id"]] == step["expect"]


BATCH_WINDOW_SCENARIOS = [pytest.param(s, id=s["name"]) for s in load("batch_windows.yaml")]


@pytest.mark.parametrize("batched", [False, True], ids=["process", "process_batch"])
@pytest.mark.parametrize("backend", ["rocksdb", "memory"])
@pytest.mark.parametrize("scenario", BATCH_WINDOW_SCENARIOS)
def test_batch_windows_transcripts(scenario, backend, batched, tmp_path):
    from sessionstore import BatchAggregator, BatchWindows, aggregations

    size = scenario["size_ms"]
    store = (SessionStore(tmp_path / "state", retention_ms=4 * size) if backend == "rocksdb"
             else InMemorySessionStore(retention_ms=4 * size))
    engine = BatchAggregator(store, BatchWindows(size), aggregations.collect())
    out: list[Any] = []
    pending: list[dict[str, Any]] = []

    def drain() -> None:
        if pending:
            out.extend(engine.process_batch([e["key"] for e in pending],
                                            [e["value"] for e in pending],
                                            [e["t"] for e in pending]))
            pending.clear()

    for step in scenario["input"]:
        if "watermark" in step:
            drain()
            out.extend(engine.advance_watermark(step["watermark"]))
        elif batched:
            pending.append(step)
        else:
            out.extend(engine.process(step["key"], step["value"], step["t"]))
    drain()
    store.close()
    assert [{"key": e.session.key, "start": e.session.start, "end": e.session.end,
             "value": e.value} for e in out] == scenario["expect"]
