"""The aggregations of each session, in columns.

Rows arrive sorted by (key, time, arrival); session ``j`` holds rows ``bounds[j]:bounds[j + 1]``.
Each kind has the semantics of :mod:`sessionstore.aggspec` (Spark's null rule: ``sum``, ``min``,
``max`` and ``collect`` skip nulls, ``first`` and ``last`` keep them) and gives exactly what the
streaming paths give for the same events: a float sum is a left fold in (time, arrival) order
(``folds.sum_per_session``), a float ``min``/``max`` orders NaN above every value and -0.0 below
0.0 (the engine's rule, ``aggregations.smaller``/``larger``, and Spark's for NaN), an
integer sum that does not fit in int64 is an error.
"""

from __future__ import annotations

import decimal
import json
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from .. import aggspec, folds, kernels
from ..aggregations import Combined
from .frame import Frame, arrow_of, as_numpy, to_arrow

Int64Array = npt.NDArray[np.int64]
#: Names a session for error messages: index -> "key 'u1', session [0, 30)".
Describe = Callable[[int], str]


class Sorted:
    """The columns of a frame in session order, each gathered once (numpy arrays for numeric
    columns without nulls, Arrow arrays otherwise)."""

    def __init__(self, frame: Frame, perm: Int64Array | None) -> None:
        self.frame = frame
        self.perm = perm
        self._cache: dict[str, Any] = {}

    def column(self, name: str) -> Any:
        """The column in session order; a dictionary column (a key: other columns come
        decoded) as its values, which the aggregations take."""
        found = self._cache.get(name)
        if found is None:
            found = self.frame.take(name, self.perm)
            data_type = self.frame.types[name]
            if pa.types.is_dictionary(data_type):
                found = found.cast(data_type.value_type)
            self._cache[name] = found
        return found

    def arrow(self, name: str) -> pa.Array:
        """The column in session order as an Arrow array (of its input type, a dictionary's
        values for a dictionary)."""
        data_type = self.frame.types[name]
        if pa.types.is_dictionary(data_type):
            data_type = data_type.value_type
        return to_arrow(self.column(name), data_type)


def _present(values: Any, bounds: Int64Array) -> tuple[Any, Int64Array]:
    """The non-null values, and how many of them each session holds."""
    if isinstance(values, np.ndarray) or not values.null_count:
        return values, np.diff(bounds)
    valid = values.is_valid().to_numpy(zero_copy_only=False)
    counts = np.add.reduceat(valid.astype(np.int64), bounds[:-1]) if len(valid) else \
        np.zeros(len(bounds) - 1, dtype=np.int64)
    return values.filter(pa.array(valid)), counts


def _numpy(values: Any) -> npt.NDArray[Any]:
    return values if isinstance(values, np.ndarray) else as_numpy(values)


def _spread(results: pa.Array, nonempty: npt.NDArray[np.bool_]) -> pa.Array:
    """One value per session from the results of the non-empty ones (null for the others)."""
    if bool(nonempty.all()):
        return results
    where = np.cumsum(nonempty) - 1
    return results.take(pa.array(where, pa.int64(), mask=~nonempty))


def _offsets(counts: Int64Array) -> Int64Array:
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    return offsets


def _sum(name: str, values: Any, bounds: Int64Array, out_type: pa.DataType,
         describe: Describe) -> pa.Array:
    present, counts = _present(values, bounds)
    nonempty = counts > 0
    offsets = _offsets(counts[nonempty])
    if not isinstance(values, np.ndarray) and pa.types.is_decimal(values.type):
        engine = aggspec.to_engine(present)
        totals = [sum(engine[a:b]) for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist(),
                                                    strict=True)]
        try:
            result = aggspec.from_engine(totals, out_type)
        except (pa.ArrowInvalid, ValueError):
            raise _too_large(name, totals, out_type, np.flatnonzero(nonempty),
                             describe) from None
        return _spread(result, nonempty)
    data = _numpy(present)
    if data.dtype == np.uint64 and len(data) and int(data.max()) > np.iinfo(np.int64).max:
        # an unsigned value past int64 makes its session's sum pass it (no value is < 0)
        raise _overflow(name, data, offsets, np.flatnonzero(nonempty), describe)
    groups = kernels.EventGroups(np.arange(len(data), dtype=np.int64), offsets)
    try:
        sums = folds.sum_per_session(groups, data)
        if sums.dtype.kind == "f":
            # a sum starts from 0, as Spark's and the engine's do: 0 + -0.0 is 0.0, and no sum
            # from there is -0.0; the fold from the first value is -0.0 exactly when every
            # value is -0.0
            sums[sums == 0] = 0.0
    except OverflowError:
        raise _overflow(name, data, offsets, np.flatnonzero(nonempty), describe) from None
    except (TypeError, ValueError) as exc:
        raise ValueError(f"aggregation {name!r}: {exc}") from None
    return _spread(arrow_of(sums, out_type), nonempty)


