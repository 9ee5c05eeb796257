"""The compiled loops of the open-session table (:mod:`sessionstore.engine.table`).

The table keeps its sessions in slots (rows of numpy columns). Each key's live slots form a
doubly linked list (``head`` per key id, ``nxt``/``prv`` per slot). A freed slot's generation
is bumped, so the end index's entries of sessions that were absorbed or closed become stale and
are skipped when the close cursor reaches them, rather than searched for and removed.

These loops are the only per-session work of a batch on the table: everything else is numpy
over the batch's rows. Each is plain Python that numba compiles on first use
(:func:`sessionstore.jit.compiled`); ``NUMBA_DISABLE_JIT=1`` runs them as written.
"""

from __future__ import annotations

from typing import Any

from .arrays import Int64Array


def table_probe(head: Int64Array, nxt: Int64Array, kids: Int64Array, out_slots: Int64Array,
                out_codes: Int64Array) -> int:
    """Write the live slots of every key id in ``kids`` (``-1``: a key the table lacks) to
    ``out_slots``, with the position in ``kids`` of their key in ``out_codes``; return how many.
    The outputs must hold the keys' live sessions."""
    n = 0
    for code in range(len(kids)):
        kid = kids[code]
        if kid < 0:
            continue
        slot = head[kid]
        while slot >= 0:
            out_slots[n] = slot
            out_codes[n] = code
            n += 1
            slot = nxt[slot]
    return n


def table_unlink(slots: Int64Array, kid: Int64Array, nxt: Int64Array, prv: Int64Array,
                 head: Int64Array, count: Int64Array, gen: Int64Array, free: Int64Array,
                 n_free: int) -> int:
    """Free ``slots`` (live, distinct): out of their key's list, generation bumped (their
    end-index entries go stale), pushed on the free stack. Returns the new stack size."""
    for i in range(len(slots)):
        slot = slots[i]
        k = kid[slot]
        before = prv[slot]
        after = nxt[slot]
        if before >= 0:
            nxt[before] = after
        else:
            head[k] = after
        if after >= 0:
            prv[after] = before
        count[k] -= 1
        kid[slot] = -1
        gen[slot] += 1
        free[n_free] = slot
        n_free += 1
    return n_free


def table_link(slots: Int64Array, kids: Int64Array, kid: Int64Array, nxt: Int64Array,
               prv: Int64Array, head: Int64Array, count: Int64Array) -> None:
    """Make the free ``slots`` live, ``slots[i]`` in the list of key id ``kids[i]``."""
    for i in range(len(slots)):
        slot = slots[i]
        k = kids[i]
        kid[slot] = k
        first = head[k]
        nxt[slot] = first
        prv[slot] = -1
        if first >= 0:
            prv[first] = slot
        head[k] = slot
        count[k] += 1


def end_runs_merge(a_ends: Int64Array, a_slots: Int64Array, a_gens: Int64Array, a_pos: int,
                   b_ends: Int64Array, b_slots: Int64Array, b_gens: Int64Array, b_pos: int,
                   gen: Int64Array, out_ends: Int64Array, out_slots: Int64Array,
                   out_gens: Int64Array) -> int:
    """Merge two end runs (each sorted by end) from ``a_pos`` and ``b_pos`` on into the
    outputs, keeping only live entries (``gen[slot]`` still the entry's generation), ``a``'s
    before ``b``'s among equal ends (a stable sort of the two joined); return how many."""
    n = 0
    i = a_pos
    j = b_pos
    na = len(a_ends)
    nb = len(b_ends)
    while i < na or j < nb:
        if j >= nb or (i < na and a_ends[i] <= b_ends[j]):
            end, slot, made = a_ends[i], a_slots[i], a_gens[i]
            i += 1
        else:
            end, slot, made = b_ends[j], b_slots[j], b_gens[j]
            j += 1
        if gen[slot] == made:
            out_ends[n] = end
            out_slots[n] = slot
            out_gens[n] = made
            n += 1
    return n


# -- a hash table of int64 keys (open addressing, linear probing): the key index while every
# key is an int. A Python dict of millions of ints costs a few cache misses per probe (the
# index, the entry, the int object); this costs one or two.

