"""plan_dense (the planner's one kernel) against the brute-force model of the per-event loop,
and equal, array for array, to the planner's reference (plan_reference): the test that pins
the kernel to the reference."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionstore import folds, jit, kernels
from sessionstore.engine.planner import plan_reference
from sessionstore.kernels import plan_dense

from .model import run_loop
from .test_planner import PROFILE_SCALE, batches, plain_python_kernels, plan_sets


def _dense_codes(events: list[tuple[int, int, int, int]], opens: list[tuple[int, int, int]]
                 ) -> tuple[dict[int, int], int]:
    """A dense code per distinct code of the batch, in an order unrelated to the codes'."""
    codes = sorted({e[0] for e in events} | {o[0] for o in opens}, key=lambda c: (c % 7, c))
    return {code: dense for dense, code in enumerate(codes)}, len(codes)


def _check(events: list[tuple[int, int, int, int]], opens: list[tuple[int, int, int]],
           inclusive: bool, by_time: bool) -> None:
    index, keys = _dense_codes(events, opens)
    ev = np.array(events, dtype=np.int64).reshape(-1, 4)
    op = np.array(opens, dtype=np.int64).reshape(-1, 3)
    dense_ev = np.array([index[c] for c in ev[:, 0].tolist()], dtype=np.int64)
    dense_op = np.array([index[c] for c in op[:, 0].tolist()], dtype=np.int64)
    got = plan_dense(dense_ev, keys, ev[:, 1], ev[:, 2], ev[:, 3], dense_op, op[:, 1],
                     op[:, 2], inclusive, by_time=by_time)
    plan = got.plan
    # the model: the same sessions, with the same events and open sessions in each
    expected = {
        (index[s.code], s.start_ms, s.end_ms, s.events, s.opens)
        for s in run_loop(events, opens, inclusive) if s.events
    }
    sessions = len(plan.session_codes)
    assert plan_sets(plan) == expected
    assert sessions == len(expected)
    # exactly what the reference answers on the dense codes, in the same order
    reference = plan_reference(dense_ev, ev[:, 1], ev[:, 2], ev[:, 3], dense_op, op[:, 1],
                               op[:, 2], inclusive, by_time=by_time)
    for mine, theirs in zip(plan, reference.plan, strict=True):
        assert mine.dtype == np.int64
        assert mine.tolist() == theirs.tolist()
    # the groupings: events in (time, arrival) order (or arrival order), opens by start
    assert got.events.order.tolist() == reference.events.order.tolist()
    assert got.events.offsets.tolist() == reference.events.offsets.tolist()
    assert got.absorbed.order.tolist() == reference.absorbed.order.tolist()
    assert got.absorbed.offsets.tolist() == reference.absorbed.offsets.tolist()
    # and what the separate groupings answer
    groups = folds.group_events(plan.event_session, ev[:, 1], sessions, by_time=by_time)
    assert got.events.order.tolist() == groups.order.tolist()
    opens_grouped = folds.group_open_sessions(plan, op[:, 1])
    assert got.absorbed.order.tolist() == opens_grouped.order.tolist()


@settings(max_examples=round(400 * PROFILE_SCALE))
@given(batches(), st.booleans(), st.booleans())
def test_plan_dense_equals_the_loop_and_the_reference(
        batch: tuple[list[tuple[int, int, int, int]], list[tuple[int, int, int]], bool],
        by_time: bool, plain_python: bool) -> None:
    """The compiled kernel and its Python source both equal the model and the reference."""
    events, opens, inclusive = batch
    with plain_python_kernels(plain_python):
        if plain_python:  # the Python source, calling the Python helpers
            jit.COMPILED["_plan_dense"] = kernels._plan_dense
        _check(events, opens, inclusive, by_time)


@settings(max_examples=round(40 * PROFILE_SCALE))
@given(seed=st.integers(0, 2**32 - 1), inclusive=st.booleans(),
       keys=st.sampled_from([1, 3, 50]), lag=st.sampled_from([0, 100, 5_000]),
       gaps=st.sampled_from([(1, 120), (1, 3_000), (500, 501)]))
def test_plan_dense_on_long_batches(seed: int, inclusive: bool, keys: int, lag: int,
                                    gaps: tuple[int, int]) -> None:
    """Hundreds of events per key and out of order, so that the per-session sorts (insertion
    and merge) and the per-key ordering of the sessions really work; wide per-event gaps make
    sessions created after others start before them."""
    rng = np.random.default_rng(seed)
    n = 600
    codes = rng.integers(0, keys, n)
    times = np.sort(rng.integers(0, 20_000, n)) + rng.integers(-lag, lag + 1, n)
    times[rng.integers(0, n, 20)] = rng.integers(0, 20, 20)  # ties
    ends = times + rng.integers(gaps[0], gaps[1], n)
    closed = np.maximum.accumulate(times) - lag - 50
    opens = []
    for code in range(keys):
        start = -500
        for _ in range(int(rng.integers(0, 6))):
            start += int(rng.integers(1, 400))
            end = start + int(rng.integers(1, 300))
            opens.append((code, start, end))
            start = end
    events = list(zip(codes.tolist(), times.tolist(), ends.tolist(), closed.tolist(),
                      strict=True))
    for by_time in (True, False):
        _check(events, opens, inclusive, by_time)


def test_one_long_session_out_of_order_is_sorted_by_time_then_arrival() -> None:
    """A single session of 5,000 events in reverse time order (the merge sort, not quadratic)
    with repeated times (arrival breaks the ties)."""
    n = 5_000
    times = (np.arange(n, dtype=np.int64)[::-1] // 3).copy()
    got = plan_dense(np.zeros(n, dtype=np.int64), 1, times, times + 10, np.full(n, -100),
                     [], [], [], True)
    assert got.plan.session_starts_ms.tolist() == [0]
    expected = sorted(range(n), key=lambda i: (int(times[i]), i))
    assert got.events.order.tolist() == expected


@pytest.mark.parametrize(
    ("codes", "open_codes", "message"),
    [([0, 2], [], r"key_codes\[1\] = 2 is not in \[0, 2\)"),
     ([0, -1], [], r"key_codes\[1\] = -1 is not in \[0, 2\)"),
     ([0, 1], [5], r"open_codes\[0\] = 5 is not in \[0, 2\)")],
)
def test_codes_must_be_dense(codes: list[int], open_codes: list[int], message: str) -> None:
    opens = len(open_codes)
    with pytest.raises(ValueError, match=message):
        plan_dense(codes, 2, [0, 1], [5, 6], [-9, -9], open_codes, [0] * opens,
                   [1] * opens, True)


def test_errors_name_the_row() -> None:
    with pytest.raises(ValueError, match=r"closed_before_ms\[2\] = 2 .* must not decrease"):
        plan_dense([0, 1, 0], 2, [0, 0, 1], [5, 5, 6], [3, 9, 2], [], [], [], True)
    with pytest.raises(ValueError, match=r"open session 1 .* overlap or touch"):
        plan_dense([0], 1, [0], [5], [0], [0, 0], [10, 20], [20, 30], True)
    with pytest.raises(ValueError, match=r"ends_ms\[0\] = 5 must be > times_ms\[0\] = 5"):
        plan_dense([0], 1, [5], [5], [0], [], [], [], True)
