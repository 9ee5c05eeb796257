"""Scenarios of Kafka Streams' session-store and session-aggregation tests, replayed through our
store and engine (both backends). Each test names the peer test it follows and what it asserts.

Kafka's session windows end at the last event ([first, last]); ours end at last + gap
([first, last + gap)), so engine scenarios are translated: the sessions and their contents are
the peer's, the ends are ours.
"""

from __future__ import annotations

from typing import Any

import pytest

from sessionstore import (
    EmitStrategy,
    InMemorySessionStore,
    SessionAggregator,
    SessionWindows,
    aggregations,
)
from sessionstore.types import Session

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def values(rows: Any) -> list[Any]:
    return [v for _, v in rows]


def test_find_sessions_for_time_range_bounds_are_inclusive(make_store):
    # AbstractSessionBytesStoreTest.shouldFindSessionsForTimeRange
    store = make_store(retention_ms=10_000)
    store.put(Session("a", 0, 0), 5)
    assert values(store.find_sessions(0, 0)) == [5]
    store.put(Session("b", 10, 20), 10)
    store.put(Session("c", 30, 40), 20)
    cases = {(0, 20): [5, 10], (0, 19): [5], (1, 20): [10], (19, 41): [10, 20],
             (0, 40): [5, 10, 20], (41, 0): []}
    for (lo, hi), expected in cases.items():
        assert values(store.find_sessions(lo, hi)) == expected, (lo, hi)


def test_find_sessions_to_merge_and_fetch_exact_session(make_store):
    # shouldFindSessionsToMerge, shouldFetchExactSession, shouldReturnNullOnSessionNotFound,
    # shouldFindValuesWithinMergingSessionWindowRange, shouldNotThrowExceptionRemovingNonexistentKey
    store = make_store(retention_ms=10_000)
    for i, (start, end) in enumerate([(0, 100), (101, 200), (201, 300), (301, 400),
                                      (401, 500)]):
        store.put(Session("a", start, end), i + 1)
    assert values(store.find_sessions_to_merge("a", 150, 300)) == [2, 3]
    for key, start, end, value in [("a", 0, 4, 1), ("aa", 0, 3, 2), ("aa", 0, 4, 3),
                                   ("aa", 1, 4, 4), ("aaa", 0, 4, 5)]:
        store.put(Session(key, start, end), value)
    assert store.fetch_session("aa", 0, 4) == 3
    assert store.fetch_session("any key", 0, 5) is None
    store.put(Session("m", 0, 0), 1)
    store.put(Session("m", 1000, 1000), 2)
    assert values(store.find_sessions_to_merge("m", -1, 1000)) == [1, 2]
    store.remove(Session("nobody", 0, 1))


def test_fetch_exact_keys_with_a_huge_retention(make_store):
    # shouldFetchExactKeys: prefix keys stay apart, times near the top of int64
    huge = 0x7A00000000000000
    store = make_store(retention_ms=huge)
    for key, start, end, value in [("a", 0, 0, 1), ("aa", 0, 10, 2), ("a", 10, 20, 3),
                                   ("aa", 10, 20, 4), ("a", huge - 2, huge - 1, 5)]:
        store.put(Session(key, start, end), value)
    assert sorted(values(store.find_sessions_to_merge("a", 0, INT64_MAX))) == [1, 3, 5]
    assert sorted(values(store.find_sessions_to_merge("aa", 0, INT64_MAX))) == [2, 4]
    assert values(store.fetch("a")) == [1, 3, 5]  # ordered by end


def test_exact_binary_keys_that_prefix_each_other(make_store):
    # shouldFetchAndIterateOverExactBinaryKeys
    store = make_store(retention_ms=10_000)
    keys = [b"\x00", b"\x00\x00", b"\x00\x00\x00"]
    for i in range(9):
        store.put(Session(keys[i % 3], i + 1, 100), str(i + 1))
    for k, expected in zip(keys, [["1", "4", "7"], ["2", "5", "8"], ["3", "6", "9"]],
                           strict=True):
        assert values(store.find_sessions_to_merge(k, 0, INT64_MAX)) == expected
    # text and bytes of the same spelling are two keys
    store.put(Session("\x00", 1, 100), "text")
    assert values(store.fetch("\x00")) == ["text"]
    assert "text" not in values(store.fetch(b"\x00"))


