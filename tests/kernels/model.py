"""A brute-force model of the per-event session loop, sharing no code with sessionstore.

It keeps every session of every key in one list and, for each event, scans all of them. It is
slow on purpose: nothing in it is clever enough to be wrong in the same way as the kernel.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ModelSession:
    code: int
    start_ms: int
    end_ms: int
    events: frozenset[int] = field(default_factory=frozenset)
    opens: frozenset[int] = field(default_factory=frozenset)


def run_loop(
    events: list[tuple[int, int, int, int]],
    opens: list[tuple[int, int, int]],
    inclusive: bool,
) -> list[ModelSession]:
    """Sessionize ``events`` (code, time, end, closed_before) over ``opens`` (code, start, end).

    Returns every session at the end, including untouched open ones.
    """
    sessions = [ModelSession(code, start, end, frozenset(), frozenset({j}))
                for j, (code, start, end) in enumerate(opens)]
    for i, (code, time_ms, end_ms, closed_before_ms) in enumerate(events):
        hits = []
        rest = []
        for session in sessions:
            if session.code != code or session.end_ms <= closed_before_ms:
                rest.append(session)
                continue
            if inclusive:
                overlaps = session.start_ms <= end_ms and session.end_ms >= time_ms
            else:
                overlaps = session.start_ms < end_ms and session.end_ms > time_ms
            (hits if overlaps else rest).append(session)
        merged = ModelSession(
            code,
            min([time_ms] + [s.start_ms for s in hits]),
            max([end_ms] + [s.end_ms for s in hits]),
            frozenset({i}).union(*(s.events for s in hits)),
            frozenset().union(*(s.opens for s in hits)),
        )
        sessions = rest + [merged]
    return sessions
