"""The emit-final latency histogram of :class:`EngineMetrics`, fed as the event path feeds it
(``record_final_sum`` once per close, put in the histogram in bulk), against a count by hand."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionstore.engine.emit import EVENT_TIME_BUCKETS_S, EngineMetrics

_closes = st.lists(st.tuples(st.integers(-10**6, 10**8), st.integers(0, 10**4),
                             st.lists(st.integers(0, 4 * 10**7), max_size=30)), max_size=12)


def counts_by_hand(latencies_ms: list[int]) -> list[int]:
    counts = [0] * (len(EVENT_TIME_BUCKETS_S) + 1)
    for latency in latencies_ms:
        slot = next((i for i, bound in enumerate(EVENT_TIME_BUCKETS_S)
                     if latency <= bound * 1000), len(EVENT_TIME_BUCKETS_S))
        counts[slot] += 1
    return counts


@settings(max_examples=60)
@given(closes=_closes, read_between=st.booleans())
def test_the_histogram_counts_every_final_latency(closes: list[tuple[int, int, list[int]]],
                                                  read_between: bool) -> None:
    metrics = EngineMetrics()
    want: list[int] = []
    for close_upto, grace, back in closes:
        ends = sorted(close_upto - b for b in back)  # latencies >= 0, ends in order
        latencies = [close_upto - end for end in ends]
        metrics.record_final_sum(len(ends), sum(latencies), max(latencies, default=0), ends,
                                 close_upto + grace, grace)
        want += latencies
        if read_between:
            assert list(metrics.histograms()["emit-final-latency"].counts) == counts_by_hand(want)
    reading = metrics.histograms()["emit-final-latency"]
    assert list(reading.counts) == counts_by_hand(want)
    assert reading.sum_s == pytest.approx(sum(want) / 1000)  # float seconds: rounding only


def test_a_long_run_is_put_in_the_histogram_before_it_is_read() -> None:
    """More finals than are held back: the ones over the limit and the rest both count."""
    metrics = EngineMetrics()
    for close in range(70_000):
        metrics.record_final_sum(1, 5, 5, [close - 5], close + 2, 2)
    reading = metrics.histograms()["emit-final-latency"]
    assert reading.count == 70_000
    assert reading.counts[1] == 70_000  # 5 ms: above 1 ms, at most 10 ms
