"""BatchWindows at the int64 edges: an event whose stream-time window does not fit is refused
naming the argument, and changes nothing (the aggregator keeps working)."""

from __future__ import annotations

import pytest

from sessionstore import BatchAggregator, BatchWindows, InMemorySessionStore, aggregations
from sessionstore.timeutil import INT64_MAX, INT64_MIN


def _aggregator() -> BatchAggregator:
    return BatchAggregator(InMemorySessionStore(retention_ms=10), BatchWindows(10),
                           aggregations.collect())


@pytest.mark.parametrize("bad", [INT64_MAX - 4, INT64_MAX, INT64_MIN, INT64_MIN + 3])
def test_event_whose_window_does_not_fit_changes_nothing(bad: int) -> None:
    agg = _aggregator()
    with pytest.raises(ValueError, match="timestamp_ms"):
        agg.process("k", "bad", bad)
    assert agg.metrics["records-in"] == 0
    assert agg.stream_time == INT64_MIN
    assert agg.process("k", "a", 5) == []
    closed = agg.advance_watermark(10)
    assert [(e.session.start, e.session.end, e.value) for e in closed] == [(0, 10, ["a"])]


def test_batch_with_one_event_out_of_range_is_refused_whole() -> None:
    agg = _aggregator()
    with pytest.raises(ValueError, match="timestamps_ms"):
        agg.process_batch(["k", "k"], ["a", "b"], [5, INT64_MAX - 1])
    assert agg.stream_time == INT64_MIN
    assert agg.process_batch(["k", "k"], ["a", "b"], [5, 7]) == []
    closed = agg.advance_watermark(10)
    assert [(e.session.start, e.session.end, e.value) for e in closed] == [(0, 10, ["a", "b"])]


def test_largest_window_that_fits_is_accepted() -> None:
    agg = _aggregator()
    last = (INT64_MAX // 10) * 10 - 1  # its window ends at a multiple of 10 <= INT64_MAX
    assert agg.process("k", "a", last) == []
    assert agg.stream_time == last
