"""An adversarial run against the bucketed static plan (``static_columnar.bucketed_frame``, whose
expressions are SQL strings over the user's column names, and ``bucketed_partition``, which
keys string and binary columns by dictionary codes) with native ``session_window`` as the
oracle: column names Spark's SQL parser could misread or confuse with the plan's own, keys of
several types at once whose values differ only in trailing spaces, case, NUL bytes or their
last character, a task's rows spread over many Arrow batches, and inputs where no row or no row
of a key has a time.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from pyspark.sql import functions as F

from spark_adapter import sessionize, static_columnar
from tests.strategies import mixed_key_cases

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
DAYS = (dt.date(1969, 12, 31), dt.date(1970, 1, 1), dt.date(2024, 2, 29))
GAP = "10 seconds"


def _q(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _at(us: int | None) -> dt.datetime | None:
    return None if us is None else EPOCH + dt.timedelta(microseconds=us)


def _bucketed(frame: Any) -> Any:
    plan = frame._jdf.queryExecution().executedPlan().toString()
    assert "HashAggregate" in plan and "MapInArrow" in plan, plan  # the bucketed plan
    return frame


def _native(df: Any, keys: list[str], time: str, aggs: dict[str, Any]) -> list[tuple[Any, ...]]:
    parts = [(F.count("*") if item == "count" else getattr(F, item[0])(F.col(_q(item[1]))))
             .alias(name) for name, item in aggs.items()]
    frame = df.groupBy(*[F.col(_q(k)) for k in keys],
                       F.session_window(F.col(_q(time)), GAP).alias("w")).agg(*parts)
    return sorted((tuple(r) for r in frame.select(
        *[F.col(_q(k)) for k in keys], "w.start", "w.end", *[F.col(_q(n)) for n in aggs])
        .collect()), key=repr)


def _ours(df: Any, keys: list[str], time: str, aggs: dict[str, Any]) -> list[tuple[Any, ...]]:
    frame = _bucketed(sessionize(df, key=keys, timestamp=time, gap=GAP, aggregations=aggs))
    assert frame.columns[:len(keys)] == keys
    return sorted((tuple(r) for r in frame.collect()), key=repr)


@contextlib.contextmanager
def _options(spark: Any, **options: str) -> Iterator[None]:
    """Spark SQL options (dots as double underscores) set for a block, restored after it."""
    names = {name.replace("__", "."): value for name, value in options.items()}
    before = {name: spark.conf.get(name, None) for name in names}
    for name, value in names.items():
        spark.conf.set(name, value)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                spark.conf.unset(name)
            else:
                spark.conf.set(name, value)


_BATCH_ROWS = "spark__sql__execution__arrow__maxRecordsPerBatch"
_PARTITIONS = "spark__sql__shuffle__partitions"


MIXED_KEYS = ["s", "i", "b", "day", "flag"]
MIXED_AGGS: dict[str, Any] = {"n": "count", "sum_v": ("sum", "v"), "min_v": ("min", "v"),
                              "max_v": ("max", "v")}


@settings(max_examples=6)
@given(case=mixed_key_cases())
def test_mixed_type_keys_over_many_arrow_batches_equal_native(spark, case):
    """Five key columns of five types; strings and bytes that only trailing spaces, case, a NUL
    byte, a decomposed accent or a last character of 3000 tell apart (a dictionary or a
    comparison that trims, folds or stops at NUL would merge them); a task's rows in Arrow
    batches of 1, 3 or all rows (each batch of a task is a chunk of its own before the
    dictionary codes are taken); a key whose rows all lack a time, and a row with a null key
    column and no time (dropped, not refused)."""
    df = spark.createDataFrame(
        [(s, i, None if b is None else bytearray(b), DAYS[d], flag, _at(t), v)
         for s, i, b, d, flag, t, v in case["rows"]],
        "s string, i int, b binary, day date, flag boolean, ts timestamp, v long")
    with _options(spark, **{_BATCH_ROWS: str(case["batch_rows"]),
                            _PARTITIONS: str(case["partitions"])}):
        ours = _ours(df, MIXED_KEYS, "ts", MIXED_AGGS)
        assert ours == _native(df, MIXED_KEYS, "ts", MIXED_AGGS)
    assert not [r for r in ours if r[0] == "ghost"]


def test_timestamp_and_integer_keys_at_their_extremes_equal_native(spark):
    """Key columns of every integer width at its extremes, a timestamp (not the time column)
    before and after 1970 with microseconds, a timestamp_ntz and a boolean: each goes to the
    bounded path in its engine form (``_engine_key``) and back to its Spark type."""
    rows = []
    for j, (b, sh, lg) in enumerate([(-128, -(2**15), -(2**63)), (127, 2**15 - 1, 2**63 - 1),
                                     (0, 0, 0)]):
        for at in (-1_000_001, -1, 0, 9_999_999, 10_000_000, 25_000_001):
            ntz = dt.datetime(1969, 12, 31, 23, 59, 59, 999_999 - j)
            rows.append((b, sh, lg, _at(-7 * j - 1), ntz, j % 2 == 0, _at(at), at))
    df = spark.createDataFrame(
        rows, "b byte, sh short, lg long, tk timestamp, ntz timestamp_ntz, flag boolean, "
              "ts timestamp, v long")
    keys = ["b", "sh", "lg", "tk", "ntz", "flag"]
    with _options(spark, **{_BATCH_ROWS: "2"}):
        ours = _ours(df, keys, "ts", MIXED_AGGS)
        assert ours == _native(df, keys, "ts", MIXED_AGGS)
    assert len(ours) == 3 * 2  # per key: -1.000001 s to 10 s (steps of a gap at most), 25 s


# every name below is one column; Spark's SQL parser would misread each unquoted
ODD = ["select", "it's", 'say "hi"', "\u043a\u043b\u044e\u0447 \U0001f511", "a\tb\nc\\d", "AS",
       "x AS y", "a`b.c"]


@pytest.mark.parametrize("time", ["__sessionstore_first", "__sessionstore_key0",
                                  "__sessionstore_bucket", "__SESSIONSTORE_LAST"])
def test_odd_and_internal_column_names_all_at_once_equal_native(spark, time):
    """Keys named with quotes, SQL keywords, unicode, control characters and backticks; a key
    named like an internal column in another case (``bucketed_parts`` refuses only the exact
    prefix); ten key columns; the time column and every value column named like the plan's
    own columns (``__sessionstore_first``, ``_key0``, ``_bucket``; ``_v0``, ``_l0``, ``_n0``,
    ``_time``), an output named ``__sessionstore_v0``, and a key column that is also a value
    column. The plan's SQL strings must read each as the user's column."""
    keys = [*ODD, "__SESSIONSTORE_KEY1", "from"]
    values = ["__sessionstore_v0", "__sessionstore_l0", "__sessionstore_n0",
              "__sessionstore_time"]
    rows = []
    for j, (k, t, v) in enumerate([("a", 0, 1), ("a", 5, 2), ("a", 30, 3), ("b", 1, 4),
                                   ("b", 40, None), ("a", 36, 5), ("a ", 36, 6)]):
        rows.append((*[f"{k}{n}" for n in range(len(ODD))], k, j % 2,
                     _at(t * 1_000_000), v, None if v is None else -v, 2 * j, v))
    schema = ", ".join(f"{_q(n)} {t}" for n, t in [
        *[(n, "string") for n in ODD], ("__SESSIONSTORE_KEY1", "string"), ("from", "int"),
        (time, "timestamp"), *[(n, "long") for n in values]])
    df = spark.createDataFrame(rows, schema)
    aggs: dict[str, Any] = {"n": "count", "s": ("sum", "__sessionstore_v0"),
                            "lo": ("min", "__sessionstore_l0"),
                            "hi": ("max", "__sessionstore_n0"),
                            "__sessionstore_v0": ("sum", "__sessionstore_time"),
                            "f": ("sum", "from"), "fm": ("max", "from")}
    ours = _ours(df, keys, time, aggs)
    assert ours == _native(df, keys, time, aggs)
    assert len(ours) == 7


def test_no_row_with_a_time_gives_no_session_and_no_error(spark, monkeypatch):
    """Every row lacks a time, some lack a key too: every static path drops them all (the
    bucketed plan's null bucket is all there is), and refuses nothing."""
    df = spark.createDataFrame([("a", None, 1), (None, None, 2), ("b", None, None)],
                               "k string, ts timestamp, v long")
    aggs: dict[str, Any] = {"n": "count", "s": ("sum", "v")}
    assert _ours(df, ["k"], "ts", aggs) == [] == _native(df, ["k"], "ts", aggs)
    with monkeypatch.context() as patched:  # the row path, on the same input
        patched.setattr(static_columnar, "bucketed_parts", lambda config: None)
        assert sessionize(df, key="k", timestamp="ts", gap=GAP, aggregations=aggs).collect() == []


def test_a_null_in_one_of_several_key_columns_in_a_later_batch_is_refused(spark):
    """A null in the third of three key columns, in a row with a time, in a later Arrow batch
    of its task than the first: refused, naming the key columns."""
    rows = [("a", 1, "x", _at(t), 1) for t in range(0, 50_000_000, 7_000_000)]
    rows.append(("a", 1, None, _at(80_000_000), 2))
    df = spark.createDataFrame(rows, "k string, i int, z string, ts timestamp, v long")
    with (_options(spark, **{_BATCH_ROWS: "1", _PARTITIONS: "1"}),
          pytest.raises(Exception) as exc):  # Spark wraps the task's ValueError
        _ours(df, ["k", "i", "z"], "ts", {"n": "count"})
    assert "key column(s) ['k', 'i', 'z'] hold nulls" in str(exc.value), str(exc.value)[-2000:]
