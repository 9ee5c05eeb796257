"""Nulls in the values of a non-numeric column aggregation on ``process_batch``: the batch path
gives the event path's answer, whether the aggregation skips nulls (Spark's rule, the CLI's
``collect``) or keeps them (the engine's plain ``collect``)."""

from __future__ import annotations

from typing import Any

import pytest

from sessionstore import (
    EmitStrategy,
    InMemorySessionStore,
    SessionAggregator,
    SessionWindows,
    aggregations,
)
from sessionstore.aggspec import SkipNullColumn

ROWS = [("a", 0, "x"), ("a", 1000, None), ("a", 2000, "y"), ("b", 500, None),
        ("b", 700, None), ("c", 900, "z")]


def _run(agg: Any, batched: bool) -> list[tuple[Any, ...]]:
    windows = SessionWindows(60_000)
    engine = SessionAggregator(InMemorySessionStore(retention_ms=windows.retention_ms), windows,
                               agg, emit=EmitStrategy.ON_WINDOW_CLOSE)
    out = []
    values = [{"pg": v} for _, _, v in ROWS]
    if batched:
        out += engine.process_batch([k for k, _, _ in ROWS], values, [t for _, t, _ in ROWS])
    else:
        for (k, t, _), value in zip(ROWS, values, strict=True):
            out += engine.process(k, value, t)
    out += engine.advance_watermark(10**9)
    return sorted((e.session.key, e.session.start, e.session.end, repr(e.value)) for e in out)


@pytest.mark.parametrize("kind", ["collect", "first_of", "last_of"])
@pytest.mark.parametrize("skips", [True, False])
def test_nulls_in_a_column_aggregation_are_the_event_paths(kind: str, skips: bool) -> None:
    built = getattr(aggregations, kind)(column="pg")
    agg = SkipNullColumn(built) if skips else built
    expected = _run(agg, batched=False)
    assert _run(agg, batched=True) == expected
    if skips and kind == "collect":  # the nulls are no input: no None in any session
        assert "None" not in repr(expected)
