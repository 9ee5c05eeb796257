"""A float sum's run fold is the same left fold as adding one event at a time."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sessionstore import aggregations


@given(st.lists(st.floats(allow_nan=False, allow_infinity=False, width=64), max_size=40),
       st.floats(allow_nan=False, allow_infinity=False))
def test_add_run_is_the_left_fold_of_add(values: list[float], start: float) -> None:
    agg = aggregations.sum_of()
    times = list(range(len(values)))
    expected = start
    for t, value in enumerate(values):
        expected = agg.add("k", value, t, t, expected)
    got = agg.add_run("k", values, times, times, start)
    assert repr(got) == repr(expected)  # bit for bit, signed zeros included


def test_a_run_that_compensated_summation_would_round_differently() -> None:
    # 1e16 + 1.0 + 1.0 is 1e16 added left to right, 1e16 + 2 with compensation (Python 3.12's
    # sum()); the left fold is what add() gives and what the engine stores
    agg = aggregations.sum_of()
    assert agg.add_run("k", [1.0, 1.0], [0, 1], [0, 1], 1e16) == 1e16
