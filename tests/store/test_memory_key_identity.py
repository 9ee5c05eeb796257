"""The in-memory store tells keys apart by their encoded bytes with a compiled hash table
(``_key_ranks``) and keeps each session's last write of a call in the call's order
(``_last_writes``): large calls (where the key encoder builds a byte matrix) and keys too long
for one, with the same session and the same key listed many times, against single calls."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionstore import InMemorySessionStore, Session

PROFILE_SCALE = settings.default.max_examples / 100

# per kind, keys of several encoded widths (msgpack's int formats, short and long strings), and
# keys too long for a byte matrix (over 256 encoded bytes: the path without one)
POOLS: dict[str, list[Any]] = {
    "int": [0, 127, 128, -1, -33, 70_000, 2**40, -(2**63)],
    "str": ["a", "b", "ab", "", "é" * 20, "x" * 40],
    "bytes": [b"a", b"\0", b"\0\0", b"", b"a\0"],
    "long": ["y" * 300, "z" * 300, "y" * 299, "s"],
    "tuple": [("a", 1), ("a", 2), ("b", 1)],
}


def contents(store: InMemorySessionStore, keys: list[Any]) -> list[Any]:
    by_time = [(tuple(s), v) for s, v in store.find_sessions(-(2**63), 2**63 - 1)]
    by_key = [[(tuple(s), v) for s, v in store.fetch(key)] for key in keys]
    return [by_time, by_key]


@settings(max_examples=round(60 * PROFILE_SCALE), deadline=None)
@given(kind=st.sampled_from(sorted(POOLS)), data=st.data(), indexed=st.booleans(),
       reads=st.booleans())
def test_large_calls_with_repeated_keys_equal_single_calls(
    kind: str, data: st.DataObject, indexed: bool, reads: bool
) -> None:
    """put_many and remove_many of 64 to 150 sessions over a few keys and a few bounds (so
    that sessions repeat within a call, under keys listed several times) leave what put and
    remove one by one leave. Kills: equal encodings ranked apart (a session written twice in
    one call is indexed twice), and the first write of a call kept instead of the last."""
    pool = POOLS[kind]
    bulk = InMemorySessionStore(retention_ms=10**6, segment_interval_ms=7)
    loop = InMemorySessionStore(retention_ms=10**6, segment_interval_ms=7)
    for call in range(data.draw(st.integers(1, 3))):
        n = data.draw(st.integers(64, 150))
        keys = [pool[i] for i in data.draw(st.lists(st.integers(0, len(pool) - 1),
                                                     min_size=n, max_size=n))]
        starts = data.draw(st.lists(st.integers(0, 20), min_size=n, max_size=n))
        ends = [s + data.draw(st.integers(0, 3)) for s in starts]
        values = [call * 1_000 + row for row in range(n)]
        if indexed:  # a key column that lists each key several times, and an index into it
            column = keys * 2
            index = np.array([row + n * data.draw(st.integers(0, 1)) for row in range(n)],
                             dtype=np.int64)
            written = bulk.put_many(column, starts, ends, values, key_index=index)
        else:
            written = bulk.put_many(keys, starts, ends, values)
        expected = [loop.put(Session(k, s, e), v)
                    for k, s, e, v in zip(keys, starts, ends, values, strict=True)]
        assert written.tolist() == expected
        gone = data.draw(st.lists(st.integers(0, n - 1), max_size=n))
        bulk.remove_many([keys[r] for r in gone], [starts[r] for r in gone],
                         [ends[r] for r in gone])
        for r in gone:
            loop.remove(Session(keys[r], starts[r], ends[r]))
        if reads:  # applies the log: later calls land on applied sessions
            assert contents(bulk, pool) == contents(loop, pool)
    assert contents(bulk, pool) == contents(loop, pool)
