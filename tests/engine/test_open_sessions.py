"""The engine's persistent open-session table (``engine/table.py``) against a plain dict model.

Random interleavings of inserts (new and known keys of several types, including keys that are
equal in Python but distinct for the engine: ``1`` and ``True``, and tuples), removals of
sessions found by probing, and closes up to a time. After every step, probing any keys gives
exactly the model's sessions of those keys, with their accumulators, and a close gives exactly
the model's sessions ending at or before the time. The slack before a key renumbering and
before a collect arena compaction varies down to 0, so both run often.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionstore.engine.columnar import PartColumns, SessionRows
from sessionstore.engine.key_index import KeyIndex, unique_keys
from sessionstore.engine.table import OpenSessions

KINDS = ["count", "sum", "first", "collect"]
KEY_POOL: list[Any] = [0, 1, 2, True, False, "a", "b", b"a", (1, "a"), (1, True), -5, 2**40]


def _rows(keys: list[Any], sessions: list[tuple[int, int, int, list[Any]]]) -> SessionRows:
    """Rows for ``sessions`` ``(key position, start, end, items)``: count = len(items),
    sum = float sum, first = the first item (time = start, seq = its position), collect = the
    items (times start.., seqs ..)."""
    counts = np.array([len(items) for *_, items in sessions], dtype=np.int64)
    sums = np.array([float(sum(range(len(items)))) for *_, items in sessions])
    first_value = np.empty(len(sessions), dtype=object)
    first_value[:] = [items[0] for *_, items in sessions]
    starts = np.array([start for _, start, _, _ in sessions], dtype=np.int64)
    flat = [item for *_, items in sessions for item in items]
    offsets = np.zeros(len(sessions) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    flat_values = np.empty(len(flat), dtype=object)
    flat_values[:] = flat
    item_t = np.concatenate([np.arange(len(items), dtype=np.int64) + start
                             for _, start, _, items in sessions]) if sessions else starts
    parts = [
        PartColumns("count", counts),
        PartColumns("sum", sums),
        PartColumns("first", first_value, starts.copy(), np.arange(len(sessions))),
        PartColumns("collect", flat_values, item_t, np.arange(len(flat), dtype=np.int64),
                    offsets),
    ]
    key_objects = np.empty(len(sessions), dtype=object)
    key_objects[:] = [keys[k] for k, *_ in sessions]
    return SessionRows(key_objects, starts,
                       np.array([end for _, _, end, _ in sessions], dtype=np.int64), parts)


def _as_model_rows(rows: SessionRows) -> Counter[tuple[Any, ...]]:
    keys = rows.key_list()
    out: Counter[tuple[Any, ...]] = Counter()
    results = [part.results() for part in rows.parts]
    for i, (key, start, end) in enumerate(zip(keys, rows.starts_ms.tolist(),
                                              rows.ends_ms.tolist(), strict=True)):
        accs = tuple(tuple(r[i]) if isinstance(r[i], list) else r[i] for r in results)
        out[(type(key), key, start, end, accs)] += 1
    return out


def _model_row(key: Any, start: int, end: int, items: list[Any]) -> tuple[Any, ...]:
    return (type(key), key, start, end,
            (len(items), float(sum(range(len(items)))), items[0], tuple(items)))


step = st.one_of(
    st.tuples(st.just("insert"),
              st.lists(st.tuples(st.sampled_from(range(len(KEY_POOL))),
                                 st.integers(0, 50), st.integers(1, 20),
                                 st.lists(st.one_of(st.integers(-3, 3), st.text(max_size=2)),
                                          min_size=1, max_size=3)),
                       max_size=8)),
    st.tuples(st.just("remove"), st.lists(st.sampled_from(range(len(KEY_POOL))), max_size=4),
              st.integers(0, 2**32)),
    st.tuples(st.just("close"), st.integers(0, 80)),
)


@settings(max_examples=150)
@given(steps=st.lists(step, max_size=25), key_slack=st.sampled_from([0, 2, 65_536]),
       arena_slack=st.sampled_from([0, 3, 1024]), looks=st.lists(st.booleans(), max_size=25))
def test_the_table_equals_a_dict_model(steps: list[Any], key_slack: int,
                                       arena_slack: int, looks: list[bool]) -> None:
    """After the steps where ``looks`` says so (a look puts an insert's sessions in slots;
    without one, a close or another insert comes first)."""
    table = OpenSessions(KINDS)
    table.KEY_SLACK = key_slack
    for part in table.parts:
        part.ARENA_SLACK = arena_slack
    model: Counter[tuple[Any, ...]] = Counter()
    for at, op in enumerate(steps):
        if op[0] == "insert":
            sessions = [(k, start, start + length, items)
                        for k, start, length, items in op[1]]
            keys = KEY_POOL
            used = sorted({k for k, *_ in sessions})
            batch_keys = [keys[k] for k in used]
            position = {k: i for i, k in enumerate(used)}
            codes = np.array([position[k] for k, *_ in sessions], dtype=np.int64)
            rows = _rows(keys, sessions)
            kids = table.index.lookup(batch_keys)
            table.insert(batch_keys, codes, kids, rows)
            assert (kids >= 0).all() or not len(sessions)
            model.update(_model_row(keys[k], s, e, items) for k, s, e, items in sessions)
        elif op[0] == "remove":
            batch_keys = [KEY_POOL[k] for k in sorted(set(op[1]))]
            slots, codes = table.probe(table.index.lookup(batch_keys))
            rng = np.random.default_rng(op[2])
            chosen = slots[rng.random(len(slots)) < 0.5]
            gone = _as_model_rows(table.rows(chosen))
            assert gone <= model
            table.remove(chosen)
            model -= gone
        else:
            closed = table.close_upto(op[1], rows=True)
            expected = Counter({row: n for row, n in model.items() if row[3] <= op[1]})
            assert (Counter() if closed is None else _as_model_rows(closed)) == expected
            model -= expected
        assert len(table) == model.total()
        if at < len(looks) and not looks[at]:
            continue
        everything = table.probe(table.index.lookup(KEY_POOL))[0]
        assert _as_model_rows(table.rows(everything)) == model
        assert len(everything) == model.total()


def test_key_ids_looked_up_before_a_read_stay_valid_through_it() -> None:
    """A read (``probe``) first puts the last insert's sessions in slots; that must not
    renumber the key ids the caller looked up for it. Here a close leaves two key ids without
    sessions, and placing one new key's session made them outnumber the live ones."""
    table = OpenSessions(KINDS)
    table.KEY_SLACK = 2

    def insert(sessions: list[tuple[int, int, int, list[Any]]]) -> None:
        used = sorted({k for k, *_ in sessions})
        batch_keys = [KEY_POOL[k] for k in used]
        codes = np.array([used.index(k) for k, *_ in sessions], dtype=np.int64)
        table.insert(batch_keys, codes, table.index.lookup(batch_keys), _rows(KEY_POOL, sessions))

    insert([(0, 0, 1, [0]), (2, 0, 1, [0])])
    closed = table.close_upto(1, rows=True)
    assert closed is not None and sorted(closed.key_list()) == [0, 2]
    insert([(1, 5, 9, [7])])
    slots, codes = table.probe(table.index.lookup(KEY_POOL))
    assert codes.tolist() == [KEY_POOL.index(1)]
    assert _as_model_rows(table.rows(slots)) == Counter([_model_row(1, 5, 9, [7])])


