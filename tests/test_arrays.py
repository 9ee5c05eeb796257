"""``arrays.sort_order`` and ``arrays.last_of_each`` against Python's sort, on each of their
paths: columns packed with the row numbers, packed as dense ranks when the row numbers do not
fit beside them, and too wide to pack (``np.lexsort``)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionstore import arrays

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
PROFILE_SCALE = settings.default.max_examples / 100

# per column, a span of values: a few values, 2**58 of them (two such columns and 6 row bits
# overflow 63 bits: the dense-rank path), or the whole int64 range (too wide to pack)
SPANS = st.sampled_from([(0, 3), (-3, 2), (0, 2**58), (INT64_MIN, INT64_MAX)])


@st.composite
def column_sets(draw: st.DrawFn) -> list[list[int]]:
    spans = draw(st.lists(SPANS, min_size=1, max_size=3))
    n = draw(st.integers(1, 70))
    rows = []
    for _ in range(n):
        if rows and draw(st.integers(0, 3)) == 0:  # ties: where stability shows
            rows.append(rows[draw(st.integers(0, len(rows) - 1))])
        else:
            rows.append(tuple(draw(st.one_of(st.integers(low, high),
                                             st.sampled_from([low, high])))
                              for low, high in spans))
    return [list(column) for column in zip(*rows, strict=True)]


@settings(max_examples=round(300 * PROFILE_SCALE))
@given(columns=column_sets())
def test_sort_order_is_the_stable_sort(columns: list[list[int]]) -> None:
    rows = list(zip(*columns, strict=True))
    arrays_in = [np.array(column, dtype=np.int64) for column in columns]
    copies = [column.copy() for column in arrays_in]
    expected = sorted(range(len(rows)), key=lambda i: (rows[i], i))
    assert arrays.sort_order(arrays_in).tolist() == expected
    if len(set(rows)) == len(rows):
        assert arrays.sort_order(arrays_in, distinct=True).tolist() == expected
    for column, copy in zip(arrays_in, copies, strict=True):  # the arguments are not changed
        assert column.tolist() == copy.tolist()


@settings(max_examples=round(300 * PROFILE_SCALE))
@given(columns=column_sets())
def test_last_of_each_is_the_last_occurrence_of_each_row(columns: list[list[int]]) -> None:
    rows = list(zip(*columns, strict=True))
    last = {row: i for i, row in enumerate(rows)}
    expected = [last[row] for row in sorted(last)]
    got = arrays.last_of_each([np.array(column, dtype=np.int64) for column in columns])
    assert got.tolist() == expected


def test_each_path_is_taken() -> None:
    """The cases above reach every path: packed with the row numbers, as dense ranks, and
    np.lexsort (checked through the bits the packing reports)."""
    small = np.array([2, 0, 1, 0], dtype=np.int64)
    wide = np.array([0, 2**60, 5, 2**60], dtype=np.int64)
    packed = arrays._packed([small, wide])  # noqa: SLF001 - which path is what this checks
    assert packed is not None and packed[1] == 2 + 61  # no room for 2 row bits: ranks
    assert arrays._packed([small]) is not None  # noqa: SLF001
    assert arrays._packed([wide, wide, np.array([INT64_MIN, 0, 0, INT64_MAX])]) is None  # noqa: SLF001
    assert arrays.sort_order([small, wide]).tolist() == [1, 3, 2, 0]
    assert arrays.last_of_each([small, wide]).tolist() == [3, 2, 0]


@settings(max_examples=round(300 * PROFILE_SCALE))
@given(columns=column_sets())
def test_last_rows_marks_the_last_occurrence_of_each_row(columns: list[list[int]]) -> None:
    """The compiled hash-table pass against a dict of each row's last occurrence, and so
    against :func:`arrays.last_of_each` (up to three columns; a missing one is constant), in
    the order drawn and sorted. Whole-int64 spans and ties make the hash slots collide and
    wrap."""
    n = len(columns[0])
    full = columns + [[0] * n] * (3 - len(columns))
    rows = list(zip(*full, strict=True))
    last = {row: i for i, row in enumerate(rows)}
    got = arrays.last_rows(*[np.array(column, dtype=np.int64) for column in full])
    assert got.dtype == np.bool_
    assert np.flatnonzero(got).tolist() == sorted(last.values())
    # rows in order (the one-pass path when they strictly increase; ties take the table)
    ordered = sorted(rows)
    last_ordered = {row: i for i, row in enumerate(ordered)}
    got = arrays.last_rows(*[np.array(column, dtype=np.int64)
                             for column in zip(*ordered, strict=True)])
    assert np.flatnonzero(got).tolist() == sorted(last_ordered.values())
    assert sorted(arrays.last_of_each(
        [np.array(column, dtype=np.int64) for column in columns]).tolist()) \
        == sorted(last.values())


@settings(max_examples=round(300 * PROFILE_SCALE))
@given(pieces=st.lists(st.one_of(st.binary(max_size=3), st.binary(min_size=6, max_size=16),
                                 st.sampled_from([b"", b"\0", b"\0\0", b"a\0", b"a",
                                                  b"\0" * 7, b"\0" * 8, b"a" * 7,
                                                  b"a" * 7 + b"\0", b"a" * 14 + b"b"])),
                       max_size=80),
       gaps=st.lists(st.integers(0, 2), min_size=80, max_size=80))
def test_first_equal_rows_is_the_first_row_with_the_same_bytes(
    pieces: list[bytes], gaps: list[int]
) -> None:
    """Rows cut anywhere from one buffer (with bytes between them that belong to no row)
    against a dict of each byte string's first row: rows differing only in a trailing zero
    byte, or in length, are told apart, also where the hash's seven-byte words end."""
    buffer = b""
    first, stop = [], []
    for piece, gap in zip(pieces, gaps, strict=False):
        buffer += b"\xff" * gap
        first.append(len(buffer))
        buffer += piece
        stop.append(len(buffer))
    seen: dict[bytes, int] = {}
    expected = [seen.setdefault(piece, row) for row, piece in enumerate(pieces)]
    got = arrays.first_equal_rows(np.frombuffer(buffer, dtype=np.uint8),
                                  np.array(first, dtype=np.int64),
                                  np.array(stop, dtype=np.int64))
    assert got.tolist() == expected


