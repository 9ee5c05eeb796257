"""Vectorised aggregations against a per-event fold written with plain Python values."""

from __future__ import annotations

import math
import struct
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionstore import arrays, folds
from sessionstore.engine import planner

# Sizes are for the default profile (100 examples); a soak profile with more scales them up.
PROFILE_SCALE = settings.default.max_examples / 100

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

FLOATS = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False, width=64),
    st.floats(-1e3, 1e3),
    st.sampled_from([0.0, -0.0, 1e308, -1e308, 5e-324, 0.1, 0.2, 0.3]),
)
INTS = st.one_of(st.integers(-50, 50), st.integers(INT64_MIN, INT64_MAX),
                 st.sampled_from([INT64_MIN, INT64_MAX, -1, 0]))


@st.composite
def sessionized(draw: st.DrawFn) -> tuple[list[int], list[int], int]:
    """(event_session, times, sessions): each session holds at least one event."""
    sessions = draw(st.integers(0, 6))
    n = draw(st.integers(sessions, sessions + 30)) if sessions else 0
    owner = list(range(sessions)) + [draw(st.integers(0, sessions - 1))
                                     for _ in range(n - sessions)]
    owner = draw(st.permutations(owner))
    times = [draw(st.sampled_from([INT64_MIN, -3, 0, 0, 1, 7, INT64_MAX])) for _ in range(n)]
    return owner, times, sessions


def fold_groups(owner: list[int], times: list[int], sessions: int,
                by_time: bool = True) -> list[list[int]]:
    """Each session's event indices, in (time, arrival) order, by Python's stable sort."""
    members: list[list[int]] = [[] for _ in range(sessions)]
    for i, s in enumerate(owner):
        members[s].append(i)
    if by_time:
        return [sorted(m, key=lambda i: (times[i], i)) for m in members]
    return members


def same_float(a: float, b: float) -> bool:
    """Bit-for-bit equality (so -0.0 != 0.0 and NaN == NaN)."""
    return struct.pack("<d", a) == struct.pack("<d", b)


@settings(max_examples=round(300 * PROFILE_SCALE))
@given(sessionized(), st.data(), st.booleans())
def test_aggregations_equal_a_per_event_fold(
    batch: tuple[list[int], list[int], int], data: st.DataObject, by_time: bool
) -> None:
    owner, times, sessions = batch
    floats = data.draw(st.lists(FLOATS, min_size=len(owner), max_size=len(owner)))
    groups = folds.group_events(owner, times, sessions, by_time=by_time)
    expected_groups = fold_groups(owner, times, sessions, by_time)
    assert [groups.order[groups.offsets[j]:groups.offsets[j + 1]].tolist()
            for j in range(sessions)] == expected_groups

    assert folds.count_per_session(groups).tolist() == [len(g) for g in expected_groups]
    sums = folds.sum_per_session(groups, np.array(floats, dtype=np.float64))
    for j, members in enumerate(expected_groups):
        acc = floats[members[0]]
        for i in members[1:]:
            acc = acc + floats[i]
        assert same_float(float(sums[j]), acc)
    initial = data.draw(st.lists(FLOATS, min_size=sessions, max_size=sessions))
    continued = folds.sum_per_session(groups, np.array(floats), np.array(initial))
    for j, members in enumerate(expected_groups):
        acc = initial[j]
        for i in members:
            acc = acc + floats[i]
        assert same_float(float(continued[j]), acc)
    mins = folds.min_per_session(groups, floats).tolist()
    maxs = folds.max_per_session(groups, floats).tolist()
    assert mins == [min(floats[i] for i in g) for g in expected_groups]
    assert maxs == [max(floats[i] for i in g) for g in expected_groups]
    labels = np.array([f"e{i}" for i in range(len(owner))], dtype=object)
    assert folds.first_per_session(groups, labels).tolist() == [
        f"e{g[0]}" for g in expected_groups]
    assert folds.last_per_session(groups, labels).tolist() == [
        f"e{g[-1]}" for g in expected_groups]
    assert folds.collect_per_session(groups, labels) == [
        [f"e{i}" for i in g] for g in expected_groups]


@settings(max_examples=round(300 * PROFILE_SCALE))
@given(sessionized(), st.data())
def test_integer_sums_are_exact_or_refused(batch: tuple[list[int], list[int], int],
                                           data: st.DataObject) -> None:
    owner, times, sessions = batch
    ints = data.draw(st.lists(INTS, min_size=len(owner), max_size=len(owner)))
    use_initial = data.draw(st.booleans())
    initial = data.draw(st.lists(INTS, min_size=sessions, max_size=sessions))
    groups = folds.group_events(owner, times, sessions)
    exact = [sum(ints[i] for i in g) + (initial[j] if use_initial else 0)
             for j, g in enumerate(fold_groups(owner, times, sessions))]
    args: list[Any] = [groups, np.array(ints, dtype=np.int64)]
    if use_initial:
        args.append(np.array(initial, dtype=np.int64))
    if all(INT64_MIN <= s <= INT64_MAX for s in exact):
        got = folds.sum_per_session(*args)
        assert got.dtype == np.int64
        assert got.tolist() == exact
        assert folds.min_per_session(groups, ints).tolist() == [
            min(ints[i] for i in g) for g in fold_groups(owner, times, sessions)]
    else:
        with pytest.raises(OverflowError, match=r"the sum of session \d+ is -?\d+"):
            folds.sum_per_session(*args)


