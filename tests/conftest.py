"""Shared fixtures. Spark fixtures live in tests/spark/conftest.py."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from sessionstore import InMemorySessionStore, SessionStore

settings.register_profile(
    "default", deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "ci", deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
# soak: pytest tests/engine --hypothesis-profile=long
settings.register_profile(
    "long", max_examples=5_000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("ci" if os.environ.get("CI") else "default")

StoreFactory = Callable[..., object]


@pytest.fixture(params=["rocksdb", "memory"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    """Build stores of either backend with the same arguments; closes them afterwards."""
    opened: list[object] = []

    def factory(**kwargs: object) -> object:
        if request.param == "rocksdb":
            store: object = SessionStore(tmp_path / f"store{len(opened)}", **kwargs)
        else:
            store = InMemorySessionStore(**kwargs)
        opened.append(store)
        return store

    yield factory
    for store in opened:
        store.close()  # type: ignore[attr-defined]
