"""The planner (its reference and its kernel) against a brute-force model of the per-event loop,
and its argument checks."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionstore import jit, kernels
from sessionstore.engine.planner import plan, plan_reference
from sessionstore.kernels import SessionPlan

from .model import run_loop

# Sizes are for the default profile (100 examples); a soak profile with more scales them up.
PROFILE_SCALE = settings.default.max_examples / 100

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

# Each key's times are drawn around a base; bases at the int64 bounds check that nothing in the
# kernel computes with times (an overflow would wrap silently in int64).
BASES = [0, -1_000_000, INT64_MIN + 50, INT64_MAX - 400]
CODES = [INT64_MIN, -7, 0, 1, 3, INT64_MAX]


@st.composite
def batches(draw: st.DrawFn) -> tuple[list[tuple[int, int, int, int]],
                                      list[tuple[int, int, int]], bool]:
    """Events (code, time, end, closed_before) in arrival order, open sessions, inclusive."""
    inclusive = draw(st.booleans())
    codes = draw(st.lists(st.sampled_from(CODES), min_size=1, max_size=4, unique=True))
    base = {code: draw(st.sampled_from(BASES)) for code in codes}
    # closed_before: a per-key walk that never goes back, starting anywhere from well before the
    # data to inside it, so that sessions turn final during the batch.
    closed = {code: base[code] + draw(st.integers(-60, 120)) for code in codes}
    events = []
    for _ in range(draw(st.integers(0, 40))):
        code = draw(st.sampled_from(codes))
        time_ms = base[code] + draw(st.integers(0, 300))
        gap = draw(st.integers(1, 40))  # per-event gaps: ends - times is not constant
        closed[code] += draw(st.sampled_from([0, 0, 0, 1, 5, 30]))
        closed_before = min(max(closed[code], INT64_MIN), INT64_MAX)
        events.append((code, time_ms, min(time_ms + gap, INT64_MAX), closed_before))
    opens = []
    first_closed = {}
    for code, _, _, c in events:
        first_closed.setdefault(code, c)
    for code in codes:
        cursor = base[code] + draw(st.integers(-20, 100))
        for _ in range(draw(st.integers(0, 4))):
            # disjoint: strictly apart when touching merges, possibly touching otherwise
            start = cursor + draw(st.integers(1 if inclusive else 0, 40))
            end = start + draw(st.integers(1, 60))
            if end > INT64_MAX - 5:
                break
            opens.append((code, start, end))
            cursor = end
        if code in first_closed and draw(st.booleans()):
            # a session already final at the key's first event may overlap anything
            end = first_closed[code] - draw(st.integers(0, 20))
            start = end - draw(st.integers(1, 80))
            if start >= INT64_MIN:
                opens.append((code, start, end))
        if code in first_closed and draw(st.booleans()):
            # a session ending exactly at the key's first close cursor (final, so untouchable)
            # or one past it (open: the first event may still join it)
            end = first_closed[code] + draw(st.sampled_from([0, 1]))
            start = end - draw(st.integers(1, 30))
            if start >= INT64_MIN and all(o[0] != code or o[2] < start or o[1] > end
                                          for o in opens):
                opens.append((code, start, end))
    order = draw(st.permutations(range(len(opens))))
    return events, [opens[j] for j in order], inclusive


def _plan(events: list[tuple[int, int, int, int]], opens: list[tuple[int, int, int]],
          inclusive: bool, reference: bool = False) -> SessionPlan:
    ev = np.array(events, dtype=np.int64).reshape(-1, 4)
    op = np.array(opens, dtype=np.int64).reshape(-1, 3)
    planner = plan_reference if reference else plan
    return planner(ev[:, 0], ev[:, 1], ev[:, 2], ev[:, 3],
                   op[:, 0], op[:, 1], op[:, 2], inclusive).plan


def _check_against_model(events: list[tuple[int, int, int, int]],
                         opens: list[tuple[int, int, int]], inclusive: bool,
                         reference: bool = False) -> None:
    plan = _plan(events, opens, inclusive, reference)
    expected = {
        (s.code, s.start_ms, s.end_ms, s.events, s.opens)
        for s in run_loop(events, opens, inclusive) if s.events
    }
    got = plan_sets(plan)
    assert got == expected
    sessions = len(plan.session_codes)
    assert sessions == len(expected)  # no session listed twice or without events
    listed = list(zip(plan.session_codes.tolist(), plan.session_starts_ms.tolist(),
                      plan.session_ends_ms.tolist(), strict=True))
    assert listed == sorted(listed)
    for array in plan:
        assert array.dtype == np.int64


def plan_sets(plan: SessionPlan) -> set[tuple[int, int, int, frozenset[int], frozenset[int]]]:
    """Each planned session as ``(code, start, end, its events, the open sessions it took)``,
    the form the model's sessions take."""
    sessions = len(plan.session_codes)
    members: list[set[int]] = [set() for _ in range(sessions)]
    absorbed: list[set[int]] = [set() for _ in range(sessions)]
    for i, s in enumerate(plan.event_session.tolist()):
        members[s].add(i)
    for j, s in enumerate(plan.open_session.tolist()):
        if s >= 0:
            absorbed[s].add(j)
    return {
        (int(plan.session_codes[s]), int(plan.session_starts_ms[s]), int(plan.session_ends_ms[s]),
         frozenset(members[s]), frozenset(absorbed[s]))
        for s in range(sessions)
    }


