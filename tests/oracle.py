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


def sessionize_max_duration(
    steps: list[tuple[Any, ...]], gap: int | None, max_duration: int, grace: int = 0,
    inclusive: bool = True, out_of_orderness: int | None = 0,
) -> tuple[list[tuple[Any, ...]], list[Any]]:
    """Sessionize with a maximum session duration (issue 12), step by step.

    At every event, the key's sessions that are final (``end <= W - grace``) stay as they are;
    all the other events of the key, and the new one, are sorted by (time, arrival) and cut
    again from scratch by :func:`cut_max_duration`. An event is late when
    ``W >= t + min(gap, max_duration) + grace`` (the session it would form alone is closed).

    Args:
        steps: ``("event", key, value, t)`` (or with a fifth item, the event's own gap) and
            ``("watermark", w)``, in arrival order. An event whose own gap is None or <= 0 is
            dropped as if it never arrived.
        gap, max_duration, grace, inclusive, out_of_orderness: as :func:`sessionize`.

    Returns:
        As :func:`sessionize`.
    """
    w = NEG_INF
    sessions: dict[Any, list[tuple[int, int, list[tuple[Any, ...]]]]] = {}
    dropped = []
    for arrival, step in enumerate(steps):
        if step[0] == "watermark":
            w = max(w, step[1])
            continue
        key, value, t = step[1], step[2], step[3]
        own_gap = step[4] if len(step) > 4 else gap
        if own_gap is None or own_gap <= 0:
            continue
        if w >= t + min(own_gap, max_duration) + grace:
            dropped.append(value)
            continue
        final = [s for s in sessions.get(key, []) if s[1] <= w - grace]
        pending = [e for s in sessions.get(key, []) if s[1] > w - grace for e in s[2]]
        pending.append((t, arrival, t + own_gap, value))
        sessions[key] = final + cut_max_duration(pending, max_duration, inclusive)
        if out_of_orderness is not None:
            w = max(w, t - out_of_orderness)
    result = [(key, s[0], s[1], [e[3] for e in s[2]])
              for key, mine in sessions.items() for s in mine]
    return sorted(result, key=lambda r: (repr(r[0]), r[1], r[2])), dropped


def cut_max_duration(events: list[tuple[Any, ...]], max_duration: int, inclusive: bool
                     ) -> list[tuple[int, int, list[tuple[Any, ...]]]]:
    """The offline rule of one key: ``events`` are ``(t, arrival, t + gap, value)``; returns
    ``(start, end, events)`` per session. Each session is grown from its first event: the next
    event (in (time, arrival) order) joins while it lies before ``start + max_duration`` and
    within reach of the largest ``t + gap`` so far."""
    ordered = sorted(events, key=lambda e: (e[0], e[1]))
    out: list[tuple[int, int, list[tuple[Any, ...]]]] = []
    while ordered:
        members = [ordered.pop(0)]
        start = members[0][0]
        while ordered:
            reach = max(e[2] for e in members)
            t = ordered[0][0]
            near = t <= reach if inclusive else t < reach
            if not (near and t < start + max_duration):
                break
            members.append(ordered.pop(0))
        out.append((start, min(max(e[2] for e in members), start + max_duration), members))
    return out


def offline_max_duration(events: list[tuple[Any, ...]], gap: int, max_duration: int,
                         inclusive: bool = True) -> list[tuple[Any, ...]]:
    """All events at once, nothing late: ``events`` are ``(key, value, t)`` or
    ``(key, value, t, gap)`` in arrival order; returns ``(key, start, end, values)`` sorted."""
    per_key: dict[Any, list[tuple[Any, ...]]] = {}
    for arrival, event in enumerate(events):
        own_gap = event[3] if len(event) > 3 else gap
        per_key.setdefault(event[0], []).append((event[2], arrival, event[2] + own_gap, event[1]))
    result = [(key, start, end, [e[3] for e in members])
              for key, mine in per_key.items()
              for start, end, members in cut_max_duration(mine, max_duration, inclusive)]
    return sorted(result, key=lambda r: (repr(r[0]), r[1], r[2]))
