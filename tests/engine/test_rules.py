"""Each rule's one home, and its other forms pinned to it (the gap convention, the
closed-before rule, the store's session order, the capped session end, retention, the
event-time overflow rule, the record layout).

The gap-boundary convention is :func:`sessionstore.gap_boundary.reaches`; ``merge_bounds`` (the
closed range a store scans) and ``join_range`` (that range with the close-cursor floor) must say
exactly what it says, for every relative position of a session, an event and the close cursor.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sessionstore import (
    InMemorySessionStore,
    SessionAggregator,
    SessionWindows,
    aggregations,
    keyschema,
)
from sessionstore.engine.columnar import SessionRows
from sessionstore.engine.config import required_retention_ms
from sessionstore.engine.cuts import cut, cut_pieces, cut_until_unchanged
from sessionstore.engine.max_duration_state import own_window_end
from sessionstore.engine.merge import join_range, merge_event
from sessionstore.engine.record import (
    Phase,
    SessionRecord,
    acc_of,
    events_of,
    plain_record,
    record_with_events,
)
from sessionstore.gap_boundary import first_open_end, is_final, merge_bounds, reaches
from sessionstore.packing import pack_session_records
from sessionstore.serde import MsgpackSerde
from sessionstore.types import Session
from sessionstore.windows import latest_event_time_ms, minimum_retention_ms


@pytest.mark.parametrize("inclusive", [True, False])
def test_merge_bounds_is_reaches_both_ways(inclusive: bool) -> None:
    for start, length, t, gap in itertools.product(range(-3, 4), range(1, 4), range(-4, 5),
                                                   range(1, 4)):
        end, own_end = start + length, t + gap
        earliest_end, latest_start = merge_bounds(t, own_end, inclusive)
        by_range = end >= earliest_end and start <= latest_start
        by_rule = reaches(end, t, inclusive) and reaches(own_end, start, inclusive)
        assert by_range == by_rule, (start, end, t, own_end)


@pytest.mark.parametrize("inclusive", [True, False])
def test_join_range_is_the_rule_above_the_close_cursor(inclusive: bool) -> None:
    for start, length, t, gap, closed in itertools.product(
            range(-3, 4), range(1, 4), range(-3, 4), range(1, 3), range(-3, 5)):
        end, own_end = start + length, t + gap
        floor, latest_start = join_range(t, own_end, closed, inclusive)
        joins = end >= floor and start <= latest_start
        want = (not is_final(end, closed) and reaches(end, t, inclusive)
                and reaches(own_end, start, inclusive))
        assert joins == want, (start, end, t, own_end, closed)
        _, _, joined = merge_event([(start, end)], t, own_end, closed, inclusive)
        assert joined == ([(start, end)] if want else [])


def test_touching_reaches_only_when_inclusive() -> None:
    assert reaches(10, 10, True) and not reaches(10, 10, False)
    assert reaches(10, 9, False) and not reaches(10, 11, True)
    ends = np.array([10, 10, 10])
    points = np.array([9, 10, 11])
    assert reaches(ends, points, True).tolist() == [True, True, False]
    assert reaches(ends, points, False).tolist() == [True, False, False]


def test_a_session_ending_at_the_close_cursor_is_final() -> None:
    assert is_final(10, 10) and is_final(9, 10) and not is_final(11, 10)
    for closed in (-3, 0, 10, 2**63 - 2):
        assert first_open_end(closed) == closed + 1  # the smallest end that is not final
        assert not is_final(first_open_end(closed), closed) and is_final(closed, closed)
    assert first_open_end(2**63 - 1) == 2**63 - 1  # a store time fits int64
    ends = np.array([9, 10, 11])
    assert is_final(ends, 10).tolist() == [True, True, False]
    assert is_final(ends, np.array([8, 10, 12])).tolist() == [False, True, True]


# -- the store's session order: (end, encoded key, start), the time-first byte order ----------

_KEYS = st.one_of(st.integers(-(2**63), 2**63 - 1), st.text(max_size=4), st.binary(max_size=4),
                  st.tuples(st.integers(-3, 3), st.text(max_size=2)))
_TIMES = st.integers(-(2**62), 2**62)


@given(st.lists(st.tuples(_KEYS, _TIMES, _TIMES), max_size=12))
def test_store_order_is_the_time_first_byte_order(rows: list[tuple[Any, int, int]]) -> None:
    sessions = [Session(key, start, end) for key, start, end in rows]
    by_bytes = sorted(sessions, key=lambda s: keyschema.time_first(
        keyschema.encode_key(s.key), s.end, s.start))
    by_order = sorted(sessions, key=keyschema.session_order)
    assert [keyschema.session_order(s) for s in by_order] == \
        [keyschema.session_order(s) for s in by_bytes]
    for s in sessions:
        assert keyschema.session_order(s) == keyschema.store_order(
            s.end, keyschema.encode_key(s.key), s.start)


@given(st.lists(st.tuples(st.one_of(st.integers(-(2**40), 2**40), st.text(max_size=3)),
                          st.integers(-50, 50), st.integers(1, 20)), max_size=12))
def test_the_columnar_store_order_is_session_order(rows: list[tuple[Any, int, int]]) -> None:
    sessions = list({Session(key, start, start + length) for key, start, length in rows})
    table = SessionRows.from_rows(["count"], [(s, 1) for s in sessions], combined=False)
    keys = table.key_list()
    ordered = [(keys[i], int(table.starts_ms[i]), int(table.ends_ms[i]))
               for i in table.store_order().tolist()]
    assert ordered == [tuple(s) for s in sorted(sessions, key=keyschema.session_order)]


# -- the capped session end: every cut ends at own_window_end(start, max_end, max_duration) ---

@st.composite
def _cut_events(draw: st.DrawFn, fixed_gap: bool) -> tuple[list[list[Any]], int]:
    times = sorted(draw(st.lists(st.integers(-50, 50), min_size=1, max_size=14)))
    gap = draw(st.integers(1, 12))
    events = [[t, seq, t + (gap if fixed_gap else draw(st.integers(1, 12))), None]
              for seq, t in enumerate(times)]
    return events, draw(st.integers(1, 30))


def _check_capped(bounds: list[tuple[int, int, int]], md: int) -> None:
    assert bounds, "a cut of events has sessions"
    for start, end, max_end in bounds:
        assert end == own_window_end(start, max_end, md), (start, end, max_end, md)
        assert end == min(max_end, start + md)  # the definition, written out once more here


@given(_cut_events(fixed_gap=False), st.booleans())
def test_the_cuts_end_each_session_at_its_own_window_end(case: tuple[list[list[Any]], int],
                                                         inclusive: bool) -> None:
    events, md = case
    cuts = cut(events, md, inclusive)
    _check_capped([(a, b, c) for a, b, c, _ in cuts], md)
    low = 0
    for start, _, max_end, stop in cuts:  # the largest own end is that of the session's events
        assert start == events[low][0] and max_end == max(e[2] for e in events[low:stop])
        low = stop
    again, used = cut_until_unchanged(list(events), 0, lambda i: [], md, inclusive)
    assert (again, used) == (cuts, 0)


@given(_cut_events(fixed_gap=True), st.booleans())
def test_the_binary_search_cut_ends_each_session_at_its_own_window_end(
        case: tuple[list[list[Any]], int], inclusive: bool) -> None:
    events, md = case
    recut, used, _ = cut_pieces([[e] for e in events], 0, 0, lambda i: [], md, inclusive)
    _check_capped([(a, b, c) for a, b, c, _, _ in recut], md)
    assert used == 0
    assert [(a, b, c) for a, b, c, _, _ in recut] == \
        [(a, b, c) for a, b, c, _ in cut(events, md, inclusive)]


# -- retention and the event-time overflow rule: one function each ------------------------

def test_the_retention_minimum_is_one_rule() -> None:
    for windows, minimum in ((SessionWindows(10, 3), 13),
                             (SessionWindows(10, 3, max_duration_ms=7), 20),
                             (SessionWindows(None, 2, max_gap_ms=12), 14)):
        assert minimum_retention_ms(windows.max_gap_ms, windows.grace_ms,
                                    windows.max_duration_ms) == minimum
        assert windows.retention_ms == minimum  # the default
        assert required_retention_ms(windows, 5, "event_time") == minimum + 5
        assert required_retention_ms(windows, 5, "external") == minimum
    with pytest.raises(ValueError, match="retention_ms must be >= gap_ms \\+ grace_ms "
                                         "\\+ max_duration_ms = 20, got 19"):
        SessionWindows(10, 3, max_duration_ms=7, retention_ms=19)


def test_both_batch_paths_refuse_an_event_whose_window_end_leaves_int64() -> None:
    windows = SessionWindows(10, 3)
    latest = latest_event_time_ms(windows.max_gap_ms, windows.grace_ms)
    assert latest == 2**63 - 1 - 13
    gaps = np.array([0, 5, 13], dtype=np.int64)
    assert latest_event_time_ms(gaps, 3).tolist() == [2**63 - 4, 2**63 - 9, 2**63 - 17]
    engine = SessionAggregator(InMemorySessionStore(retention_ms=13), windows,
                               aggregations.count())
    engine.process_batch(["k", "k"], [1, 2], [0, latest])  # the last time that fits
    with pytest.raises(ValueError, match=rf"timestamps_ms\[1\] = {latest + 1}: \+ gap_ms "
                                         r"\+ grace_ms overflows int64"):
        engine.process_batch(["k", "k"], [1, 2], [0, latest + 1])
    with pytest.raises(ValueError, match=rf"t\[1\] = {latest + 1}: \+ gap_ms \+ grace_ms "
                                         r"overflows int64"):
        engine.process_table(pa.table({"k": ["k", "k"], "t": [1, latest + 1]}), key="k",
                             time="t")


# -- the record layout: one module owns it; the fast forms are pinned to SessionRecord ---------

RECORD_ACCS = [0, 7, -3, 2.5, None, "x", [1, 2.0], {"a": 1}]


@pytest.mark.parametrize("acc", RECORD_ACCS)
def test_record_accessors_are_session_record(acc: object) -> None:
    assert list(plain_record(acc)) == SessionRecord(acc).to_wire()
    assert acc_of(plain_record(acc)) == acc
    assert acc_of(SessionRecord(acc, 3, 2, Phase.LATE, 9).to_wire()) == acc
    assert events_of(plain_record(acc)) is None
    with_events = record_with_events(acc, [[1, 2]], 40)
    assert SessionRecord.from_wire(with_events) == SessionRecord(acc)
    assert acc_of(with_events) == acc
    assert events_of(with_events) == ([[1, 2]], 40)
    with pytest.raises(ValueError, match="not a session record"):
        acc_of([acc, 0, 0])


def test_the_batch_paths_record_forms_are_plain_records() -> None:
    """The columnar table's records and the packed bytes are plain_record's, byte for byte."""
    ints = np.array([0, 5, -(2**40)], dtype=np.int64)
    floats = np.array([0.5, -1.0, 3e300])
    serde = MsgpackSerde()
    single = pack_session_records([ints], combined=False)
    assert single is not None
    assert list(single) == [serde.dumps(plain_record(v)) for v in ints.tolist()]
    both = pack_session_records([ints, floats], combined=True)
    assert both is not None
    assert list(both) == [serde.dumps(plain_record([a, b]))
                          for a, b in zip(ints.tolist(), floats.tolist(), strict=True)]
    counts = [1, 4, 2]
    rows = [(Session("k", 0, 10 + i), [n]) for i, n in enumerate(counts)]
    table = SessionRows.from_rows(["count"], rows, combined=True)
    assert table.wire_records(combined=True) == [plain_record([n]) for n in counts]
    table = SessionRows.from_rows(["count"], [(s, acc[0]) for s, acc in rows], combined=False)
    assert table.wire_records(combined=False) == [plain_record(n) for n in counts]
