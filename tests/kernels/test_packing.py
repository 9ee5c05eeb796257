"""pack_session_records against msgpack itself, and the stores' handling of packed values."""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionstore import InMemorySessionStore, Session, SessionStore
from sessionstore.arrays import ByteRows
from sessionstore.packing import PackedValues, pack_session_records

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
# every edge of msgpack's int formats, and anything in between
EDGES = [0, 1, -1, -32, -33, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, INT64_MAX,
         INT64_MIN, -128, -129, -32768, -32769, -(2**31), -(2**31) - 1]
INTS = st.one_of(st.sampled_from(EDGES), st.integers(-300, 300),
                 st.integers(INT64_MIN, INT64_MAX))
FLOATS = st.floats(allow_nan=False)


def packed_by_msgpack(columns: list[list[Any]], combined: bool) -> list[bytes]:
    """What the serde writes for each record, one Python value at a time."""
    pack = msgpack.Packer(use_bin_type=True).pack
    rows = list(zip(*columns, strict=True))
    return [pack(([*row] if combined else row[0], 0, 0, 0, None)) for row in rows]


@settings(max_examples=200)
@given(st.data())
def test_packed_records_are_msgpacks_bytes(data: st.DataObject) -> None:
    n = data.draw(st.integers(0, 30))
    parts = data.draw(st.integers(1, 4))
    combined = parts > 1 or data.draw(st.booleans())
    kinds = [data.draw(st.sampled_from(["int", "float"])) for _ in range(parts)]
    columns = [data.draw(st.lists(INTS if kind == "int" else FLOATS, min_size=n, max_size=n))
               for kind in kinds]
    arrays = [np.array(column, dtype=np.int64 if kind == "int" else np.float64)
              for column, kind in zip(columns, kinds, strict=True)]
    got = pack_session_records(arrays, combined=combined)
    assert type(got) is PackedValues
    expected = packed_by_msgpack([a.tolist() for a in arrays], combined)
    # packed when first read (the in-memory store logs them unread): taking rows first takes
    # columns, and changing the caller's columns afterwards changes nothing
    assert got.is_packed() == (n == 0) and len(got) == n
    picked = data.draw(st.lists(st.integers(0, max(n - 1, 0)), max_size=6 if n else 0))
    taken = got.take(np.array(picked, dtype=np.int64))
    assert taken.is_packed() == (n == 0) and len(taken) == len(picked)
    for array in arrays:
        array[:] = 0
    assert list(taken) == [expected[i] for i in picked]
    # as byte rows (what the in-memory store logs), then as bytes objects
    assert got.rows().tolist() == expected and got.is_packed()
    assert list(got.take(np.array(picked, dtype=np.int64))) == [expected[i] for i in picked]
    assert list(got) == expected and len(got) == n
    assert [msgpack.unpackb(b) for b in got] == [
        [[*row] if combined else row[0], 0, 0, 0, None]
        for row in zip(*columns, strict=True)]