def _overflow(name: str, data: npt.NDArray[Any], offsets: Int64Array,
              sessions: Int64Array, describe: Describe) -> ValueError:
    """The error for the first session whose integer sum does not fit in int64."""
    for j, (a, b) in enumerate(zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True)):
        exact = sum(data[a:b].tolist())
        if not -(2**63) <= exact < 2**63:
            return ValueError(f"aggregation {name!r}: the sum of {describe(int(sessions[j]))} "
                              f"is {exact}, which does not fit in int64 (no silent wrap-around)")
    return ValueError(f"aggregation {name!r}: a sum does not fit in int64")


def _too_large(name: str, totals: list[Any], out_type: pa.DataType, sessions: Int64Array,
               describe: Describe) -> ValueError:
    """The error for the first session whose decimal sum does not fit in ``out_type``."""
    for j, total in enumerate(totals):
        try:
            aggspec.from_engine([total], out_type)
        except (pa.ArrowInvalid, ValueError):
            shown = decimal.Decimal(total).scaleb(-out_type.scale, aggspec.EXACT_DECIMALS)
            return ValueError(f"aggregation {name!r}: the sum of {describe(int(sessions[j]))} "
                              f"is {shown}, which does not fit in {out_type}")
    return ValueError(f"aggregation {name!r}: a sum does not fit in {out_type}")


def _extreme(kind: str, values: Any, bounds: Int64Array, out_type: pa.DataType
             ) -> pa.Array:
    present, counts = _present(values, bounds)
    nonempty = counts > 0
    starts = _offsets(counts[nonempty])[:-1]
    if len(starts) == 0:
        return pa.nulls(len(counts), out_type)
    if isinstance(present, np.ndarray) or pa.types.is_integer(present.type) \
            or pa.types.is_floating(present.type):
        data = _numpy(present)
        if data.dtype.kind == "f":
            result = _float_extreme(kind, data, starts)
        else:
            result = (np.minimum if kind == "min" else np.maximum).reduceat(data, starts)
        return _spread(arrow_of(result, out_type), nonempty)
    session = np.repeat(np.arange(len(starts), dtype=np.int64),
                        np.diff(np.append(starts, len(present))))
    grouped = pa.table({"s": session, "v": present}).group_by("s", use_threads=False) \
        .aggregate([("v", kind)]).sort_by("s")
    return _spread(grouped.column(f"v_{kind}").combine_chunks().cast(out_type), nonempty)


def _float_extreme(kind: str, data: npt.NDArray[Any], starts: Int64Array
                   ) -> npt.NDArray[Any]:
    """The engine's ``min``/``max`` (:func:`sessionstore.aggregations.smaller` and ``larger``)
    over each session's values: NaN is above every other value (a minimum is NaN only when
    every value is, a maximum whenever one is, as in Spark), and a zero result is -0.0 for
    ``min`` (0.0 for ``max``) when the session holds that zero, whatever the order."""
    # fmin skips NaN unless both are NaN: exactly the minimum with NaN greatest
    result = (np.fmin if kind == "min" else np.fmax).reduceat(data, starts)
    if (result == 0).any():
        from ..folds import signed_zero_extremes  # numpy only; imported when a zero needs it

        owner = np.repeat(np.arange(len(starts), dtype=np.int64),
                          np.diff(np.append(starts, len(data))))
        result = signed_zero_extremes(result, kind, [(owner, data)])
    if kind == "max":
        any_nan = np.logical_or.reduceat(np.isnan(data), starts)
        result[any_nan] = np.nan
    return result


def _collect(values: Any, bounds: Int64Array, out_type: pa.DataType) -> pa.Array:
    present, counts = _present(values, bounds)
    if isinstance(present, np.ndarray):
        present = arrow_of(present, out_type.value_type)
    offsets = _offsets(counts)
    if offsets[-1] >= 2**31:
        return pa.LargeListArray.from_arrays(arrow_of(offsets, pa.int64()), present).cast(
            out_type)
    return pa.ListArray.from_arrays(arrow_of(offsets, pa.int32()), present, type=out_type)


