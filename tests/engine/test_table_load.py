"""The open-session table read back from the store in bulk (``find_sessions_columns`` and
``table_from_columns``, the path of a cold start, a reopen and an abort) against the row read
it replaces (``find_sessions`` and ``table_from_rows``).

Random stores on both backends, behind the engine's write cache (sizes down to 0, so some
writes are still cached and uncommitted when the table is read) and the metered layer: keys of
every kind the store takes (ints across msgpack's formats, str including long and non-ASCII
ones, bytes, tuples, and mixes), records of every built-in kind (count, int and float sums,
min, max, first, last, collect, and combinations), bulk writes (packed, as the batch path
writes them), single puts, removes, commits and aborts, 1 ms segments and minimum retention
(so expiry and the read floor cut sessions), and a low bound drawn at exact session ends. The
two reads must give the same table (as a multiset of key, start, end and accumulator, types
kept apart), or raise the same error. Damaged records and keys must raise exactly what the
row read raises.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sessionstore import InMemorySessionStore, SessionStore
from sessionstore.engine.columnar import NotColumnar, PartColumns, SessionRows
from sessionstore.engine.record import plain_record
from sessionstore.engine.table import OpenSessions
from sessionstore.engine.table_load import load_open_sessions, table_from_columns, table_from_rows
from sessionstore.keyschema import encode_key
from sessionstore.packing import PackedValues, pack_session_records
from sessionstore.store.caching import CachingSessionStore
from sessionstore.store.metered import MeteredSessionStore
from sessionstore.timeutil import INT64_MAX, INT64_MIN
from sessionstore.types import Session

INT_KEYS = st.one_of(st.integers(-40, 300), st.integers(INT64_MIN, INT64_MAX),
                     st.sampled_from([127, 128, 255, 256, 65535, 65536, 2**32, -32, -33, -128,
                                      -129, -(2**31), -(2**31) - 1, INT64_MIN, INT64_MAX]))
STR_KEYS = st.one_of(st.text(max_size=4), st.text(min_size=30, max_size=40),
                     st.sampled_from(["", "é", "\U0001f600", "a" * 31, "a" * 32, "b" * 256]))
BYTES_KEYS = st.one_of(st.binary(max_size=4), st.binary(min_size=250, max_size=260))
TUPLE_KEYS = st.tuples(st.integers(-3, 3), st.text(max_size=2))
KEY_FAMILIES = {
    "int": INT_KEYS, "str": STR_KEYS, "bytes": BYTES_KEYS, "tuple": TUPLE_KEYS,
    "mixed": st.one_of(st.integers(-3, 3), st.text(max_size=2), st.binary(max_size=2),
                       TUPLE_KEYS),
}
# (kinds, combined, what each part's accumulator is drawn from)
FLOATS = st.one_of(st.floats(allow_nan=False, width=64),
                   st.sampled_from([0.0, -0.0, math.inf, 1.5]))
ITEM = st.tuples(st.integers(-5, 5), st.integers(0, 9), st.integers(-3, 3))
AGGREGATIONS: dict[str, tuple[list[str], bool, list[Any]]] = {
    "count": (["count"], False, [st.integers(1, 2**40)]),
    "sum-int": (["sum"], False, [st.integers(INT64_MIN, INT64_MAX)]),
    "sum-float": (["sum"], False, [FLOATS]),
    "sum-mixed": (["sum"], False, [st.one_of(st.integers(-9, 9), FLOATS)]),
    "min": (["min"], False, [st.integers(-(2**40), 2**40)]),
    "max-float": (["max"], False, [FLOATS]),
    "first": (["first"], False, [ITEM.map(list)]),
    "last": (["last"], False, [ITEM.map(list)]),
    "collect": (["collect"], False, [st.lists(ITEM.map(list), min_size=1, max_size=3)]),
    "combined": (["count", "sum", "max"], True,
                 [st.integers(1, 300), st.integers(-(2**62), 2**62), FLOATS]),
    "combined-one": (["sum"], True, [FLOATS]),
    "combined-first": (["count", "first"], True, [st.integers(1, 9), ITEM.map(list)]),
}
NUMERIC = {"count", "sum", "min", "max"}


def _tag(value: Any) -> Any:
    """A value with its type, so that 1, 1.0, True and -0.0 compare apart."""
    if isinstance(value, list | tuple):
        return (type(value).__name__, tuple(map(_tag, value)))
    if isinstance(value, float):
        return ("float", repr(value))
    return (type(value).__name__, value)


def contents(table: OpenSessions) -> Counter[Any]:
    """The table as a multiset of (key, start, end, accumulator parts in stored form), after
    checking that each key's sessions are all found by looking the key up (one key id per
    key: equal keys written in different encodings must not get two)."""
    rows = table.rows(table.live_slots())
    keys = rows.key_list()
    per_key = Counter(map(_tag, keys))
    distinct = list({_tag(key): key for key in keys}.values())
    slots, codes = table.probe(table.index.lookup(distinct))
    assert Counter(_tag(distinct[c]) for c in codes.tolist()) == per_key
    accs = list(zip(*(part.wire() for part in rows.parts), strict=True))
    return Counter(zip(map(_tag, keys), rows.starts_ms.tolist(),
                       rows.ends_ms.tolist(), map(_tag, accs), strict=True))


def outcome(read: Any) -> tuple[str, Any]:
    """What a read gives: its table's contents, or the error the read raised (type and
    message; an error met later, while reading the table, fails the test)."""
    try:
        table = read()
    except Exception as exc:  # noqa: BLE001 - the outcome compared is the error itself
        return "error", (type(exc).__name__, str(exc))
    return "table", contents(table)


def make_store(backend: str, root: Path, retention_ms: int, segment_ms: int | None) -> Any:
    if backend == "memory":
        return InMemorySessionStore(retention_ms=retention_ms, segment_interval_ms=segment_ms)
    return SessionStore(root, retention_ms=retention_ms, segment_interval_ms=segment_ms)


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, Any]:
    family = draw(st.sampled_from(sorted(KEY_FAMILIES)))
    keys = draw(st.lists(KEY_FAMILIES[family], min_size=1, max_size=6, unique_by=_tag))
    aggregation = draw(st.sampled_from(sorted(AGGREGATIONS)))
    _kinds, _combined, acc_strategies = AGGREGATIONS[aggregation]
    n_ops = draw(st.integers(1, 12))
    ops: list[tuple[Any, ...]] = []
    for _ in range(n_ops):
        op = draw(st.sampled_from(["put", "put", "bulk", "bulk", "remove", "commit", "abort"]))
        if op in ("put", "bulk"):
            rows = []
            for _ in range(draw(st.integers(1, 8)) if op == "bulk" else 1):
                start = draw(st.one_of(st.integers(-30, 60), st.sampled_from(
                    [INT64_MIN, INT64_MIN + 255, -257, -1, 255, 256, INT64_MAX - 12])))
                end = start + draw(st.integers(0, 12))
                accs = [draw(s) for s in acc_strategies]
                rows.append((draw(st.sampled_from(keys)), start, end, accs))
            ops.append((op, rows, draw(st.booleans())))
        elif op == "remove":
            ops.append((op, draw(st.integers(0, 1000))))
        else:
            ops.append((op,))
    return {
        "aggregation": aggregation, "ops": ops,
        "cache": draw(st.sampled_from([0, 1, 2, 1000])),
        "segment": draw(st.sampled_from([1, 1, 7, None])),
        "retention": draw(st.sampled_from([0, 5, 40, 10_000])),
        "low_pick": draw(st.integers(0, 1000)), "low_shift": draw(st.sampled_from([0, 0, 1, -1])),
        "low_min": draw(st.integers(0, 5)) == 0,
    }


def build(scenario: dict[str, Any], backend: str, root: Path
          ) -> tuple[CachingSessionStore, list[int]]:
    """Run the scenario's writes; return the engine's store layers and every end written."""
    kinds, combined, _ = AGGREGATIONS[scenario["aggregation"]]
    store = make_store(backend, root, scenario["retention"], scenario["segment"])
    cache = CachingSessionStore(MeteredSessionStore(store), scenario["cache"])
    written: list[Session] = []
    ends: list[int] = []
    for op in scenario["ops"]:
        if op[0] in ("put", "bulk"):
            rows, packed = op[1], op[2]
            accs = [a if combined else a[0] for *_, a in rows]
            ends += [end for _, _, end, _ in rows]
            if op[0] == "put":
                key, start, end, _ = rows[0]
                session = Session(key, start, end)
                cache.sessions_of(key, INT64_MIN)  # a view: the put stays cached (dirty)
                cache.put(session, plain_record(accs[0]))
                written.append(session)
                continue
            values: Any = None
            if packed and set(kinds) <= NUMERIC:
                columns = [np.array([a[p] if combined else a for a in accs])
                           for p in range(len(kinds))]
                values = pack_session_records(columns, combined=combined)
            if values is None:
                values = [plain_record(acc) for acc in accs]
            cache.put_many([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows],
                           values)
            written += [Session(r[0], r[1], r[2]) for r in rows]
        elif op[0] == "remove" and written:
            cache.remove(written[op[1] % len(written)])
        elif op[0] == "commit":
            cache.commit()
        elif op[0] == "abort":
            cache.abort()
    return cache, ends


def low_of(scenario: dict[str, Any], ends: list[int]) -> int:
    if scenario["low_min"] or not ends:
        return INT64_MIN
    # an end at either int64 limit is shifted back inside the range, not past it
    low = ends[scenario["low_pick"] % len(ends)] + scenario["low_shift"]
    return min(max(low, INT64_MIN), INT64_MAX)


def check_same_table(scenario: dict[str, Any], backend: str, root: Path) -> None:
    kinds, combined, _ = AGGREGATIONS[scenario["aggregation"]]
    cache, ends = build(scenario, backend, root)
    try:
        low = low_of(scenario, ends)
        dirty = cache.dirty_count
        # the bulk read first, while cached writes are unflushed: it must see them
        stored = cache.find_sessions_columns(low)
        assert stored is not None
        assert cache.dirty_count == 0 or dirty == 0
        bulk = outcome(lambda: table_from_columns(stored, kinds, combined)
                       or load_open_sessions(cache, low, kinds, combined=combined))
        rows = outcome(lambda: table_from_rows(cache.find_sessions(low, INT64_MAX), kinds,
                                               combined=combined))
        assert bulk == rows
        if set(kinds) <= NUMERIC and bulk[0] == "table":
            # the bulk decode took these itself (the test would be vacuous otherwise)
            assert table_from_columns(stored, kinds, combined) is not None
        assert outcome(lambda: load_open_sessions(cache, low, kinds, combined=combined)) == rows
    finally:
        cache.close()


LIMIT_ENDS = {"aggregation": "first", "cache": 0, "segment": 1, "retention": 0, "low_pick": 0,
              "low_shift": -1, "low_min": False,
              "ops": [("put", [(b"", INT64_MIN, INT64_MIN, [[0, 0, 0]])], False),
                      ("put", [(b"", 0, 0, [[0, 0, 0]])], False)]}


@settings(max_examples=250)
@given(scenarios())
@example(scenario=LIMIT_ENDS)
def test_bulk_read_gives_the_row_reads_table_in_memory(scenario: dict[str, Any]) -> None:
    check_same_table(scenario, "memory", Path("unused"))


@settings(max_examples=120)
@given(scenarios())
@example(scenario=LIMIT_ENDS)
def test_bulk_read_gives_the_row_reads_table_on_rocksdb(tmp_path_factory: pytest.TempPathFactory,
                                                        scenario: dict[str, Any]) -> None:
    check_same_table(scenario, "rocksdb", tmp_path_factory.mktemp("store"))


# -- damaged and foreign records: the error of the row read, never a smaller answer ------------

_PREFIX = (0).to_bytes(4, "big")


def _raw_key(payload: bytes) -> bytes:
    """An encoded key with the given msgpack bytes (canonical or not) and a right prefix."""
    return len(payload).to_bytes(4, "big") + payload


GOOD = msgpack.packb([3, 0, 0, 0, None])
DAMAGED_VALUES = {
    "truncated msgpack": GOOD[:-1],
    "trailing bytes": GOOD + b"\x00",
    "three items": msgpack.packb([3, 0, 0]),
    "seven items": msgpack.packb([3, 0, 0, 0, None, [], 9]),
    "trigger state": msgpack.packb([3, 2, 1, 1, 77]),
    "a str count": msgpack.packb(["x", 0, 0, 0, None]),
    "a bool count": msgpack.packb([True, 0, 0, 0, None]),
    "beyond int64": msgpack.packb([2**63, 0, 0, 0, None]),
    "a float32": b"\x95\xca\x3f\xc0\x00\x00\x00\x00\x00\xc0",
    "a float count": msgpack.packb([1.5, 0, 0, 0, None]),
    "not an array": msgpack.packb({"a": 1}),
    "nil": msgpack.packb(None),
}
DAMAGED_KEYS = {
    "int in a wider format": _raw_key(b"\xcc\x05"),
    "negative in an unsigned format": _raw_key(b"\xd0\x05"),
    "str in a wider header": _raw_key(b"\xd9\x01a"),
    "bin in a wider header": _raw_key(b"\xc5\x00\x01a"),
    "invalid UTF-8": _raw_key(b"\xa2\xff\xfe"),
    "a surrogate": _raw_key(b"\xa3\xed\xa0\x80"),
    "an overlong form": _raw_key(b"\xa2\xc0\xaf"),
    "a short prefix": (9).to_bytes(4, "big") + b"\xa1a",
    "trailing bytes": (3).to_bytes(4, "big") + b"\xa1ab",
    "truncated str": _raw_key(b"\xa3ab"),
    "a float key": _raw_key(b"\xcb" + b"\x00" * 8),
    "nil key": _raw_key(b"\xc0"),
    "a tuple in a wider header": _raw_key(b"\xdc\x00\x01\x01"),
    "uint64 beyond int64": _raw_key(b"\xcf\x80" + b"\x00" * 7),
}


OTHER_KEY = {5: 6, "a": "z", b"a": b"z", (1, "a"): (2, "b")}


def _damaged_store(backend: str, root: Path, key_bytes: bytes, value: bytes,
                   good_key: Any) -> Any:
    """A store of a few good sessions (keys of one kind, so that the bulk decoders of that
    kind meet the raw record) plus one raw record, as a damaged or foreign store holds it
    (written below the store's encoders)."""
    store = make_store(backend, root, 10_000, None)
    store.put_many([good_key, good_key, OTHER_KEY[good_key]], [0, 20, 5], [3, 25, 9],
                   [plain_record(1), plain_record(2), plain_record(4)])
    store._write(key_bytes, 12, 10, value)  # noqa: SLF001 - a record no encoder writes
    return store


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
@pytest.mark.parametrize("damage", sorted(DAMAGED_VALUES))
def test_a_damaged_record_gives_the_row_reads_answer(tmp_path: Path, backend: str,
                                                     damage: str) -> None:
    store = _damaged_store(backend, tmp_path / "s", encode_key("k"), DAMAGED_VALUES[damage], "a")
    try:
        for kinds, combined in ((["count"], False), (["sum"], False), (["max"], True)):
            rows = outcome(lambda k=kinds, c=combined: table_from_rows(  # type: ignore[misc]
                store.find_sessions(INT64_MIN, INT64_MAX), k, combined=c))
            bulk = outcome(lambda k=kinds, c=combined: load_open_sessions(  # type: ignore[misc]
                store, INT64_MIN, k, combined=c))
            assert bulk == rows, (kinds, combined)
    finally:
        store.close()


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
@pytest.mark.parametrize("damage", sorted(DAMAGED_KEYS))
@pytest.mark.parametrize("good_key", [5, "a", b"a", (1, "a")])
def test_a_damaged_or_foreign_key_gives_the_row_reads_answer(tmp_path: Path, backend: str,
                                                            damage: str, good_key: Any) -> None:
    store = _damaged_store(backend, tmp_path / "s", DAMAGED_KEYS[damage], GOOD, good_key)
    try:
        rows = outcome(lambda: table_from_rows(store.find_sessions(INT64_MIN, INT64_MAX),
                                               ["count"], combined=False))
        bulk = outcome(lambda: load_open_sessions(store, INT64_MIN, ["count"], combined=False))
        assert bulk == rows
    finally:
        store.close()


def test_a_nan_sum_is_refused_as_the_row_read_refuses_it(tmp_path: Path) -> None:
    store = SessionStore(tmp_path / "s", retention_ms=10_000)
    try:
        columns = [np.array([1.0, math.nan, 2.0])]
        store.put_many(["a", "b", "c"], [0, 0, 0], [1, 2, 3],
                       pack_session_records(columns, combined=False))
        stored = store.find_sessions_columns(INT64_MIN)
        with pytest.raises(NotColumnar, match="NaN"):
            table_from_columns(stored, ["sum"], False)
        with pytest.raises(NotColumnar, match="NaN"):
            table_from_rows(store.find_sessions(INT64_MIN, INT64_MAX), ["sum"], combined=False)
    finally:
        store.close()


def test_packed_values_that_are_not_msgpack_records_are_read_row_by_row(tmp_path: Path) -> None:
    store = SessionStore(tmp_path / "s", retention_ms=10_000)
    try:
        store.put_many(["a"], [0], [1], PackedValues([b"\xc1"]))  # never used by msgpack
        with pytest.raises(Exception) as bulk:  # noqa: PT011 - compared with the row read's
            load_open_sessions(store, INT64_MIN, ["count"], combined=False)
        with pytest.raises(Exception) as rows:  # noqa: PT011
            table_from_rows(store.find_sessions(INT64_MIN, INT64_MAX), ["count"],
                            combined=False)
        assert (type(bulk.value), str(bulk.value)) == (type(rows.value), str(rows.value))
    finally:
        store.close()


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
def test_float_counts_read_as_the_row_read_reads_them(tmp_path: Path, backend: str) -> None:
    store = make_store(backend, tmp_path / "s", 10_000, None)
    try:
        store.put_many(["a", "b"], [0, 0], [1, 2], [plain_record(1.0), plain_record(2.5)])
        rows = outcome(lambda: table_from_rows(store.find_sessions(INT64_MIN, INT64_MAX),
                                               ["count"], combined=False))
        assert outcome(lambda: load_open_sessions(store, INT64_MIN, ["count"],
                                                  combined=False)) == rows
    finally:
        store.close()


# -- the loaded table afterwards: batches on a key index over encodings -------------------------

LATER_KEYS = ["a", "b", "é", "x" * 40, b"a", 7, (1, "a"), "new", ""]
table_step = st.one_of(
    st.tuples(st.just("insert"), st.lists(st.tuples(st.sampled_from(range(len(LATER_KEYS))),
                                                    st.integers(0, 50), st.integers(0, 9),
                                                    st.integers(1, 5)), max_size=6)),
    st.tuples(st.just("remove"), st.lists(st.sampled_from(range(len(LATER_KEYS))), max_size=4),
              st.integers(0, 2**32)),
    st.tuples(st.just("close"), st.integers(-10, 80)),
)


def _apply(table: OpenSessions, op: tuple[Any, ...]) -> Any:
    """One batch step, as the batch path takes it; returns what it hands out."""
    if op[0] == "insert":
        used = sorted({k for k, *_ in op[1]})
        keys = [LATER_KEYS[k] for k in used]
        position = {k: i for i, k in enumerate(used)}
        rows = SessionRows(None, np.array([s for _, s, _, _ in op[1]], dtype=np.int64),
                           np.array([s + n for _, s, n, _ in op[1]], dtype=np.int64),
                           [PartColumns("count", np.array([c for *_, c in op[1]],
                                                          dtype=np.int64))])
        table.insert(keys, np.array([position[k] for k, *_ in op[1]], dtype=np.int64),
                     table.index.lookup(keys), rows)
        return None
    if op[0] == "remove":
        keys = [LATER_KEYS[k] for k in sorted(set(op[1]))]
        slots, _ = table.probe(table.index.lookup(keys))
        rows = table.rows(slots)
        # the same sessions in both tables: chosen by their content, not their slots
        order = np.lexsort((rows.ends_ms, rows.starts_ms,
                            np.array([repr(_tag(k)) for k in rows.key_list()])))
        rng = np.random.default_rng(op[2])
        chosen = slots[order][rng.random(len(slots)) < 0.5]
        table.remove(chosen)
        return None
    closed = table.close_upto(op[1], rows=True)
    return None if closed is None else Counter(zip(map(_tag, closed.key_list()),
                                                   closed.starts_ms.tolist(),
                                                   closed.ends_ms.tolist(), strict=True))


@settings(max_examples=150)
@given(stored_keys=st.lists(st.one_of(STR_KEYS, st.sampled_from(["a", "b", "é"])), min_size=1,
                            max_size=8, unique=True),
       binary=st.booleans(), steps=st.lists(table_step, max_size=15),
       key_slack=st.sampled_from([0, 3, 65_536]))
def test_a_bulk_loaded_table_takes_batches_as_the_row_loaded_one(
        stored_keys: list[Any], binary: bool, steps: list[Any], key_slack: int) -> None:
    keys = [k.encode() for k in stored_keys] if binary else stored_keys
    store = InMemorySessionStore(retention_ms=10_000)
    try:
        store.put_many(keys * 2, [0] * len(keys) + [30] * len(keys),
                       [5] * len(keys) + [33] * len(keys), [plain_record(2)] * (2 * len(keys)))
        bulk = table_from_columns(store.find_sessions_columns(INT64_MIN), ["count"], False)
        assert bulk is not None and type(bulk.index).__name__ == "EncodedKeyIndex"
        rows = table_from_rows(store.find_sessions(INT64_MIN, INT64_MAX), ["count"],
                               combined=False)
        for table in (bulk, rows):
            table.KEY_SLACK = key_slack
        for op in steps:
            assert _apply(bulk, op) == _apply(rows, op)
            assert contents(bulk) == contents(rows)
            for asked in (LATER_KEYS, keys):
                found = [table.rows(table.probe(table.index.lookup(asked))[0])
                         for table in (bulk, rows)]
                assert [Counter(zip(map(_tag, r.key_list()), r.starts_ms.tolist(), strict=True))
                        for r in found] == [Counter(zip(map(_tag, found[1].key_list()),
                                                        found[1].starts_ms.tolist(),
                                                        strict=True))] * 2
    finally:
        store.close()


def test_an_encoded_key_index_refuses_a_key_the_store_cannot_hold() -> None:
    store = InMemorySessionStore(retention_ms=10_000)
    try:
        store.put_many(["a"], [0], [1], [plain_record(1)])
        table = table_from_columns(store.find_sessions_columns(INT64_MIN), ["count"], False)
        assert table is not None
        with pytest.raises(NotColumnar, match="cannot hold"):
            table.index.lookup([1.5])
    finally:
        store.close()


class _RowsOnly:
    """A store whose bulk read must not be called."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def find_sessions_columns(self, earliest_end_ms: int) -> Any:
        raise AssertionError("read in bulk, then again row by row")

    def find_sessions(self, earliest_end_ms: int, latest_end_ms: int) -> Any:
        return self.store.find_sessions(earliest_end_ms, latest_end_ms)


@pytest.mark.parametrize("kinds", [["first"], ["last"], ["collect"], ["count", "first"]])
def test_kinds_the_bulk_read_does_not_decode_are_read_once(kinds: list[str]) -> None:
    store = InMemorySessionStore(retention_ms=10_000)
    try:
        item = [0, 0, "x"]
        acc = {"first": item, "last": item, "collect": [item], "count": 1}
        record = [acc[k] for k in kinds] if len(kinds) > 1 else acc[kinds[0]]
        store.put_many(["a"], [0], [1], [plain_record(record)])
        table = load_open_sessions(_RowsOnly(store), INT64_MIN, kinds, combined=len(kinds) > 1)
        assert len(table) == 1
    finally:
        store.close()
