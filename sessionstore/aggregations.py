"""Aggregations: initializer / aggregator / merger, and the presets built on them.

An aggregation keeps an *accumulator* per session. The accumulator is stored in the session store,
so it must be msgpack-serialisable (numbers, strings, lists, dicts). ``result`` turns it into what
is emitted.

The KIP-94 signatures are ``aggregator(key, value, agg)`` and ``merger(key, agg1, agg2)``; the
engine also passes the event time and an arrival sequence number to :meth:`Aggregation.add`, which
:func:`collect` uses to order values by event time, ties by arrival.
"""

from __future__ import annotations

import functools
import heapq
import math
import operator
from collections.abc import Callable, Mapping
from typing import Any

from .timeutil import INT64_MAX, INT64_MIN


class SumOverflowError(ValueError):
    """An integer sum left int64.

    The rule, on every path and front end: a session's integer sum is an int64 whenever the
    engine keeps it (after each event on the event path, after each batch on the batch paths);
    leaving that range is this error, as Spark's ``sum`` raises ``ARITHMETIC_OVERFLOW`` in ANSI
    mode (its default since Spark 4). A sum never wraps (Spark's non-ANSI mode) and is never
    widened, so every sum written is exact. The call that raises it changes nothing.

    Attributes:
        aggregation: the name of the failing output (set by :func:`combine`), or None.
        key: the session's key.
        total: the exact sum that does not fit.
        timestamp_ms: the time of an event of the session (the last one added), or None when
            the sum left int64 as two sessions merged.
    """

    def __init__(self, key: Any, total: int, timestamp_ms: int | None,
                 aggregation: str | None = None, source: Aggregation | None = None) -> None:
        self.key = key
        self.total = total
        self.timestamp_ms = timestamp_ms
        self.aggregation = aggregation
        self.source = source
        name = "the sum" if aggregation is None else f"the sum {aggregation!r}"
        where = ("as two of its sessions merge" if timestamp_ms is None
                 else f"in the session holding its event at time {timestamp_ms}")
        super().__init__(
            f"{name} of key {key!r} leaves int64 {where}: it would be {total}; an integer sum "
            f"never wraps or widens (Spark's sum raises ARITHMETIC_OVERFLOW here in ANSI "
            f"mode); sum a float column to accept rounding instead")

    def naming(self, aggregation: str) -> SumOverflowError:
        """The same error, naming the output ``aggregation``."""
        return SumOverflowError(self.key, self.total, self.timestamp_ms, aggregation)


def int64_sum(total: Any, key: Any, timestamp_ms: int | None, source: Aggregation) -> Any:
    """The one overflow check of integer sums: ``total`` itself when it is not an int or fits
    int64 (every path's sums go through here, the columnar kernels falling back to the exact
    path to name the session).

    Raises:
        SumOverflowError: ``total`` is an int outside int64.
    """
    if type(total) is int and not INT64_MIN <= total <= INT64_MAX:
        raise SumOverflowError(key, total, timestamp_ms, source=source)
    return total


