"""A streaming query's progress as plain JSON, with the observed counters by name.

``query.lastProgress`` holds each ``df.observe`` result as a PySpark ``Row``. A ``Row`` is a
tuple, so ``json.dumps`` writes ``observedMetrics.sessionstore`` as a bare list of numbers, and
on PySpark 4 the progress also holds ``uuid.UUID`` ids that ``json.dumps`` refuses.
:func:`progress_json` converts a progress into dicts, lists and scalars that keep every name.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from .arrow import OBSERVATION


def _plain(value: Any) -> Any:
    as_dict = getattr(value, "asDict", None)
    if as_dict is not None and isinstance(value, tuple):  # a pyspark Row
        return {str(name): _plain(item) for name, item in as_dict().items()}
    if isinstance(value, Mapping):
        return {str(name): _plain(item) for name, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    if isinstance(value, uuid.UUID):
        return str(value)
    return value


def progress_json(progress: Mapping[str, Any]) -> dict[str, Any]:
    """``progress`` (an entry of ``query.recentProgress``, or ``query.lastProgress``) as plain
    dicts, lists and scalars: observed metrics become objects with their field names, ids
    become strings. ``json.dumps(progress_json(query.lastProgress))`` keeps every name.

    Raises:
        TypeError: ``progress`` is not a mapping (None before the first micro-batch).
    """
    if not isinstance(progress, Mapping):
        raise TypeError(f"progress must be a query progress (a mapping), got "
                        f"{type(progress).__name__}")
    return {str(name): _plain(value) for name, value in progress.items()}


def progress_counters(progress: Mapping[str, Any]) -> dict[str, int]:
    """The sessionstore counters of one micro-batch's progress, by name
    (``sessions_emitted``, ``late_rows_dropped``, ``rows_in``...); empty when the query has no
    ``sessionize`` with the Arrow engine.

    Raises:
        TypeError: ``progress`` is not a mapping.
    """
    observed = progress_json(progress).get("observedMetrics") or {}
    return {name: int(value) for name, value in (observed.get(OBSERVATION) or {}).items()}
