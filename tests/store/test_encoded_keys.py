"""A bulk call whose keys come encoded already (``KeyEncodings``: the engine encodes a batch's
int keys once for its ``remove_many`` and ``put_many``) does what the same call with the keys
themselves does, on both backends: same results, same contents, same errors."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionstore import InMemorySessionStore
from sessionstore.store.keycodec import encode_int_keys
from tests.store.test_bulk_write import (
    INT64_MAX,
    INT64_MIN,
    PROFILE_SCALE,
    configurations,
    contents,
    twin_stores,
)

INTS = st.sampled_from([0, 1, 300, -7, 2**40, 127, 128, -32, -33, 65_536, INT64_MIN,
                        INT64_MAX]) | st.integers(INT64_MIN, INT64_MAX)


@st.composite
def calls(draw: st.DrawFn) -> tuple[str, list[int], list[int], list[int], list[Any],
                                    list[int] | None]:
    """A put_many or remove_many over int keys (distinct, as the engine's, or repeating),
    with a key index or without (then one session per key); sessions may repeat (the later
    wins), keys may go unused."""
    keys = draw(st.lists(INTS, min_size=1, max_size=10, unique=draw(st.booleans())))
    indexed = draw(st.booleans())
    n = draw(st.integers(0, 15)) if indexed else len(keys)
    key_index = (draw(st.lists(st.integers(0, len(keys) - 1), min_size=n, max_size=n))
                 if indexed else None)
    starts = draw(st.lists(st.integers(-40, 40), min_size=n, max_size=n))
    ends = [s + draw(st.integers(0, 20)) for s in starts]
    values = draw(st.lists(st.integers(-5, 5), min_size=n, max_size=n))
    return draw(st.sampled_from(["put_many", "remove_many"])), keys, starts, ends, values, \
        key_index


@pytest.mark.parametrize("backend", ["memory", "rocksdb-mixed"])
@settings(max_examples=round(40 * PROFILE_SCALE), deadline=None)
@given(config=configurations(), script=st.lists(calls(), min_size=1, max_size=5))
def test_encoded_int_keys_act_as_the_keys(backend: str, config: dict[str, Any],
                                          script: list[Any]) -> None:
    with twin_stores(backend, **config) as (encoded_store, plain_store):
        for operation, keys, starts, ends, values, key_index in script:
            encoded = encode_int_keys(np.array(keys, dtype=np.int64))
            if operation == "put_many":
                got = encoded_store.put_many(encoded, starts, ends, values, key_index=key_index)
                want = plain_store.put_many(keys, starts, ends, values, key_index=key_index)
                assert got.tolist() == want.tolist()
            else:
                encoded_store.remove_many(encoded, starts, ends, key_index=key_index)
                plain_store.remove_many(keys, starts, ends, key_index=key_index)
            assert contents(encoded_store) == contents(plain_store)
            # every key's own sessions too (contents() reads a fixed list of keys)
            for key in keys:
                assert list(encoded_store.fetch(key)) == list(plain_store.fetch(key))


def test_encoded_keys_are_checked_as_keys_are() -> None:
    """A key index outside the keys, and a bad session, are refused naming the argument and
    the row; nothing changes."""
    store = InMemorySessionStore(retention_ms=100)
    encoded = encode_int_keys(np.array([5, 6], dtype=np.int64))
    with pytest.raises(ValueError, match=r"key_index\[1\] = 2 is not in \[0, 2\)"):
        store.put_many(encoded, [0, 0], [1, 1], [1, 1], key_index=[0, 2])
    with pytest.raises(ValueError, match=r"starts_ms\[0\] must be <= ends_ms\[0\]"):
        store.remove_many(encoded, [3], [1], key_index=[1])
    with pytest.raises(ValueError, match="values has 1 rows, there are 2 sessions"):
        store.put_many(encoded, [0, 0], [1, 1], [1])
    assert list(store.find_sessions(INT64_MIN, INT64_MAX)) == []