# -- ByteRows against the list of bytes it stands for ------------------------------------------

PIECES = st.lists(st.binary(max_size=6) | st.sampled_from([b"", b"\x00", b"a\x00\x00"]),
                  max_size=12)


@st.composite
def byte_rows(draw: st.DrawFn) -> tuple[arrays.ByteRows, list[bytes]]:
    """A ByteRows in each form it is built in (joined, padded matrix with a stride wider than
    its rows, one-width matrix, all-empty), with the list of bytes it holds."""
    pieces = draw(PIECES)
    form = draw(st.sampled_from(["list", "padded", "matrix", "long"]))
    if form == "padded" or (form == "matrix" and len(set(map(len, pieces))) > 1):
        stride = max(map(len, pieces), default=0) + draw(st.integers(0, 2))
        matrix = np.full((len(pieces), stride), 7, dtype=np.uint8)  # padding is never read
        for row, piece in enumerate(pieces):
            matrix[row, :len(piece)] = list(piece)
        lengths = np.array([len(p) for p in pieces], dtype=np.int64)
        return arrays.ByteRows.of_matrix_rows(matrix, lengths), pieces
    if form == "matrix":
        width = len(pieces[0]) if pieces else 0
        matrix = np.array([list(p) for p in pieces], dtype=np.uint8).reshape(len(pieces), width)
        return arrays.ByteRows.of_matrix(matrix), pieces
    if form == "long" and pieces:  # beyond MAX_STRIDE: one joined buffer, no stride
        pieces = [*pieces, b"\x01" * (arrays.ByteRows.MAX_STRIDE + 1)]
    return arrays.ByteRows.of_list(pieces), pieces


@settings(max_examples=round(300 * PROFILE_SCALE), deadline=None)
@given(parts=st.lists(byte_rows(), min_size=1, max_size=4), data=st.data())
def test_byte_rows_hold_their_bytes(parts: list[tuple[arrays.ByteRows, list[bytes]]],
                                    data: st.DataObject) -> None:
    """tolist, take (rows repeated, in any order), tolist of rows and concat (of rows of
    different strides and forms) give what the same operations give on the lists. Kills: a
    take or cut that reads a row's padding, a concat that drops a part's stride or shifts
    the wrong offsets."""
    for rows, pieces in parts:
        assert len(rows) == len(pieces)
        assert rows.tolist() == pieces
        picked = data.draw(st.lists(st.integers(0, max(len(pieces) - 1, 0)),
                                    max_size=8 if pieces else 0))
        index = np.array(picked, dtype=np.int64)
        assert rows.take(index).tolist() == [pieces[i] for i in picked]
        assert rows.tolist(index) == [pieces[i] for i in picked]
    joined = arrays.ByteRows.concat([rows for rows, _ in parts])
    expected = [piece for _, pieces in parts for piece in pieces]
    assert joined.tolist() == expected
    everything = np.arange(len(expected), dtype=np.int64)[::-1].copy()
    assert joined.take(everything).tolist() == expected[::-1]


@settings(max_examples=40, deadline=None)
@given(batches=st.lists(st.lists(st.integers(0, 4_095), max_size=900), max_size=6),
       wide=st.lists(st.integers(0, 2**63 - 1), max_size=300), data=st.data())
