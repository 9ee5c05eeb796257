"""The slotted open-session table's bookkeeping beyond what the property suite reaches: slots
and key ids reused and compacted over many keys, and a key with several open sessions."""

from __future__ import annotations

import numpy as np

from sessionstore.engine.columnar import OpenTable, PartColumns
from sessionstore.engine.open_sessions import SlottedSessions


def rows(keys: list[object], starts: list[int], ends: list[int]) -> OpenTable:
    return OpenTable(np.array(keys, dtype=object), np.array(starts, dtype=np.int64),
                     np.array(ends, dtype=np.int64),
                     [PartColumns("count", np.ones(len(keys), dtype=np.int64))])


def probed(table: SlottedSessions, keys: list[object]) -> list[tuple[object, int, int]]:
    slots, codes = table.probe(keys, None)
    starts, ends = table.bounds(slots)
    return sorted(((keys[c], s, e) for c, s, e in zip(codes.tolist(), starts.tolist(),
                                                       ends.tolist(), strict=True)),
                  key=repr)


def test_many_keys_come_and_go_and_the_index_stays_exact() -> None:
    table = SlottedSessions(["count"])
    none = np.zeros(0, dtype=np.int64)
    for round_ in range(3):  # 70k keys each round, all closed: key ids are compacted
        keys = [f"k{round_}-{i}" for i in range(70_000)]
        table.replace(none, none, rows(keys, [0] * len(keys), [10 + round_] * len(keys)))
        assert len(table) == 70_000
        closed = table.close_upto(10 + round_)
        assert len(closed) == 70_000 and len(table) == 0
        assert probed(table, keys[:3]) == []
    # 1, 1.0 and True are three keys; one key holds two sessions
    table.replace(none, none, rows([1, 1.0, True, "a", "a"], [0, 0, 0, 0, 50],
                                   [20, 21, 22, 30, 60]))
    assert len(table._key_ids) == 4  # the ids of keys with no open session were dropped
    assert probed(table, [1, True, "a", "b"]) == sorted(
        [(1, 0, 20), (True, 0, 22), ("a", 0, 30), ("a", 50, 60)], key=repr)
    closed = table.close_upto(21)
    got = sorted(zip(map(repr, closed.key_list()), closed.ends_ms.tolist(), strict=True))
    assert got == [("1", 20), ("1.0", 21)]  # repr: 1 and 1.0 compare equal
    assert probed(table, [1, 1.0, True]) == [(True, 0, 22)]
    assert sorted(table.live_ends()) == [22, 30, 60]