class Aggregation:
    """Base class of aggregations. Subclasses override the four methods."""

    name = "aggregation"
    column: str | None = None
    """The column a built-in reads (``process_table``; a mapping's item on the event path)."""
    acc_always_encodable = False
    """True when the accumulator of encodable values is always encodable, so the engine need
    not check it after every change (the built-ins without a user function)."""

    def initial(self) -> Any:
        """The accumulator of an empty session."""
        raise NotImplementedError

    def add(self, key: Any, value: Any, timestamp_ms: int, seq: int, acc: Any) -> Any:
        """Fold one event into ``acc`` and return the new accumulator."""
        raise NotImplementedError

    def merge(self, key: Any, acc1: Any, acc2: Any) -> Any:
        """Combine the accumulators of two sessions that merge."""
        raise NotImplementedError

    def add_run(
        self, key: Any, values: list[Any], times_ms: list[int], seqs: list[int], acc: Any
    ) -> Any:
        """Fold several events of one key, given in (time, arrival) order, into ``acc``.

        The batch path calls this once per run of events; overriding it with a vectorised
        version is optional and must give the same result as folding with :meth:`add`.
        """
        add = self.add
        for value, t, seq in zip(values, times_ms, seqs, strict=True):
            acc = add(key, value, t, seq, acc)
        return acc

    def result(self, acc: Any) -> Any:
        """What is emitted for a session with accumulator ``acc``."""
        return acc

    @property
    def columnar_kind(self) -> str | None:
        """``"count"``, ``"sum"``, ``"min"``, ``"max"``, ``"first"``, ``"last"`` or
        ``"collect"`` for a built-in the batch path computes with array operations (it reads the
        values themselves or one column of them); None for one that needs a Python call per
        event (a user function, ``reduce``, ``aggregate``)."""
        return None

    def _plain(self) -> bool:
        fn = getattr(self, "fn", None)
        return fn is _identity or self.column is not None

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def _identity(value: Any) -> Any:
    return value


class _Count(Aggregation):
    name = "count"
    acc_always_encodable = True

    def initial(self) -> int:
        return 0

    def add(self, key: Any, value: Any, timestamp_ms: int, seq: int, acc: int) -> int:
        return acc + 1

    def merge(self, key: Any, acc1: int, acc2: int) -> int:
        return acc1 + acc2

    def add_run(
        self, key: Any, values: list[Any], times_ms: list[int], seqs: list[int], acc: int
    ) -> int:
        return acc + len(values)

    @property
    def columnar_kind(self) -> str | None:
        return "count"


class _Sum(Aggregation):
    name = "sum"

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn

    def initial(self) -> Any:
        return 0

    def add(self, key: Any, value: Any, timestamp_ms: int, seq: int, acc: Any) -> Any:
        return int64_sum(acc + self.fn(value), key, timestamp_ms, self)

    def merge(self, key: Any, acc1: Any, acc2: Any) -> Any:
        return int64_sum(acc1 + acc2, key, None, self)

    def add_run(
        self, key: Any, values: list[Any], times_ms: list[int], seqs: list[int], acc: Any
    ) -> Any:
        # the same left-to-right additions as add(); the sum kept is the run's total. Not
        # sum(): from Python 3.12 it adds floats with compensation, a different result.
        total = functools.reduce(operator.add, map(self.fn, values), acc)
        return int64_sum(total, key, times_ms[-1] if times_ms else None, self)

    @property
    def columnar_kind(self) -> str | None:
        return "sum" if self._plain() else None


def _signed_zero_tie(a: Any, b: Any) -> float:
    """For two float zeros, ``sign(b) - sign(a)`` (-2: b is -0.0 and a is 0.0); else 0."""
    if type(a) is float and type(b) is float:
        return math.copysign(1.0, b) - math.copysign(1.0, a)
    return 0.0


def smaller(a: Any, b: Any) -> Any:
    """``min(a, b)`` (``a`` on a tie: the first seen) in a total order of floats: -0.0 is below
    0.0 (IEEE 754's minimum) and NaN is above every other value, as in Spark's ordering of
    doubles (so a session's minimum is NaN only when every value is). That is the rule of
    ``min_of`` on every path: the result does not depend on arrival order or batching (the
    columnar kernels follow it: :func:`sessionstore.folds.signed_zero_extremes`; the columnar
    batch path refuses NaN and leaves it to this function)."""
    if b < a:
        return b
    if a != a:  # NaN (only NaN differs from itself): anything else is smaller
        return b
    return b if b == 0 and a == 0 and _signed_zero_tie(a, b) < 0 else a


def larger(a: Any, b: Any) -> Any:
    """``max(a, b)`` (``a`` on a tie) in the total order of :func:`smaller`: 0.0 is above -0.0
    and NaN above everything (a session's maximum is NaN when any value is NaN, as in Spark)."""
    if b > a:
        return b
    if b != b and a == a:  # b is NaN and a is not
        return b
    return b if b == 0 and a == 0 and _signed_zero_tie(a, b) > 0 else a


