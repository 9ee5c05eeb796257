"""The emit-final latency rule, ``max(0, W - (end + grace))``, in one place
(:func:`sessionstore.engine.time.final_latency_ms`), and every path's metrics pinned to it.

The emit from the write cache's memory (``closing.emit_taken``, the event path's close) sums the
rule inline; the other paths call it (the write-through close, a trigger's last pane, the
open-session table of the batch paths, the histogram's bulk pass). Each path here is driven by
an external watermark, so that every final emit happens at a watermark the test knows: the
metrics must be the rule applied to what was emitted, counted by hand.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionstore import (
    EmitStrategy,
    InMemorySessionStore,
    SessionAggregator,
    SessionWindows,
    aggregations,
)
from sessionstore.engine.emit import EVENT_TIME_BUCKETS_S
from sessionstore.engine.time import close_time_ms, final_latencies_ms, final_latency_ms
from sessionstore.triggers import AfterWatermark
from tests.engine.test_emit_metrics import counts_by_hand


def test_the_rule_at_its_boundary() -> None:
    """W one before, at and after the close time ``end + grace``."""
    assert close_time_ms(100, 7) == 107
    assert [final_latency_ms(w, 100, 7) for w in (50, 106, 107, 108, 1_000)] == \
        [0, 0, 0, 1, 893]
    ends = np.array([100, 101, 99, 2**62], dtype=np.int64)
    assert final_latencies_ms(108, ends, 7).tolist() == [1, 0, 2, 0]
    assert final_latencies_ms(108, ends, 7).dtype == np.int64  # exact in int64
    # float64: no int64 wrap at extreme times (a histogram's input)
    extreme = final_latencies_ms(float(2**63 - 1), np.array([-(2**63)], dtype=np.float64), 0.0)
    assert extreme.tolist() == [float(2**64)]


def test_the_bulk_rule_and_record_finals_leave_their_inputs_alone() -> None:
    """The bulk rule and ``record_finals`` compute in place only in arrays they made: the
    caller's ends, watermarks and latencies (int64 or float64, negatives clamped in the
    histogram only) are as they were, and the histogram and sums see the clamped values."""
    from sessionstore.engine.emit import EngineMetrics

    ends = np.array([100, 101, 99], dtype=np.int64)
    float_ends = ends.astype(np.float64)
    watermarks = np.array([108.0, 200.0, 90.0])
    assert final_latencies_ms(108, ends, 0).tolist() == [8, 7, 9]
    assert final_latencies_ms(watermarks, float_ends, 0.0).tolist() == [8.0, 99.0, 0.0]
    assert ends.tolist() == [100, 101, 99] and float_ends.tolist() == [100.0, 101.0, 99.0]
    assert watermarks.tolist() == [108.0, 200.0, 90.0]
    for latencies in (np.array([-5.0, 3.0, 2_500.0]), np.array([-5, 3, 2_500], dtype=np.int64)):
        before = latencies.tolist()
        metrics = EngineMetrics()
        metrics.record_finals(latencies)
        assert latencies.tolist() == before
        reading = metrics.histograms()["emit-final-latency"]
        assert sum(reading.counts) == 3 and reading.sum_s == pytest.approx(2.503)


# each bucket bound in ms, one either side, negatives, and values large enough that the
# histogram's float sum is no longer exact (2**53 over the count) or the int64 sum wraps
_BOUNDS_MS = [round(b * 1000) + d for b in EVENT_TIME_BUCKETS_S for d in (-1, 0, 1)]
LATENCIES = st.lists(st.sampled_from(_BOUNDS_MS) | st.integers(-3, 3) | st.integers(-(2**40), 2**40)
                     | st.integers(2**51, 2**53) | st.integers(-(2**63), 2**63 - 1), max_size=60)


@settings(max_examples=100, deadline=None)
@given(batches=st.lists(LATENCIES, max_size=3))
def test_record_finals_of_int64_latencies_reads_as_the_float_path(
        batches: list[list[int]]) -> None:
    """``record_finals`` of an int64 array (one compiled pass: bucket, clamp, sums and max)
    gives the readings of the float path it replaced, computed here with numpy: each
    bucket's count (``searchsorted`` of the latency clamped at 0, as a float, in the bounds),
    the histogram's sum to the last bit, and the int64 (wrapping) total and maximum. Kills a
    bucket off by one at a bound, a clamp missing or applied to the totals, and a float sum
    taken from the int total where it rounds."""
    from sessionstore.engine.emit import EngineMetrics

    metrics = EngineMetrics()
    counts = np.zeros(len(EVENT_TIME_BUCKETS_S) + 1, dtype=np.int64)
    bounds_ms = np.array(EVENT_TIME_BUCKETS_S) * 1000.0
    sum_s, total, top = 0.0, 0, 0
    for batch in batches:
        latencies = np.array(batch, dtype=np.int64)
        metrics.record_finals(latencies)
        if not batch:
            continue
        clamped = np.maximum(latencies.astype(np.float64), 0.0)
        counts += np.bincount(np.searchsorted(bounds_ms, clamped, side="left"),
                              minlength=len(counts))
        sum_s += float(clamped.sum()) / 1000.0
        total += int(latencies.sum())
        top = max(top, int(latencies.max()))
    reading = metrics.histograms()["emit-final-latency"]
    assert reading.counts == tuple(counts.tolist())
    assert reading.sum_s == sum_s
    assert (metrics.final_latency_sum, metrics.final_latency_max) == (total, top)


def _build(**options: Any) -> SessionAggregator:
    grace = options.pop("grace_ms")
    windows = SessionWindows(10, grace_ms=grace)
    return SessionAggregator(InMemorySessionStore(retention_ms=windows.retention_ms), windows,
                             aggregations.count(), watermark="external", **options)


def _by_events(engine: SessionAggregator, events: list[tuple[str, int]], w: int
               ) -> list[int]:
    for key, t in events:
        engine.process(key, 1, t)
    return [emit.session.end for emit in engine.advance_watermark(w)
            if emit.pane is None or emit.pane.is_last]


def _by_table(engine: SessionAggregator, events: list[tuple[str, int]], w: int) -> list[int]:
    if events:
        engine.process_table(pa.table({"k": [k for k, _ in events], "t": [t for _, t in events],
                                       "v": [1] * len(events)}), key="k", time="t", value="v")
    return list(engine.advance_watermark_table(w, key="k").column("session_end_ms")
                .to_pylist())


PATHS: dict[str, tuple[dict[str, Any], Callable[..., list[int]]]] = {
    # closes_in_cache: the cache's end index hands the closed rows (emit_taken, inline sum)
    "event path, closes from the cache": ({"emit": EmitStrategy.ON_WINDOW_CLOSE}, _by_events),
    # no cache: closed sessions are read from the store (close_up_to)
    "event path, write-through": ({"emit": EmitStrategy.ON_WINDOW_CLOSE,
                                   "cache_max_sessions": 0}, _by_events),
    "trigger, last pane": ({"trigger": AfterWatermark()}, _by_events),
    "open-session table": ({"emit": EmitStrategy.ON_WINDOW_CLOSE}, _by_table),
}


@st.composite
def _rounds(draw: st.DrawFn) -> list[tuple[list[tuple[str, int]], int]]:
    """Rounds of (events, then the watermark moved up by a step)."""
    out = []
    w = 0
    for _ in range(draw(st.integers(1, 6))):
        events = draw(st.lists(st.tuples(st.sampled_from("abc"), st.integers(w, w + 60)),
                               max_size=6))
        w += draw(st.sampled_from([1, 5, 17, 40, 2_000, 90_000]))
        out.append((events, w))
    return out


@pytest.mark.parametrize("path", PATHS)
@settings(max_examples=40, deadline=None)
@given(rounds=_rounds(), grace=st.sampled_from([0, 3, 25]))
def test_every_path_records_the_rule_for_what_it_emits(
        path: str, rounds: list[tuple[list[tuple[str, int]], int]], grace: int) -> None:
    """Kills an off-by-grace or a wrong row in ``emit_taken``'s inline sum (the maximum is
    the first row's, the sum subtracts ``n * grace``), a latency measured from the end rather
    than the close time on any path, and a bulk histogram that counts them otherwise."""
    options, feed = PATHS[path]
    engine = _build(grace_ms=grace, **options)
    want: list[int] = []
    for events, w in rounds:
        want += [final_latency_ms(w, end, grace) for end in feed(engine, events, w)]
    metrics = engine.metrics
    assert metrics["emit-final-records-total"] == len(want)
    assert metrics["emit-final-latency-max"] == max(want, default=0)
    assert metrics["emit-final-latency-avg"] == (sum(want) / len(want) if want else 0.0)
    reading = engine.latency_histograms["emit-final-latency"]
    assert list(reading.counts) == counts_by_hand(want)
