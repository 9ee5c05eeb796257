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