class _Extreme(Aggregation):
    def __init__(self, fn: Callable[[Any], Any], pick: Callable[..., Any], name: str):
        self.fn = fn
        self.pick = pick
        self.name = name
        self.acc_always_encodable = fn is _identity

    def initial(self) -> Any:
        return None

    def add(self, key: Any, value: Any, timestamp_ms: int, seq: int, acc: Any) -> Any:
        item = self.fn(value)
        return item if acc is None else self.pick(acc, item)

    def merge(self, key: Any, acc1: Any, acc2: Any) -> Any:
        if acc1 is None:
            return acc2
        if acc2 is None:
            return acc1
        return self.pick(acc1, acc2)

    def add_run(
        self, key: Any, values: list[Any], times_ms: list[int], seqs: list[int], acc: Any
    ) -> Any:
        best = functools.reduce(self.pick, map(self.fn, values))
        return best if acc is None else self.pick(acc, best)

    @property
    def columnar_kind(self) -> str | None:
        return self.name if self._plain() else None


class _Collect(Aggregation):
    """Accumulator: ``[[t, seq, value], ...]`` sorted by (t, seq)."""

    name = "collect"

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn
        self.acc_always_encodable = fn is _identity

    def initial(self) -> list[Any]:
        return []

    def add(self, key: Any, value: Any, timestamp_ms: int, seq: int, acc: list[Any]) -> list[Any]:
        item = [timestamp_ms, seq, self.fn(value)]
        if not acc or (acc[-1][0], acc[-1][1]) <= (timestamp_ms, seq):
            acc.append(item)
        else:
            acc.append(item)
            acc.sort(key=lambda entry: (entry[0], entry[1]))
        return acc

    def merge(self, key: Any, acc1: list[Any], acc2: list[Any]) -> list[Any]:
        return list(heapq.merge(acc1, acc2, key=lambda entry: (entry[0], entry[1])))

    def add_run(
        self, key: Any, values: list[Any], times_ms: list[int], seqs: list[int], acc: list[Any]
    ) -> list[Any]:
        fn = self.fn
        items = [[t, seq, fn(value)] for value, t, seq in zip(values, times_ms, seqs, strict=True)]
        return self.merge(key, acc, items) if acc else items

    def result(self, acc: list[Any]) -> list[Any]:
        return [entry[2] for entry in acc]

    @property
    def columnar_kind(self) -> str | None:
        return "collect" if self._plain() else None


class _First(Aggregation):
    """Keeps ``[t, seq, value]`` of the earliest (``last=False``) or latest event."""

    def __init__(self, fn: Callable[[Any], Any], last: bool) -> None:
        self.fn = fn
        self.last = last
        self.acc_always_encodable = fn is _identity
        self.name = "last" if last else "first"

    def initial(self) -> Any:
        return None

    def _better(self, a: list[Any], b: list[Any]) -> list[Any]:
        if self.last:
            return a if (a[0], a[1]) >= (b[0], b[1]) else b
        return a if (a[0], a[1]) <= (b[0], b[1]) else b

    def add(self, key: Any, value: Any, timestamp_ms: int, seq: int, acc: Any) -> Any:
        item = [timestamp_ms, seq, self.fn(value)]
        return item if acc is None else self._better(acc, item)

    def merge(self, key: Any, acc1: Any, acc2: Any) -> Any:
        if acc1 is None:
            return acc2
        if acc2 is None:
            return acc1
        return self._better(acc1, acc2)

    def add_run(
        self, key: Any, values: list[Any], times_ms: list[int], seqs: list[int], acc: Any
    ) -> Any:
        # runs arrive in (time, arrival) order: the first or last element is the candidate
        i = -1 if self.last else 0
        item = [times_ms[i], seqs[i], self.fn(values[i])]
        return item if acc is None else self._better(acc, item)

    def result(self, acc: Any) -> Any:
        return None if acc is None else acc[2]

    @property
    def columnar_kind(self) -> str | None:
        return self.name if self._plain() else None


