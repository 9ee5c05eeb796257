"""An independent offline sessionizer: the reference the engine's paths are checked against.

It shares no code with ``sessionstore``: plain lists, one pass over the steps in arrival order,
the rules of DESIGN.md section 2 written out directly.
"""

from __future__ import annotations

from typing import Any

NEG_INF = float("-inf")


def sessionize(steps: list[tuple[Any, ...]], gap: int | None, grace: int = 0,
               inclusive: bool = True, out_of_orderness: int | None = 0,
               invalid_gaps: list[Any] | None = None) -> tuple[list[tuple[Any, ...]], list[Any]]:
    """Sessionize a whole input.

    Args:
        steps: ``("event", key, value, t)`` and ``("watermark", w)`` in arrival order; an event
            may carry its own gap as a fifth item, ``("event", key, value, t, gap)``.
        gap, grace, inclusive: the windows; ``gap`` is the gap of events without their own.
        out_of_orderness: the event-time watermark lag; None for an external watermark (only
            ``watermark`` steps move it).
        invalid_gaps: receives the values of events whose own gap is None or <= 0; those are
            dropped as if they never arrived (they move no watermark).

    Returns:
        ``(sessions, dropped)``: every session as ``(key, start, end, values)`` with values in
        (time, arrival) order, sorted; and the values of the events dropped as late.
    """
    w = NEG_INF
    sessions: dict[Any, list[list[Any]]] = {}  # key -> [[start, end, [(t, arrival, v)]], ...]
    dropped = []
    for arrival, step in enumerate(steps):
        if step[0] == "watermark":
            w = max(w, step[1])
            continue
        key, value, t = step[1:4]
        own = step[4] if len(step) > 4 else gap
        if own is None or own <= 0:
            if invalid_gaps is not None:
                invalid_gaps.append(value)
            continue
        if w >= t + own + grace:
            dropped.append(value)
            continue
        mine = sessions.setdefault(key, [])
        lo, hi = t, t + own
        keep, join = [], []
        for s in mine:
            final = s[1] <= w - grace
            reach = (s[1] >= t and s[0] <= t + own) if inclusive else (s[1] > t and s[0] < t + own)
            (join if reach and not final else keep).append(s)
        items = [(t, arrival, value)]
        for s in join:
            lo, hi = min(lo, s[0]), max(hi, s[1])
            items += s[2]
        sessions[key] = keep + [[lo, hi, sorted(items)]]
        if out_of_orderness is not None:
            w = max(w, t - out_of_orderness)
    result = [(key, s[0], s[1], [v for _, _, v in s[2]])
              for key, mine in sessions.items() for s in mine]
    return sorted(result, key=lambda r: (repr(r[0]), r[1], r[2])), dropped
