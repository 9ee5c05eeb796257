"""The vectorised key encoder against msgpack itself and the per-key encoder."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionstore import keyschema
from sessionstore.arrays import length_prefixed_rows
from sessionstore.store.keycodec import (
    EncodedKeys,
    encode_int_keys,
    encode_key_column,
    encode_key_rows,
    encode_keys,
)

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
# every boundary of msgpack's int formats, and one either side
BOUNDARIES = [b + d for b in (0, 0x7F, 0xFF, 0xFFFF, 0xFFFF_FFFF, 2**63 - 1, -32, -0x80,
                              -0x8000, -0x8000_0000, -(2**63)) for d in (-1, 0, 1)
              if -(2**63) <= b + d <= 2**63 - 1]


def _oracle(key: object) -> bytes:
    """The layout of keyschema's docstring, built from msgpack directly."""
    packed = msgpack.packb(key, use_bin_type=True)
    return len(packed).to_bytes(4, "big") + packed


def _checked(keys: list[object]) -> list[bytes]:
    """encode_keys' answer; encode_key_column gives the same bytes, and its byte matrix (when
    it builds one) is the zero-padded rows of those bytes, built here from msgpack's."""
    encoded = encode_keys(keys)
    same, matrix = encode_key_column(keys)
    assert same == encoded
    # the uncut form (the in-memory store's bulk log keeps it) holds the same bytes, as a
    # sequence and as byte rows, and comes with the same matrix
    uncut, uncut_matrix = encode_key_rows(keys)
    assert list(uncut) == encoded and len(uncut) == len(encoded)
    if isinstance(uncut, EncodedKeys):
        assert uncut.rows().tolist() == encoded
        assert uncut_matrix is uncut.matrix and matrix is not None
        assert uncut_matrix.rows.tolist() == matrix.rows.tolist()
    else:
        assert uncut_matrix is None or uncut_matrix.lengths.tolist() == list(map(len, encoded))
    expected = [_oracle(k) for k in keys]
    widest = max(map(len, expected), default=0)
    if matrix is None:
        # only a column the vectorised encoders do not take, or one too wide for a matrix
        assert len(keys) < 64 or len({type(k) for k in keys}) > 1 or widest > 256 \
            or isinstance(keys[0], tuple)
    else:
        assert 0 < widest <= 256
        assert matrix.lengths.tolist() == [len(e) for e in expected]
        assert matrix.rows.tolist() == [list(e) + [0] * (widest - len(e)) for e in expected]
        assert matrix.rows.dtype == np.uint8
    return encoded


@pytest.mark.parametrize(("longest", "built"), [(250, True), (251, False)])
def test_the_byte_matrix_holds_keys_of_up_to_256_bytes(longest: int, built: bool) -> None:
    """A str8 key of 250 characters encodes to 256 bytes, the widest a KeyMatrix holds."""
    keys: list[object] = ["x" * longest] + [f"k{i}" for i in range(70)]
    _checked(keys)
    assert (encode_key_column(keys)[1] is not None) == built


def test_int_format_boundaries() -> None:
    keys = BOUNDARIES * 8  # enough rows for the vectorised path
    assert _checked(keys) == [_oracle(k) for k in keys]


@settings(max_examples=60, deadline=None)
@given(st.lists(INT64, min_size=64, max_size=400))
def test_ints_match_msgpack(keys: list[int]) -> None:
    assert _checked(keys) == [_oracle(k) for k in keys]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(max_size=40) | st.sampled_from(["", "x" * 31, "x" * 32, "é" * 128,
                                                          "y" * 255, "z" * 256, "w" * 65_536]),
                min_size=64, max_size=300))
def test_strings_match_msgpack(keys: list[str]) -> None:
    assert _checked(keys) == [_oracle(k) for k in keys]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(st.characters(max_codepoint=127), max_size=40)
                | st.sampled_from(["", "\x00", "a\x00" * 20, "y" * 255, "z" * 256, "w" * 65_536]),
                min_size=64, max_size=300))
def test_ascii_strings_match_msgpack(keys: list[str]) -> None:
    """ASCII-only columns take the encoder's path without Arrow."""
    assert _checked(keys) == [_oracle(k) for k in keys]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.binary(max_size=40) | st.sampled_from([b"", b"\x00", b"x\x00" * 20,
                                                          b"y" * 255, b"z" * 256, b"w" * 65_535,
                                                          b"v" * 65_536]),
                min_size=64, max_size=300))
