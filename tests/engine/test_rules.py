"""Each rule's one home, and its other forms pinned to it (the gap convention, the record
layout).

The gap-boundary convention is :func:`sessionstore.gap_boundary.reaches`; ``merge_bounds`` (the
closed range a store scans) and ``join_range`` (that range with the close-cursor floor) must say
exactly what it says, for every relative position of a session, an event and the close cursor.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from sessionstore.engine.columnar import SessionRows
from sessionstore.engine.merge import join_range, merge_event
from sessionstore.engine.record import (
    Phase,
    SessionRecord,
    acc_of,
    events_of,
    plain_record,
    record_with_events,
)
from sessionstore.gap_boundary import merge_bounds, reaches
from sessionstore.packing import pack_session_records
from sessionstore.serde import MsgpackSerde
from sessionstore.types import Session


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
        want = (end > closed and reaches(end, t, inclusive)
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