class _Reduce(Aggregation):
    name = "reduce"

    def __init__(self, fn: Callable[[Any, Any], Any]) -> None:
        self.fn = fn

    def initial(self) -> Any:
        return None

    def add(self, key: Any, value: Any, timestamp_ms: int, seq: int, acc: Any) -> Any:
        return value if acc is None else self.fn(acc, value)

    def merge(self, key: Any, acc1: Any, acc2: Any) -> Any:
        if acc1 is None:
            return acc2
        if acc2 is None:
            return acc1
        return self.fn(acc1, acc2)


class _Custom(Aggregation):
    name = "aggregate"

    def __init__(
        self,
        initializer: Callable[[], Any],
        aggregator: Callable[[Any, Any, Any], Any],
        merger: Callable[[Any, Any, Any], Any],
    ) -> None:
        self.initializer = initializer
        self.aggregator = aggregator
        self.merger = merger

    def initial(self) -> Any:
        return self.initializer()

    def add(self, key: Any, value: Any, timestamp_ms: int, seq: int, acc: Any) -> Any:
        return self.aggregator(key, value, acc)

    def merge(self, key: Any, acc1: Any, acc2: Any) -> Any:
        return self.merger(key, acc1, acc2)


class Combined(Aggregation):
    """Several named aggregations over the same events; emits a dict of their results."""

    name = "combined"

    def __init__(self, parts: Mapping[str, Aggregation]) -> None:
        if not parts:
            raise ValueError("aggregations must name at least one aggregation")
        for label, part in parts.items():
            if not isinstance(part, Aggregation):
                raise TypeError(
                    f"aggregation {label!r} must be a sessionstore.aggregations object, "
                    f"got {type(part).__name__}"
                )
        self.names = list(parts)
        self.parts = list(parts.values())
        self.acc_always_encodable = all(part.acc_always_encodable for part in self.parts)

    def initial(self) -> list[Any]:
        return [part.initial() for part in self.parts]

    def add(self, key: Any, value: Any, timestamp_ms: int, seq: int, acc: list[Any]) -> list[Any]:
        try:
            return [
                part.add(key, value, timestamp_ms, seq, item)
                for part, item in zip(self.parts, acc, strict=True)
            ]
        except SumOverflowError as exc:
            raise self._named(exc) from None

    def merge(self, key: Any, acc1: list[Any], acc2: list[Any]) -> list[Any]:
        try:
            return [
                part.merge(key, a, b) for part, a, b in zip(self.parts, acc1, acc2, strict=True)
            ]
        except SumOverflowError as exc:
            raise self._named(exc) from None

    def add_run(
        self, key: Any, values: list[Any], times_ms: list[int], seqs: list[int], acc: list[Any]
    ) -> list[Any]:
        try:
            return [
                part.add_run(key, values, times_ms, seqs, item)
                for part, item in zip(self.parts, acc, strict=True)
            ]
        except SumOverflowError as exc:
            raise self._named(exc) from None

    def _named(self, exc: SumOverflowError) -> SumOverflowError:
        """``exc`` naming the output whose sum failed (the part is, or wraps, its source)."""
        if exc.aggregation is not None:
            return exc
        for label, part in zip(self.names, self.parts, strict=True):
            inner: Any = part
            while inner is not None:
                if inner is exc.source:
                    return exc.naming(label)
                inner = getattr(inner, "inner", None)
        return exc

    def result(self, acc: list[Any]) -> dict[str, Any]:
        return {
            label: part.result(item)
            for label, part, item in zip(self.names, self.parts, acc, strict=True)
        }


def _check_callable(fn: Any, name: str) -> None:
    if not callable(fn):
        raise TypeError(f"{name} must be callable, got {type(fn).__name__}")