@pytest.mark.parametrize("removed", [0, 1, 2])
def test_a_keys_sessions_stay_linked_through_the_table_growing(removed: int) -> None:
    """Three sessions of one key, then enough sessions of other keys that the slots' and the
    key ids' row blocks grow (several doublings), then one of the three removed: the key's
    list still links the other two (every link column is carried over when a block grows),
    and a close takes back exactly what is left."""
    table = OpenSessions(KINDS)

    def insert(keys: list[Any], sessions: list[tuple[int, int, int, list[Any]]]) -> None:
        used = sorted({k for k, *_ in sessions})
        batch_keys = [keys[k] for k in used]
        codes = np.array([used.index(k) for k, *_ in sessions], dtype=np.int64)
        table.insert(batch_keys, codes, table.index.lookup(batch_keys), _rows(keys, sessions))
        table.settle()

    insert(["k"], [(0, 10 * i, 10 * i + 5, [i]) for i in range(3)])
    fillers = [1_000 + i for i in range(300)]
    insert(fillers, [(i, 0, 100, [0]) for i in range(300)])
    slots, _ = table.probe(table.index.lookup(["k"]))
    by_start = {int(table.starts_ms[slot]): slot for slot in slots.tolist()}
    table.remove(np.array([by_start[10 * removed]], dtype=np.int64))
    kept = [i for i in range(3) if i != removed]
    slots, _ = table.probe(table.index.lookup(["k"]))
    assert _as_model_rows(table.rows(slots)) == Counter(
        _model_row("k", 10 * i, 10 * i + 5, [i]) for i in kept)
    closed = table.close_upto(1_000, rows=True)
    assert closed is not None and len(closed) == 300 + 2 and len(table) == 0


def test_keys_equal_in_python_stay_apart() -> None:
    index = KeyIndex()
    kids = index.add([1, True, "1", b"1", (1, "a"), 2**70])
    assert index.lookup([True, 1, 1.0, (1, "a"), 2**70]).tolist() == [kids[1], kids[0], -1,
                                                                      kids[4], kids[5]]
    assert index.ints is None  # 2**70 leaves int64: keys go through objects
    distinct, codes = unique_keys([1, True, 1, "x", True])
    assert distinct == [1, True, "x"] and codes.tolist() == [0, 1, 0, 2, 1]


