"""Time values at the API edge: integer milliseconds, datetimes, timedeltas and duration strings.

Everything inside the engine is an int64 count of milliseconds. This module is the one place that
turns what users pass in into those integers, and it names the offending argument when it cannot.
"""

from __future__ import annotations

import datetime as _dt
import numbers
import re
from typing import Any

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

_UNIT_MS = {
    "ms": 1,
    "milli": 1,
    "millis": 1,
    "millisecond": 1,
    "milliseconds": 1,
    "s": 1_000,
    "sec": 1_000,
    "secs": 1_000,
    "second": 1_000,
    "seconds": 1_000,
    "m": 60_000,
    "min": 60_000,
    "mins": 60_000,
    "minute": 60_000,
    "minutes": 60_000,
    "h": 3_600_000,
    "hr": 3_600_000,
    "hrs": 3_600_000,
    "hour": 3_600_000,
    "hours": 3_600_000,
    "d": 86_400_000,
    "day": 86_400_000,
    "days": 86_400_000,
    "w": 604_800_000,
    "week": 604_800_000,
    "weeks": 604_800_000,
}
#: Calendar units with no fixed length: refused, with the reason, rather than given one by guess.
_CALENDAR_UNITS = {
    "y": "a year", "yr": "a year", "yrs": "a year", "year": "a year", "years": "a year",
    "mo": "a month", "mon": "a month", "month": "a month", "months": "a month",
}
#: A numpy ``timedelta64`` unit as an exact fraction of a second, ``(seconds, per_second)``.
_NUMPY_UNIT_SECONDS = {"W": (604_800, 1), "D": (86_400, 1), "h": (3_600, 1), "m": (60, 1),
                       "s": (1, 1), "ms": (1, 10**3), "us": (1, 10**6), "ns": (1, 10**9),
                       "ps": (1, 10**12), "fs": (1, 10**15), "as": (1, 10**18)}
# Terms are ASCII digits (not str.isdigit's Unicode digits), an optional fraction, a unit.
_PART = re.compile(r"\s*([0-9]+)(?:\.([0-9]+))?\s*([a-z]+)\s*", re.ASCII)
_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)


def check_int64(value: Any, name: str) -> int:
    """Return ``value`` as a Python int if it is an integer within int64, else raise.

    Raises:
        TypeError: ``value`` is not an integer (bools, floats and strings are refused).
        ValueError: ``value`` is outside the int64 range.
    """
    if type(value) is int and INT64_MIN <= value <= INT64_MAX:
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer number of milliseconds, got {value!r} "
                        f"({type(value).__name__})")
    as_int = int(value)
    if not INT64_MIN <= as_int <= INT64_MAX:
        raise ValueError(f"{name} must fit in int64, got {as_int}")
    return as_int


def timestamp_ms(value: Any, name: str = "timestamp_ms") -> int:
    """Convert an event time to int64 milliseconds since the epoch.

    Accepts an int, a numpy integer, or a ``datetime`` (naive datetimes are taken as UTC).

    Raises:
        TypeError: for any other type, floats included.
        ValueError: for a value outside int64.
    """
    if isinstance(value, _dt.datetime):
        aware = value if value.tzinfo is not None else value.replace(tzinfo=_dt.timezone.utc)
        delta = aware - _EPOCH
        return check_int64(
            (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000, name
        )
    return check_int64(value, name)


def duration_ms(value: Any, name: str) -> int:
    """Convert a duration to integer milliseconds, exactly.

    Accepts an int (milliseconds, any sign: callers check the range they need), a
    ``timedelta`` or numpy ``timedelta64`` (see :func:`duration_fraction`), or a string of one
    or more non-negative terms such as ``"10 minutes"``, ``"30m"``, ``"1 hour 30 minutes"``,
    ``"1.001s"``, ``"250 ms"``, ``"7d"`` or ``"2w"`` (optionally prefixed with ``interval``).
    Years and months are refused: they have no fixed length. Strings are parsed with integer
    arithmetic, never floats.

    Raises:
        TypeError: ``value`` has an unsupported type (floats included).
        ValueError: naming ``name``: the string cannot be parsed, has a negative term, a year
            or a month, or is not a whole number of milliseconds (``"1.0005s"``, a
            ``timedelta`` with spare microseconds); the result is outside int64; a ``NaT``.
    """
    exact = duration_fraction(value, name)
    if exact is not None:
        amount, per_second = exact
        millis, rest = divmod(amount * 1000, per_second)
        if rest:
            raise ValueError(f"{name} is not a whole number of milliseconds: {value!r}")
        return check_int64(millis, name)
    if isinstance(value, str):
        return check_int64(_parse_duration(value, name), name)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be milliseconds (int), a timedelta or a duration string "
                        f"like '10 minutes', got {value!r} ({type(value).__name__})")
    return check_int64(value, name)


