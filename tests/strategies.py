"""Hypothesis strategies shared by the test suite."""

from __future__ import annotations

from hypothesis import strategies as st

KEYS = st.sampled_from(["a", "ab", "b", b"a", 1, ("a", 1), ""])
VALUES = st.one_of(
    st.none(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.text(max_size=5),
    st.lists(st.integers(-5, 5), max_size=3),
)


@st.composite
def sessions(draw: st.DrawFn, low: int = -2_000, high: int = 6_000) -> tuple[object, int, int]:
    """A (key, start, end) triple with start <= end."""
    key = draw(KEYS)
    start = draw(st.integers(low, high))
    length = draw(st.integers(0, 800))
    return key, start, start + length


ENGINE_KEYS = st.sampled_from(["a", "b", "c", 7])


@st.composite
def engine_configs(draw: st.DrawFn) -> dict[str, object]:
    """Engine configurations, varied as hard as the input: cache sizes down to 0, segments down
    to 1 ms, minimum retention, both watermark modes and both gap conventions."""
    gap = draw(st.integers(1, 20))
    return {
        "gap": gap,
        "grace": draw(st.integers(0, 15)),
        "inclusive": draw(st.booleans()),
        "ooo": draw(st.integers(0, 25)),
        "watermark": draw(st.sampled_from(["event_time", "external"])),
        "cache": draw(st.sampled_from([0, 1, 2, 100_000])),
        "segment": draw(st.sampled_from([1, 2, gap, None])),
        "extra_retention": draw(st.sampled_from([0, 0, 7])),
    }


@st.composite
def engine_steps(draw: st.DrawFn, max_events: int = 40) -> list[tuple[object, ...]]:
    """Events ``("event", key, value, t)`` with disorder beyond gap + grace, and (sometimes)
    watermark advances, commits, aborts and reopens between them."""
    n = draw(st.integers(0, max_events))
    base = sorted(draw(st.lists(st.integers(-50, 300), min_size=n, max_size=n)))
    steps: list[tuple[object, ...]] = []
    for i, t in enumerate(base):
        jitter = draw(st.sampled_from([0, 0, 0, -5, -30, -80]))
        steps.append(("event", draw(ENGINE_KEYS), i, t + jitter))
        extra = draw(st.sampled_from([None] * 6 + ["watermark", "commit", "abort", "reopen"]))
        if extra == "watermark":
            steps.append(("watermark", t + draw(st.integers(-20, 40))))
        elif extra is not None:
            steps.append((extra,))
    return steps


@st.composite
def bucket_events(draw: st.DrawFn, max_events: int = 60) -> tuple[int, list[tuple[object, ...]]]:
    """(gap in seconds, rows ``(key, time_us, value)``) for a static input that Spark reduces by
    gap-wide time bucket: times on both sides of the epoch and of bucket edges, steps of just
    under, exactly and just over a gap, and int64 values of either sign past 2**32 (so that
    their high and low halves both matter), some null."""
    gap_s = draw(st.sampled_from([1, 7, 60]))
    gap_us = gap_s * 1_000_000
    n = draw(st.integers(1, max_events))
    clocks = {key: draw(st.integers(-3, 3)) * gap_us for key in ("a", "b", "c")}
    rows: list[tuple[object, ...]] = []
    for _ in range(n):
        key = draw(st.sampled_from(sorted(clocks)))
        clocks[key] += draw(st.sampled_from([0, 1, gap_us - 1, gap_us, gap_us + 1, gap_us // 3,
                                             2 * gap_us + 5, 5 * gap_us]))
        value = draw(st.one_of(st.none(), st.integers(-(2**40), 2**40)))
        rows.append((key, clocks[key], value))
    return gap_s, draw(st.permutations(rows))
