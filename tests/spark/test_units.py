"""Units at the edge between the Spark adapter and the engine: inside ``spark_adapter`` a
microsecond quantity is named ``*_us``, and reaches the engine's unit-agnostic ``*_ms`` arguments
only through ``config.engine_arguments``. No SparkSession: a static partition runs in-process."""

from __future__ import annotations

import ast
import datetime as dt
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from pyspark.sql import types as T

from sessionstore import aggregations
from spark_adapter import arrow
from spark_adapter.config import US_PER_MS, SessionizeConfig, duration_us, engine_arguments

ROOT = Path(__file__).resolve().parents[2]
T0 = 1_700_000_000_000_000  # us


def test_engine_arguments_renames_microsecond_quantities_and_refuses_anything_else():
    assert engine_arguments(gap_us=7, retention_us=None, gaps_us=[1, None]) == \
        {"gap_ms": 7, "retention_ms": None, "gaps_ms": [1, None]}
    assert engine_arguments() == {}
    with pytest.raises(TypeError, match=r"named \*_us, got delay_ms=5"):
        engine_arguments(delay_ms=5)  # a millisecond value must be converted, not handed over


def _bound_names(node: ast.AST) -> list[str]:
    return [n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(node)
            if isinstance(n, ast.Name | ast.Attribute)]


def test_no_engine_argument_named_ms_is_given_a_microsecond_quantity():
    """The old adapter passed ``gaps_ms=rows.gaps_us``, ``retention_ms=config.retention_us``
    and ``retention_ms=STATIC_RETENTION_US``: a name that lies about its unit."""
    lies = []
    for path in sorted((ROOT / "spark_adapter").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.keyword) and node.arg and node.arg.endswith("_ms") \
                    and any(name.lower().endswith("_us") for name in _bound_names(node.value)):
                lies.append(f"{path.name}:{node.value.lineno} {node.arg}=")
    assert lies == []


def _config(**changes) -> SessionizeConfig:
    config = SessionizeConfig(
        key_columns=["user"], key_types=[T.StringType()], time_column="ts",
        time_type=T.TimestampType(), value_columns=[], value_types=[], gap_us=10_000_000,
        inclusive_gap=True, emit="final", aggregation=aggregations.combine({"n": aggregations.count()}),
        output_names=["n"], output_fields=[T.StructField("n", T.LongType())], json_outputs=[])
    for name, value in changes.items():
        setattr(config, name, value)
    return config


def _sessions(config: SessionizeConfig, rows: dict[str, list]) -> list[tuple]:
    batch = pa.RecordBatch.from_pydict(rows, schema=config.arrow_input_schema())
    out = []
    for piece in arrow.static_partition(config, iter([batch])):
        out += [(r["user"], r["session_start"], r["session_end"], r["n"])
                for r in piece.to_pylist()]
    return sorted(out)


def _at(us: int) -> dt.datetime:
    return dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(microseconds=us)


def test_the_engine_gets_the_gap_in_microseconds_unchanged():
    """10 s apart touch (one session, inclusive gap); 10 s + 1 us apart do not."""
    config = _config()
    windows = config.windows()
    assert windows.gap_ms == 10_000_000 and windows.retention_ms == config.retention_us
    times = [T0, T0 + 10_000_000, T0 + 20_000_001]
    got = _sessions(config, {"user": ["a"] * 3, "ts": times})
    assert got == [("a", _at(T0), _at(T0 + 20_000_000), 2),
                   ("a", _at(T0 + 20_000_001), _at(T0 + 30_000_001), 1)]


def test_per_row_gaps_reach_the_engine_in_microseconds():
    config = _config(gap_us=None, gap_column="g", gap_description="g", max_gap_us=60_000_000)
    times = [T0, T0 + 5_000_000, T0 + 12_000_001]
    gaps = [5_000_000, 7_000_000, 1]  # the second touches the first; the third is 1 us late
    got = _sessions(config, {"user": ["a"] * 3, "ts": times, "g": gaps})
    assert got == [("a", _at(T0), _at(T0 + 12_000_000), 2),
                   ("a", _at(T0 + 12_000_001), _at(T0 + 12_000_002), 1)]


def test_a_stream_keeps_state_for_the_delay_in_microseconds():
    """Retention covers the gap and the watermark delay, both handed over in microseconds."""
    short, long = _config(delay_ms=0), _config(delay_ms=1_500)
    assert long.retention_us - short.retention_us == 1_500 * US_PER_MS
    assert long.windows().retention_ms == long.retention_us > 10_000_000 + 1_500 * US_PER_MS


@pytest.mark.parametrize(("value", "micros"), [
    (np.timedelta64(1_500, "us"), 1_500),
    (np.timedelta64(3_000, "ns"), 3),
    (np.timedelta64(2, "s"), 2_000_000),
    (np.timedelta64(1, "W"), 604_800_000_000),
    (pd.Timedelta(microseconds=1_500), 1_500),
    (pd.Timedelta(nanoseconds=7_000), 7),
    (dt.timedelta(microseconds=7), 7),
    ("250 microseconds", 250),
    (5, 5_000),  # an int is milliseconds
])
def test_durations_are_microseconds_exactly(value, micros):
    """Killed bugs: a numpy timedelta64 finer than a millisecond was refused as "not a whole
    number of milliseconds", though Spark keeps microseconds."""
    assert duration_us(value, "gap") == micros


@pytest.mark.parametrize("value", [pd.Timedelta(nanoseconds=1_500), np.timedelta64(1, "ns"),
                                   pd.Timedelta(microseconds=2, nanoseconds=1)])
def test_a_duration_finer_than_a_microsecond_is_refused_not_truncated(value):
    """Killed bug: a pandas Timedelta lost its nanoseconds (1500 ns became 1 us), silently."""
    with pytest.raises(ValueError, match="max_gap is not a whole number of microseconds"):
        duration_us(value, "max_gap")


def test_a_calendar_or_missing_numpy_duration_is_refused_naming_the_argument():
    with pytest.raises(ValueError, match="max_duration .*a month has no fixed length"):
        duration_us(np.timedelta64(1, "M"), "max_duration")
    with pytest.raises(ValueError, match="max_duration is .*NaT.*, not a duration"):
        duration_us(np.timedelta64("NaT", "ns"), "max_duration")