# 2**64 / golden ratio, as a signed int64 (so the product wraps in int64): a multiplicative hash
_GOLDEN = 0x9E3779B97F4A7C15 - (1 << 64)


def int_index_lookup(table_keys: Int64Array, table_ids: Int64Array, keys: Int64Array,
                     out: Int64Array) -> None:
    """``out[i]``: the id of ``keys[i]`` in the table (size a power of two, ``-1`` ids mark
    empty cells), or ``-1``."""
    mask = len(table_keys) - 1
    for i in range(len(keys)):
        key = keys[i]
        at = ((key * _GOLDEN) >> 17) & mask
        while True:
            kid = table_ids[at]
            if kid < 0 or table_keys[at] == key:
                out[i] = kid
                break
            at = (at + 1) & mask


def int_index_insert(table_keys: Int64Array, table_ids: Int64Array, keys: Int64Array,
                     ids: Int64Array) -> None:
    """Add ``keys[i] -> ids[i]`` (keys absent from the table, which has room)."""
    mask = len(table_keys) - 1
    for i in range(len(keys)):
        key = keys[i]
        at = ((key * _GOLDEN) >> 17) & mask
        while table_ids[at] >= 0:
            at = (at + 1) & mask
        table_keys[at] = key
        table_ids[at] = ids[i]


# -- the key index over encoded keys (EncodedKeyIndex) -----------------------------------------
#
# Keys as their encodings (keyschema.encode_key) in an arena, ``arena[first[id]:stop[id]]``;
# a table of ids (``-1``: an empty cell; size a power of two, at most half full), probed
# linearly from a 32-bit FNV-1a hash of the bytes; ``hashes[id]`` keeps each key's hash, so a
# probe compares bytes only when the hashes agree.


def bytes_hashes(data: Any, first: Int64Array, stop: Int64Array, out: Int64Array) -> None:
    """``out[i]``: the 32-bit FNV-1a hash of ``data[first[i]:stop[i]]``."""
    for i in range(len(first)):
        h = 2166136261
        for j in range(first[i], stop[i]):
            h = ((h ^ int(data[j])) * 16777619) & 0xFFFFFFFF
        out[i] = h


def bytes_index_find(table: Int64Array, arena: Any, arena_first: Int64Array,
                     arena_stop: Int64Array, arena_hashes: Int64Array, size: int, data: Any,
                     first: Int64Array, stop: Int64Array, hashes: Int64Array, out: Int64Array,
                     add: bool) -> int:
    """``out[i]``: the id of the key ``data[first[i]:stop[i]]`` (hash ``hashes[i]``) among
    the ``size`` ids of the table, or -1. With ``add`` (``arena`` must then be ``data``, and
    the id arrays have room), a key not found is added as the next id, pointing at its row's
    bytes: how a cold start finds the distinct keys of its rows. Returns the new size."""
    mask = len(table) - 1
    for i in range(len(first)):
        h = hashes[i]
        at = h & mask
        while True:
            kid = table[at]
            if kid < 0:
                if add:
                    table[at] = size
                    arena_first[size] = first[i]
                    arena_stop[size] = stop[i]
                    arena_hashes[size] = h
                    kid = size
                    size += 1
                out[i] = kid
                break
            if arena_hashes[kid] == h and arena_stop[kid] - arena_first[kid] == stop[i] - first[i]:
                same = True
                for k in range(stop[i] - first[i]):
                    if arena[arena_first[kid] + k] != data[first[i] + k]:
                        same = False
                        break
                if same:
                    out[i] = kid
                    break
            at = (at + 1) & mask
    return size


def bytes_index_insert(table: Int64Array, arena_hashes: Int64Array, ids: Int64Array) -> None:
    """Add the ids ``ids`` (of keys absent from the table, which has room) by their hashes."""
    mask = len(table) - 1
    for i in range(len(ids)):
        at = arena_hashes[ids[i]] & mask
        while table[at] >= 0:
            at = (at + 1) & mask
        table[at] = ids[i]


def gather_bytes(data: Any, first: Int64Array, stop: Int64Array, out: Any, at: int) -> None:
    """Copy ``data[first[i]:stop[i]]`` one after another into ``out`` from ``at`` on."""
    for i in range(len(first)):
        for j in range(first[i], stop[i]):
            out[at] = data[j]
            at += 1
