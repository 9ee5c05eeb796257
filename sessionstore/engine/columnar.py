"""Sessions as columns, and the built-in aggregations over them.

The fast batch path moves sessions as :class:`SessionRows`: a key column, start and end arrays,
and one set of accumulator columns per built-in aggregation part (:class:`PartColumns`). The
engine keeps its open sessions (end after the close cursor) in the persistent table of
:mod:`sessionstore.engine.table`, which hands a batch the rows of the batch's keys as
:class:`SessionRows`. A batch then costs array operations over the batch and the sessions of
its keys, never a Python call per event or per session: the merge plan comes from
:func:`sessionstore.engine.planner.plan`, the accumulators from the vectorised aggregations
of :mod:`sessionstore.kernels`, and the store sees one ``remove_many`` and one ``put_many``.

Combination order (what makes the fast path equal the exact path bit for bit): a session's new
accumulator is the aggregation's initial value, merged with the open sessions it absorbed in
start order, then merged with the fold of the batch's events in (time, arrival) order. Float sums
are left folds in that order; count, integer sums, min and max do not depend on it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from .. import arrays, folds, kernels, keyschema
from ..aggregations import Aggregation, Combined
from ..arrays import ListBacked
from ..jit import compiled
from ..types import Session
from .emit import Emit

Int64Array = npt.NDArray[np.int64]
NUMERIC_KINDS = ("sum", "min", "max")
ITEM_KINDS = ("first", "last", "collect")


class NotColumnar(Exception):
    """This batch (or stored state) cannot take the fast path; the exact slower path runs."""


def columnar_parts(aggregation: Aggregation) -> list[tuple[str, str | None]] | None:
    """``[(kind, column), ...]`` of an aggregation the fast path can compute; None otherwise."""
    parts = aggregation.parts if isinstance(aggregation, Combined) else [aggregation]
    out = []
    for part in parts:
        kind = part.columnar_kind
        if kind is None:
            return None
        out.append((kind, part.column))
    return out


def object_array(values: Any) -> npt.NDArray[Any]:
    """A 1-d object array of ``values`` (nested lists stay elements, not dimensions)."""
    return np.fromiter(values, dtype=object, count=len(values))


class IntKeys(ListBacked[int]):
    """A batch's distinct int keys, held as their int64 values and read as Python ints only
    when something reads an item: the fast batch path over an int key column and an int key
    index never does (it takes :attr:`values`), so the list is never built.

    Args:
        values: int64, one per key.
    """

    __slots__ = ("values", "_list")

    def __init__(self, values: Int64Array) -> None:
        self.values = values
        self._list: list[int] | None = None

    def as_list(self) -> list[int]:
        """The keys as a list of Python ints (built once)."""
        if self._list is None:
            self._list = self.values.tolist()
        return self._list

    def __len__(self) -> int:
        return len(self.values)


def numeric_column(values: Any, what: str) -> npt.NDArray[Any]:
    """int64 or float64 values for sum/min/max, exactly as Python would add and compare them.

    Raises:
        NotColumnar: mixed or non-numeric types, NaN, or ints beyond int64 (Python's own
            arithmetic on them, in the exact path, decides what happens).
    """
    if isinstance(values, np.ndarray):
        array = values
        if array.dtype.kind in "iu":
            if array.dtype.kind == "u" and len(array) and array.max() > np.iinfo(np.int64).max:
                raise NotColumnar(f"{what}: beyond int64")
            array = array.astype(np.int64, copy=False)
        elif array.dtype.kind != "f":
            raise NotColumnar(f"{what}: dtype {array.dtype}")
    else:
        types = set(map(type, values))
        if types <= {int}:
            try:
                array = np.array(values, dtype=np.int64)
            except OverflowError:
                raise NotColumnar(f"{what}: beyond int64") from None
        elif types <= {float}:
            array = np.array(values, dtype=np.float64)
        else:
            raise NotColumnar(f"{what}: types {sorted(t.__name__ for t in types)}")
    if array.dtype.kind == "f":
        array = array.astype(np.float64, copy=False)
        if np.isnan(array).any():
            raise NotColumnar(f"{what}: NaN")  # Python's min/max with NaN depend on order
    return array


@dataclass
class PartColumns:
    """The accumulators of one aggregation part, one row per session (``collect``: per item).

    ``value``: count, sum, min or max per row; for first/last the value; for collect the values
    of all rows' items, row after row. ``t_ms``/``seq``: the (time, arrival) of first/last per
    row, or of each collect item. ``offsets``: collect only, rows + 1 item offsets.
    """

    kind: str
    value: npt.NDArray[Any]
    t_ms: Int64Array | None = None
    seq: Int64Array | None = None
    offsets: Int64Array | None = None

    def take(self, rows: Int64Array) -> PartColumns:
        if self.kind != "collect":
            return PartColumns(self.kind, self.value[rows],
                               None if self.t_ms is None else self.t_ms[rows],
                               None if self.seq is None else self.seq[rows])
        assert self.offsets is not None and self.t_ms is not None and self.seq is not None
        items, offsets = _gather_items(self.offsets, rows)
        return PartColumns("collect", self.value[items], self.t_ms[items], self.seq[items],
                           offsets)

    def results(self) -> list[Any]:
        """What each row emits, as Python values."""
        if self.kind != "collect":
            return self.value.tolist()  # type: ignore[no-any-return]
        assert self.offsets is not None
        flat = self.value.tolist()
        bounds = self.offsets.tolist()
        return list(map(flat.__getitem__, map(slice, bounds[:-1], bounds[1:])))

    def wire(self) -> list[Any]:
        """Each row's accumulator in the stored form of the aggregation (see aggregations)."""
        if self.kind in ("count", *NUMERIC_KINDS):
            return self.value.tolist()  # type: ignore[no-any-return]
        assert self.t_ms is not None and self.seq is not None
        triples = list(map(list, zip(self.t_ms.tolist(), self.seq.tolist(),
                                     self.value.tolist(), strict=True)))
        if self.kind != "collect":
            return triples
        assert self.offsets is not None
        bounds = self.offsets.tolist()
        return list(map(triples.__getitem__, map(slice, bounds[:-1], bounds[1:])))

    def arrow(self) -> pa.Array:
        """What each row emits, as an Arrow array (collect: a list array)."""
        if self.kind != "collect":
            return pa.array(self.value)
        assert self.offsets is not None
        return pa.ListArray.from_arrays(pa.array(self.offsets.astype(np.int32)),
                                        pa.array(self.value))


