"""Durations: exact parsing, checked against an independent model, and refusals that name the
argument."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal, localcontext

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sessionstore import BatchWindows, SessionWindows
from sessionstore.timeutil import duration_ms

INT64_MAX = 2**63 - 1

# The model's own unit table, derived from the standard library rather than copied from the code
# under test: how many milliseconds one of each unit is.
_MS = dt.timedelta(milliseconds=1)
MODEL_UNITS = {
    alias: dt.timedelta(**{kwarg: 1}) // _MS
    for kwarg, aliases in {
        "milliseconds": ["ms", "milli", "millis", "millisecond", "milliseconds"],
        "seconds": ["s", "sec", "secs", "second", "seconds"],
        "minutes": ["m", "min", "mins", "minute", "minutes"],
        "hours": ["h", "hr", "hrs", "hour", "hours"],
        "days": ["d", "day", "days"],
        "weeks": ["w", "week", "weeks"],
    }.items()
    for alias in aliases
}


def model_ms(terms: list[tuple[str, str]]) -> int | str:
    """The exact value of ``number unit`` terms read left to right, in Decimal arithmetic with
    ample precision: an int, or which refusal comes first ("whole" or "int64")."""
    total = Decimal(0)
    with localcontext() as ctx:
        ctx.prec = 2000
        for number, unit in terms:
            value = Decimal(number) * MODEL_UNITS[unit]
            if value != value.to_integral_value():
                return "whole"
            total += value
            if total > INT64_MAX:
                return "int64"
    return int(total)


NUMBERS = st.one_of(
    st.integers(0, 10**6).map(str),
    st.tuples(st.integers(0, 10**4), st.text("0123456789", min_size=1, max_size=6)).map(
        lambda p: f"{p[0]}.{p[1]}"),
    st.integers(0, 10**22).map(str),  # around and beyond int64
    st.tuples(st.integers(0, 3), st.integers(0, 30)).map(lambda p: "0" * p[0] + "1" + "0" * p[1]),
)
TERMS = st.lists(st.tuples(NUMBERS, st.sampled_from(sorted(MODEL_UNITS))), min_size=1,
                 max_size=4)
SPACES = st.sampled_from(["", " ", "  "])


@settings(max_examples=400)
@given(terms=TERMS, inner=SPACES, between=st.sampled_from([" ", "  ", ""]),
       upper=st.booleans(), prefix=st.booleans())
@example(terms=[("1.001", "s")], inner="", between=" ", upper=False, prefix=False)
@example(terms=[("1" + "0" * 400, "ms")], inner=" ", between=" ", upper=False, prefix=False)
def test_parser_matches_an_exact_decimal_model(terms, inner, between, upper, prefix):
    # Without a separator a unit would run into the next number's unit ("1m" "5s" is fine,
    # but "1ms" + "5s" must stay two terms): the letters end where a digit starts, so it does.
    text = between.join(f"{number}{inner}{unit}" for number, unit in terms)
    if upper:
        text = text.upper()
    if prefix:
        text = "interval " + text
    expected = model_ms(terms)
    if expected == "whole":
        with pytest.raises(ValueError, match="gap_ms is not a whole number of milliseconds"):
            duration_ms(text, "gap_ms")
    elif expected == "int64":
        with pytest.raises(ValueError, match="gap_ms must fit in int64"):
            duration_ms(text, "gap_ms")
    else:
        assert duration_ms(text, "gap_ms") == expected


@settings(max_examples=200)
@given(digits=st.text("0123456789", min_size=1, max_size=40))
def test_bare_digit_strings_are_milliseconds(digits):
    value = int(digits)
    if value > INT64_MAX:
        with pytest.raises(ValueError, match="grace_ms must fit in int64"):
            duration_ms(digits, "grace_ms")
    else:
        assert duration_ms(digits, "grace_ms") == value


@settings(max_examples=200)
@given(micros=st.integers(-(10**15), 10**15))
def test_timedeltas_are_exact_or_refused(micros):
    delta = dt.timedelta(microseconds=micros)
    if micros % 1000:
        with pytest.raises(ValueError, match="size_ms is not a whole number"):
            duration_ms(delta, "size_ms")
    else:
        assert duration_ms(delta, "size_ms") == micros // 1000


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1.001s", 1001), ("1.5 minutes", 90_000), ("0.25h", 900_000), ("1h30m", 5_400_000),
     ("INTERVAL 2 days", 172_800_000), ("007 ms", 7), ("1.000000000000000000000000s", 1000)],
)
def test_exact_examples(text, expected):
    assert duration_ms(text, "gap_ms") == expected


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("-5m 10m", "gap_ms has a negative term"),
        ("10m -5m", "gap_ms has a negative term"),
        ("-5", "gap_ms has a negative term"),
        ("1.0005s", "gap_ms is not a whole number of milliseconds"),
        ("0.1ms", "gap_ms is not a whole number of milliseconds"),
        ("1" + "0" * 400, "gap_ms must fit in int64"),
        ("1" + "0" * 400 + " ms", "gap_ms must fit in int64"),
        ("1" + "0" * 5000 + "s", "gap_ms must fit in int64"),  # never reaches int()'s limit
        ("0." + "0" * 5000 + "1s", "gap_ms is not a whole number"),
        ("9223372036854775807ms 1ms", "gap_ms must fit in int64"),
        ("5 parsecs", "gap_ms has an unknown time unit 'parsecs'"),
        ("1y", "gap_ms: a year has no fixed length"),
        ("2 years 1d", "gap_ms: a year has no fixed length"),
        ("3 months", "gap_ms: a month has no fixed length"),
        ("١٢ms", "gap_ms is not a duration"),  # Arabic-Indic digits are not ASCII digits
        ("1e3ms", "gap_ms"),
        (".5s", "gap_ms is not a duration"),
        ("", "gap_ms is an empty duration string"),
    ],
)
def test_refusals_name_the_argument(text, match):
    with pytest.raises(ValueError, match=match):
        duration_ms(text, "gap_ms")


def test_derived_retention_outside_int64_names_the_argument():
    with pytest.raises(ValueError, match=r"retention_ms \(gap_ms \+ grace_ms\) must fit in int64"):
        SessionWindows(2**62, 2**62)
    with pytest.raises(ValueError, match="retention_ms must be >= gap_ms"):
        SessionWindows(2**62, 2**62, retention_ms=INT64_MAX)
    windows = SessionWindows(2**62, 2**62 - 1)
    assert windows.retention_ms == INT64_MAX


def test_windows_accept_exact_strings():
    assert SessionWindows("1.001s").gap_ms == 1001
    assert BatchWindows("0.5s").size_ms == 500
    with pytest.raises(ValueError, match="gap_ms has a negative term"):
        SessionWindows("-5m 10m")
