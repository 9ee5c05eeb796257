"""The open-session table's key index: a dense id per key.

:class:`KeyIndex` keeps Python keys (a compiled int64 hash table while every key is an int,
dicts per key type otherwise, so that ``1``, ``1.0`` and ``True`` stay three keys);
:class:`EncodedKeyIndex` keeps str or bytes keys as the store encodes them, so a table read back
in bulk never makes a Python object per key. :func:`grown` and :func:`headroom` size the
table's columns.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from .. import keyschema
from .. import table_kernels as tk
from ..arrays import ByteRows, Int64Array
from ..jit import compiled
from ..store.keycodec import EncodedKeys, encode_key_rows
from ..timeutil import INT64_MAX, INT64_MIN
from .columnar import (
    NotColumnar,
    key_column,
    object_array,
)

_EMPTY = np.zeros(0, dtype=np.int64)


def grown(array: npt.NDArray[Any], size: int, fill: Any = 0) -> npt.NDArray[Any]:
    """``array`` with room for ``size`` rows (doubling), the old rows kept, new ones ``fill``."""
    if size <= len(array):
        return array
    capacity = max(size, 2 * len(array), 64)
    out = np.full(capacity, fill, dtype=array.dtype)
    out[:len(array)] = array
    return out


def headroom(size: int) -> int:
    """A capacity for ``size`` rows loaded at once, with room for a quarter more."""
    return size + size // 4 + 64


def unique_keys(keys: list[Any]) -> tuple[list[Any], Int64Array]:
    """The distinct keys (in first-seen order, types kept apart as :class:`KeyIndex` keeps
    them) and each key's position among them."""
    first: dict[tuple[type, Any], int] = {}
    codes = np.fromiter((first.setdefault((type(key), key), len(first)) for key in keys),
                        dtype=np.int64, count=len(keys))
    return [key for _, key in first], codes


class KeyIndex:
    """Keys to dense key ids, kept across batches. Keys of different types stay apart (``1``,
    ``1.0`` and ``True`` are three keys, as the store's key encoding keeps them)."""

    def __init__(self) -> None:
        # while every key is an int that fits in int64 (the common case), the index is a
        # compiled hash table (_hash_keys, _hash_ids) and ``ints`` holds the keys by id, so
        # that probes and output key columns need no Python object per key; otherwise dicts
        # by key type, built on the first other key
        self._ids: dict[type, dict[Any, int]] | None = None
        self.ints: Int64Array | None = np.zeros(0, dtype=np.int64)
        self._hash_keys = np.zeros(0, dtype=np.int64)
        self._hash_ids = np.zeros(0, dtype=np.int64)
        self.keys: npt.NDArray[Any] = np.empty(0, dtype=object)  # by key id, dicts only
        self.size = 0

    @staticmethod
    def _as_ints(keys: Sequence[Any]) -> Int64Array | None:
        """``keys`` as int64 when they are all ints (not bools) that fit, else None."""
        if not set(map(type, keys)) <= {int}:
            return None
        try:
            return np.array(keys, dtype=np.int64).reshape(-1)
        except OverflowError:
            return None

    def lookup(self, keys: Sequence[Any], ints: Int64Array | None = None) -> Int64Array:
        """Each key's id, ``-1`` for keys the index lacks. ``ints``: the same keys as int64,
        when the caller has them (an Arrow int column's values): they are not converted."""
        if not keys:
            return _EMPTY
        if self._ids is None:
            out = np.full(len(keys), -1, dtype=np.int64)
            if not len(self._hash_ids):
                return out
            if ints is None:
                ints = self._as_ints(keys)
            if ints is not None:
                compiled(tk.int_index_lookup)(self._hash_keys, self._hash_ids, ints, out)
                return out
            # other keys too (absent: the index holds ints only): look up the ints among them
            rows = [i for i, key in enumerate(keys)
                    if type(key) is int and INT64_MIN <= key <= INT64_MAX]
            if rows:
                found = np.empty(len(rows), dtype=np.int64)
                compiled(tk.int_index_lookup)(self._hash_keys, self._hash_ids,
                                              np.array([keys[i] for i in rows], dtype=np.int64),
                                              found)
                out[rows] = found
            return out
        by_type = self._ids
        kinds = set(map(type, keys))
        if len(kinds) == 1:
            ids = by_type.get(kinds.pop())
            if ids is None:
                return np.full(len(keys), -1, dtype=np.int64)
            return np.fromiter(map(ids.get, keys, itertools.repeat(-1)), dtype=np.int64,
                               count=len(keys))
        empty: dict[Any, int] = {}
        return np.fromiter((by_type.get(type(key), empty).get(key, -1) for key in keys),
                           dtype=np.int64, count=len(keys))

    def add(self, keys: Sequence[Any], ints: Int64Array | None = None) -> Int64Array:
        """Give ids to ``keys`` (distinct, and absent from the index); return them.
        ``ints``: as in :meth:`lookup`; while the index holds ints only, ``keys`` may then be
        empty (the ints are the keys)."""
        first = self.size
        n = len(keys) if ints is None else len(ints)
        ids = np.arange(first, first + n, dtype=np.int64)
        self.size = first + n
        if self._ids is None:
            if ints is None:
                ints = self._as_ints(keys)
            if ints is not None:
                assert self.ints is not None
                self.ints = grown(self.ints, first + n)
                self.ints[first:first + n] = ints
                self._hash(ints, ids)
                return ids
            # the first key that is not an int64: the index becomes dicts by type, and the
            # keys are kept as objects
            assert self.ints is not None
            known = self.ints[:first].tolist()
            self.ints = None
            self._hash_keys = self._hash_ids = _EMPTY
            self._ids = {}
            self.keys = object_array(known)
            self._add_to_dicts(known, 0)
        self.keys = grown(self.keys, first + n, None)
        self.keys[first:first + n] = object_array(keys)  # tuples stay elements
        self._add_to_dicts(keys, first)
        return ids

    def _add_to_dicts(self, keys: Sequence[Any], first: int) -> None:
        by_type = self._ids
        assert by_type is not None
        kinds = set(map(type, keys))
        if len(kinds) == 1:  # the usual case (a cold start's millions of keys): one C call
            kind = kinds.pop()
            table = by_type.get(kind)
            if table is None:
                table = by_type[kind] = {}
            table.update(zip(keys, range(first, first + len(keys)), strict=True))
            return
        for kid, key in enumerate(keys, first):
            table = by_type.get(type(key))
            if table is None:
                table = by_type[type(key)] = {}
            table[key] = kid

    def _hash(self, ints: Int64Array, ids: Int64Array) -> None:
        """Add to the int hash table, doubling it to stay at most half full."""
        if 2 * self.size > len(self._hash_ids):
            capacity = 1024
            while capacity < 4 * self.size:
                capacity *= 2
            assert self.ints is not None
            # each cell's key and id side by side: a probe costs one cache miss, not two
            cells = np.empty((capacity, 2), dtype=np.int64)
            cells[:, 0] = 0
            cells[:, 1] = -1
            self._hash_keys, self._hash_ids = cells[:, 0], cells[:, 1]
            ints = self.ints[:self.size]
            ids = np.arange(self.size, dtype=np.int64)
        compiled(tk.int_index_insert)(self._hash_keys, self._hash_ids, ints, ids)

    def column(self, kids: Int64Array) -> Any:
        """The keys of ``kids`` as a key column (:func:`~.columnar.key_column`)."""
        if self.ints is not None:
            return pa.array(self.ints[kids])
        return key_column(self.keys[kids].tolist())

    def keep(self, kids: Int64Array) -> None:
        """Keep only the keys ``kids`` (ascending), renumbered ``0..len(kids)-1``."""
        if self.ints is not None:
            ints = self.ints[kids]
            self.__init__()  # type: ignore[misc]
            self.add(ints.tolist(), ints)
            return
        keys = self.keys[kids]
        self.__init__()  # type: ignore[misc]
        self.add(keys.tolist())