@settings(max_examples=150)
@given(st.data())
def test_columns_of_mostly_one_format_are_msgpacks_bytes(data: st.DataObject) -> None:
    """Counts are mostly small with a few large: most rows share one layout, the rest do not
    (row 0 among them or not), which is packed by writing every row in the commonest layout
    into one padded matrix and the others over theirs, each with its own length. Kills: the
    others left in the common layout, the common layout taken from row 0, and a row cut at
    another row's length."""
    n = data.draw(st.integers(2, 60))
    parts = data.draw(st.integers(1, 3))
    combined = parts > 1 or data.draw(st.booleans())
    ranges = [(0, 127), (128, 255), (-32, -1), (256, 65535), (2**32, 2**40)]
    arrays = []
    for _ in range(parts):
        if data.draw(st.integers(0, 4)) == 0:
            arrays.append(np.array(data.draw(st.lists(FLOATS, min_size=n, max_size=n)),
                                   dtype=np.float64))
            continue
        low, high = data.draw(st.sampled_from(ranges))
        column = data.draw(st.lists(st.integers(low, high), min_size=n, max_size=n))
        for row in data.draw(st.lists(st.integers(0, n - 1), max_size=max(1, n // 5))):
            column[row] = data.draw(INTS)
        arrays.append(np.array(column, dtype=np.int64))
    got = pack_session_records(arrays, combined=combined)
    assert type(got) is PackedValues
    expected = packed_by_msgpack([a.tolist() for a in arrays], combined)
    # as byte rows (what the in-memory store logs), then as bytes objects
    assert got.rows().tolist() == expected
    picked = data.draw(st.lists(st.integers(0, max(n - 1, 0)), max_size=6 if n else 0))
    assert list(got.take(np.array(picked, dtype=np.int64))) == [expected[i] for i in picked]
    assert list(got) == expected and len(got) == n


def test_other_columns_are_not_packed() -> None:
    ints = np.arange(3, dtype=np.int64)
    assert pack_session_records([ints.astype(object)], combined=False) is None
    assert pack_session_records([ints.astype(np.int32)], combined=False) is None
    assert pack_session_records([ints, ints], combined=False) is None  # two parts, one acc
    assert pack_session_records([ints] * 16, combined=True) is None  # beyond a fixarray
    assert pack_session_records([], combined=True) is None


class JsonLikeSerde:
    def dumps(self, value: Any) -> bytes:
        return repr(value).encode()

    def loads(self, data: bytes) -> Any:
        raise AssertionError("not read here")


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
def test_stores_write_packed_values_as_they_are(backend: str, tmp_path: Any) -> None:
    store = (InMemorySessionStore(retention_ms=1_000) if backend == "memory"
             else SessionStore(tmp_path / "s", retention_ms=1_000))
    try:
        packed = pack_session_records([np.array([3, 70_000], dtype=np.int64)], combined=False)
        assert packed is not None
        store.put_many(["a", "b"], [0, 5], [10, 15], packed)
        assert store.fetch_session("a", 0, 10) == [3, 0, 0, 0, None]
        assert store.fetch_session("b", 5, 15) == [70_000, 0, 0, 0, None]
    finally:
        store.close()


def test_a_store_with_another_serde_refuses_packed_values() -> None:
    store = InMemorySessionStore(retention_ms=1_000, value_serde=JsonLikeSerde())
    store.put(Session("z", 0, 1), "before")
    packed = PackedValues([b"\x95\x01\x00\x00\x00\xc0"])
    with pytest.raises(TypeError, match="packed with msgpack, but this store's serde is "
                                        "JsonLikeSerde"):
        store.put_many(["a"], [0], [10], packed)
    assert [tuple(s) for s, _ in store.fetch("a")] == []


def test_the_memory_store_packs_values_logged_as_columns_when_read() -> None:
    """Packed values of columns reach the in-memory store's log unpacked, split across
    segments; the caller's columns changing afterwards changes nothing; a read packs them
    and sees msgpack's records, also after a compaction (which packs them too)."""

    counts = np.array([1, 300, 7, 70_000], dtype=np.int64)
    packed = pack_session_records([counts], combined=False)
    assert packed is not None and not packed.is_packed()
    store = InMemorySessionStore(retention_ms=10**6, segment_interval_ms=10)
    store.put_many(["a", "b", "c", "d"], [0, 5, 12, 13], [4, 9, 14, 25], packed)
    logged = [bulk.data for segment in store._segments.values()  # noqa: SLF001
              for bulk in segment._pending]  # noqa: SLF001 - the log is the subject here
    assert len(logged) == 3  # segments 0, 1 and 2
    assert all(type(data) is PackedValues and not data.is_packed() for data in logged)
    counts[:] = -1
    segment = store._segments[1]  # noqa: SLF001
    segment.compact()
    compacted = [bulk.data for bulk in segment._pending]  # noqa: SLF001
    assert [type(data) for data in compacted] == [ByteRows]
    assert [data.tolist() for data in compacted if type(data) is ByteRows] == [
        packed_by_msgpack([[7]], False)]
    assert [(tuple(s), v) for s, v in store.find_sessions(0, 30)] == [
        (("a", 0, 4), [1, 0, 0, 0, None]), (("b", 5, 9), [300, 0, 0, 0, None]),
        (("c", 12, 14), [7, 0, 0, 0, None]), (("d", 13, 25), [70_000, 0, 0, 0, None])]