def reduce_sessions(columns: Sorted, bounds: Int64Array, specs: Sequence[aggspec.AggSpec],
                    planned: aggspec.AggPlan, *, custom: Callable[[int], Any] | None,
                    describe: Describe) -> list[pa.Array]:
    """One array per output of ``planned``, one value per session, typed as the plan says.

    Args:
        columns: the input in session order.
        bounds: int64[s + 1], session ``j`` is rows ``bounds[j]:bounds[j + 1]``.
        specs: the parsed aggregations, in output order.
        planned: :func:`aggspec.plan` of ``specs`` over the input schema.
        custom: for custom aggregations, ``fold(index)`` returns the combined accumulator's
            results per session (see :func:`fold_custom`); None when there are none.
        describe: names session ``j`` in error messages.

    Raises:
        ValueError: an integer sum that does not fit in int64, naming the aggregation, the key
            and the session.
    """
    out: list[pa.Array] = []
    first_rows = bounds[:-1]
    folded: list[dict[str, Any]] | None = None
    for spec, field in zip(specs, planned.output_fields, strict=True):
        if spec.kind == "count":
            out.append(arrow_of(np.diff(bounds), pa.int64()))
            continue
        if spec.kind == aggspec.CUSTOM:
            if folded is None:
                assert custom is not None
                folded = [custom(j) for j in range(len(first_rows))]
            out.append(pa.array([_json_text(spec.name, row[spec.name], j, describe)
                                 for j, row in enumerate(folded)], pa.string()))
            continue
        assert spec.column is not None
        values = columns.column(spec.column)
        if spec.kind in ("first", "last"):
            values = columns.arrow(spec.column)
        if spec.kind == "sum":
            out.append(_sum(spec.name, values, bounds, field.type, describe))
        elif spec.kind in ("min", "max"):
            out.append(_extreme(spec.kind, values, bounds, field.type))
        elif spec.kind == "first":
            out.append(values.take(arrow_of(first_rows, pa.int64())))
        elif spec.kind == "last":
            out.append(values.take(arrow_of(bounds[1:] - 1, pa.int64())))
        elif spec.kind == "collect":
            out.append(_collect(values, bounds, field.type))
        else:  # pragma: no cover - aggspec.KINDS and this list are the same kinds
            raise ValueError(f"aggregation {spec.name!r}: unknown kind {spec.kind!r}")
    return out


def _json_text(name: str, value: Any, session: int, describe: Describe) -> str:
    """A custom aggregation's result for session ``session`` as JSON text.

    Raises:
        ValueError: the result has no JSON form, naming the aggregation and the session.
    """
    try:
        return json.dumps(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"aggregation {name!r}: the result for {describe(session)} has no "
                         f"JSON form: {exc}") from None


def fold_custom(columns: Sorted, bounds: Int64Array, planned: aggspec.AggPlan,
                keys: Sequence[str], times: Int64Array, rows: Int64Array
                ) -> Callable[[int], dict[str, Any]]:
    """Per session, the results of the custom aggregations of ``planned``: each is folded with
    ``initial()`` then ``add_run`` over the session's events in (time, arrival) order, given
    as the engine gives them (values in their engine representation, a tuple key for several
    key columns, ``rows`` as arrival numbers)."""
    aggregation = planned.aggregation
    assert isinstance(aggregation, Combined)
    parts = [(name, part) for name, part in zip(aggregation.names, aggregation.parts,
                                                 strict=True)
             if name in planned.custom_outputs]
    engine_values = [_engine_list(columns.arrow(c)) for c in planned.value_columns]
    engine_keys = [_engine_list(columns.arrow(k)) for k in keys]
    values = list(zip(*engine_values, strict=True)) if engine_values else \
        [()] * len(times)
    key_of: Callable[[int], Any] = ((lambda i: engine_keys[0][i]) if len(keys) == 1
                                    else (lambda i: tuple(k[i] for k in engine_keys)))
    time_list = times.tolist()
    row_list = rows.tolist()

    def fold(j: int) -> dict[str, Any]:
        a, b = int(bounds[j]), int(bounds[j + 1])
        key = key_of(a)
        return {name: part.result(part.add_run(key, values[a:b], time_list[a:b],
                                               row_list[a:b], part.initial()))
                for name, part in parts}

    return fold


def _engine_list(values: pa.Array) -> list[Any]:
    converted = aggspec.to_engine(values)
    return converted.to_pylist() if isinstance(converted, (pa.Array, pa.ChunkedArray)) \
        else list(converted)
