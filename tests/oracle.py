"""An independent offline sessionizer: the reference the engine's paths are checked against.

It shares no code with ``sessionstore``: plain lists, one pass over the steps in arrival order,
the rules of DESIGN.md section 2 written out directly.
"""

from __future__ import annotations

from typing import Any

NEG_INF = float("-inf")


def sessionize(steps: list[tuple[Any, ...]], gap: int, grace: int = 0, inclusive: bool = True,
               out_of_orderness: int | None = 0) -> tuple[list[tuple[Any, ...]], list[Any]]:
    """Sessionize a whole input.

    Args:
        steps: ``("event", key, value, t)`` and ``("watermark", w)`` in arrival order.
        gap, grace, inclusive: the windows.
        out_of_orderness: the event-time watermark lag; None for an external watermark (only
            ``watermark`` steps move it).

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
        _, key, value, t = step
        if w >= t + gap + grace:
            dropped.append(value)
            continue
        mine = sessions.setdefault(key, [])
        lo, hi = t, t + gap
        keep, join = [], []
        for s in mine:
            final = s[1] <= w - grace
            reach = (s[1] >= t and s[0] <= t + gap) if inclusive else (s[1] > t and s[0] < t + gap)
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
