"""Each rule's one home, and its other forms pinned to it.

The gap-boundary convention is :func:`sessionstore.gap_boundary.reaches`; ``merge_bounds`` (the
closed range a store scans) and ``join_range`` (that range with the close-cursor floor) must say
exactly what it says, for every relative position of a session, an event and the close cursor.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from sessionstore.engine.merge import join_range, merge_event
from sessionstore.gap_boundary import merge_bounds, reaches


@pytest.mark.parametrize("inclusive", [True, False])
def test_merge_bounds_is_reaches_both_ways(inclusive: bool) -> None:
    for start, length, t, gap in itertools.product(range(-3, 4), range(1, 4), range(-4, 5),
                                                   range(1, 4)):
        end, own_end = start + length, t + gap
        earliest_end, latest_start = merge_bounds(t, own_end, inclusive)
        by_range = end >= earliest_end and start <= latest_start
        by_rule = reaches(end, t, inclusive) and reaches(own_end, start, inclusive)
        assert by_range == by_rule, (start, end, t, own_end)


@pytest.mark.parametrize("inclusive", [True, False])
def test_join_range_is_the_rule_above_the_close_cursor(inclusive: bool) -> None:
    for start, length, t, gap, closed in itertools.product(
            range(-3, 4), range(1, 4), range(-3, 4), range(1, 3), range(-3, 5)):
        end, own_end = start + length, t + gap
        floor, latest_start = join_range(t, own_end, closed, inclusive)
        joins = end >= floor and start <= latest_start
        want = (end > closed and reaches(end, t, inclusive)
                and reaches(own_end, start, inclusive))
        assert joins == want, (start, end, t, own_end, closed)
        _, _, joined = merge_event([(start, end)], t, own_end, closed, inclusive)
        assert joined == ([(start, end)] if want else [])


def test_touching_reaches_only_when_inclusive() -> None:
    assert reaches(10, 10, True) and not reaches(10, 10, False)
    assert reaches(10, 9, False) and not reaches(10, 11, True)
    ends = np.array([10, 10, 10])
    points = np.array([9, 10, 11])
    assert reaches(ends, points, True).tolist() == [True, True, False]
    assert reaches(ends, points, False).tolist() == [True, False, False]
