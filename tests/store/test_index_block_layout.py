"""The bytes of an index block (``keyschema.encode_index_block``, built by two compiled
kernels), pinned to a plain layout written here from its docstring, with the padded key matrix
and without it, compiled and as the kernels' Python source; and the key-first rows'
kernel run as its Python source too (``tests/store/test_rocks_sst_file.py`` pins its compiled
form)."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionstore import jit, keyschema

PROFILE_SCALE = settings.default.max_examples / 100
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
KERNELS = ("index_block_slots_kernel", "index_block_kernel", "key_first_rows_kernel")


@contextmanager
def python_source(enabled: bool) -> Iterator[None]:
    """Run the kernels' Python source (as ``NUMBA_DISABLE_JIT=1`` does)."""
    if not enabled:
        yield
        return
    saved = dict(jit.COMPILED)
    jit.COMPILED.update({name: getattr(keyschema, name) for name in KERNELS})
    try:
        yield
    finally:
        jit.COMPILED.clear()
        jit.COMPILED.update(saved)


def reference_block(encoded: list[bytes], index: list[int], ends: list[int],
                    starts: list[int]) -> tuple[bytes, list[int], bytes, list[int]]:
    """The block's bytes, and its rows' key places, key bytes and key offsets."""
    used = sorted(set(index))
    place = {key: n for n, key in enumerate(used)}
    blob = b"".join(encoded[key] for key in used)
    offsets = [0]
    for key in used:
        offsets.append(offsets[-1] + len(encoded[key]))
    rows = [place[key] for key in index]
    n = len(index)
    data = (b"SSIB" + bytes([1]) + bytes(3) + struct.pack("<QQQ", n, len(used), len(blob))
            + struct.pack(f"<{n}q", *ends) + struct.pack(f"<{n}q", *starts)
            + struct.pack(f"<{len(offsets)}Q", *offsets) + struct.pack(f"<{n}I", *rows) + blob)
    return data, rows, blob, offsets


KEYS = st.lists(st.one_of(st.text(max_size=300), st.integers(INT64_MIN, INT64_MAX),
                          st.binary(max_size=12)),
                min_size=1, max_size=12, unique_by=keyschema.encode_key)


@st.composite
def sessions(draw: st.DrawFn, keys: int, most: int) -> tuple[list[int], list[int], list[int]]:
    """Up to ``most`` sessions' key indexes (of ``keys`` keys), ends and starts."""
    n = draw(st.integers(0, most))
    times = st.integers(INT64_MIN, INT64_MAX)
    return (draw(st.lists(st.integers(0, keys - 1), min_size=n, max_size=n)),
            draw(st.lists(times, min_size=n, max_size=n)),
            draw(st.lists(times, min_size=n, max_size=n)))


@settings(max_examples=round(100 * PROFILE_SCALE), deadline=None)
@given(keys=KEYS, data=st.data(), python=st.booleans())
def test_an_index_block_is_its_documented_layout(keys: list[Any], data: st.DataObject,
                                                 python: bool) -> None:
    # kills: a key not used by any row kept in the blob (or a used one dropped), keys placed
    # in row order instead of key order, an offset or row place off by one, a key cut at its
    # matrix width or read from another row, the ends and starts swapped
    encoded = [keyschema.encode_key(k) for k in keys]
    index, ends, starts = data.draw(sessions(len(keys), 30))
    expected, rows, blob, offsets = reference_block(encoded, index, ends, starts)
    matrices = [keyschema.key_matrix(encoded), None]
    for matrix in matrices:
        with python_source(python):
            got, block = keyschema.encode_index_block(
                encoded, np.array(index, dtype=np.int64), np.array(ends, dtype=np.int64),
                np.array(starts, dtype=np.int64), matrix)
        assert isinstance(got, bytes) and got == expected
        assert block.ends_ms.tolist() == ends and block.starts_ms.tolist() == starts
        assert block.key_of_row.tolist() == rows and block.key_bytes == blob
        assert block.key_offsets.tolist() == offsets
        assert block.keys().tolist() == [encoded[key] for key in sorted(set(index))]


def test_a_key_index_out_of_range_is_refused() -> None:
    # the kernels index without bounds checks: a wrong index must not reach them
    encoded = [keyschema.encode_key(k) for k in ("a", "b")]
    times = np.zeros(1, dtype=np.int64)
    for bad in (2, -1):
        with pytest.raises(ValueError, match="key_index holds"):
            keyschema.encode_index_block(encoded, np.array([bad], dtype=np.int64), times, times)


@settings(max_examples=round(30 * PROFILE_SCALE), deadline=None)
@given(keys=KEYS, data=st.data())
def test_the_key_first_rows_python_source_writes_the_records(keys: list[Any],
                                                             data: st.DataObject) -> None:
    # the kernel's source under NUMBA_DISABLE_JIT (unsigned positions index numpy arrays)
    encoded = [keyschema.encode_key(k) for k in keys]
    index, ends, starts = data.draw(sessions(len(keys), 10))
    n = len(index)
    with python_source(True):
        got, offsets = keyschema.key_first_rows(
            encoded, np.array(index, dtype=np.int64), np.array(ends, dtype=np.int64),
            np.array(starts, dtype=np.int64))
    assert [got[offsets[i]:offsets[i + 1]].tobytes() for i in range(n)] == [
        keyschema.key_first(encoded[k], e, s) for k, e, s in zip(index, ends, starts,
                                                                 strict=True)]
