"""The planner's reference definition against the independent oracle (tests/oracle.py).

A small harness plans batches (split anywhere) with ``plan_reference`` and applies each plan to a
dict of sessions: drop the absorbed open sessions, add the planned ones with their events. The
sessions left at the end, with their values, must be the oracle's. The kernel is pinned to this
reference in ``tests/kernels/test_plan_dense.py``, so every path that plans through the kernel
answers to the oracle through this test too.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import example, given
from hypothesis import strategies as st

from sessionstore.engine.planner import plan, plan_reference
from tests import oracle

NEG_INF = float("-inf")


@st.composite
def planner_cases(draw: st.DrawFn) -> tuple[dict[str, Any], list[tuple[Any, ...]]]:
    """A configuration and steps: events (some with their own gap) and watermarks."""
    cfg = {
        "gap": draw(st.integers(1, 20)),
        "grace": draw(st.integers(0, 15)),
        "inclusive": draw(st.booleans()),
        "ooo": draw(st.none() | st.integers(0, 25)),
        "dynamic": draw(st.booleans()),
    }
    steps: list[tuple[Any, ...]] = []
    for i in range(draw(st.integers(0, 40))):
        t = draw(st.integers(0, 200)) + draw(st.sampled_from([0, 0, -5, -30]))
        event: tuple[Any, ...] = ("event", draw(st.sampled_from(["a", "b", 7])), i, t)
        if cfg["dynamic"]:
            event += (draw(st.integers(1, 30)),)
        steps.append(event)
        if draw(st.integers(0, 5)) == 0:
            # sometimes exactly at a gap boundary: sessions end exactly at the close cursor
            steps.append(("watermark", t + draw(st.sampled_from([-20, 0, cfg["gap"], 15]))))
    return cfg, steps


def run_planner(cfg: dict[str, Any], steps: list[tuple[Any, ...]], cuts: list[bool],
                planner: Any) -> list[tuple[Any, ...]]:
    """Plan and apply batches of consecutive events; a watermark step or a cut ends a batch."""
    w: float = NEG_INF
    grace, gap = cfg["grace"], cfg["gap"]
    codes: dict[Any, int] = {}
    sessions: list[tuple[int, int, int, list[tuple[int, int, Any]]]] = []  # code, start, end
    pending: list[tuple[int, int, int, int, int, Any]] = []  # code, t, end, closed, arrival, v

    def apply() -> None:
        nonlocal sessions
        if not pending:
            return
        mine = {p[0] for p in pending}
        opens = [s for s in sessions if s[0] in mine]
        ev = np.array([p[:4] for p in pending], dtype=np.int64).reshape(-1, 4)
        op = np.array([s[:3] for s in opens], dtype=np.int64).reshape(-1, 3)
        got = planner(ev[:, 0], ev[:, 1], ev[:, 2], ev[:, 3], op[:, 0], op[:, 1], op[:, 2],
                      cfg["inclusive"]).plan
        items: list[list[tuple[int, int, Any]]] = [[] for _ in got.session_codes]
        for j, into in enumerate(got.open_session.tolist()):
            if into >= 0:
                items[into] += opens[j][3]
        for i, into in enumerate(got.event_session.tolist()):
            items[into].append((pending[i][1], pending[i][4], pending[i][5]))
        absorbed = {id(opens[j]) for j, into in enumerate(got.open_session.tolist())
                    if into >= 0}
        sessions = [s for s in sessions if id(s) not in absorbed]
        sessions += [(c, s, e, sorted(v)) for c, s, e, v in zip(
            got.session_codes.tolist(), got.session_starts_ms.tolist(),
            got.session_ends_ms.tolist(), items, strict=True)]
        pending.clear()

    for arrival, step in enumerate(steps):
        if step[0] == "watermark":
            apply()
            w = max(w, step[1])
            continue
        key, value, t = step[1:4]
        own = step[4] if len(step) > 4 else gap
        closed = w - grace
        if t + own <= closed:
            continue  # late: the planner takes accepted events only
        code = codes.setdefault(key, len(codes))
        pending.append((code, t, t + own, int(max(closed, -(2**62))), arrival, value))
        if cfg["ooo"] is not None:
            w = max(w, t - cfg["ooo"])
        if cuts[arrival % len(cuts)]:
            apply()
    apply()
    keys = {code: key for key, code in codes.items()}
    result = [(keys[c], s, e, [v for _, _, v in items]) for c, s, e, items in sessions]
    return sorted(result, key=lambda r: (repr(r[0]), r[1], r[2]))


@given(planner_cases(), st.lists(st.booleans(), min_size=1, max_size=8),
       st.sampled_from(["reference", "kernel"]))
@example(  # exclusive gap: an event at a session's end starts its own
    ({"gap": 10, "grace": 0, "inclusive": False, "ooo": None, "dynamic": False},
     [("event", "a", 0, 0), ("event", "a", 1, 10)]), [True], "reference")
@example(  # a session ending exactly at the close cursor is final: the next event stays apart
    ({"gap": 10, "grace": 0, "inclusive": True, "ooo": None, "dynamic": False},
     [("event", "a", 0, 0), ("watermark", 10), ("event", "a", 1, 5)]), [False], "reference")
def test_reference_planner_equals_the_oracle(case: tuple[dict[str, Any], list[tuple[Any, ...]]],
                                             cuts: list[bool], planner: str) -> None:
    cfg, steps = case
    gap = None if cfg["dynamic"] else cfg["gap"]
    want, _ = oracle.sessionize(steps, gap, cfg["grace"], cfg["inclusive"], cfg["ooo"])
    got = run_planner(cfg, steps, cuts, plan_reference if planner == "reference" else plan)
    assert got == want