def test_bytes_match_msgpack(keys: list[bytes]) -> None:
    assert _checked(keys) == [_oracle(k) for k in keys]


WIDE_AND_NARROW = {
    "int": (st.integers(2**32, 2**63 - 1), st.integers(-(2**31), 2**32 - 1)),
    "str": (st.text("ab\x00", min_size=10, max_size=10), st.text("ab\x00", max_size=9)),
    "bytes": (st.binary(min_size=12, max_size=12), st.binary(max_size=11)),
}


@settings(max_examples=60, deadline=None)
@given(kind=st.sampled_from(sorted(WIDE_AND_NARROW)), data=st.data())
def test_columns_of_mostly_the_widest_keys_match_msgpack(kind: str, data: st.DataObject) -> None:
    """Most keys of the widest encoding and fewer than a quarter narrower: every row is cut
    at the widest width and the narrower ones replaced. Kills: a narrower key left as cut at
    the widest width (with the zero padding)."""
    wide, narrow = WIDE_AND_NARROW[kind]
    n = data.draw(st.integers(64, 120))
    keys: list[object] = data.draw(st.lists(wide, min_size=n, max_size=n))
    for row in data.draw(st.lists(st.integers(0, n - 1), max_size=(n - 1) // 4)):
        keys[row] = data.draw(narrow)
    assert _checked(keys) == [_oracle(k) for k in keys]


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(-(2**63), 2**63 - 1) | st.text(max_size=10) | st.binary(max_size=10)
                | st.tuples(st.integers(0, 9), st.text(max_size=3)), min_size=0, max_size=120))
def test_mixed_columns_match_the_per_key_encoder(keys: list[object]) -> None:
    assert encode_keys(keys) == [keyschema.encode_key(k) for k in keys]


@pytest.mark.parametrize(("bad", "error"), [
    (True, TypeError), (None, ValueError), (2**63, ValueError), (1.5, TypeError),
    ("\ud800", ValueError),
])
def test_a_bad_key_names_its_row(bad: object, error: type[Exception]) -> None:
    keys: list[object] = [*range(100), bad, *range(5)]
    with pytest.raises(error, match=r"^keys\[100\]: "):
        encode_keys(keys)
    strings: list[object] = [*map(str, range(100)), bad]
    with pytest.raises(error, match=r"^keys\[100\]: "):
        encode_keys(strings)


@settings(max_examples=100)
@given(st.lists(st.one_of(INT64, st.text(max_size=4), st.binary(max_size=4),
                          st.tuples(st.text(max_size=2), INT64), st.just("w" * 300)),
                max_size=20))
def test_length_prefixed_rows_cuts_key_encodings_apart(keys: list[object]) -> None:
    """Cutting by the length prefixes gives back each encoding (empty and zero-ending ones,
    keys over 255 bytes, whose length takes two prefix bytes, included)."""
    encoded = [keyschema.encode_key(k) for k in keys]
    data, first, stop = length_prefixed_rows(encoded)
    assert [data[a:b].tobytes() for a, b in zip(first.tolist(), stop.tolist(), strict=True)] \
        == encoded


@pytest.mark.parametrize("pieces", [[b"abc"], [b"\0\0\0\x05ab"], [b"\0\0\0\x00", b"\0"],
                                    [b"\0\0\0"], [b"\0\0\0\x01", b"x"]])
def test_length_prefixed_rows_refuses_other_bytes(pieces: list[bytes]) -> None:
    """A buffer too short for a prefix or a length, one with bytes left over, and one holding
    fewer encodings than keys: refused, never cut wrongly or read beyond its end."""
    with pytest.raises(ValueError, match="not length-prefixed"):
        length_prefixed_rows(pieces)


