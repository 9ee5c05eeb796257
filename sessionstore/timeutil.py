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
_PART = re.compile(r"\s*(-?\d+(?:\.\d+)?)\s*([a-zA-Z]+)\s*")
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
    """Convert a duration to integer milliseconds.

    Accepts an int (milliseconds), a ``timedelta``, or a string such as ``"10 minutes"``,
    ``"30m"``, ``"1 hour 30 minutes"`` or ``"250 ms"``.

    Raises:
        TypeError: ``value`` has an unsupported type.
        ValueError: the string cannot be parsed, or the result is outside int64.
    """
    if isinstance(value, _dt.timedelta):
        return check_int64(
            (value.days * 86_400 + value.seconds) * 1000 + value.microseconds // 1000, name
        )
    if isinstance(value, str):
        return check_int64(_parse_duration(value, name), name)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be milliseconds (int), a timedelta or a duration string "
                        f"like '10 minutes', got {value!r} ({type(value).__name__})")
    return check_int64(value, name)


def _parse_duration(text: str, name: str) -> int:
    stripped = text.strip().lower()
    if stripped.startswith("interval "):
        stripped = stripped[len("interval "):]
    if not stripped:
        raise ValueError(f"{name} is an empty duration string")
    if stripped.lstrip("-").isdigit():
        return int(stripped)
    total = 0.0
    pos = 0
    while pos < len(stripped):
        match = _PART.match(stripped, pos)
        if match is None or match.end() == pos:
            raise ValueError(f"{name} is not a duration: {text!r} (try '10 minutes' or '30s')")
        number, unit = match.groups()
        if unit not in _UNIT_MS:
            raise ValueError(f"{name} has an unknown time unit {unit!r} in {text!r}")
        total += float(number) * _UNIT_MS[unit]
        pos = match.end()
    if total != int(total):
        raise ValueError(f"{name} is not a whole number of milliseconds: {text!r}")
    return int(total)
