"""Property tests: the event path, the batch path (split at random points) and the independent
oracle (tests/oracle.py) agree, over configurations varied as hard as the input."""

from __future__ import annotations

import decimal
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from sessionstore import (
    Emit,
    EmitStrategy,
    InMemorySessionStore,
    SessionAggregator,
    SessionWindows,
    aggregations,
)
from sessionstore.engine import required_retention_ms
from sessionstore.timeutil import INT64_MAX
from sessionstore.types import Session
from tests import oracle
from tests.strategies import engine_configs, engine_steps

AGG = aggregations.combine({"n": aggregations.count(), "values": aggregations.collect()})


class Driver:
    """Plays steps on an engine, with commits, aborts and reopens, keeping what survives."""

    def __init__(self, cfg: dict[str, Any], emit: EmitStrategy, batched: bool,
                 cuts: list[bool], write_cache: bool = False, bad_row: int | None = None,
                 tabled: bool = False, aggregation: Any = AGG):
        self.tabled = tabled
        self.aggregation = aggregation
        self.cfg = cfg
        self.emit = emit
        self.batched = batched
        self.cuts = cuts
        self.write_cache = write_cache
        self.bad_row = bad_row
        self.dynamic = cfg.get("dynamic")  # None (fixed gap), "column" or "callable"
        if self.dynamic is None:
            self.windows = SessionWindows(cfg["gap"], cfg["grace"], cfg["inclusive"])
        else:  # each event carries its gap: ("event", key, value, t, gap)
            gap_of: dict[Any, Any] = {}  # the callable reads an event's gap by its value
            self.gap_of = gap_of
            self.windows = SessionWindows(
                None if self.dynamic == "column" else (lambda k, v, t: gap_of[v]),
                cfg["grace"], cfg["inclusive"], max_gap_ms=cfg["max_gap"])
        retention = required_retention_ms(self.windows, cfg["ooo"], cfg["watermark"])
        self.store = InMemorySessionStore(retention_ms=retention + cfg["extra_retention"],
                                          segment_interval_ms=cfg["segment"])
        self.engine = self._engine()
        self.refused = 0

    def _engine(self) -> SessionAggregator:
        cfg = self.cfg
        return SessionAggregator(
            self.store, self.windows, self.aggregation, emit=self.emit, watermark=cfg["watermark"],
            max_out_of_orderness_ms=cfg["ooo"], cache_max_sessions=cfg["cache"],
            write_cache=self.write_cache)

    def run(self, steps: list[tuple[Any, ...]]) -> tuple[list[Any], list[tuple[Any, ...]]]:
        """Returns (the emits that survive, the steps that took effect)."""
        kept_out: list[Any] = []
        out: list[Any] = []
        kept_steps: list[tuple[Any, ...]] = []
        effective: list[tuple[Any, ...]] = []
        pending: list[tuple[Any, Any, int, Any]] = []
        column = self.dynamic == "column"
        engine_events = 0

        def drain() -> None:
            if not pending:
                return
            keys, values, times, gaps = (list(c) for c in zip(*pending, strict=True))
            if self.bad_row is not None and self.bad_row < len(values):
                bad = list(values)
                bad[self.bad_row] = decimal.Decimal("1.5")
                before = self.engine.metrics["records-in"]
                with pytest.raises(TypeError, match=rf"values\[{self.bad_row}\]"):
                    self.engine.process_batch(keys, bad, times, gaps if column else None)
                assert self.engine.metrics["records-in"] == before  # nothing changed
                self.refused += 1
                self.bad_row = None
            if self.tabled:
                table = pa.table({"k": keys, "v": values, "t": pa.array(times, pa.int64()),
                                  "g": pa.array(gaps, pa.int64())})
                out.extend(table_emits(self.engine.process_table(
                    table, key="k", time="t", value="v", gap="g" if column else None)))
            else:
                out.extend(self.engine.process_batch(keys, values, times,
                                                     gaps if column else None))
            if self.write_cache:
                out.extend(self.engine.flush())
            pending.clear()

        for step in steps:
            kind = step[0]
            if kind == "event":
                key, value, t = step[1:4]
                gap = step[4] if len(step) > 4 else None
                if self.dynamic == "callable":
                    self.gap_of[value] = gap
                effective.append(step)
                if self.batched:
                    pending.append((key, value, t, gap))
                    if self.cuts[engine_events % len(self.cuts)]:
                        drain()
                else:
                    # process() requires gap_ms (None means "not given"): a null gap is
                    # passed as 0, which is dropped and counted the same way
                    out.extend(self.engine.process(key, value, t, 0 if gap is None else gap)
                               if column else self.engine.process(key, value, t))
                    if self.write_cache and self.cuts[engine_events % len(self.cuts)]:
                        out.extend(self.engine.flush())  # where the batched run cuts
                engine_events += 1
                continue
            drain()
            if self.write_cache:
                out.extend(self.engine.flush())
            if kind == "watermark":
                effective.append(step)
                out.extend(self.engine.advance_watermark(step[1]))
            elif kind == "commit":
                self.engine.commit({"steps": len(effective)})
                kept_out += out
                out = []
                kept_steps = list(effective)
            elif kind == "abort":
                self.engine.abort()
                out = []
                effective = list(kept_steps)
            elif kind == "reopen":
                self.store.abort()
                self.engine = self._engine()
                assert self.engine.committed_metadata in (None, {"steps": len(kept_steps)})
                out = []
                effective = list(kept_steps)
        drain()
        out.extend(self.engine.advance_watermark(INT64_MAX))
        out.extend(self.engine.flush())
        return kept_out + out, effective