class EncodedKeyIndex:
    """Keys to dense key ids by their encodings (:func:`~sessionstore.keyschema.encode_key`),
    for the str or bytes keys a cold start reads back from the store: the encodings in one
    arena, and a compiled hash table over them, so that millions of keys need no Python
    object each; only the keys a batch looks up, adds or emits become objects (or Arrow
    arrays). Distinct encodings are distinct keys, so ``1``, ``"1"`` and ``b"1"`` stay apart
    as :class:`KeyIndex` keeps them; a key the store cannot hold (a float, say) is never in
    the index, and looking one up raises :class:`NotColumnar` (the exact path reports it).

    Args:
        arena: the encodings, id after id (``arena[first[id]:stop[id]]``), uint8; the first
            ``used`` bytes are taken.
        first, stop: each id's bytes in the arena (the first ``size`` entries are taken).
        hashes: each id's hash (:func:`~sessionstore.table_kernels.bytes_hashes`).
        table: the hash table of the ids (a power of two, at most half full).
        kind: ``"str"`` or ``"bytes"`` while every key is of that type.
    """

    ints: Int64Array | None = None  # never an int index (see KeyIndex.ints)

    def __init__(self, arena: npt.NDArray[np.uint8], used: int, first: Int64Array,
                 stop: Int64Array, hashes: Int64Array, size: int, table: Int64Array,
                 kind: str | None) -> None:
        self._arena = arena
        self._used = used
        self._first = first
        self._stop = stop
        self._hashes = hashes
        self._table = table
        self._kind = kind
        self.size = size

    @classmethod
    def gathered(cls, data: npt.NDArray[np.uint8], first: Int64Array, stop: Int64Array,
                 hashes: Int64Array, table: Int64Array, kind: str | None) -> EncodedKeyIndex:
        """The index of the encodings ``data[first[i]:stop[i]]`` (id ``i``), copied into an
        arena of their own; ``table`` already holds the ids."""
        n = len(first)
        lengths = stop - first
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        # room for a quarter more keys: the batches after a cold start add keys, and growing
        # arrays of millions of keys at once would cost the first of them what the load did
        arena = np.empty(headroom(int(offsets[-1])), dtype=np.uint8)
        compiled(tk.gather_bytes)(data, first, stop, arena, 0)
        index_first = np.zeros(headroom(n), dtype=np.int64)
        index_stop = np.zeros(headroom(n), dtype=np.int64)
        index_hashes = np.zeros(headroom(n), dtype=np.int64)
        index_first[:n] = offsets[:-1]
        index_stop[:n] = offsets[1:]
        index_hashes[:n] = hashes
        return cls(arena, int(offsets[-1]), index_first, index_stop, index_hashes, n, table,
                   kind)

    @staticmethod
    def _encode(keys: Any) -> tuple[npt.NDArray[np.uint8], Int64Array, Int64Array, Int64Array]:
        """The keys' encodings as ``(bytes, first, stop, hashes)``.

        Raises:
            NotColumnar: a key the store cannot hold (nothing has changed yet).
        """
        try:
            encoded, _ = encode_key_rows(keys)
        except (TypeError, ValueError) as exc:
            raise NotColumnar(f"a key the store cannot hold: {exc}") from None
        # the encoder's matrix as it is (no bytes object per key), or the bytes joined
        rows = encoded.rows() if isinstance(encoded, EncodedKeys) else ByteRows.of_list(encoded)
        data, first, stop = rows.data, rows.first, rows.stop
        hashes = np.empty(len(encoded), dtype=np.int64)
        compiled(tk.bytes_hashes)(data, first, stop, hashes)
        return data, first, stop, hashes

    def lookup(self, keys: Sequence[Any], ints: Int64Array | None = None) -> Int64Array:
        """Each key's id, ``-1`` for keys the index lacks (``ints`` is not needed here).

        Raises:
            NotColumnar: a key the store cannot hold.
        """
        if not len(keys):
            return _EMPTY
        data, first, stop, hashes = self._encode(keys)
        out = np.empty(len(keys), dtype=np.int64)
        compiled(tk.bytes_index_find)(self._table, self._arena, self._first, self._stop,
                                      self._hashes, self.size, data, first, stop, hashes, out,
                                      False)
        return out

    def add(self, keys: Sequence[Any], ints: Int64Array | None = None) -> Int64Array:
        """Give ids to ``keys`` (distinct, absent, and looked up before: encodable); return
        them. ``ints``: the keys as int64 when ``keys`` is empty."""
        if not len(keys) and ints is not None:
            keys = ints.tolist()
        data, first, stop, hashes = self._encode(keys)
        n = len(keys)
        start = self.size
        ids = np.arange(start, start + n, dtype=np.int64)
        lengths = stop - first
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        self._arena = grown(self._arena, self._used + int(offsets[-1]))
        compiled(tk.gather_bytes)(data, first, stop, self._arena, self._used)
        self._first = grown(self._first, start + n)
        self._stop = grown(self._stop, start + n)
        self._hashes = grown(self._hashes, start + n)
        self._first[ids] = self._used + offsets[:-1]
        self._stop[ids] = self._used + offsets[1:]
        self._hashes[ids] = hashes
        self._used += int(offsets[-1])
        self.size = start + n
        if self._kind is not None and set(map(type, keys)) != {
                str if self._kind == "str" else bytes}:
            self._kind = None  # mixed: keys leave one by one (column)
        if 2 * self.size > len(self._table):
            self._rehash()
        else:
            compiled(tk.bytes_index_insert)(self._table, self._hashes, ids)
        return ids

    def _rehash(self) -> None:
        capacity = 1024
        while capacity < 4 * self.size:
            capacity *= 2
        self._table = np.full(capacity, -1, dtype=np.int64)
        compiled(tk.bytes_index_insert)(self._table, self._hashes,
                                        np.arange(self.size, dtype=np.int64))

    def column(self, kids: Int64Array) -> Any:
        """The keys of ``kids`` as a key column (:func:`~.columnar.key_column`)."""
        first, stop = self._first[kids], self._stop[kids]
        if self._kind is not None:
            return keyschema.text_key_column(self._arena, first, stop, self._kind == "bytes")
        arena = self._arena
        return key_column([keyschema.decode_key(arena[a:b].tobytes())
                           for a, b in zip(first.tolist(), stop.tolist(), strict=True)])

    def keep(self, kids: Int64Array) -> None:
        """Keep only the keys ``kids`` (ascending), renumbered ``0..len(kids)-1``."""
        kept = EncodedKeyIndex.gathered(self._arena, self._first[kids], self._stop[kids],
                                        self._hashes[kids], self._table, self._kind)
        self._arena, self._used = kept._arena, kept._used
        self._first, self._stop, self._hashes = kept._first, kept._stop, kept._hashes
        self.size = kept.size
        self._rehash()