def _reader(fn: Any, column: Any) -> Callable[[Any], Any]:
    """The function a built-in applies to each value: ``fn``, the ``column`` item, or identity.

    A ``column`` names what the built-in reads: a column of ``process_table``'s table, or the
    item of that name of each value (a mapping) on the event path and ``process_batch``.
    """
    if fn is not None and column is not None:
        raise ValueError("pass fn or column, not both")
    if fn is not None:
        _check_callable(fn, "fn")
        return fn  # type: ignore[no-any-return]
    if column is not None:
        if not isinstance(column, str):
            raise TypeError(f"column must be a str, got {type(column).__name__}")
        return operator.itemgetter(column)
    return _identity


def _with_column(aggregation: Aggregation, column: str | None) -> Aggregation:
    aggregation.column = column
    if column is not None:
        aggregation.acc_always_encodable = True  # the item of an encodable value is encodable
    return aggregation


def count() -> Aggregation:
    """The number of events in the session."""
    return _Count()


def is_count(aggregation: Aggregation) -> bool:
    """Whether ``aggregation`` is :func:`count`'s (whose accumulator is the plain int the
    event paths add to directly)."""
    return type(aggregation) is _Count


def sum_of(fn: Callable[[Any], Any] | None = None, *, column: str | None = None) -> Aggregation:
    """The sum of ``fn(value)`` (of the ``column`` item, or of the values themselves).

    Raises:
        ValueError: both ``fn`` and ``column``. TypeError: ``fn`` not callable, ``column`` not
            a str.
    """
    return _with_column(_Sum(_reader(fn, column)), column)


def min_of(fn: Callable[[Any], Any] | None = None, *, column: str | None = None) -> Aggregation:
    """The smallest ``fn(value)`` (or ``column`` item, or value); None for an empty pane."""
    return _with_column(_Extreme(_reader(fn, column), smaller, "min"), column)


def max_of(fn: Callable[[Any], Any] | None = None, *, column: str | None = None) -> Aggregation:
    """The largest ``fn(value)`` (or ``column`` item, or value); None for an empty pane."""
    return _with_column(_Extreme(_reader(fn, column), larger, "max"), column)


def first_of(fn: Callable[[Any], Any] | None = None, *,
             column: str | None = None) -> Aggregation:
    """``fn(value)`` (or ``column`` item, or value) of the earliest event (ties: the first to
    arrive)."""
    return _with_column(_First(_reader(fn, column), last=False), column)


def last_of(fn: Callable[[Any], Any] | None = None, *,
            column: str | None = None) -> Aggregation:
    """``fn(value)`` (or ``column`` item, or value) of the latest event (ties: the last to
    arrive)."""
    return _with_column(_First(_reader(fn, column), last=True), column)


def collect(fn: Callable[[Any], Any] | None = None, *,
            column: str | None = None) -> Aggregation:
    """The values (or ``fn(value)``, or ``column`` items) in event-time order, ties by
    arrival."""
    return _with_column(_Collect(_reader(fn, column)), column)


def reduce(fn: Callable[[Any, Any], Any]) -> Aggregation:
    """Fold values with ``fn(agg, value)``; merging uses the same function."""
    _check_callable(fn, "fn")
    return _Reduce(fn)


def aggregate(
    initializer: Callable[[], Any],
    aggregator: Callable[[Any, Any, Any], Any],
    merger: Callable[[Any, Any, Any], Any],
) -> Aggregation:
    """KIP-94's ``aggregate``: ``aggregator(key, value, agg)`` and ``merger(key, agg1, agg2)``."""
    _check_callable(initializer, "initializer")
    _check_callable(aggregator, "aggregator")
    _check_callable(merger, "merger")
    return _Custom(initializer, aggregator, merger)


def combine(parts: Mapping[str, Aggregation]) -> Aggregation:
    """Run several aggregations at once; the result is ``{name: result}``."""
    return Combined(parts)


__all__ = [
    "Aggregation",
    "Combined",
    "aggregate",
    "collect",
    "combine",
    "count",
    "first_of",
    "last_of",
    "max_of",
    "min_of",
    "reduce",
    "sum_of",
]
