"""The batch path keys a Python list exactly as the event path does: Arrow infers ``binary`` for
``["a", b"a"]`` and ``int64`` for numpy scalars, which would merge keys that ``process`` keeps
apart, or accept keys that ``process`` refuses."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest

from sessionstore import (
    EmitStrategy,
    InMemorySessionStore,
    SessionAggregator,
    SessionWindows,
    aggregations,
)
from sessionstore.timeutil import INT64_MAX


def _engine() -> SessionAggregator:
    windows = SessionWindows(10)
    return SessionAggregator(InMemorySessionStore(retention_ms=windows.retention_ms), windows,
                             aggregations.count(), emit=EmitStrategy.ON_WINDOW_CLOSE)


def _sessions(out: list[Any]) -> list[tuple[type, Any, int]]:
    return sorted(((type(x.session.key), x.session.key, x.value) for x in out),
                  key=lambda row: (row[0].__name__, repr(row[1])))


@pytest.mark.parametrize("keys", [
    ["a", b"a"], [b"a", "a", b"a"], ["", b"", ""], ["\u00e9", "\u00e9".encode()],
    pd.Series(["a", b"a"]),
])
def test_str_and_bytes_stay_apart(keys: Any) -> None:
    key_list = list(keys)
    times = list(range(len(key_list)))
    loop = _engine()
    out_loop = [x for k, t in zip(key_list, times, strict=True) for x in loop.process(k, k, t)]
    out_loop += loop.advance_watermark(INT64_MAX)
    batch = _engine()
    out_batch = batch.process_batch(keys, key_list, times) + batch.advance_watermark(INT64_MAX)
    # one session per distinct (type, key): counted here without the engine
    expected: dict[tuple[type, Any], int] = {}
    for k in key_list:
        expected[(type(k), k)] = expected.get((type(k), k), 0) + 1
    want = sorted(((kind, k, n) for (kind, k), n in expected.items()),
                  key=lambda row: (row[0].__name__, repr(row[1])))
    assert _sessions(out_loop) == want
    assert _sessions(out_batch) == want


@pytest.mark.parametrize("keys", [[1, np.int64(1)], ["a", np.str_("a")]])
def test_numpy_scalars_refused_like_the_event_path(keys: list[Any]) -> None:
    with pytest.raises(TypeError, match=r"keys\[1\]"):
        _engine().process_batch(keys, keys, [0, 1])
    with pytest.raises(TypeError):
        _engine().process(keys[1], None, 1)


def test_numpy_int_column_still_takes_the_fast_path() -> None:
    out = _engine().process_batch(np.array([1, 1, 2]), [None] * 3, [0, 1, 2])
    closed = _engine()
    closed.process_batch(np.array([1, 1, 2]), [None] * 3, [0, 1, 2])
    rows = _sessions(closed.advance_watermark(INT64_MAX))
    assert out == []
    assert rows == [(int, 1, 2), (int, 2, 1)]
