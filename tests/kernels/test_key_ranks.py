"""key_ranks (the emission order of the columnar path) against the store's byte order of the
encoded keys, which the event path and the store sort by."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionstore import keyschema
from sessionstore.engine.columnar import key_ranks

from .test_planner import PROFILE_SCALE

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
# every boundary between msgpack's int formats, from both sides
EDGES = [INT64_MIN, INT64_MIN + 1, -(2**31) - 1, -(2**31), -32769, -32768, -129, -128, -33,
         -32, -1, 0, 1, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, INT64_MAX]


def _assert_byte_order(keys: list[Any], array: pa.Array) -> None:
    array_ranks = key_ranks(array)
    assert array_ranks.dtype == np.int64 and len(array_ranks) == len(keys)
    ranks = array_ranks.tolist()
    encoded = [keyschema.encode_key(k) for k in keys]
    for i in range(len(keys)):
        for j in range(len(keys)):
            by_rank = (ranks[i] > ranks[j]) - (ranks[i] < ranks[j])
            by_bytes = (encoded[i] > encoded[j]) - (encoded[i] < encoded[j])
            assert by_rank == by_bytes, (keys[i], keys[j])


@settings(max_examples=round(200 * PROFILE_SCALE))
@given(st.lists(st.one_of(st.sampled_from(EDGES), st.integers(-300, 300),
                          st.integers(INT64_MIN, INT64_MAX)), max_size=40))
def test_int_keys(keys: list[int]) -> None:
    _assert_byte_order(keys, pa.array(keys, type=pa.int64()))


@settings(max_examples=round(200 * PROFILE_SCALE))
@given(st.lists(st.one_of(st.text(max_size=40), st.sampled_from(["", "z" * 31, "z" * 32,
                                                                  "\x7f", "\x80", "é"])),
                max_size=30))
def test_str_keys(keys: list[str]) -> None:
    _assert_byte_order(keys, pa.array(keys, type=pa.string()))


@settings(max_examples=round(200 * PROFILE_SCALE))
@given(st.lists(st.one_of(st.binary(max_size=40), st.sampled_from([b"", bytes(255), bytes(256),
                                                                   b"\xff", b"\x00"])),
                max_size=30))
def test_bytes_keys(keys: list[bytes]) -> None:
    _assert_byte_order(keys, pa.array(keys, type=pa.binary()))


def test_object_keys_fall_back_to_encoding() -> None:
    keys = [(1, "a"), "b", 3, b"c", (1,)]
    array = np.empty(len(keys), dtype=object)
    array[:] = keys
    ranks = key_ranks(array)
    encoded = [keyschema.encode_key(k) for k in keys]
    assert sorted(range(len(keys)), key=lambda i: int(ranks[i])) == \
        sorted(range(len(keys)), key=lambda i: encoded[i])