@settings(max_examples=60, deadline=None)
@given(keys=st.lists(INT64 | st.sampled_from(BOUNDARIES), max_size=80), data=st.data())
def test_encoded_int_keys_hold_msgpack_encodings(keys: list[int], data: st.DataObject) -> None:
    """``encode_int_keys`` (any number of keys: no per-key path below 64) and the rows it
    takes, in any order and with repeats, are msgpack's encodings, zero-padded to the widest
    row taken."""
    encodings = encode_int_keys(np.array(keys, dtype=np.int64))
    assert len(encodings) == len(keys)
    rows = data.draw(st.lists(st.integers(0, len(keys) - 1), max_size=30)) if keys else []
    matrix = encodings.take(np.array(rows, dtype=np.int64))
    expected = [_oracle(keys[row]) for row in rows]
    widest = max(map(len, expected), default=0)
    assert matrix.lengths.tolist() == [len(e) for e in expected]
    assert matrix.rows.tolist() == [list(e) + [0] * (widest - len(e)) for e in expected]
    # cut into bytes objects (for RocksDB's writers), twice: the second call reuses the first
    assert encodings.cut(np.array(rows, dtype=np.int64)) == expected
    assert encodings.cut(np.array(rows[::-1], dtype=np.int64)) == expected[::-1]


@settings(max_examples=60, deadline=None)
@given(keys=st.lists(st.integers(-3, 3) | st.sampled_from(BOUNDARIES), max_size=40),
       data=st.data())
def test_encoded_int_keys_identities_match_byte_equality(keys: list[int],
                                                        data: st.DataObject) -> None:
    """The labels the in-memory store ranks encoded keys by (instead of hashing their bytes)
    are equal exactly when the two rows' msgpack encodings are, for any rows taken in any
    order; taking them does not change the caller's array. Kills labels that merge distinct
    keys (a session of one key would be dropped as an earlier write of another) or that are
    the rows' positions rather than the taken rows' labels."""
    values = np.array(keys, dtype=np.int64)
    encodings = encode_int_keys(values)
    values[:] = 0  # the encodings own what they encode
    rows = data.draw(st.lists(st.integers(0, len(keys) - 1), max_size=30)) if keys else []
    labels = encodings.identities(np.array(rows, dtype=np.int64)).tolist()
    expected = [_oracle(keys[row]) for row in rows]
    assert len(labels) == len(rows)
    for i in range(len(rows)):
        for j in range(len(rows)):
            assert (labels[i] == labels[j]) == (expected[i] == expected[j])


@settings(max_examples=60, deadline=None)
@given(keys=st.lists(st.integers(-40, 40) | st.sampled_from(BOUNDARIES), unique=True,
                     max_size=40), data=st.data())
def test_distinct_int_keys_label_rows_as_the_hash_pass_does(keys: list[int],
                                                             data: st.DataObject) -> None:
    """Keys encoded as distinct (a batch's distinct keys: no hash pass) label any rows taken,
    in any order and with repeats, equal exactly when the hash pass's labels are, and so
    exactly when the rows' msgpack encodings are. Kills labels that are the taken rows'
    positions (a repeated row would get two labels: two writes of one session kept) or that
    merge distinct keys."""
    values = np.array(keys, dtype=np.int64)
    rows = np.array(data.draw(st.lists(st.integers(0, len(keys) - 1), max_size=30))
                    if keys else [], dtype=np.int64)
    labels = encode_int_keys(values, distinct=True).identities(rows).tolist()
    hashed = encode_int_keys(values).identities(rows).tolist()
    for i in range(len(rows)):
        for j in range(len(rows)):
            assert (labels[i] == labels[j]) == (hashed[i] == hashed[j])


def test_encoded_int_keys_at_every_format_boundary() -> None:
    """Every boundary of msgpack's int formats, and one either side, at once (the compiled
    encoder picks the format per row): kills a format bound off by one."""
    encodings = encode_int_keys(np.array(BOUNDARIES, dtype=np.int64))
    rows = np.arange(len(BOUNDARIES), dtype=np.int64)
    assert encodings.cut(rows) == [_oracle(key) for key in BOUNDARIES]
    matrix = encodings.take(rows)
    assert matrix.lengths.tolist() == [len(_oracle(key)) for key in BOUNDARIES]


def test_encoded_int_keys_refuse_other_arrays() -> None:
    with pytest.raises(ValueError, match="values must be a one-dimensional int64 array"):
        encode_int_keys(np.array([1, 2], dtype=np.int32))  # type: ignore[arg-type]