def test_a_put_into_an_expired_segment_is_dropped_and_counted(make_store):
    # shouldMeasureExpiredRecords: segment interval 60 s, retention 10 s
    store = make_store(retention_ms=10_000, segment_interval_ms=60_000)
    assert store.put(Session("initial record", 0, 120_000), 0)
    assert not store.put(Session("late record", 0, 0), 0)
    assert store.put(Session("another on-time record", 0, 120_000), 0)
    assert store.metrics["dropped-records"] == 1
    assert sorted(s.key for s, _ in store.find_sessions(INT64_MIN, INT64_MAX)) == [
        "another on-time record", "initial record"]


def test_negative_and_extreme_times_keep_their_order(make_store):
    # sign-flipped big-endian times: negative ends sort before positive ones, also at INT64_MIN
    store = make_store(retention_ms=INT64_MAX, segment_interval_ms=1_000)
    sessions = [(INT64_MIN, INT64_MIN), (-70_000, -65_000), (-5, -1), (0, 0), (1, 2)]
    for i, (start, end) in enumerate(reversed(sessions)):
        store.put(Session("k", start, end), i)
    # Kafka's read rule: with stream time 2, ends below 2 - retention + 1 = INT64_MIN + 4 are
    # expired to readers, so the session ending at INT64_MIN is hidden...
    assert [(s.start, s.end) for s, _ in store.fetch("k")] == sessions[1:]
    # ...until expiry is capped at INT64_MIN (as the engine caps it while sessions are open)
    store.cap_expiry_time(INT64_MIN)
    assert [(s.start, s.end) for s, _ in store.fetch("k")] == sessions
    assert [(s.start, s.end) for s, _ in store.find_sessions(-70_000, 0)] == sessions[1:4]
    assert [(s.start, s.end) for s, _ in store.find_sessions_to_merge("k", -1, 1)] == [
        (-5, -1), (0, 0), (1, 2)]
    top = make_store(retention_ms=10_000)
    assert top.put(Session("k", INT64_MAX - 1, INT64_MAX), "top")
    assert values(top.find_sessions(INT64_MAX, INT64_MAX)) == ["top"]
    assert values(top.find_sessions_to_merge("k", INT64_MAX, INT64_MAX)) == ["top"]


# -- KStreamSessionWindowAggregateProcessorTest, on the engine -------------------------------------

GAP = 5 * 60 * 1000


def engine(emit: EmitStrategy, gap: int = GAP, grace: int = 0) -> SessionAggregator:
    windows = SessionWindows(gap, grace)
    return SessionAggregator(InMemorySessionStore(retention_ms=windows.retention_ms), windows,
                             aggregations.count(), emit=emit, watermark="external")


