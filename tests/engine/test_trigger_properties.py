"""Property tests with a trigger (issue 25, and issue 22's "no property test has a trigger"):
the trigger path merges through ``merge.merge_event``, which no other path uses, so its gap
convention (the ``+ 1`` of an exclusive gap in ``merge_bounds``) and its close-cursor floor are
checked here against the independent oracle, with both gap conventions, commits, aborts and
reopens, and batches split anywhere.

With ACCUMULATING panes, the last pane of every final session holds all its values; a window
that fired and was later merged away holds a part of one final session of its key."""

from __future__ import annotations

from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from sessionstore import (
    AccumulationMode,
    AfterCount,
    AfterWatermark,
    SessionAggregator,
    aggregations,
)
from tests.engine.test_engine_properties import Driver, reference
from tests.strategies import engine_configs, engine_steps

TRIGGERS = st.sampled_from([
    AfterWatermark(),
    AfterWatermark(early=AfterCount(2)),
    AfterWatermark(late=AfterCount(1)),
    AfterWatermark(early=AfterCount(1), late=AfterCount(2)),
])


class TriggerDriver(Driver):
    """The property suite's driver, on an engine with a trigger and accumulating panes."""

    def __init__(self, trigger: AfterWatermark, *args: Any, **kwargs: Any) -> None:
        self.trigger = trigger
        super().__init__(*args, **kwargs)

    def _engine(self) -> SessionAggregator:
        cfg = self.cfg
        return SessionAggregator(
            self.store, self.windows, aggregations.collect(), watermark=cfg["watermark"],
            max_out_of_orderness_ms=cfg["ooo"], cache_max_sessions=cfg["cache"],
            trigger=self.trigger, accumulation=AccumulationMode.ACCUMULATING)


@given(engine_configs(), engine_steps(), TRIGGERS, st.booleans(),
       st.lists(st.booleans(), min_size=1, max_size=8))
@example(  # exclusive gap: an event at a session's end starts a new session
    {"gap": 10, "grace": 0, "inclusive": False, "ooo": 0, "watermark": "event_time",
     "cache": 100_000, "segment": None, "extra_retention": 0},
    [("event", "a", 0, 0), ("event", "a", 1, 10)], AfterWatermark(), False, [True])
@example(  # exclusive gap: an event whose own window ends at a session's start stays apart
    {"gap": 10, "grace": 20, "inclusive": False, "ooo": 0, "watermark": "event_time",
     "cache": 100_000, "segment": None, "extra_retention": 0},
    [("event", "a", 0, 10), ("event", "a", 1, 0)], AfterWatermark(), False, [True])
@example(  # a session final at the close cursor takes no event, even one its gap reaches
    {"gap": 10, "grace": 5, "inclusive": True, "ooo": 0, "watermark": "event_time",
     "cache": 100_000, "segment": None, "extra_retention": 0},
    [("event", "a", 0, 0), ("event", "b", 1, 15), ("event", "a", 2, 6)], AfterWatermark(),
    False, [True])
def test_trigger_path_final_panes_are_the_oracle_sessions(cfg, steps, trigger, batched, cuts):
    cfg = {**cfg, "emit": None}
    driver = TriggerDriver(trigger, cfg, None, batched, cuts)
    out, effective = driver.run(steps)
    expected = reference(cfg, effective)
    last: dict[tuple[Any, int, int], list[Any]] = {}
    for e in out:
        assert e.pane is not None and not e.retraction
        last[(e.session.key, e.session.start, e.session.end)] = e.value
    for key, start, end, values in expected:
        assert last.get((key, start, end)) == values, (key, start, end)
    finals = {(k, s, e): v for k, s, e, v in expected}
    for (key, start, end), values in last.items():
        if (key, start, end) in finals:
            continue
        # a window merged away: inside one final session of its key, with a part of its values
        homes = [v for (k, s, e), v in finals.items() if k == key and s <= start and end <= e]
        assert len(homes) == 1 and all(v in homes[0] for v in values), (key, start, end)
