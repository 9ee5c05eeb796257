"""Float ``min``/``max`` with NaN and signed zeros give one answer whatever the arrival order
and the batch splits, on every path: NaN is above every value (Spark's order of doubles) and
-0.0 below 0.0. The oracle is written out here and shares no code with the engine."""

from __future__ import annotations

import math
from typing import Any

import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

import sessionstore
from sessionstore import (
    EmitStrategy,
    InMemorySessionStore,
    SessionAggregator,
    SessionWindows,
    aggregations,
)

VALUES = st.sampled_from([float("nan"), 0.0, -0.0, 1.5, -2.0, 7.25, float("inf")])


def _rank(v: float) -> tuple[int, float, float]:
    # NaN greatest; -0.0 below 0.0
    return (1, 0.0, 0.0) if math.isnan(v) else (0, v, math.copysign(1.0, v))


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))


def _engine(rows: list[tuple[int, float]], cuts: list[int]) -> dict[str, Any]:
    windows = SessionWindows(1_000_000)
    engine = SessionAggregator(
        InMemorySessionStore(retention_ms=windows.retention_ms + 1_000),
        windows, aggregations.combine({"lo": aggregations.min_of(column="x"),
                                       "hi": aggregations.max_of(column="x")}),
        emit=EmitStrategy.ON_WINDOW_CLOSE, max_out_of_orderness_ms=1_000)
    out = []
    bounds = [0, *sorted(set(cuts)), len(rows)]
    for a, b in zip(bounds, bounds[1:], strict=False):
        chunk = rows[a:b]
        if not chunk:
            continue
        if b - a == 1:
            out += engine.process("k", {"x": chunk[0][1]}, chunk[0][0])
        else:
            out += engine.process_batch(["k"] * len(chunk), [{"x": v} for _, v in chunk],
                                        [t for t, _ in chunk])
    out += engine.advance_watermark(10**9)
    assert len(out) == 1
    return dict(out[0].value)


@given(st.lists(st.tuples(st.integers(0, 900), VALUES), min_size=1, max_size=12),
       st.lists(st.integers(0, 12), max_size=4))
def test_nan_and_zero_extremes_do_not_depend_on_order_or_batches(rows: list[tuple[int, float]],
                                                                  cuts: list[int]) -> None:
    values = [v for _, v in rows]
    lo, hi = min(values, key=_rank), max(values, key=_rank)
    got = _engine(rows, [c for c in cuts if c <= len(rows)])
    assert _same(got["lo"], lo) and _same(got["hi"], hi), (got, lo, hi)
    static = sessionstore.sessionize(
        pa.table({"k": ["k"] * len(rows), "t": [t for t, _ in rows], "x": values}),
        key="k", time="t", gap=1_000_000, time_unit="ms",
        aggregations=["lo=min:x", "hi=max:x"]).to_pylist()
    assert _same(static[0]["lo"], lo) and _same(static[0]["hi"], hi), (static, lo, hi)
