"""Running Beam triggers: typed trigger state, merging it, and deciding when panes fire.

The public trigger objects (:mod:`sessionstore.triggers`) only describe *when* to fire. This
module keeps, per session, a :class:`~sessionstore.engine.record.SessionRecord` (element count,
processing-time target, pane index and phase) and applies Beam's rules (Java runner) to it:

* ``on_element``: an element inside a session continues its trigger state.
* ``on_merge``: a merge that changes the bounds starts a fresh pane history; counts add up and
  the processing-time target becomes the minimum, the new element's own window included.
* ``should_fire``: ``AfterCount`` fires on the element that meets it, in the early phase and in
  the late phase alike (Beam's ``early_late_sessions`` transcript); ``AfterProcessingTime`` fires
  when processing time is strictly past its target; ON_TIME fires when ``W >= end``; the
  closing pane fires when ``W >= end + grace`` if something arrived since the last firing.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from typing import Any

from ..aggregations import Aggregation
from ..gap_boundary import is_final
from ..triggers import (
    AccumulationMode,
    AfterCount,
    AfterProcessingTime,
    AfterWatermark,
    Pane,
    PaneTiming,
    SubTrigger,
)
from ..types import Session
from .emit import Emit, EngineMetrics, make_emit
from .record import Phase, SessionRecord
from .time import TimeKeeper, final_latency_ms


class TriggerRunner:
    """Trigger state transitions and firings of one engine.

    Args:
        trigger, accumulation: what the user configured.
        clock: processing time in ms.
        aggregation: to turn accumulators into pane values.
        times: the engine's watermark and cursors.
        metrics: the engine's counters.
        put: writes a session's updated record to the engine's state.
    """

    def __init__(self, trigger: AfterWatermark, accumulation: AccumulationMode,
                 clock: Callable[[], int], aggregation: Aggregation, times: TimeKeeper,
                 metrics: EngineMetrics, put: Callable[[Session, SessionRecord], None]) -> None:
        self.early: SubTrigger | None = trigger.early
        self.late: SubTrigger | None = trigger.late
        self.discarding = accumulation is AccumulationMode.DISCARDING
        self.clock = clock
        self.aggregation = aggregation
        self.times = times
        self.metrics = metrics
        self.put = put
        self.on_time_heap: list[int] = []  # ends of sessions still before their ON_TIME pane
        self.timers: list[tuple[int, int, Any, int, int]] = []  # (target, seq, key, start, end)
        self._timer_seq = 0

    # -- state transitions ------------------------------------------------------------------

    def on_element(self, record: SessionRecord, acc: Any) -> SessionRecord:
        """An element inside an existing session, not moving its bounds."""
        updated = record.copy()
        updated.acc = acc
        updated.n_new += 1
        sub = self.early if updated.phase is Phase.EARLY else self.late
        if isinstance(sub, AfterProcessingTime) and updated.pt_target_ms is None:
            updated.pt_target_ms = self.clock() + sub.delay_ms
        return updated

    def on_merge(self, merged: Iterable[SessionRecord], acc: Any, end_ms: int) -> SessionRecord:
        """A new window (a merge, or a fresh session): a fresh pane history."""
        n_new = 1
        targets = []
        for rec in merged:
            n_new += rec.n_new
            if rec.pt_target_ms is not None:
                targets.append(rec.pt_target_ms)
        phase = Phase.LATE if end_ms <= self.times.watermark else Phase.EARLY
        target = None
        if phase is Phase.EARLY and isinstance(self.early, AfterProcessingTime):
            targets.append(self.clock() + self.early.delay_ms)
            target = min(targets)
        return SessionRecord(acc, n_new, 0, phase, target)

    def after_update(self, new: Session, record: SessionRecord, previous_target: int | None,
                     same: bool, out: list[Emit]) -> None:
        """Index the updated session and fire what the element makes due."""
        if not same and record.phase is Phase.EARLY:
            heapq.heappush(self.on_time_heap, new.end)
        if record.pt_target_ms is not None and (not same or previous_target is None):
            self.push_timer(record.pt_target_ms, new)
        if record.phase is Phase.LATE:
            late = self.late
            # a new window behind the watermark fires at once; a late AfterCount fires on the
            # element that meets it (Beam's early_late_sessions transcript)
            if not same or (isinstance(late, AfterCount) and record.n_new >= late.n):
                self.fire(new, record, PaneTiming.LATE, False, out)
        elif isinstance(self.early, AfterCount) and record.n_new >= self.early.n:
            self.fire(new, record, PaneTiming.EARLY, False, out)

    # -- firing -----------------------------------------------------------------------------

    def fire(self, session: Session, record: SessionRecord, timing: PaneTiming, is_last: bool,
             out: list[Emit]) -> None:
        """Emit a pane of ``session`` and reset its trigger state."""
        index = record.pane_index
        pane = Pane(timing, index, index == 0, is_last)
        out.append(make_emit(session, self.aggregation.result(record.acc), pane))
        self.metrics.emitted += 1
        if is_last:
            self.metrics.record_final(final_latency_ms(self.times.watermark, session.end,
                                                       self.times.config.grace_ms))
            return
        updated = SessionRecord(
            self.aggregation.initial() if self.discarding else record.acc,
            0,
            index + 1,
            Phase.LATE if timing is not PaneTiming.EARLY else record.phase,
            None,
        )
        self.put(session, updated)

    def fire_closing(self, session: Session, record: SessionRecord, out: list[Emit]) -> None:
        if record.phase is Phase.EARLY:
            self.fire(session, record, PaneTiming.ON_TIME, True, out)
        elif record.n_new > 0:
            self.fire(session, record, PaneTiming.LATE, True, out)

    def on_time_due(self, w: int) -> bool:
        """Whether some session may owe its ON_TIME pane at watermark ``w``."""
        heap = self.on_time_heap
        if heap and heap[0] <= w:
            while heap and heap[0] <= w:
                heapq.heappop(heap)
            return True
        return False

    def push_timer(self, target_ms: int, session: Session) -> None:
        self._timer_seq += 1
        heapq.heappush(self.timers,
                       (target_ms, self._timer_seq, session.key, session.start, session.end))

    def fire_timers(self, now_ms: int, get: Callable[[Session], SessionRecord | None],
                    out: list[Emit]) -> None:
        """Fire the processing-time triggers strictly past their target."""
        timers = self.timers
        while timers and timers[0][0] < now_ms:
            target, _, key, start, end = heapq.heappop(timers)
            session = Session(key, start, end)
            record = get(session)
            if record is None or record.pt_target_ms != target or record.n_new == 0:
                continue  # merged away, already fired, or re-targeted
            if is_final(session.end, self.times.closed_before()):
                continue  # closed: the closing pane took it
            timing = PaneTiming.EARLY if record.phase is Phase.EARLY else PaneTiming.LATE
            self.fire(session, record, timing, False, out)

    def index(self, session: Session, record: SessionRecord) -> None:
        """Rebuild the in-memory indexes for a session found in the store on restart."""
        if record.phase is Phase.EARLY:
            heapq.heappush(self.on_time_heap, session.end)
        if record.pt_target_ms is not None:
            self.push_timer(record.pt_target_ms, session)