def test_seen_bits_count_the_repeats_of_a_set(batches: list[list[int]], wide: list[int],
                                              data: st.DataObject) -> None:
    """``SeenBits.add`` returns how many values a Python set held already (or that came
    earlier in the same call), exactly while the values are below its 4,096 bits, and never
    fewer for any values; and keyed row hashes are equal exactly for equal rows here (no
    collision among these few), non-negative, compiled or not."""
    seen = arrays.SeenBits(0)
    held: set[int] = set()
    for batch in batches:
        repeats = 0
        for value in batch:
            repeats += value in held
            held.add(value)
        assert seen.add(np.array(batch, dtype=np.int64)) == repeats
    seen = arrays.SeenBits(len(wide))
    assert seen.add(np.array(wide, dtype=np.int64)) >= len(wide) - len(set(wide))
    keys = [bytes([b]) * (3 * b % 17) for b in range(6)]  # 0 to 15 bytes: across words
    n = data.draw(st.integers(0, 40))
    rows = [(data.draw(st.integers(0, 5)), data.draw(st.integers(-3, 3)) * 2**40,
             data.draw(st.integers(-3, 3))) for _ in range(n)]
    key_index, a, b = (np.array([row[i] for row in rows], dtype=np.int64) for i in range(3))
    hashes = arrays.keyed_row_hashes(arrays.ByteRows.of_list(keys), key_index, a, b).tolist()
    assert all(h >= 0 for h in hashes)
    by_row = {(keys[k], x, y): h for (k, x, y), h in zip(rows, hashes, strict=True)}
    assert len(by_row) == len(set(by_row.values()))  # equal rows, equal hashes; others differ
    rows_of_keys = arrays.ByteRows.of_list(keys)
    key_hashes = np.empty(len(keys), dtype=np.int64)
    arrays.byte_row_hashes_kernel(rows_of_keys.data, rows_of_keys.first, rows_of_keys.stop,
                                  key_hashes)  # as Python, not compiled
    out = np.empty(n, dtype=np.int64)
    arrays.keyed_row_hashes_kernel(key_hashes, key_index, a, b, out)
    assert ((out & arrays._LOW63) ^ ((out & arrays._LOW63) >> 29)).tolist() == hashes


@settings(max_examples=40, deadline=None)
@given(batches=st.lists(st.lists(st.tuples(st.integers(0, 5), st.integers(-3, 3),
                                           st.integers(-3, 3)), max_size=30), max_size=5))
def test_seen_rows_count_the_rows_seen_before(
        batches: list[list[tuple[int, int, int]]]) -> None:
    """``SeenBits.add_rows`` (hash, fold and mark in one compiled pass) counts exactly the
    rows ``(key bytes, a, b)`` seen before, in earlier calls or earlier in the same call (a
    Python set), in a bitmap wide enough that these few rows share no bit; and never fewer
    in the narrowest bitmap."""
    keys = [bytes([k]) * (5 * k % 17) for k in range(6)]  # 0 to 15 bytes: across words
    rows = arrays.ByteRows.of_list(keys)
    wide, narrow = arrays.SeenBits(1 << 20), arrays.SeenBits(0)
    held: set[tuple[bytes, int, int]] = set()
    for batch in batches:
        repeats = 0
        for k, x, y in batch:
            repeats += (keys[k], x, y) in held
            held.add((keys[k], x, y))
        key_index, a, b = (np.array([row[i] for row in batch], dtype=np.int64)
                           for i in range(3))
        a = a * 2**40  # columns beyond 32 bits
        assert wide.add_rows(rows, key_index, a, b) == repeats
        assert narrow.add_rows(rows, key_index, a, b) >= repeats


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-(2**63), 2**63 - 1) | st.integers(-3, 3), max_size=300))
def test_factorize_is_arrows_dictionary_encoding(values: list[int]) -> None:
    """The same codes and uniques (first-seen order) as Arrow's ``dictionary_encode``."""
    import pyarrow as pa

    codes, uniques = arrays.factorize(np.array(values, dtype=np.int64))
    encoded = pa.array(values, type=pa.int64()).dictionary_encode()
    assert codes.tolist() == encoded.indices.to_pylist()
    assert uniques.tolist() == encoded.dictionary.to_pylist()


@settings(max_examples=60, deadline=None)
@given(st.integers(-(2**63), 2**63 - 1), st.integers(1, 40),
       st.lists(st.integers(0, 2**16), min_size=1, max_size=200), st.booleans())
def test_factorize_of_values_in_a_narrow_span_is_arrows(base: int, span: int,
                                                        offsets: list[int], edge: bool) -> None:
    """Values spanning at most twice their count (the offset-indexed pass, keys numbered from
    a base, up to either end of int64) and just more (the hash pass): Arrow's codes and
    uniques."""
    import pyarrow as pa

    low = min(max(base, -(2**63)), 2**63 - span) if not edge else (
        -(2**63) if base < 0 else 2**63 - span)
    values = [low + o % span for o in offsets]
    if len(values) > 1 and span > 2 * len(values):
        values[-1] = low + span - 1  # the span's far end, so it is the span
    codes, uniques = arrays.factorize(np.array(values, dtype=np.int64))
    encoded = pa.array(values, type=pa.int64()).dictionary_encode()
    assert codes.tolist() == encoded.indices.to_pylist()
    assert uniques.tolist() == encoded.dictionary.to_pylist()
