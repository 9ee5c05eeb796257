"""``min`` and ``max`` over 0.0 and -0.0 (issue 25): every path and every arrival order agree.

Spark compares doubles with -0.0 == 0.0 and keeps whichever its plan saw first; that depends on
partitioning, so we order the two zeros as IEEE 754's minimum and maximum do: ``min`` gives -0.0
when a -0.0 is among the values, ``max`` gives 0.0 when a 0.0 is."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest

from sessionstore import (
    EmitStrategy,
    InMemorySessionStore,
    SessionAggregator,
    SessionWindows,
    aggregations,
)
from sessionstore.timeutil import INT64_MAX

ORDERS = [[0.0, -0.0], [-0.0, 0.0], [-0.0, -0.0, 0.0, 1.0], [0.0, 0.0, -0.0, 1.0],
          [0.0, 1.0], [-0.0, 1.0], [-0.0, -1.0]]


def engine() -> SessionAggregator:
    windows = SessionWindows(100)
    return SessionAggregator(
        InMemorySessionStore(retention_ms=windows.retention_ms), windows,
        aggregations.combine({"lo": aggregations.min_of(column="v"),
                              "hi": aggregations.max_of(column="v")}),
        emit=EmitStrategy.ON_WINDOW_CLOSE)


def signed(x: float) -> tuple[float, float]:
    return (x, math.copysign(1.0, x))


def expected(values: list[float]) -> dict[str, tuple[float, float]]:
    lo, hi = min(values), max(values)
    if lo == 0 and any(v == 0 and math.copysign(1.0, v) < 0 for v in values):
        lo = -0.0
    if hi == 0 and any(v == 0 and math.copysign(1.0, v) > 0 for v in values):
        hi = 0.0
    return {"lo": signed(lo), "hi": signed(hi)}


def results(e: SessionAggregator) -> dict[str, tuple[float, float]]:
    (emit,) = e.advance_watermark(INT64_MAX)
    return {name: signed(value) for name, value in emit.value.items()}


@pytest.mark.parametrize("values", ORDERS)
@pytest.mark.parametrize("split", [0, 1])
def test_every_path_gives_the_signed_zero_of_ieee_minimum_and_maximum(values, split):
    times = list(range(len(values)))
    rows = [{"v": v} for v in values]
    event = engine()
    for row, t in zip(rows, times, strict=True):
        event.process("a", row, t)
    batch = engine()
    table = engine()
    for part in (slice(0, split), slice(split, None)):  # split: an open session absorbed
        if rows[part]:
            batch.process_batch(["a"] * len(rows[part]), rows[part], np.array(times[part]))
            table.process_table(pa.table({"k": ["a"] * len(rows[part]), "t": times[part],
                                          "v": pa.array(values[part], pa.float64())}),
                                key="k", time="t")
    want = expected(values)
    assert results(event) == want
    assert results(batch) == want
    assert results(table) == want