def _gather_items(offsets: Int64Array, rows: Int64Array) -> tuple[Int64Array, Int64Array]:
    """The item indices of ``rows`` (row after row) and their new offsets."""
    lengths = offsets[rows + 1] - offsets[rows]
    new_offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(lengths, out=new_offsets[1:])
    items = (np.arange(new_offsets[-1], dtype=np.int64)
             - np.repeat(new_offsets[:-1] - offsets[rows], lengths))
    return items, new_offsets


def _concat_values(a: npt.NDArray[Any], b: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """Concatenate keeping each row's Python type: an empty side takes the other's dtype, and
    int64 next to float64 becomes objects (a sum stays an int where only ints were added)."""
    if len(a) == 0:
        return b
    if len(b) == 0 or a.dtype == b.dtype:
        return np.concatenate((a, b)) if len(b) else a
    return np.concatenate((a.astype(object), b.astype(object)))


def _concat_parts(a: PartColumns, b: PartColumns) -> PartColumns:
    value = _concat_values(a.value, b.value)
    if a.kind in ("count", *NUMERIC_KINDS):
        return PartColumns(a.kind, value)
    assert a.t_ms is not None and b.t_ms is not None and a.seq is not None
    assert b.seq is not None
    t_ms = np.concatenate((a.t_ms, b.t_ms))
    seq = np.concatenate((a.seq, b.seq))
    if a.kind != "collect":
        return PartColumns(a.kind, value, t_ms, seq)
    assert a.offsets is not None and b.offsets is not None
    offsets = np.concatenate((a.offsets, b.offsets[1:] + a.offsets[-1]))
    return PartColumns("collect", value, t_ms, seq, offsets)


class SessionRows:
    """Sessions as columns: keys, ``starts_ms``, ``ends_ms`` and accumulator parts.

    ``keys`` is an Arrow array when the keys are all ints, all str or all bytes (so that the
    output columns are built without a Python object per row), else a numpy object array.
    """

    def __init__(self, keys: Any, starts_ms: Int64Array, ends_ms: Int64Array,
                 parts: list[PartColumns]) -> None:
        self.keys = keys
        self.starts_ms = starts_ms
        self.ends_ms = ends_ms
        self.parts = parts

    def __len__(self) -> int:
        return len(self.starts_ms)

    @classmethod
    def empty(cls, kinds: list[str]) -> SessionRows:
        none = np.zeros(0, dtype=np.int64)
        parts = [PartColumns(kind, np.zeros(0, dtype=object) if kind in ITEM_KINDS else
                             np.zeros(0, dtype=np.int64),
                             None if kind in ("count", *NUMERIC_KINDS) else none,
                             None if kind in ("count", *NUMERIC_KINDS) else none,
                             np.zeros(1, dtype=np.int64) if kind == "collect" else None)
                 for kind in kinds]
        return cls(np.zeros(0, dtype=object), none, none, parts)

    @classmethod
    def from_rows(cls, kinds: list[str], rows: list[tuple[Session, Any]], *,
                  combined: bool) -> SessionRows:
        """Build from stored ``(session, accumulator)`` rows (a cold start: one pass in Python).

        ``combined``: the aggregation is a :class:`Combined` (even of one part), whose
        accumulator is a list with one entry per part; otherwise the accumulator is bare.

        Raises:
            NotColumnar: an accumulator column mixes types the fast path keeps apart.
        """
        if not rows:
            return cls.empty(kinds)
        keys = key_column([s.key for s, _ in rows])
        starts = np.array([s.start for s, _ in rows], dtype=np.int64)
        ends = np.array([s.end for s, _ in rows], dtype=np.int64)
        single = not combined
        parts = []
        for p, kind in enumerate(kinds):
            accs = [acc if single else acc[p] for _, acc in rows]
            if kind == "count":
                parts.append(PartColumns(kind, np.array(accs, dtype=np.int64)))
            elif kind in NUMERIC_KINDS:
                parts.append(PartColumns(kind, numeric_column(accs, "stored accumulators")))
            elif kind != "collect":
                parts.append(PartColumns(kind, object_array([a[2] for a in accs]),
                                         np.array([a[0] for a in accs], dtype=np.int64),
                                         np.array([a[1] for a in accs], dtype=np.int64)))
            else:
                flat = [item for acc in accs for item in acc]
                offsets = np.zeros(len(accs) + 1, dtype=np.int64)
                np.cumsum([len(acc) for acc in accs], out=offsets[1:])
                parts.append(PartColumns(kind, object_array([i[2] for i in flat]),
                                         np.array([i[0] for i in flat], dtype=np.int64),
                                         np.array([i[1] for i in flat], dtype=np.int64),
                                         offsets))
        return cls(keys, starts, ends, parts)

    def take(self, rows: Int64Array) -> SessionRows:
        keys = self.keys.take(pa.array(rows)) if isinstance(self.keys, pa.Array) \
            else self.keys[rows]
        return SessionRows(keys, self.starts_ms[rows], self.ends_ms[rows],
                         [part.take(rows) for part in self.parts])

    def concat(self, other: SessionRows) -> SessionRows:
        return SessionRows(concat_keys(self.keys, other.keys),
                         np.concatenate((self.starts_ms, other.starts_ms)),
                         np.concatenate((self.ends_ms, other.ends_ms)),
                         [_concat_parts(a, b) for a, b in zip(self.parts, other.parts,
                                                               strict=True)])

    def key_list(self) -> list[Any]:
        keys: list[Any] = self.keys.to_pylist() if isinstance(self.keys, pa.Array) \
            else self.keys.tolist()
        return keys

    def store_order(self) -> Int64Array:
        """Rows in (end, encoded key, start) order: the store's ``find_sessions`` order."""
        return arrays.sort_order([self.ends_ms, key_ranks(self.keys), self.starts_ms])

    def wire_records(self, *, combined: bool) -> list[Any]:
        """The stored value of each row: the session record ``[acc, 0, 0, 0, None]``, with
        ``acc`` a list of the parts' accumulators when ``combined`` (see :meth:`from_rows`)."""
        accs = self.parts[0].wire() if not combined else \
            list(map(list, zip(*(part.wire() for part in self.parts), strict=True)))
        # tuples pack as the same msgpack arrays as the event path's lists, and cost less
        zero = itertools.repeat(0)
        return list(zip(accs, zero, zero, zero, itertools.repeat(None)))

    def results(self, names: list[str] | None) -> list[Any]:
        """What each row emits: the single part's result, or ``{name: result}``."""
        if names is None:
            return self.parts[0].results()
        columns = [part.results() for part in self.parts]
        return list(map(dict, map(zip, itertools.repeat(names), zip(*columns, strict=True))))

    def emits(self, names: list[str] | None, retraction: npt.NDArray[np.bool_] | None = None
              ) -> list[Emit]:
        """The rows as :class:`Emit` objects, built by C-level maps (no Python call per row)."""
        sessions = map(tuple.__new__, itertools.repeat(Session),
                       zip(self.key_list(), self.starts_ms.tolist(), self.ends_ms.tolist(),
                           strict=True))
        flags = itertools.repeat(False) if retraction is None else retraction.tolist()
        return list(map(tuple.__new__, itertools.repeat(Emit),
                        zip(sessions, self.results(names), itertools.repeat(None), flags,
                            (self.ends_ms - 1).tolist())))


# msgpack's int formats in the byte order of their encodings (length prefix, then header, then
# the big-endian payload): positive fixint, negative fixint, uint8, int8, uint16, int16, uint32,
# int32, uint64, int64. Within one format, byte order is numeric order.
_INT_FORMAT_LOWS = np.array([-(2**63), -(2**31), -32768, -128, -32, 0, 128, 256, 65536, 2**32],
                            dtype=np.int64)
_INT_FORMAT_RANK = np.array([9, 7, 5, 3, 1, 0, 2, 4, 6, 8], dtype=np.int64)


def key_ranks(keys: Any) -> Int64Array:
    """Per row, a number that orders the rows' keys as their encodings
    (:func:`~sessionstore.keyschema.encode_key`) order in bytes, as the store sorts them:
    equal keys get equal numbers.

    Computed without encoding a key when the column is Arrow ints, strings or binaries:
    non-negative ints encode in numeric order (the int itself is its rank); other ints order
    by msgpack format, then value; strings and binaries by byte length (the length prefix),
    then bytes. Other columns are encoded (each key once) and their bytes ranked.
    """
    if isinstance(keys, pa.Array) and pa.types.is_int64(keys.type):
        values = keys.to_numpy(zero_copy_only=False)
        if len(values) == 0 or values.min() >= 0:
            return values  # type: ignore[no-any-return]
        distinct, inverse = np.unique(values, return_inverse=True)
        formats = _INT_FORMAT_RANK[np.searchsorted(_INT_FORMAT_LOWS, distinct, side="right") - 1]
        ranks = np.empty(len(distinct), dtype=np.int64)
        ranks[np.argsort(formats, kind="stable")] = np.arange(len(distinct), dtype=np.int64)
        return ranks[inverse.reshape(-1)]
    if isinstance(keys, pa.Array) and (pa.types.is_string(keys.type)
                                       or pa.types.is_binary(keys.type)):
        dictionary = keys.dictionary_encode()
        distinct = dictionary.dictionary
        order = pc.sort_indices(
            pa.table({"length": pc.binary_length(distinct), "key": distinct}),
            sort_keys=[("length", "ascending"), ("key", "ascending")],
        ).to_numpy(zero_copy_only=False)
        ranks = np.empty(len(distinct), dtype=np.int64)
        ranks[order] = np.arange(len(distinct), dtype=np.int64)
        by_row: Int64Array = ranks[dictionary.indices.to_numpy(zero_copy_only=False)]
        return by_row
    if isinstance(keys, pa.Array):  # encode each distinct key once
        dictionary = keys.dictionary_encode()
        encoded = list(map(keyschema.encode_key, dictionary.dictionary.to_pylist()))
        indices = dictionary.indices.to_numpy(zero_copy_only=False)
        by_row = keyschema.key_order(encoded)[indices]
        return by_row
    return keyschema.key_order(list(map(keyschema.encode_key, keys.tolist())))


def key_column(keys: list[Any]) -> Any:
    """Keys as an Arrow array when they are all ints, all str or all bytes; else objects."""
    types = set(map(type, keys))
    if types <= {int} or types <= {str} or types <= {bytes}:
        try:
            array = pa.array(keys)
        except (pa.ArrowInvalid, OverflowError):
            return object_array(keys)
        return normal_key_array(array)
    return object_array(keys)


def normal_key_array(array: pa.Array) -> Any:
    """Arrow keys in one type per kind (int64, string, binary), so equal keys compare equal."""
    if pa.types.is_integer(array.type):
        if pa.types.is_uint64(array.type) and len(array) and \
                pc.max(array).as_py() > np.iinfo(np.int64).max:
            return object_array(array.to_pylist())
        return array.cast(pa.int64())
    if pa.types.is_large_string(array.type):
        return array.cast(pa.string())
    if pa.types.is_large_binary(array.type):
        return array.cast(pa.binary())
    return array


def concat_keys(a: Any, b: Any) -> Any:
    if isinstance(a, pa.Array) and isinstance(b, pa.Array) and a.type == b.type:
        return pa.concat_arrays([a, b])
    if len(a) == 0:
        return b
    if len(b) == 0:
        return a
    left = object_array(a.to_pylist()) if isinstance(a, pa.Array) else a
    right = object_array(b.to_pylist()) if isinstance(b, pa.Array) else b
    return np.concatenate((left, right))


def codes_in(table_keys: Any, uniques: list[Any], uniques_arrow: Any) -> Int64Array:
    """For each table key, its index in the batch's ``uniques`` (-1 when absent)."""
    if isinstance(table_keys, pa.Array) and isinstance(uniques_arrow, pa.Array) \
            and table_keys.type == uniques_arrow.type:
        found = pc.fill_null(pc.index_in(table_keys, value_set=uniques_arrow), -1)
        return found.to_numpy(zero_copy_only=False).astype(np.int64)  # type: ignore[no-any-return]
    keys = table_keys.to_pylist() if isinstance(table_keys, pa.Array) else table_keys.tolist()
    # (type, key) so that 1, 1.0 and True stay apart, as the key encoding keeps them
    index = dict(zip(zip(map(type, uniques), uniques, strict=True), itertools.count()))
    return np.fromiter(map(index.get, zip(map(type, keys), keys, strict=True),
                           itertools.repeat(-1)),
                       dtype=np.int64, count=len(keys))


# -- aggregating a planned batch ------------------------------------------------------------


def needs_time_order(kinds: list[str], event_values: list[npt.NDArray[Any] | None]) -> bool:
    """Whether :func:`aggregate_plan` needs each session's events in (time, arrival) order:
    for first, last, collect and float sums; count, integer sums, min and max do not depend
    on the order."""
    return any(kind in ITEM_KINDS or (kind == "sum" and values is not None
                                      and values.dtype.kind == "f")
               for kind, values in zip(kinds, event_values, strict=True))


def aggregate_plan(
    kinds: list[str], plan: Any, open_parts: list[PartColumns], open_starts_ms: Int64Array,
    event_values: list[npt.NDArray[Any] | None], times_ms: Int64Array, seqs: Int64Array,
    groups: kernels.EventGroups | None = None, absorbed: kernels.EventGroups | None = None,
) -> list[PartColumns]:
    """The accumulator columns of a plan's sessions, in the combination order of the module.

    Args:
        kinds: the part kinds.
        plan: a :class:`~sessionstore.kernels.SessionPlan` over the accepted events.
        open_parts: the accumulator columns of the open sessions given to the plan.
        open_starts_ms: their starts.
        event_values: per part, the accepted events' values (None for count).
        times_ms, seqs: the accepted events' times and arrival numbers.
        groups, absorbed: the plan's event groups and absorbed open sessions when already
            computed (:func:`~sessionstore.kernels.plan_dense`); the event groups must be in
            (time, arrival) order when :func:`needs_time_order` says so.

    Raises:
        NotColumnar: an integer sum leaves int64.
    """
    sessions = len(plan.session_codes)
    if groups is None:
        groups = folds.group_events(plan.event_session, times_ms, sessions)
    if absorbed is None:
        absorbed = folds.group_open_sessions(plan, open_starts_ms)
    owner = plan.open_session[absorbed.order]
    out = []
    for kind, part, values in zip(kinds, open_parts, event_values, strict=True):
        if kind == "count":
            total = folds.count_per_session(groups).astype(np.int64)
            np.add.at(total, owner, part.value[absorbed.order])
            out.append(PartColumns(kind, total))
        elif kind == "sum":
            out.append(PartColumns(kind, _sum(groups, absorbed, owner, part.value, values)))
        elif kind in ("min", "max"):
            reduce = folds.min_per_session if kind == "min" else folds.max_per_session
            assert values is not None
            best = reduce(groups, values)
            sources = [(plan.event_session, values)]
            if len(owner):
                absorbed_values = part.value[absorbed.order]
                (np.fmin if kind == "min" else np.maximum).at(best, owner, absorbed_values)
                sources.append((owner, absorbed_values))
            out.append(PartColumns(kind, folds.signed_zero_extremes(best, kind, sources)))
        elif kind in ("first", "last"):
            assert values is not None and part.t_ms is not None and part.seq is not None
            pick = groups.order[groups.offsets[:-1] if kind == "first"
                                else groups.offsets[1:] - 1]
            t_ms, seq, value = times_ms[pick], seqs[pick], values[pick]
            if len(owner):
                rows = absorbed.order
                # the best absorbed accumulator of each session, then against the events'
                order = np.lexsort((part.seq[rows], part.t_ms[rows], owner))
                bounds = absorbed.offsets
                has = bounds[1:] > bounds[:-1]
                idx = (bounds[:-1] if kind == "first" else bounds[1:] - 1)[has]
                cand = rows[order[idx]]
                ct, cs = part.t_ms[cand], part.seq[cand]
                target = np.flatnonzero(has)
                et, es = t_ms[target], seq[target]
                if kind == "first":
                    better = (ct < et) | ((ct == et) & (cs < es))
                else:
                    better = (ct > et) | ((ct == et) & (cs > es))
                win = target[better]
                t_ms, seq = t_ms.copy(), seq.copy()
                value = value.astype(object) if value.dtype != part.value.dtype else value.copy()
                t_ms[win], seq[win] = ct[better], cs[better]
                value[win] = part.value[cand[better]]
            out.append(PartColumns(kind, value, t_ms, seq))
        else:
            assert values is not None and part.offsets is not None
            assert part.t_ms is not None and part.seq is not None
            items, item_offsets = _gather_items(part.offsets, absorbed.order)
            item_owner = np.repeat(owner, np.diff(item_offsets))
            all_owner = np.concatenate((item_owner, plan.event_session))
            all_t = np.concatenate((part.t_ms[items], times_ms))
            all_seq = np.concatenate((part.seq[items], seqs))
            all_values = _concat_values(part.value[items], values)
            order = np.lexsort((all_seq, all_t, all_owner))
            offsets = np.zeros(sessions + 1, dtype=np.int64)
            np.cumsum(np.bincount(all_owner, minlength=sessions), out=offsets[1:])
            out.append(PartColumns(kind, all_values[order], all_t[order], all_seq[order],
                                   offsets))
    return out


def _sum(groups: kernels.EventGroups, absorbed: kernels.EventGroups, owner: Int64Array,
         open_values: npt.NDArray[Any], values: Any) -> npt.NDArray[Any]:
    sessions = len(groups.offsets) - 1
    if values.dtype.kind == "f":
        # 0 + absorbed sums in start order, + (0 + events in (time, arrival) order)
        run = folds.sum_per_session(groups, values, np.zeros(sessions))
        return compiled(_fold_open_then_run)(
            absorbed.order, absorbed.offsets, open_values.astype(np.float64), run)
    try:
        run = folds.sum_per_session(groups, values)
    except OverflowError:
        raise NotColumnar("an integer sum leaves int64") from None
    total = run.copy()
    if len(owner):
        extra = open_values[absorbed.order].astype(np.int64)
        with np.errstate(over="ignore"):
            np.add.at(total, owner, extra)
        estimate = run.astype(np.float64)
        np.add.at(estimate, owner, extra.astype(np.float64))
        if (np.abs(estimate) >= 2.0**62).any():
            raise NotColumnar("an integer sum may leave int64")
    return total


def _fold_open_then_run(order: Int64Array, offsets: Int64Array,
                        open_values: npt.NDArray[np.float64],
                        run: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    out = np.empty(len(run), dtype=np.float64)
    for j in range(len(run)):
        acc = 0.0
        for q in range(offsets[j], offsets[j + 1]):
            acc += open_values[order[q]]
        out[j] = acc + run[j]
    return out
