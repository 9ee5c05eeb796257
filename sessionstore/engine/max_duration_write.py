"""Writing the sessions of a maximum-duration cut: the difference from the stored open sessions
(:func:`diff_cut`), its store writes (:func:`write_changes`) and its emission, change log or
close index (:func:`publish_changes`, :func:`emit_log`). The event step, the held keys and the
batch path all write through here (see :mod:`sessionstore.engine.max_duration`)."""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Any

from .. import keyschema
from ..types import Session
from .cuts import Recut
from .emit import Emit, make_emit
from .max_duration_state import Added, ChangeLog, DurationState, Removed, fold_events
from .record import acc_of, record_with_events

if TYPE_CHECKING:
    from .host import EngineHost


def diff_cut(state: DurationState, key: Any, sessions: list[Recut],
             old: dict[tuple[int, int], Any]) -> tuple[list[Removed], list[Added]]:
    """The changes that replace the stored open sessions ``old`` (``{bounds: record}``, in
    order) of ``key`` by the sessions of a cut over their events and new ones: ``(removed,
    added)``, as :func:`write_changes` and :func:`publish_changes` apply them.

    A session of a cut holds exactly the open events in ``[start, end)``, so one with stored
    bounds and no new event is the stored one (unchanged); every other one gets its
    accumulator folded from its events (in (time, arrival) order). Counts the work in
    ``state``."""
    agg = state.engine.aggregation
    kept: set[tuple[int, int]] = set()
    added: list[Added] = []
    for start, end, max_end, members, holds_new in sessions:
        raw = old.get((start, end))
        if raw is not None:
            kept.add((start, end))  # unchanged, or changed in place: no removal
            if not holds_new:
                continue
        state.recut_events += len(members)
        state.recut_steps += 1
        added.append((start, end, fold_events(agg, key, members), members, max_end,
                      raw is None, None if raw is None else acc_of(raw)))
    return [(b, acc_of(raw)) for b, raw in old.items() if b not in kept], added


def write_changes(engine: EngineHost, key: Any, removed: list[Removed], added: list[Added]
                  ) -> None:
    """Write a key's changed open sessions to the engine's store."""
    state = engine.cache
    for b, _ in removed:
        state.remove(Session(key, b[0], b[1]))
    for start, end, acc, events, max_end, *_ in added:
        state.put(Session(key, start, end), record_with_events(acc, events, max_end))


def publish_changes(engine: EngineHost, key: Any, removed: list[Removed], added: list[Added],
                    out: list[Emit], log: ChangeLog | None) -> None:
    """Emit (``ON_WINDOW_UPDATE``), log (a batch's ``ON_WINDOW_UPDATE``, when ``log`` is
    given) or index for closing (``ON_WINDOW_CLOSE``) the changes :func:`write_changes`
    wrote; emits are appended to ``out``. With a write cache and ``ON_WINDOW_UPDATE`` nothing
    is done: the cache delivers the changes on flush."""
    if engine.updates:
        if engine.write_cache:
            return  # the write cache delivers the changes on flush
        result = engine.aggregation.result
        if log is not None:
            for b, old_acc in removed:
                session = Session(key, b[0], b[1])
                entry = log.get(session)
                if entry is None:
                    log[session] = [old_acc, None]
                else:
                    entry[1] = None
            for start, end, acc, _, _, _, old_acc in added:
                session = Session(key, start, end)
                entry = log.get(session)
                if entry is None:
                    log[session] = [old_acc, acc]
                else:
                    entry[1] = acc
            return
        for b, old_acc in removed:
            out.append(make_emit(Session(key, b[0], b[1]), result(old_acc), retraction=True))
        for start, end, acc, *_ in added:
            out.append(make_emit(Session(key, start, end), result(acc)))
        engine.metrics.emitted += len(removed) + len(added)
        return
    heap = engine.close_heap
    for _, end, _, _, _, fresh, _ in added:
        if fresh:
            heapq.heappush(heap, end)
            if engine.record_close_times:
                engine.new_close_times.append(end)


def emit_log(engine: EngineHost, log: ChangeLog, out: list[Emit]) -> None:
    """Emit a batch's changes (appended to ``out``) as the write cache would flush them: in
    (end, key, start) order, an update per session changed, a retraction per session
    delivered before the batch and removed by it."""
    result = engine.aggregation.result
    emitted = 0
    for session in sorted(log, key=keyschema.session_order):
        before, now = log[session]
        if now is not None:
            out.append(make_emit(session, result(now)))
        elif before is not None:
            out.append(make_emit(session, result(before), retraction=True))
        else:
            continue
        emitted += 1
    engine.metrics.emitted += emitted