@contextlib.contextmanager
def plain_python_kernels(enabled: bool) -> Iterator[None]:
    """Run the kernels' Python source instead of their numba-compiled form."""
    if not enabled:
        yield
        return
    saved = dict(jit.COMPILED)
    jit.COMPILED.clear()
    jit.COMPILED.update({"_plan_dense": kernels._plan_dense})
    try:
        yield
    finally:
        jit.COMPILED.clear()
        jit.COMPILED.update(saved)


@settings(max_examples=round(300 * PROFILE_SCALE))
@given(batches(), st.sampled_from(["compiled", "python", "reference"]))
def test_plan_equals_the_per_event_loop(batch: tuple[list[tuple[int, int, int, int]],
                                                     list[tuple[int, int, int]], bool],
                                        planner: str) -> None:
    """The compiled kernel, its Python source and the reference all equal the model."""
    events, opens, inclusive = batch
    with plain_python_kernels(planner == "python"):
        _check_against_model(events, opens, inclusive, reference=planner == "reference")


@pytest.mark.parametrize("reference", [False, True])
def test_touching_windows_merge_only_when_inclusive(reference: bool) -> None:
    events = [(1, 0, 10, -100), (1, 10, 20, -100)]
    assert len(_plan(events, [], True, reference).session_codes) == 1
    assert len(_plan(events, [], False, reference).session_codes) == 2


@pytest.mark.parametrize("reference", [False, True])
def test_a_session_ending_at_the_close_cursor_is_final(reference: bool) -> None:
    """Closed-before is inclusive of the end: a session ending exactly at the cursor never
    joins again; one ending a millisecond later still does."""
    final = _plan([(1, 5, 15, 10)], [(1, 0, 10)], True, reference)
    assert final.session_starts_ms.tolist() == [5]
    assert final.open_session.tolist() == [-1]
    still_open = _plan([(1, 5, 15, 10)], [(1, 0, 11)], True, reference)
    assert still_open.session_starts_ms.tolist() == [0]
    assert still_open.open_session.tolist() == [0]


def test_one_event_bridges_two_open_sessions() -> None:
    plan = _plan([(5, 10, 20, 0)], [(5, 0, 12), (5, 18, 30), (6, 0, 100)], True)
    assert plan.session_starts_ms.tolist() == [0]
    assert plan.session_ends_ms.tolist() == [30]
    assert plan.open_session.tolist() == [0, 0, -1]


def test_an_event_overlapping_a_final_session_starts_its_own() -> None:
    plan = _plan([(1, 5, 15, 10)], [(1, 0, 10)], True)
    assert plan.session_starts_ms.tolist() == [5]
    assert plan.session_ends_ms.tolist() == [15]
    assert plan.open_session.tolist() == [-1]


def test_empty_batch() -> None:
    plan = _plan([], [(1, 0, 5)], True)
    assert [len(a) for a in plan] == [0, 0, 0, 0, 1]
    assert plan.open_session.tolist() == [-1]


@pytest.mark.parametrize(
    ("events", "opens", "message"),
    [
        ([(1, 5, 5, 0)], [], r"ends_ms\[0\] = 5 must be > times_ms\[0\] = 5"),
        ([(1, 0, 5, 0)], [(1, 3, 3)], r"open_starts_ms\[0\] = 3 must be < open_ends_ms\[0\]"),
        ([(1, 0, 5, 3), (2, 0, 5, 9), (1, 1, 6, 2)], [],
         r"closed_before_ms\[2\] = 2 .* must not decrease within a key"),
        ([(1, 0, 5, 0)], [(1, 10, 20), (1, 20, 30)], r"open session 1 .* overlap or touch"),
        ([(1, 0, 5, 0)], [(1, 10, 21), (1, 20, 30)], r"open session \d .* overlap"),
    ],
)
def test_bad_arguments_name_the_argument_and_the_row(
    events: list[tuple[int, int, int, int]], opens: list[tuple[int, int, int]], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        _plan(events, opens, True)


def test_touching_open_sessions_are_fine_when_not_inclusive() -> None:
    plan = _plan([(1, 0, 5, 0)], [(1, 10, 20), (1, 20, 30)], False)
    assert plan.open_session.tolist() == [-1, -1]


def test_argument_types_and_lengths_are_checked() -> None:
    with pytest.raises(TypeError, match="times_ms must hold integers"):
        plan([1], [0.5], [2], [0], [], [], [], True)
    with pytest.raises(ValueError, match="ends_ms has 2 rows, key_codes has 1"):
        plan([1], [0], [2, 3], [0], [], [], [], True)
    with pytest.raises(ValueError, match="open_ends_ms has 0 rows, open_codes has 1"):
        plan([], [], [], [], [1], [0], [], True)
    with pytest.raises(ValueError, match="key_codes must be one-dimensional"):
        plan([[1]], [[0]], [[2]], [[0]], [], [], [], True)
    with pytest.raises(ValueError, match=r"times_ms\[0\] = 18446744073709551615 does not fit"):
        plan([1], np.array([2**64 - 1], dtype=np.uint64), [2], [0], [], [], [], True)