def test_kafka_merge_sessions_out_of_order():
    # shouldMergeSessions: events at 0 and GAP + 1 are two sessions, one at GAP / 2 bridges them
    e = engine(EmitStrategy.ON_WINDOW_UPDATE)
    e.process("mel", "first", 0)
    e.process("mel", "second", GAP + 1)
    assert [(s.start, v) for s, v in e.sessions("mel")] == [(0, 1), (GAP + 1, 1)]
    out = e.process("mel", "third", GAP // 2)
    assert [(s.start, s.end, v) for s, v in e.sessions("mel")] == [(0, 2 * GAP + 1, 3)]
    # both sessions it replaced are retracted, then the merged one is emitted
    assert [(x.session.start, x.value, x.retraction) for x in out] == [
        (0, 1, True), (GAP + 1, 1, True), (0, 3, False)]


def test_kafka_multiple_sessions_and_merging_per_key():
    # shouldHandleMultipleSessionsAndMerging, final results per key
    e = engine(EmitStrategy.ON_WINDOW_CLOSE)
    for key, t in [("a", 0), ("b", 0), ("c", 0), ("d", 0), ("d", GAP // 2), ("a", GAP + 1),
                   ("b", GAP + 1), ("a", GAP + 1 + GAP // 2), ("c", GAP + 1 + GAP // 2)]:
        e.process(key, "x", t)
    out = e.advance_watermark(10 * GAP)
    got = sorted((x.session.key, x.session.start, x.value) for x in out)
    assert got == [("a", 0, 1), ("a", GAP + 1, 2), ("b", 0, 1), ("b", GAP + 1, 1), ("c", 0, 1),
                   ("c", GAP + 1 + GAP // 2, 1), ("d", 0, 2)]


@pytest.mark.parametrize("grace", [0, 1])
def test_kafka_late_record_is_dropped_and_counted(grace):
    # shouldLogAndMeterWhenSkippingLateRecordWith{Zero,Nonzero}Grace, translated: Kafka drops a
    # record whose session [t, t] ends before stream time - grace; ours drops it when its window
    # [t, t + gap) is closed, W >= t + gap + grace
    gap = 10
    late: list[int] = []
    windows = SessionWindows(gap, grace)
    e = SessionAggregator(InMemorySessionStore(retention_ms=windows.retention_ms), windows,
                          aggregations.count(), emit=EmitStrategy.ON_WINDOW_CLOSE,
                          on_late=lambda key, value, t: late.append(t))
    out = e.process("dummy", "dummy", 0)
    out += e.process("OnTime1", "1", 0)
    out += e.process("dummy", "dummy", gap + grace - 1)
    out += e.process("OnTime2", "1", 0)        # W = gap + grace - 1 < 0 + gap + grace
    out += e.process("dummy", "dummy", gap + grace)
    out += e.process("Late1", "1", 0)          # W = gap + grace: closed
    assert late == [0] and e.metrics["dropped-records"] == 1
    out += e.advance_watermark(1_000)
    assert sorted((x.session.key, x.session.start, x.value) for x in out) == [
        ("OnTime1", 0, 1), ("OnTime2", 0, 1), ("dummy", 0, 3)]


# -- Flink WindowOperatorTest, session windows with allowed lateness -------------------------------

FLINK_STEPS: list[Any] = [1000, ("W", 1999), 2000, ("W", 4998), 4500, 8500, ("W", 7400), 7000,
                          ("W", 11501), 11600, ("W", 14600), 10000, 14500, ("W", 20000),
                          ("W", 100000)]


@pytest.mark.parametrize(("lateness", "expected"), [
    # testDropDueToLatenessSessionZeroLateness: 10000 is dropped; 14500 cannot join the fired
    # and purged [11600, 14600) and forms a session of its own
    (0, [(1000, 11500, 5), (11600, 14600, 1), (14500, 17500, 1)]),
    # testDropDueToLatenessSessionWithHugeLateness: 10000 bridges both fired sessions, the
    # merged window is behind the watermark and fires at once; 14500 extends it
    (10_000, [(1000, 11500, 5), (11600, 14600, 1), (1000, 14600, 7), (1000, 17500, 8)]),
])
def test_flink_session_lateness_with_an_accumulating_event_time_trigger(lateness, expected):
    # Flink's EventTimeTrigger fires at the watermark and on every element of a window already
    # behind it: AfterWatermark(late=AfterCount(1)), accumulating. Flink's watermark Wf means
    # "every time <= Wf was seen" and fires [s, e) at Wf >= e - 1; ours fires it at W >= e, so
    # W = Wf + 1; allowed lateness is grace.
    from sessionstore import AccumulationMode, AfterCount, AfterWatermark, ManualClock

    windows = SessionWindows(3000, grace_ms=lateness)
    e = SessionAggregator(InMemorySessionStore(retention_ms=windows.retention_ms), windows,
                          aggregations.count(), watermark="external", clock=ManualClock(0),
                          trigger=AfterWatermark(late=AfterCount(1)),
                          accumulation=AccumulationMode.ACCUMULATING)
    out = []
    for step in FLINK_STEPS:
        if isinstance(step, tuple):
            out += e.advance_watermark(step[1] + 1)
        else:
            out += e.process("key2", 1, step)
    assert [(x.session.start, x.session.end, x.value) for x in out] == expected