def test_integer_keys_come_back_as_an_int64_column() -> None:
    table = OpenSessions(["count"])
    keys = [7, -3, 2**62]
    rows = SessionRows(np.array(keys, dtype=object), np.array([0, 5, 9]), np.array([4, 8, 20]),
                       [PartColumns("count", np.array([1, 2, 3], dtype=np.int64))])
    table.insert(keys, np.arange(3, dtype=np.int64), table.index.lookup(keys), rows)
    closed = table.close_upto(8, rows=True)
    assert closed is not None
    assert closed.keys.type == "int64"
    assert sorted(zip(closed.keys.to_pylist(), closed.parts[0].value.tolist(),
                      strict=True)) == [(-3, 2), (7, 1)]
    assert len(table) == 1


int64s = st.one_of(st.integers(-(2**63), 2**63 - 1), st.integers(-50, 3000))


@settings(max_examples=60)
@given(batches=st.lists(st.lists(int64s, max_size=700, unique=True), max_size=4),
       probes=st.lists(st.one_of(int64s, st.booleans(), st.just(2**64), st.just("1")),
                       max_size=50))
def test_the_int_key_index_equals_a_dict(batches: list[list[int]], probes: list[Any]) -> None:
    """The compiled hash table of int keys (grown past its first size by large batches) finds
    every key added and nothing else; a bool or an out-of-range int is never an int key."""
    index = KeyIndex()
    model: dict[int, int] = {}
    for number, batch in enumerate(batches):
        fresh = [key for key in batch if key not in model]
        # the batch path hands an int column's values over as they are; other callers do not
        ids = index.add(fresh, np.array(fresh, dtype=np.int64) if number % 2 else None)
        model.update(zip(fresh, ids.tolist(), strict=True))
        assert index.ints is not None
    queries = list(model)[:2000] + probes
    expected = [model.get(key, -1) if type(key) is int else -1 for key in queries]
    assert index.lookup(queries).tolist() == expected
    ints = [key for key in queries if type(key) is int]
    assert index.lookup(ints).tolist() == [model.get(key, -1) for key in ints]
    in_range = [key for key in ints if -(2**63) <= key < 2**63]
    assert index.lookup(in_range, np.array(in_range, dtype=np.int64)).tolist() == \
        [model.get(key, -1) for key in in_range]
    if model:  # renumbering keeps a subset, still hashed
        kept = np.arange(0, index.size, 2, dtype=np.int64)
        keys = [key for key, kid in model.items() if kid % 2 == 0]
        index.keep(kept)
        assert index.lookup(keys).tolist() == [model[key] // 2 for key in keys]
        # the first key of another type turns the index into dicts, keeping every int
        index.add(["x"])
        assert index.ints is None
        assert index.lookup(keys + ["x"]).tolist() == [model[key] // 2 for key in keys] + \
            [index.size - 1]
        assert index.column(np.arange(len(keys), dtype=np.int64)).to_pylist() == \
            [key for key, kid in sorted(model.items(), key=lambda item: item[1])
             if kid % 2 == 0]


@settings(max_examples=60, deadline=None)
@given(a=st.lists(st.tuples(st.integers(-5, 5), st.booleans()), max_size=30),
       b=st.lists(st.tuples(st.integers(-5, 5), st.booleans()), max_size=30),
       consumed=st.tuples(st.integers(0, 30), st.integers(0, 30)))
def test_end_runs_merge_as_a_stable_sort_of_their_live_entries(
    a: list[tuple[int, bool]], b: list[tuple[int, bool]], consumed: tuple[int, int]
) -> None:
    """The merge of two end runs (the compiled pass) equals the stable sort of their live,
    unconsumed entries joined (the first run's entries before the second's among equal ends),
    stale and consumed entries dropped."""
    from sessionstore.engine.table import _EndRun

    rows = a + b
    gen = np.zeros(len(rows), dtype=np.int64)
    for slot, (_, live) in enumerate(rows):
        gen[slot] = 0 if live else 1  # an entry is live while its slot keeps generation 0

    def run(entries: list[tuple[int, bool]], first_slot: int, pos: int
            ) -> tuple[_EndRun, list[int]]:
        order = sorted(range(len(entries)), key=lambda i: entries[i][0])
        made = _EndRun(np.array([entries[i][0] for i in order], dtype=np.int64),
                       np.array([first_slot + i for i in order], dtype=np.int64),
                       np.zeros(len(entries), dtype=np.int64))
        made.pos = min(pos, len(entries))
        return made, [first_slot + i for i in order[made.pos:]]

    run_a, left_a = run(a, 0, consumed[0])
    run_b, left_b = run(b, len(a), consumed[1])
    merged = run_a.merged(run_b, gen)
    expected = sorted(((rows[slot][0], slot) for slot in left_a + left_b if rows[slot][1]),
                      key=lambda entry: entry[0])  # stable: a's slots come first
    assert list(zip(merged.ends.tolist(), merged.slots.tolist(), strict=True)) == expected
    assert merged.gens.tolist() == [0] * len(expected)
    assert merged.pos == 0