def reference(cfg: dict[str, Any], steps: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    ooo = cfg["ooo"] if cfg["watermark"] == "event_time" else None
    gap = None if cfg.get("dynamic") else cfg["gap"]
    sessions, _ = oracle.sessionize(steps, gap, cfg["grace"], cfg["inclusive"], ooo)
    return sessions


def as_rows(emits: list[Any]) -> list[tuple[Any, ...]]:
    return sorted(((e.session.key, e.session.start, e.session.end, e.value["values"])
                   for e in emits), key=lambda r: (repr(r[0]), r[1], r[2]))


def applied(emits: list[Any]) -> dict[tuple[Any, int, int], Any]:
    """Apply an update/retraction changelog: each session's last value."""
    table: dict[tuple[Any, int, int], Any] = {}
    for e in emits:
        ident = (e.session.key, e.session.start, e.session.end)
        if e.retraction:
            assert table.pop(ident) == e.value  # retracts exactly what was delivered
        else:
            table[ident] = e.value
    return table


def changelog_table(emits: list[Any]) -> list[tuple[Any, ...]]:
    """Apply an update/retraction changelog; what is left must be the sessions."""
    table = applied(emits)
    return sorted(((k, s, end, v["values"]) for (k, s, end), v in table.items()),
                  key=lambda r: (repr(r[0]), r[1], r[2]))


cuts_strategy = st.lists(st.booleans(), min_size=1, max_size=8)



@given(engine_configs(), engine_steps(), cuts_strategy, st.none() | st.integers(0, 5))
def test_close_mode_event_path_batch_path_and_oracle_agree(cfg, steps, cuts, bad_row):
    emits, effective = Driver(cfg, EmitStrategy.ON_WINDOW_CLOSE, False, cuts).run(steps)
    assert as_rows(emits) == reference(cfg, effective)
    ends = [e.session.end for e in emits]
    assert len({e.session for e in emits}) == len(emits)  # each session once
    batched, effective_b = Driver(cfg, EmitStrategy.ON_WINDOW_CLOSE, True, cuts,
                                  bad_row=bad_row).run(steps)
    assert effective_b == effective
    assert batched == emits
    assert ends == sorted(ends) or any(s[0] in ("abort", "reopen") for s in steps)



@given(engine_configs(), engine_steps(), cuts_strategy)
@example(  # the cache used to forward sessions it forgot mid-batch ahead of earlier-ending ones
    {"gap": 1, "grace": 0, "inclusive": False, "ooo": 18, "watermark": "event_time",
     "cache": 0, "segment": 1, "extra_retention": 0},
    [("event", "a", 0, 0), ("event", "a", 1, 0), ("event", "a", 2, 0), ("event", "a", 3, -18),
     ("event", "a", 4, 62), ("event", "a", 5, 62)],
    [False])
@example(  # a watermark raised the expiry cap before the cache wrote a merge: no retraction
    {"gap": 16, "grace": 0, "inclusive": False, "ooo": 0, "watermark": "external",
     "cache": 0, "segment": 1, "extra_retention": 0},
    [("event", "a", 0, -16)] + [("event", "a", i, 0) for i in range(1, 30)]
    + [("event", "a", 30, -31)],
    [False, True])
def test_update_mode_changelogs_rebuild_the_oracle_sessions(cfg, steps, cuts):
    plain, effective = Driver(cfg, EmitStrategy.ON_WINDOW_UPDATE, False, cuts).run(steps)
    want = reference(cfg, effective)
    assert changelog_table(plain) == want
    small_cache, _ = Driver(cfg, EmitStrategy.ON_WINDOW_UPDATE, False, cuts,
                            write_cache=True).run(steps)
    assert changelog_table(small_cache) == want  # evictions forward early, correctly
    cached, _ = Driver({**cfg, "cache": 100_000}, EmitStrategy.ON_WINDOW_UPDATE, False, cuts,
                       write_cache=True).run(steps)
    assert changelog_table(cached) == want
    batched, _ = Driver(cfg, EmitStrategy.ON_WINDOW_UPDATE, True, cuts).run(steps)
    # the batch path is the event path with its (unbounded) write cache flushed per batch
    assert batched == cached


def table_emits(table: pa.Table) -> list[Emit]:
    """process_table's rows as the Emits process_batch returns, to compare the two."""
    labels = [c for c in table.column_names
              if c not in ("k", "session_start_ms", "session_end_ms", "retracted")]
    out = []
    for row in table.to_pylist():
        value = {label: row[label] for label in labels}
        out.append(Emit(Session(row["k"], row["session_start_ms"], row["session_end_ms"]),
                        value, None, row.get("retracted", False), row["session_end_ms"] - 1))
    return out


AGG_ALL = aggregations.combine({
    "n": aggregations.count(), "values": aggregations.collect(), "sum": aggregations.sum_of(),
    "min": aggregations.min_of(), "max": aggregations.max_of(),
    "first": aggregations.first_of(), "last": aggregations.last_of(),
})


def string_keys(steps: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """An Arrow key column holds one type: the same steps with every key as a str."""
    return [(s[0], str(s[1]), *s[2:]) if s[0] == "event" else s for s in steps]


def check_table_path(cfg: dict[str, Any], steps: list[tuple[Any, ...]], cuts: Any,
                     emit: EmitStrategy, driver: type[Driver] | None = None,
                     ref: Callable[..., list[tuple[Any, ...]]] | None = None) -> None:
    """``process_table`` = ``process_batch`` (same cuts) = the oracle ``ref``, with every
    built-in aggregation checked against the oracle's values; on close also = the event path."""
    driver = driver or Driver
    ref = ref or reference
    steps = string_keys(steps)
    tabled, effective = driver(cfg, emit, True, cuts, tabled=True,
                               aggregation=AGG_ALL).run(steps)
    batched, _ = driver(cfg, emit, True, cuts, aggregation=AGG_ALL).run(steps)
    assert tabled == batched
    want = ref(cfg, effective)
    rows = as_rows(tabled) if emit is EmitStrategy.ON_WINDOW_CLOSE else changelog_table(tabled)
    assert rows == want
    if emit is EmitStrategy.ON_WINDOW_CLOSE:
        plain, _ = driver(cfg, emit, False, cuts, aggregation=AGG_ALL).run(steps)
        assert tabled == plain
    # every built-in agrees with the oracle's values, which share no code with them
    check_builtins({(e.session.key, e.session.start, e.session.end): e.value for e in tabled
                    if not e.retraction}, want)


def check_builtins(final: dict[tuple[Any, int, int], Any], want: list[tuple[Any, ...]]) -> None:
    """Each oracle session's count, sum, min, max, first and last, as the engine gave them."""
    for key, start, end, values in want:
        got = final[(key, start, end)]
        assert got["n"] == len(values)
        assert got["sum"] == sum(values)
        assert (got["min"], got["max"]) == (min(values), max(values))
        assert (got["first"], got["last"]) == (values[0], values[-1])


@given(engine_configs(), engine_steps(), cuts_strategy, st.sampled_from(list(EmitStrategy)))
def test_process_table_equals_process_batch_event_path_and_oracle(cfg, steps, cuts, emit):
    check_table_path(cfg, steps, cuts, emit)


AGG_REDUCE = aggregations.combine({
    "n": aggregations.count(), "values": aggregations.collect(),
    "total": aggregations.reduce(lambda acc, value: acc + value),
})


@given(engine_configs(), engine_steps(), cuts_strategy, st.sampled_from(list(EmitStrategy)),
       st.booleans())
@example(  # an event late by exactly its own end: dropped on every path (<= in the late rule)
    {"gap": 10, "grace": 0, "inclusive": True, "ooo": 0, "watermark": "external",
     "cache": 100_000, "segment": None, "extra_retention": 0},
    [("event", "a", 0, 0), ("watermark", 10), ("event", "a", 1, 0), ("event", "a", 2, 1)],
    [False], EmitStrategy.ON_WINDOW_CLOSE, False)
def test_a_reduce_aggregation_on_the_batch_paths_equals_the_oracle(cfg, steps, cuts, emit,
                                                                  tabled):
    """A ``reduce`` is no built-in column: the batch paths take the exact path (planned by
    the same planner), whose lateness and merge rules are checked here against the oracle,
    both gap conventions included; in close mode also against the event path."""
    steps = string_keys(steps)
    got, effective = Driver(cfg, emit, True, cuts, tabled=tabled,
                            aggregation=AGG_REDUCE).run(steps)
    want = reference(cfg, effective)
    rows = as_rows(got) if emit is EmitStrategy.ON_WINDOW_CLOSE else changelog_table(got)
    assert rows == want
    for e in got:
        if not e.retraction:
            assert e.value["total"] == sum(e.value["values"])
            assert e.value["n"] == len(e.value["values"])
    if emit is EmitStrategy.ON_WINDOW_CLOSE:
        plain, _ = Driver(cfg, emit, False, cuts, aggregation=AGG_REDUCE).run(steps)
        assert got == plain


AGG_SLOTS = aggregations.combine({
    "n": aggregations.count(), "sum": aggregations.sum_of(), "min": aggregations.min_of(),
    "max": aggregations.max_of(), "first": aggregations.first_of(),
    "last": aggregations.last_of(),
})


@given(engine_configs(), engine_steps(), cuts_strategy, st.sampled_from(list(EmitStrategy)))
@example(  # a session ending exactly at the close cursor closes then, before the commit
    {"gap": 10, "grace": 0, "inclusive": True, "ooo": 0, "watermark": "external",
     "cache": 100_000, "segment": None, "extra_retention": 0},
    [("event", "a", 0, 0), ("watermark", 10), ("commit",), ("reopen",), ("event", "b", 1, 20)],
    [True], EmitStrategy.ON_WINDOW_CLOSE)
def test_the_slotted_open_table_equals_the_oracle(cfg, steps, cuts, emit):
    """Built-in aggregations without ``collect`` keep the engine's open sessions in the
    persistent slotted table (engine/open_sessions.py): process_table and process_batch, with
    commits, aborts, reopens and batch splits, against the oracle's sessions and values, and
    in close mode equal to the event path."""
    steps = string_keys(steps)
    tabled, effective = Driver(cfg, emit, True, cuts, tabled=True,
                               aggregation=AGG_SLOTS).run(steps)
    batched, _ = Driver(cfg, emit, True, cuts, aggregation=AGG_SLOTS).run(steps)
    assert tabled == batched
    want = reference(cfg, effective)
    if emit is EmitStrategy.ON_WINDOW_CLOSE:  # each session emitted once
        assert len({e.session for e in tabled}) == len(tabled)
    got = applied(tabled)
    assert sorted(got, key=lambda r: (repr(r[0]), r[1], r[2])) == [w[:3] for w in want]
    check_builtins(got, want)
    if emit is EmitStrategy.ON_WINDOW_CLOSE:
        plain, _ = Driver(cfg, emit, False, cuts, aggregation=AGG_SLOTS).run(steps)
        assert tabled == plain


# -- dynamic gaps (issue 12): each event brings its own gap -----------------------------------


@st.composite
def dynamic_configs(draw: st.DrawFn) -> dict[str, Any]:
    """engine_configs, with the gap given per event (as a column/argument or by a callable)
    and bounded by max_gap (which then sizes retention and the tiny segments)."""
    cfg = draw(engine_configs())
    max_gap = draw(st.integers(1, 25))
    return {**cfg, "dynamic": draw(st.sampled_from(["column", "callable"])),
            "max_gap": max_gap, "segment": draw(st.sampled_from([1, 2, max_gap, None]))}


@st.composite
def dynamic_steps(draw: st.DrawFn, max_gap: int) -> list[tuple[Any, ...]]:
    """engine_steps with a gap drawn per event: mostly in 1..max_gap (max_gap itself often),
    sometimes None, 0 or negative (those events are dropped, as Spark filters them)."""
    gaps = st.one_of(st.integers(1, max_gap), st.just(max_gap), st.just(1),
                     st.sampled_from([None, 0, -1, -7]))
    return [(*s, draw(gaps)) if s[0] == "event" else s for s in draw(engine_steps())]


@st.composite
def dynamic_cases(draw: st.DrawFn) -> tuple[dict[str, Any], list[tuple[Any, ...]]]:
    cfg = draw(dynamic_configs())
    return cfg, draw(dynamic_steps(cfg["max_gap"]))


@given(dynamic_cases(), cuts_strategy, st.none() | st.integers(0, 5))
@example(  # a long gap bridges two short ones: the session ends at the largest t + gap
    ({"gap": 1, "grace": 0, "inclusive": True, "ooo": 0, "watermark": "external", "cache": 0,
      "segment": 1, "extra_retention": 0, "dynamic": "column", "max_gap": 20},
     [("event", "a", 0, 0, 20), ("event", "a", 1, 5, 1), ("event", "a", 2, 20, 3),
      ("event", "a", 3, 2, 0), ("event", "a", 4, 24, None), ("event", "a", 5, 23, 2)]),
    [True], None)
@example(  # lateness on the boundary, by each event's own end, inside one batch
    ({"gap": 1, "grace": 0, "inclusive": True, "ooo": 0, "watermark": "event_time", "cache": 0,
      "segment": 1, "extra_retention": 0, "dynamic": "callable", "max_gap": 20},
     [("event", "a", 0, 10, 5), ("event", "a", 1, 5, 5), ("event", "a", 2, 6, 5),
      ("event", "b", 3, -9, 19), ("event", "b", 4, -10, 20)]),
    [False], None)
def test_dynamic_gap_close_mode_event_path_batch_path_and_oracle_agree(case, cuts, bad_row):
    cfg, steps = case
    emits, effective = Driver(cfg, EmitStrategy.ON_WINDOW_CLOSE, False, cuts).run(steps)
    assert as_rows(emits) == reference(cfg, effective)
    assert len({e.session for e in emits}) == len(emits)  # each session once
    batched, effective_b = Driver(cfg, EmitStrategy.ON_WINDOW_CLOSE, True, cuts,
                                  bad_row=bad_row).run(steps)
    assert effective_b == effective
    assert batched == emits


@given(dynamic_cases(), cuts_strategy)
@example(  # lateness on the boundary, by each event's own end, inside one batch
    ({"gap": 1, "grace": 0, "inclusive": True, "ooo": 0, "watermark": "event_time", "cache": 0,
      "segment": 1, "extra_retention": 0, "dynamic": "column", "max_gap": 20},
     [("event", "a", 0, 10, 5), ("event", "a", 1, 5, 5), ("event", "a", 2, 6, 5),
      ("event", "b", 3, -9, 19), ("event", "b", 4, -10, 20)]),
    [False])
def test_dynamic_gap_update_mode_changelogs_rebuild_the_oracle_sessions(case, cuts):
    cfg, steps = case
    plain, effective = Driver(cfg, EmitStrategy.ON_WINDOW_UPDATE, False, cuts).run(steps)
    want = reference(cfg, effective)
    assert changelog_table(plain) == want
    cached, _ = Driver({**cfg, "cache": 100_000}, EmitStrategy.ON_WINDOW_UPDATE, False, cuts,
                       write_cache=True).run(steps)
    batched, _ = Driver(cfg, EmitStrategy.ON_WINDOW_UPDATE, True, cuts).run(steps)
    assert batched == cached
    assert changelog_table(cached) == want
    # with a write cache the batch takes the exact (non-columnar) path
    exact, _ = Driver(cfg, EmitStrategy.ON_WINDOW_UPDATE, True, cuts, write_cache=True).run(steps)
    assert changelog_table(exact) == want


@given(dynamic_cases(), cuts_strategy, st.sampled_from(list(EmitStrategy)))
def test_dynamic_gap_process_table_equals_process_batch_and_oracle(case, cuts, emit):
    cfg, steps = case
    check_table_path(cfg, steps, cuts, emit)


@given(dynamic_cases(), cuts_strategy, st.booleans())
def test_dynamic_gap_drops_are_counted_as_the_oracle_drops(case, cuts, tabled):
    cfg, steps = case
    steps = string_keys([s for s in steps if s[0] in ("event", "watermark")])
    ooo = cfg["ooo"] if cfg["watermark"] == "event_time" else None
    invalid: list[Any] = []
    _, late = oracle.sessionize(steps, None, cfg["grace"], cfg["inclusive"], ooo, invalid)
    for batched in (False, True):
        driver = Driver(cfg, EmitStrategy.ON_WINDOW_CLOSE, batched, cuts,
                        tabled=tabled and batched)
        driver.run(steps)
        metrics = driver.engine.metrics
        assert metrics["records-in"] == sum(1 for s in steps if s[0] == "event")
        assert metrics["dropped-invalid-gap-records"] == len(invalid)
        assert metrics["dropped-records"] == len(invalid) + len(late)


@given(dynamic_cases(), st.integers(0, 39), st.sampled_from(["event", "batch", "table"]))
def test_a_gap_above_max_gap_is_refused_and_changes_nothing(case, row, path):
    cfg, steps = case
    cfg = {**cfg, "dynamic": "column"}
    events = [(str(s[1]), s[2], s[3], 0 if s[4] is None else s[4])
              for s in steps if s[0] == "event"]
    if not events:
        return
    row %= len(events)
    too_big = cfg["max_gap"] + 1 + row
    keys, values, times, gaps = (list(c) for c in zip(*events, strict=True))
    gaps[row] = too_big

    def play(refuse: bool) -> tuple[list[Emit], tuple[float, float, float]]:
        """Events before ``row``, the refused call (or none), the events from ``row`` on."""
        engine = Driver(cfg, EmitStrategy.ON_WINDOW_UPDATE, False, [True]).engine
        out = []
        for event in events[:row]:
            out += engine.process(*event)
        if refuse:
            with pytest.raises(ValueError, match=rf"\[{row}\] = {too_big} exceeds max_gap_ms = "
                               rf"{cfg['max_gap']}" if path != "event" else
                               rf"gap_ms = {too_big} exceeds max_gap_ms = {cfg['max_gap']}"):
                if path == "event":
                    engine.process(keys[row], values[row], times[row], too_big)
                elif path == "batch":
                    engine.process_batch(keys, values, times, gaps)
                else:
                    table = pa.table({"k": keys, "v": values, "t": pa.array(times, pa.int64()),
                                      "g": pa.array(gaps, pa.int64())})
                    engine.process_table(table, key="k", time="t", value="v", gap="g")
        for event in events[row:]:
            out += engine.process(*event)
        out += engine.advance_watermark(INT64_MAX)
        m = engine.metrics
        return out, (m["records-in"], m["dropped-records"], m["dropped-invalid-gap-records"])

    assert play(True) == play(False)