def duration_fraction(value: Any, name: str) -> tuple[int, int] | None:
    """A duration object as an exact fraction of a second, ``(amount, per_second)`` with
    ``value == amount / per_second`` seconds; None when ``value`` is not a duration object.

    Duration objects are a ``timedelta`` (a pandas ``Timedelta`` to its nanosecond) and a
    numpy ``timedelta64`` in any fixed unit. numpy makes ``timedelta64`` an integer type, so
    this must be asked before a value is taken as a bare count: ``timedelta64(5, "s")`` is five
    seconds, never five of the caller's units.

    Raises:
        ValueError: naming ``name``: a ``NaT``, a year or month unit (no fixed length), or a
            ``timedelta64`` without a unit.
    """
    to_numpy = getattr(value, "to_timedelta64", None)
    if isinstance(value, _dt.timedelta) and to_numpy is not None:  # pandas: keeps its ns
        value = to_numpy()
    dtype = getattr(value, "dtype", None)
    if getattr(dtype, "kind", None) == "m" and getattr(value, "ndim", None) == 0:
        import numpy as np  # loaded already: the value is a numpy one

        unit, count = np.datetime_data(value.dtype)
        if np.isnat(value):
            raise ValueError(f"{name} is {value!r}, not a duration")
        if unit in ("Y", "M"):
            raise ValueError(f"{name} {value!r}: {'a year' if unit == 'Y' else 'a month'} has "
                             f"no fixed length, so it is not a duration; use days or weeks")
        if unit not in _NUMPY_UNIT_SECONDS:
            raise ValueError(f"{name} {value!r} has no time unit: give it one, e.g. "
                             f"numpy.timedelta64(30, 'm'), or pass an int")
        seconds, per_second = _NUMPY_UNIT_SECONDS[unit]
        return int(value.astype(np.int64)) * int(count) * seconds, per_second
    if isinstance(value, _dt.timedelta):
        return (value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds, 1_000_000
    return None


def _parse_duration(text: str, name: str) -> int:
    shown = repr(text) if len(text) <= 60 else repr(text[:57] + "...")
    stripped = text.strip().lower()
    if stripped.startswith("interval "):
        stripped = stripped[len("interval "):]
    if not stripped:
        raise ValueError(f"{name} is an empty duration string")
    if "-" in stripped:
        raise ValueError(f"{name} has a negative term in {shown}; durations are >= 0")
    if stripped.isdigit() and stripped.isascii():
        return _whole_ms(stripped, "", 1, name, shown)
    total = 0
    pos = 0
    while pos < len(stripped):
        match = _PART.match(stripped, pos)
        if match is None:
            raise ValueError(f"{name} is not a duration: {shown} (try '10 minutes' or '30s')")
        whole, fraction, unit = match.groups()
        if unit in _CALENDAR_UNITS:
            raise ValueError(f"{name}: {_CALENDAR_UNITS[unit]} has no fixed length (a year is "
                             f"365 or 366 days, a month 28 to 31), so {unit!r} in {shown} is not "
                             f"a duration; write days or weeks, e.g. '365d' or '4w'")
        if unit not in _UNIT_MS:
            raise ValueError(f"{name} has an unknown time unit {unit!r} in {shown}")
        total += _whole_ms(whole, fraction or "", _UNIT_MS[unit], name, shown)
        if total > INT64_MAX:
            raise ValueError(f"{name} must fit in int64 milliseconds, got {shown}")
        pos = match.end()
    return total


def _whole_ms(whole: str, fraction: str, unit_ms: int, name: str, shown: str) -> int:
    """``whole.fraction`` units in ms, exactly; refuses sub-millisecond parts and huge values."""
    whole = whole.lstrip("0")
    fraction = fraction.rstrip("0")
    # Bounded before any int(): a 400-digit term must not reach int() (or its digit limit).
    if len(whole) > 19:
        raise ValueError(f"{name} must fit in int64 milliseconds, got {shown}")
    # A unit's ms count holds at most 2**10 and 5**5, so a fraction with more than ten
    # significant digits is never a whole ms; 18 only keeps the ints small.
    if len(fraction) > 18:
        raise ValueError(f"{name} is not a whole number of milliseconds: {shown}")
    scale: int = 10 ** len(fraction)
    scaled = (int(whole or "0") * scale + int(fraction or "0")) * unit_ms
    if scaled % scale:
        raise ValueError(f"{name} is not a whole number of milliseconds: {shown}")
    return scaled // scale
