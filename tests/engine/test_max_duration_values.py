"""Which values a maximum-duration key holds (issue 25, item 3), for the inputs that usually
carry numpy scalars or decimals: a numpy array or pandas column given to ``process_batch``
arrives as Python numbers (held: linear work, out of order too); a numpy scalar other than
``float64`` or a ``Decimal`` given as a value is refused at its event (a record keeps its
events' values, and the store encodes only msgpack's types), so it never reaches a re-cut,
held or not. Counted, not timed (``recut_counts``)."""

from __future__ import annotations

import decimal
import random
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
from sessionstore.aggregations import SumOverflowError
from sessionstore.timeutil import INT64_MAX

SUM_MIN = aggregations.combine({"s": aggregations.sum_of(), "lo": aggregations.min_of()})


def chain_engine(n: int, agg: aggregations.Aggregation = SUM_MIN) -> SessionAggregator:
    """An engine whose maximum duration cuts ``n`` events 10 ms apart into 8 sessions, with
    a lateness that takes every one of them in any order."""
    windows = SessionWindows(100, max_duration_ms=n * 10 // 8)
    return SessionAggregator(InMemorySessionStore(retention_ms=windows.retention_ms + n * 10),
                             windows, agg, emit=EmitStrategy.ON_WINDOW_CLOSE,
                             max_out_of_orderness_ms=n * 10)


def work(engine: SessionAggregator) -> int:
    return engine.recut_counts["steps"] + engine.recut_counts["events"]


COLUMNS = {
    "int64 array": lambda t: t * 3 - 7,
    "int32 array": lambda t: (t % 1_009 - 500).astype(np.int32),
    "float32 array": lambda t: (t * 0.1 + 0.3).astype(np.float32),
    "bool array": lambda t: t % 30 == 0,
    "int64 series": lambda t: pd.Series(t * 3 - 7),
}


def column_chain(n: int, column: str, order: str) -> tuple[int, list[Any]]:
    """The work of one ``process_batch`` of ``n`` events of one key, newest first or
    shuffled, whose values are the numpy or pandas column :data:`COLUMNS` names, and the
    ``(start, end, sum, minimum)`` of each session (checked against Python's fold of the
    column's items in time order)."""
    times = np.arange(0, n * 10, 10, dtype=np.int64)[::-1].copy()
    if order == "shuffled":
        np.random.default_rng(n).shuffle(times)
    values = COLUMNS[column](times)
    engine = chain_engine(n)
    engine.process_batch(["k"] * n, values, times)
    out = engine.advance_watermark(INT64_MAX)
    items = dict(zip(times.tolist(), np.asarray(values).tolist(), strict=True))
    per = n // 8
    rows = []
    for i, e in enumerate(out):
        assert (e.session.start, e.session.end) == (i * per * 10, (i + 1) * per * 10)
        inside = [items[t] for t in range(e.session.start, e.session.end, 10)]
        total: Any = 0
        for item in inside:  # the left fold in time order
            total = total + item
        s, lo = e.value["s"], e.value["lo"]
        assert (type(s), s) == (type(total), total) and repr(s) == repr(total)
        assert (type(lo), lo) == (type(min(inside)), min(inside))
        rows.append((e.session.start, e.session.end, s, lo))
    return work(engine), rows


@pytest.mark.parametrize("column", list(COLUMNS))
@pytest.mark.parametrize("order", ["reversed", "shuffled"])
def test_numpy_and_pandas_columns_are_held_as_python_numbers(column, order):
    # a batch's numpy or pandas column reaches the engine as Python ints, floats and bools
    # (no numpy scalar in a session's value: an int sum is an int, a float32 column's sum the
    # left fold of its items as Python floats), and a newest-first or shuffled key of them
    # is held and written once. Kills: numpy scalars kept from the column (refused by the
    # store: every case would raise), or not held (about 4x the work at twice the events)
    small, rows = column_chain(800, column, order)
    large, _ = column_chain(1_600, column, order)
    assert len(rows) == 8
    assert small > 0 and large <= 2.2 * small
    assert large <= 4 * 1_600


def test_an_int64_column_whose_sum_would_leave_int64_is_refused_at_its_batch():
    # a disordered int64 column near the top of the range is held while its Python ints'
    # magnitudes stay within INT64_MAX; the next batch's event would pass it, so it is not
    # held: it is re-cut at itself, and aggregations.int64_sum raises there, naming the
    # output and the sum; the sessions are those before it. Kills: holding it anyway (the
    # overflow would raise at a later write, advance_watermark here, long after its batch;
    # a numpy int64 sum would wrap silently)
    engine = chain_engine(800)
    half = INT64_MAX // 2
    engine.process_batch(["k"] * 3, np.array([half, half, 0], dtype=np.int64),
                         np.array([1_000, 1_150, 1_100], dtype=np.int64))
    held = engine._core.max_duration.held
    assert held.events_held == 1  # the event at 1,100, joining [1000, 1100] and [1150, 1250)
    with pytest.raises(SumOverflowError) as caught:  # joins everything: half + 5 + 0 + half
        engine.process_batch(["k"], np.array([5], dtype=np.int64), np.array([1_060]))
    assert caught.value.aggregation == "s" and caught.value.total == half * 2 + 5
    out = engine.advance_watermark(INT64_MAX)
    assert [(e.session.start, e.session.end, e.value) for e in out] == [
        (1_000, 1_250, {"s": half * 2, "lo": 0})]


REFUSED = [np.int64(5), np.int32(-5), np.uint64(5), np.float32(0.5), np.float16(0.5),
           np.bool_(True), decimal.Decimal("0.5")]


@pytest.mark.parametrize("value", REFUSED, ids=[type(v).__name__ for v in REFUSED])
@pytest.mark.parametrize("path", ["event", "batch", "inside a mapping"])
def test_numpy_scalars_and_decimals_are_refused_at_their_event(value, path):
    # a key with a held event; a numpy scalar other than float64 (pandas' iterrows gives
    # them) or a Decimal, before every open session, would be held or re-cut: it is
    # refused first (TypeError naming the value), and changes nothing: the held event stays
    # held, nothing is re-cut, the sessions are those without it. Kills: holding or re-cutting
    # such a value (its record could not be written: a held write would fail long after the
    # event)
    agg = (aggregations.combine({"s": aggregations.sum_of(column="x"),
                                 "lo": aggregations.min_of(column="x")})
           if path == "inside a mapping" else SUM_MIN)
    wrap = (lambda v: {"x": v}) if path == "inside a mapping" else (lambda v: v)
    engine = chain_engine(800, agg)
    for t in (1_000, 1_500, 1_200):  # three sessions; the last event is held
        engine.process("k", wrap(1), t)
    held = engine._core.max_duration.held
    assert held.events_held == 1
    before = work(engine)
    with pytest.raises(TypeError, match=type(value).__name__):
        if path == "batch":
            engine.process_batch(["k", "k"], [2, value], [1_300, 900])
        else:
            engine.process("k", wrap(value), 900)
    assert held.events_held == 1 and work(engine) == before
    out = engine.advance_watermark(INT64_MAX)
    assert [(e.session.start, e.session.end, e.value) for e in out] == [
        (t, t + 100, {"s": 1, "lo": 1}) for t in (1_000, 1_200, 1_500)]


def test_values_of_unknown_classes_are_not_held():
    # an int subclass (its operators are the user's: an add or comparison could fail or
    # differ in a later write) takes the re-cut per event, as before; its sessions are
    # still right. Kills: holding any int (isinstance instead of the exact type)
    class Count(int):
        pass

    engine = chain_engine(800)
    times = list(range(0, 400, 10))
    random.Random(3).shuffle(times)
    for t in times:
        engine.process("k", Count(t), t)
    assert engine._core.max_duration.held.events_held == 0
    out = engine.advance_watermark(INT64_MAX)
    assert [(e.session.start, e.session.end, e.value) for e in out] == [
        (0, 490, {"s": sum(range(0, 400, 10)), "lo": 0})]