def test_float_sums_are_a_left_fold_not_numpy_pairwise() -> None:
    """On long sessions np.add.reduceat sums pairwise; the fold must not."""
    rng = np.random.default_rng(7)
    values = rng.standard_normal(5_000) * 10.0 ** rng.integers(-8, 8, 5_000)
    groups = folds.group_events(np.zeros(5_000, dtype=np.int64), np.arange(5_000), 1)
    acc = 0.0
    for v in values.tolist():
        acc += v
    assert same_float(float(folds.sum_per_session(groups, values)[0]), acc)
    assert not same_float(float(np.add.reduceat(values, [0])[0]), acc)  # the trap is real


def test_nan_is_above_every_value_in_min_and_max() -> None:
    # Spark's order of doubles (aggregations.smaller/larger): a minimum skips NaN unless every
    # value is NaN, a maximum is NaN when any value is
    groups = folds.group_events([0, 0, 0], [1, 2, 3], 1)
    assert folds.min_per_session(groups, [1.0, math.nan, 0.5])[0] == 0.5
    assert folds.min_per_session(groups, [math.nan, 1.0, 0.5])[0] == 0.5
    assert math.isnan(folds.min_per_session(groups, [math.nan] * 3)[0])
    assert math.isnan(folds.max_per_session(groups, [math.nan, 1.0, 0.5])[0])
    assert math.isnan(folds.max_per_session(groups, [1.0, 0.5, math.nan])[0])


def test_open_sessions_group_by_the_session_that_absorbed_them() -> None:
    plan = planner.plan([1, 2], [10, 50], [20, 60], [0, 0],
                        [1, 1, 2, 9], [15, 0, 70, 0], [30, 12, 80, 5], True).plan
    groups = folds.group_open_sessions(plan, [15, 0, 70, 0])
    assert plan.session_starts_ms.tolist() == [0, 50]
    assert groups.offsets.tolist() == [0, 2, 2]
    assert groups.order.tolist() == [1, 0]  # ordered by start within the session


@pytest.mark.parametrize(
    ("owner", "times", "sessions", "error", "message"),
    [
        ([0, 2], [0, 0], 2, ValueError, r"event_session\[1\] = 2 is not in \[0, 2\)"),
        ([0, 0], [0, 0], 2, ValueError, "session 1 holds no event"),
        ([0], [0, 1], 1, ValueError, "times_ms has 2 rows, event_session has 1"),
    ],
)
def test_group_events_checks_its_arguments(owner: list[int], times: list[int], sessions: int,
                                           error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        folds.group_events(owner, times, sessions)


def test_values_must_be_numbers() -> None:
    groups = folds.group_events([0], [0], 1)
    with pytest.raises(TypeError, match="values must hold ints or floats, got dtype <U1"):
        folds.sum_per_session(groups, ["a"])
    with pytest.raises(ValueError, match="values must be one-dimensional with 1 rows"):
        folds.sum_per_session(groups, [1, 2])


@settings(max_examples=round(300 * PROFILE_SCALE))
@given(st.integers(1, 4).flatmap(lambda k: st.lists(
    st.tuples(*[st.one_of(st.integers(-3, 3), st.integers(INT64_MIN, INT64_MAX),
                          st.sampled_from([INT64_MIN, INT64_MAX]))] * k), max_size=40)))
def test_sort_order_equals_lexsort(rows: list[tuple[int, ...]]) -> None:
    """Packed or not, the permutation is np.lexsort's, ties kept in input order."""
    if not rows:
        assert arrays.sort_order([np.zeros(0, dtype=np.int64)]).tolist() == []
        return
    columns = [np.array(column, dtype=np.int64) for column in zip(*rows, strict=True)]
    expected = sorted(range(len(rows)), key=lambda i: (rows[i], i))
    assert arrays.sort_order(columns).tolist() == expected
    if len(set(rows)) == len(rows):
        assert arrays.sort_order(columns, distinct=True).tolist() == expected
    small = [c % 5 for c in columns]
    small_rows = list(zip(*(c.tolist() for c in small), strict=True))
    if len(set(small_rows)) == len(small_rows):  # packed and sorted unstably
        assert arrays.sort_order(small, distinct=True).tolist() == sorted(
            range(len(rows)), key=lambda i: small_rows[i])
    assert arrays.sort_order([c % 5 for c in columns]).tolist() == sorted(
        range(len(rows)), key=lambda i: (tuple(v % 5 for v in rows[i]), i))
