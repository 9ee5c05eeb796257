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


@st.composite
def text_key_bucket_events(draw: st.DrawFn, max_events: int = 40
                           ) -> list[tuple[object, ...]]:
    """Rows ``(a, b, c, time_us, value)`` of a static input keyed by two string columns ``a``
    and ``c`` and a binary one ``b``, for a gap of 10 seconds: each column's values drawn from
    its own small set (an empty value, a non-ASCII one, prefixes of each other), so that the
    order in which values first appear differs from their sorted order and from column to
    column; times near each other, some a gap apart or more."""
    gap_us = 10_000_000
    rows: list[tuple[object, ...]] = []
    clock = draw(st.integers(-3, 3)) * gap_us
    for _ in range(draw(st.integers(1, max_events))):
        clock += draw(st.sampled_from([0, 1, gap_us - 1, gap_us, gap_us + 1, 3 * gap_us]))
        rows.append((draw(st.sampled_from(["z", "y", "yz", ""])),
                     draw(st.sampled_from([b"\x01", b"\x00\xff", b"", b"\x00"])),
                     draw(st.sampled_from(["p", "\u00e9", "pq"])),
                     clock, draw(st.one_of(st.none(), st.integers(-(2**40), 2**40)))))
    return draw(st.permutations(rows))


@st.composite
def adversarial_bucket_cases(draw: st.DrawFn, max_events: int = 40) -> dict[str, object]:
    """A static input and configuration for the bucketed static path: a gap off whole
    milliseconds (down to 1 us) or whole, either gap rule, one or five shuffle partitions,
    times before and after the epoch off whole milliseconds, steps of just under, exactly and
    just over a gap, duplicate rows, a few null times, and integer values of every width at
    its extremes (``x``: int64's; ``l``: past 32 bits, summable without leaving int64), some
    null. Rows are ``(k, day, time_us, b, s, i, x, l)``."""
    gap_us = draw(st.sampled_from([1, 1_000, 1_234_567, 7_000_000]))
    base = draw(st.sampled_from([-10 * gap_us - 3, -1, 0, 5 * gap_us + 999]))
    clocks = {(k, d): base + draw(st.integers(-2, 2)) * gap_us
              for k in ("a", "b") for d in (0, 1)}
    rows: list[tuple[object, ...]] = []
    for _ in range(draw(st.integers(1, max_events))):
        key = draw(st.sampled_from(sorted(clocks)))
        clocks[key] += draw(st.sampled_from([0, 1, gap_us - 1, gap_us, gap_us + 1,
                                             max(1, gap_us // 3), 2 * gap_us + 5]))
        time = None if draw(st.integers(0, 19)) == 0 else clocks[key]

        def value(low: int, high: int, edges: list[int]) -> object:
            return draw(st.one_of(st.none(), st.sampled_from(edges), st.integers(low, high)))

        row = (*key, time, value(-128, 127, [-128, 127]),
               value(-(2**15), 2**15 - 1, [-(2**15), 2**15 - 1]),
               value(-(2**31), 2**31 - 1, [-(2**31), 2**31 - 1]),
               value(-(2**63), 2**63 - 1, [-(2**63), 2**63 - 1, -1, 0]),
               value(-(2**56), 2**56, [-(2**56), 2**56, -(2**32), 2**32 - 1]))
        rows.append(row)
        if draw(st.integers(0, 9)) == 0:
            rows.append(row)  # a duplicate
    return {"gap_us": gap_us, "inclusive_gap": draw(st.booleans()),
            "partitions": draw(st.sampled_from([1, 5])),
            "keys": draw(st.sampled_from([["k"], ["k", "day"], ["lit", "k"]])),
            "rows": draw(st.permutations(rows))}


#: String key values that a lossy key encoding would merge: trailing spaces, case, NUL bytes,
#: composed and decomposed accents, an empty string and long strings that differ at their end.
NEAR_STRINGS = ["", " ", "a", "a ", "A", "a\x00", "a\x00b", "\u00e9", "e\u0301",
                "x" * 3000, "x" * 2999 + "y"]
NEAR_BYTES = [b"", b"\x00", b"\x00\x00", b"a", b"a ", b"\xff" * 2000, b"\xff" * 1999 + b"\xfe"]


@st.composite
def mixed_key_cases(draw: st.DrawFn, max_events: int = 40) -> dict[str, object]:
    """A static input for the bucketed path keyed by a string, an int, a binary, a date and a
    boolean column: rows ``(s, i, b, day, flag, time_us, v)`` with key values from
    :data:`NEAR_STRINGS` and :data:`NEAR_BYTES`, int32's extremes and days both sides of the
    epoch, a gap of 10 s, times before and after 1970 off whole milliseconds with steps of
    just under, exactly and over a gap, some times null (and, when ``ghost``, one key whose
    rows all lack a time, some with a null key column too); with how many rows a task's Arrow
    batches hold and how many shuffle partitions there are."""
    gap_us = 10_000_000
    rows: list[tuple[object, ...]] = []
    clock = draw(st.sampled_from([-7 * gap_us - 13, -1, 0, 3 * gap_us + 999]))
    for _ in range(draw(st.integers(1, max_events))):
        clock += draw(st.sampled_from([0, 1, gap_us - 1, gap_us, gap_us + 1, 2 * gap_us + 7]))
        time = None if draw(st.integers(0, 9)) == 0 else clock
        rows.append((draw(st.sampled_from(NEAR_STRINGS)), draw(st.sampled_from([0, -1, 2**31 - 1,
                                                                                -(2**31)])),
                     draw(st.sampled_from(NEAR_BYTES)), draw(st.integers(0, 2)),
                     draw(st.booleans()), time,
                     draw(st.one_of(st.none(), st.integers(-(2**62), 2**62)))))
    ghost = draw(st.booleans())
    if ghost:  # a key with no time at all; a row with a null key column and no time
        rows += [("ghost", 1, b"g", 0, True, None, 5), ("ghost", 1, b"g", 0, True, None, None),
                 (None, 1, b"g", 1, False, None, 7)]
    return {"rows": draw(st.permutations(rows)),
            "batch_rows": draw(st.sampled_from([1, 3, 10_000])),
            "partitions": draw(st.sampled_from([1, 3]))}
