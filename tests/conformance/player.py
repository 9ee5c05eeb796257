"""Plays conformance transcripts (YAML) against an engine implementation.

A transcript is data: window options, steps (events, watermark and processing-time advances,
commit-and-reopen) and the emissions expected, in order. Every implementation that can run the
steps must produce exactly the expected emissions; the Spark adapter's runner joins later.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from sessionstore import (
    AccumulationMode,
    AfterCount,
    AfterProcessingTime,
    AfterWatermark,
    EmitStrategy,
    ManualClock,
    SessionAggregator,
    SessionWindows,
    aggregations,
)
from sessionstore.timeutil import INT64_MAX

HERE = Path(__file__).parent
_CLOCK = re.compile(r"^(\d+):(\d\d):(\d\d)(?:\.(\d{3}))?$")


def to_ms(value: Any) -> int:
    """``"00:13:10"`` -> 790000; ``"inf"`` -> INT64_MAX; ints pass through."""
    if isinstance(value, int):
        return value
    if value == "inf":
        return INT64_MAX
    match = _CLOCK.match(str(value))
    if not match:
        raise ValueError(f"bad transcript time {value!r}")
    h, m, s, ms = match.groups()
    return ((int(h) * 60 + int(m)) * 60 + int(s)) * 1000 + int(ms or 0)


def load(name: str) -> list[dict[str, Any]]:
    """The scenarios of one transcript file, with the file's defaults applied."""
    doc = yaml.safe_load((HERE / name).read_text())
    defaults = doc.get("defaults", {})
    return [{**defaults, **scenario} for scenario in doc["scenarios"]]


def _sub_trigger(spec: dict[str, Any] | None) -> Any:
    if spec is None:
        return None
    if "processing_time" in spec:
        return AfterProcessingTime(spec["processing_time"])
    return AfterCount(spec["count"])


def engine_options(scenario: dict[str, Any]) -> dict[str, Any]:
    """Keyword arguments of SessionAggregator for a scenario (without store and clock)."""
    w = scenario["windows"]
    gap: Any = w["gap"]
    if "gap_by_value" in w:  # a gap callable of the event's value (Spark's CASE WHEN, a UDF)
        by_value = w["gap_by_value"]
        gap = lambda key, value, t: by_value.get(value, by_value.get("default"))  # noqa: E731
    extra = {} if "max_gap" not in w else {"max_gap_ms": w["max_gap"]}
    if "max_duration" in w:
        extra["max_duration_ms"] = w["max_duration"]
    windows = SessionWindows(gap, w.get("grace", 0), w["inclusive_gap"], **extra)
    agg = {"collect": aggregations.collect, "count": aggregations.count}[scenario["aggregation"]]()
    options: dict[str, Any] = {
        "windows": windows,
        "aggregation": agg,
        "watermark": scenario.get("watermark", "external"),
    }
    emit = scenario.get("emit", "close")
    if emit == "trigger":
        spec = scenario.get("trigger", {})
        options["trigger"] = AfterWatermark(
            early=_sub_trigger(spec.get("early")), late=_sub_trigger(spec.get("late"))
        )
        options["accumulation"] = AccumulationMode[
            scenario.get("accumulation", "discarding").upper()
        ]
    else:
        options["emit"] = {
            "close": EmitStrategy.ON_WINDOW_CLOSE,
            "update": EmitStrategy.ON_WINDOW_UPDATE,
        }[emit]
    return options


def expected(scenario: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for item in scenario["expect"]:
        row = {
            "key": item["key"],
            "start": to_ms(item["start"]),
            "end": to_ms(item["end"]),
            "value": item["value"],
            "retraction": item.get("retraction", False),
        }
        if "timing" in item:
            row["pane"] = (item["timing"], item.get("index"), item.get("is_first"),
                           item.get("is_last"))
        out.append(row)
    return out


def describe(emits: list[Any], with_pane: bool) -> list[dict[str, Any]]:
    """Emits as comparable dicts; checks the ``end - 1`` timestamp on the way."""
    out = []
    for e in emits:
        assert e.timestamp == e.session.end - 1
        row = {
            "key": e.session.key,
            "start": e.session.start,
            "end": e.session.end,
            "value": e.value,
            "retraction": e.retraction,
        }
        if with_pane:
            row["pane"] = (e.pane.timing.value, e.pane.index, e.pane.is_first, e.pane.is_last)
        out.append(row)
    return out


def fill_pane_wildcards(actual: list[dict[str, Any]], want: list[dict[str, Any]]) -> None:
    """A transcript may leave index / is_first / is_last out; compare only what it states."""
    for a, w in zip(actual, want, strict=False):
        if "pane" in w and "pane" in a:
            w["pane"] = tuple(a_i if w_i is None else w_i for a_i, w_i in zip(a["pane"], w["pane"],
                                                                              strict=True))


class EngineHarness:
    """Runs a scenario's steps on SessionAggregator over a store made by ``open_store``.

    ``open_store(reopen: bool)`` returns a store; with ``reopen=True`` it must return the same
    state as last committed (closing the previous handle first).
    """

    def __init__(self, scenario: dict[str, Any], open_store: Callable[[bool], Any],
                 batched: bool, write_cache: bool = False) -> None:
        self.scenario = scenario
        self.open_store = open_store
        self.batched = batched
        self.write_cache = write_cache
        self.options = engine_options(scenario)
        if write_cache:
            self.options["write_cache"] = True
        self.clock = ManualClock(0)
        self.dropped = 0
        self.engine = self._engine(open_store(False))

    def _engine(self, store: Any) -> SessionAggregator:
        return SessionAggregator(store, clock=self.clock, on_late=self._late, **self.options)

    def _late(self, key: Any, value: Any, t: int) -> None:
        self.dropped += 1

    def run(self) -> list[Any]:
        out: list[Any] = []
        pending: list[tuple[Any, Any, int, Any]] = []

        def drain() -> None:
            if pending:
                keys, values, times, gaps = zip(*pending, strict=True)
                # events with their own gap (a fourth item) give the batch a gap column
                gap_column = list(gaps) if len(self.scenario["steps"][0].get("event", ())) > 3 \
                    else None
                out.extend(self.engine.process_batch(list(keys), list(values), list(times),
                                                     gap_column))
                pending.clear()

        for step in self.scenario["steps"]:
            if "event" in step:
                key, value, t, *own_gap = step["event"]
                gap = own_gap[0] if own_gap else None
                if self.batched:
                    pending.append((key, value, to_ms(t), gap))
                elif own_gap:
                    out.extend(self.engine.process(key, value, to_ms(t), gap))
                else:
                    out.extend(self.engine.process(key, value, to_ms(t)))
                continue
            drain()
            if self.write_cache:  # where the batched run's batch ends
                out.extend(self.engine.flush())
            if "watermark" in step:
                out.extend(self.engine.advance_watermark(to_ms(step["watermark"])))
            elif "processing_time" in step:
                out.extend(self.engine.advance_processing_time(to_ms(step["processing_time"])))
            elif step.get("commit_and_reopen"):
                out.extend(self.engine.flush())
                self.engine.commit()
                self.engine = self._engine(self.open_store(True))
            elif step.get("reopen_without_commit"):
                self.engine = self._engine(self.open_store(True))
            else:
                raise ValueError(f"unknown step {step}")
        drain()
        out.extend(self.engine.flush())
        return out
