"""The store's retention rule has one scalar home (``min_live_segment``, ``read_floor``); the
array form the bulk writes use is pinned to it, and both are checked against Kafka's rule
written out here with Python ints."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionstore.store.base import _floor_segments, min_live_segment, read_floor
from sessionstore.timeutil import INT64_MAX, INT64_MIN

TIMES = st.one_of(st.integers(INT64_MIN, INT64_MAX), st.integers(-1000, 1000),
                  st.sampled_from([INT64_MIN, INT64_MIN + 1, INT64_MAX, -1, 0]))
RETENTIONS = st.one_of(st.integers(0, INT64_MAX), st.integers(0, 100),
                       st.sampled_from([0, 1, INT64_MAX]))
INTERVALS = st.one_of(st.integers(1, 100), st.integers(1, INT64_MAX), st.just(1))


def kafka_segment(reference: int, retention: int, interval: int) -> int:
    """segmentId(observedStreamTime - retentionPeriod), on unbounded ints."""
    return (reference - retention) // interval


@settings(max_examples=300)
@given(st.lists(TIMES, min_size=1, max_size=20), RETENTIONS, INTERVALS)
def test_the_array_form_is_the_scalar_rule(times: list[int], retention: int,
                                           interval: int) -> None:
    got = _floor_segments(np.array(times, dtype=np.int64), retention, interval).tolist()
    assert got == [min_live_segment(t, retention, interval) for t in times]


@settings(max_examples=300)
@given(TIMES, RETENTIONS, INTERVALS, TIMES)
def test_the_scalar_rule_keeps_what_kafka_keeps(reference: int, retention: int, interval: int,
                                                end: int) -> None:
    segment = min_live_segment(reference, retention, interval)
    assert INT64_MIN <= segment <= INT64_MAX
    # a session's segment is live exactly when Kafka's rule keeps it
    assert (end // interval >= segment) == (end // interval >= kafka_segment(
        reference, retention, interval))
    assert read_floor(reference, retention) == reference - retention + 1


def test_the_rule_at_exact_boundaries() -> None:
    # stream time 100, retention 30, segments of 10: segment 7 ([70, 80)) is the oldest kept
    assert min_live_segment(100, 30, 10) == 7
    assert min_live_segment(99, 30, 10) == 6
    assert read_floor(100, 30) == 71
    assert min_live_segment(INT64_MIN, 1, 1) == INT64_MIN
