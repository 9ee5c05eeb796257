"""The engine on a RocksDB store that is committed, closed, reopened and rolled back at random,
against an oracle written here.

A hypothesis state machine drives one :class:`SessionAggregator` on a ``SessionStore`` in a
temporary directory: events one at a time and in batches, with disorder well beyond the grace
period (so some are late and dropped), watermark advances, commits, aborts, a close and reopen of
the store after a commit, and a close and reopen without one (a crash: everything since the last
commit is lost, output included). The configuration is drawn as hard as the input: a write-back
cache of 0, 1 or 2 sessions (or a large one), segment intervals down to 1 ms, the minimum
retention the engine accepts, both watermark modes and both gap conventions, both emit
strategies (updates delivered at once or through the write cache), a fixed gap or a gap per
event, and whether ``process_table`` joins ``process`` and ``process_batch`` on one engine.
Two runs in three take the in-memory store instead (its reopen is a rollback to the last commit):
a RocksDB commit or open costs tens of milliseconds of disk waits.

After every step the engine must agree with the oracle:

* ``ON_WINDOW_CLOSE``: the sessions emitted so far (those a crash did not take back) are exactly
  the oracle's closed sessions (``end + grace <= W``), each once, in end order;
* ``ON_WINDOW_UPDATE``: applying the delivered changelog (updates and retractions, each
  retraction carrying exactly the value delivered before) gives exactly the oracle's sessions;
* the late events handed to ``on_late`` are the oracle's dropped events, the watermark is the
  oracle's, and an interactive query of a key shows each of its open sessions with its value.

The oracle shares no code with the package: per key a list of sessions, each with its events;
the rules of the design's section 2 written out directly.
"""

from __future__ import annotations

import copy
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from sessionstore import (
    Emit,
    EmitStrategy,
    InMemorySessionStore,
    SessionAggregator,
    SessionStore,
    SessionWindows,
    aggregations,
)
from sessionstore.types import Session

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
KEYS = st.sampled_from(["a", "aa", b"a", 0, -1, ("a", 1)])


def ident(key: Any) -> Any:
    """A key as the engine hands it back (a tuple key may come back as a list)."""
    return tuple(key) if isinstance(key, list) else key


class Oracle:
    """Sessions by the rules of the design, step by step.

    A session is ``[start, end, events]`` with events ``(t, seq, t + gap)``; ``seq`` is the
    event's value, unique, so that a collected session names its events in (time, arrival)
    order. With ``max_duration``, the events of a key's open sessions are cut again at every
    event, from scratch, by the offline rule (:meth:`cut`).
    """

    def __init__(self, gap: int, grace: int, inclusive: bool, event_time: bool,
                 ooo: int, max_duration: int | None = None) -> None:
        self.gap, self.grace, self.inclusive = gap, grace, inclusive
        self.max_duration = max_duration
        self.event_time, self.ooo = event_time, ooo
        self.w: int | None = None  # None: no progress yet
        self.sessions: dict[Any, list[list[Any]]] = {}
        self.dropped: list[int] = []

    def closed(self, end: int) -> bool:
        return self.w is not None and end + self.grace <= self.w

    def event(self, key: Any, seq: int, t: int, gap: int | None = None) -> None:
        """An event with the fixed gap, or its own ``gap`` (its window is ``[t, t + gap)``)."""
        gap = self.gap if gap is None else gap
        alone = gap if self.max_duration is None else min(gap, self.max_duration)
        if self.w is not None and self.w >= t + alone + self.grace:
            self.dropped.append(seq)
            return
        if self.max_duration is not None:
            mine = self.sessions.get(key, [])
            pending = [e for s in mine if not self.closed(s[1]) for e in s[2]]
            self.sessions[key] = ([s for s in mine if self.closed(s[1])]
                                  + self.cut([*pending, (t, seq, t + gap)]))
            if self.event_time:
                self.advance(t - self.ooo)
            return
        lo, hi = t, t + gap
        events = [(t, seq, t + gap)]
        keep = []
        for s in self.sessions.get(key, []):
            reach = ((s[1] >= t and s[0] <= t + gap) if self.inclusive
                     else (s[1] > t and s[0] < t + gap))
            if reach and not self.closed(s[1]):
                lo, hi = min(lo, s[0]), max(hi, s[1])
                events += s[2]
            else:
                keep.append(s)
        keep.append([lo, hi, sorted(events)])
        self.sessions[key] = keep
        if self.event_time:
            self.advance(t - self.ooo)

    def cut(self, events: list[tuple[int, int, int]]) -> list[list[Any]]:
        """The offline rule: in (time, arrival) order, an event joins the session before it
        while it is gap-connected to the largest ``t + gap`` so far and before its start +
        max_duration; a session ends at ``min(largest t + gap, start + max_duration)``."""
        assert self.max_duration is not None
        out: list[list[Any]] = []
        for e in sorted(events):
            if out:
                start, reach, members = out[-1]
                near = e[0] <= reach if self.inclusive else e[0] < reach
                if near and e[0] < start + self.max_duration:
                    out[-1] = [start, max(reach, e[2]), [*members, e]]
                    continue
            out.append([e[0], e[2], [e]])
        return [[start, min(reach, start + self.max_duration), members]
                for start, reach, members in out]

    def advance(self, w: int) -> None:
        self.w = w if self.w is None else max(self.w, w)

    def rows(self, closed_only: bool) -> list[tuple[Any, int, int, list[int]]]:
        return sorted(((k, s[0], s[1], [e[1] for e in s[2]])
                       for k, mine in self.sessions.items() for s in mine
                       if not closed_only or self.closed(s[1])), key=repr)


class EngineOnRocksDB(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="attack35-"))
        self.seq = 0
        self.base = 0

    @initialize(gap=st.integers(1, 20), grace=st.integers(0, 15), inclusive=st.booleans(),
                event_time=st.booleans(), ooo=st.integers(0, 25),
                cache=st.sampled_from([0, 1, 2, 100_000]),
                segment=st.sampled_from([1, 2, 3, "gap", None]),
                extra_retention=st.sampled_from([0, 0, 1, 7]),
                update=st.booleans(), rocksdb=st.sampled_from([True, False, False]),
                tables=st.sampled_from([True, True, False]),
                dynamic=st.booleans(), write_cache=st.booleans(),
                max_duration=st.sampled_from([None, None, None, None, 1, 3, 8, 25]))
    def configure(self, gap: int, grace: int, inclusive: bool, event_time: bool, ooo: int,
                  cache: int, segment: Any, extra_retention: int, update: bool,
                  rocksdb: bool, tables: bool, dynamic: bool, write_cache: bool,
                  max_duration: int | None) -> None:
        # dynamic: each event brings its own gap, 1 to ``gap`` (then the largest, max_gap_ms)
        self.dynamic = dynamic
        capped = {} if max_duration is None else {"max_duration_ms": max_duration}
        self.windows = (SessionWindows(None, grace, inclusive, max_gap_ms=gap, **capped)
                        if dynamic else SessionWindows(gap, grace, inclusive, **capped))
        self.max_gap = gap
        self.event_time = event_time
        self.ooo = ooo if event_time else 0
        self.cache = cache
        # the minimum the engine accepts: gap + grace (+ out-of-orderness with event time,
        # + max_duration)
        self.retention = gap + grace + self.ooo + (max_duration or 0) + extra_retention
        self.segment = gap if segment == "gap" else segment
        self.update = update
        # with the write cache, updates are delivered by flush(), here after every step
        self.write_cache = update and write_cache
        self.rocksdb = rocksdb
        # process_table's output has one key type (its key column's): a run that uses it
        # keeps to string keys
        self.tables = tables
        self.oracle = Oracle(gap, grace, inclusive, event_time, self.ooo, max_duration)
        self.late: list[int] = []
        self.emitted: list[tuple[Any, int, int, list[int]]] = []  # close mode: in order
        self.table: dict[tuple[Any, int, int], list[int]] = {}  # update mode: the changelog
        self.store = self._open_store()
        self.engine = self._engine()
        self._remember()

    # -- plumbing ---------------------------------------------------------------------------

    def _open_store(self) -> Any:
        extra = {} if self.segment is None else {"segment_interval_ms": self.segment}
        if self.rocksdb:
            return SessionStore(self.dir / "state", retention_ms=self.retention, **extra)
        return InMemorySessionStore(retention_ms=self.retention, **extra)

    def _reopen_store(self) -> Any:
        """The store as a new process finds it: RocksDB closed and opened from disk; the
        in-memory store (which a close would empty) rolled back to its last commit."""
        if not self.rocksdb:
            self.store.abort()
            return self.store
        self.store.close()  # without a commit, nothing since the last one survives
        return self._open_store()

    def _engine(self) -> SessionAggregator:
        self.late_calls = 0
        return SessionAggregator(
            self.store, self.windows, aggregations.collect(),
            emit=EmitStrategy.ON_WINDOW_UPDATE if self.update else EmitStrategy.ON_WINDOW_CLOSE,
            watermark="event_time" if self.event_time else "external",
            max_out_of_orderness_ms=self.ooo, cache_max_sessions=self.cache,
            write_cache=self.write_cache,
            on_late=self._on_late)

    def _on_late(self, key: Any, value: Any, t: int) -> None:
        self.late.append(value)
        self.late_calls += 1  # this engine's, not rolled back: its dropped-records metric

    def _remember(self) -> None:
        """What a commit makes durable: the oracle's state and the output delivered so far."""
        self.committed = (copy.deepcopy(self.oracle.sessions), self.oracle.w,
                          list(self.oracle.dropped), list(self.late), list(self.emitted),
                          dict(self.table))

    def _roll_back(self) -> None:
        sessions, w, dropped, late, emitted, table = copy.deepcopy(self.committed)
        self.oracle.sessions, self.oracle.w, self.oracle.dropped = sessions, w, dropped
        self.late, self.emitted, self.table = late, emitted, table

    def _deliver(self, emits: list[Any]) -> None:
        for e in emits:
            row = (ident(e.session.key), e.session.start, e.session.end)
            assert e.timestamp == e.session.end - 1
            if not self.update:
                assert not e.retraction
                self.emitted.append((*row, e.value))
            elif e.retraction:
                assert self.table.pop(row) == e.value, f"retracted {row} {e.value}"
            else:
                self.table[row] = e.value

    def _time(self, jitter: int) -> int:
        return self.base + jitter

    def _key(self, key: Any) -> Any:
        return str(key) if self.tables else key

    def _gap(self, own: int) -> int | None:
        return min(own, self.max_gap) if self.dynamic else None

    def _flushed(self) -> None:
        if self.write_cache:
            self._deliver(self.engine.flush())

    # -- rules ------------------------------------------------------------------------------

    @rule(key=KEYS, step=st.integers(0, 12),
          jitter=st.sampled_from([0, 0, -1, -3, -9, -17, -30, -60]), own=st.integers(1, 20))
    def event(self, key: Any, step: int, jitter: int, own: int) -> None:
        self.base += step
        t = self._time(jitter)
        self.seq += 1
        key, gap = self._key(key), self._gap(own)
        self.oracle.event(key, self.seq, t, gap)
        self._deliver(self.engine.process(key, self.seq, t) if gap is None
                      else self.engine.process(key, self.seq, t, gap))
        self._flushed()

    @rule(events=st.lists(st.tuples(KEYS, st.integers(0, 12),
                                    st.sampled_from([0, 0, -2, -11, -25, -70]),
                                    st.integers(1, 20)),
                          min_size=1, max_size=12))
    def batch(self, events: list[tuple[Any, int, int, int]]) -> None:
        keys, values, times, gaps = [], [], [], []
        for key, step, jitter, own in events:
            self.base += step
            t = self._time(jitter)
            self.seq += 1
            key, gap = self._key(key), self._gap(own)
            self.oracle.event(key, self.seq, t, gap)
            keys.append(key)
            values.append(self.seq)
            times.append(t)
            gaps.append(gap)
        self._deliver(self.engine.process_batch(keys, values, times,
                                                gaps if self.dynamic else None))
        self._flushed()

    @precondition(lambda self: getattr(self, "tables", False))
    @rule(events=st.lists(st.tuples(st.sampled_from(["a", "aa", "b"]), st.integers(0, 12),
                                    st.sampled_from([0, 0, -4, -13, -40]), st.integers(1, 20)),
                          min_size=1, max_size=12))
    def table(self, events: list[tuple[str, int, int, int]]) -> None:
        """The same as ``batch``, as an Arrow table (one key type per column: strings)."""
        keys, values, times, gaps = [], [], [], []
        for key, step, jitter, own in events:
            self.base += step
            t = self._time(jitter)
            self.seq += 1
            gap = self._gap(own)
            self.oracle.event(key, self.seq, t, gap)
            keys.append(key)
            values.append(self.seq)
            times.append(t)
            gaps.append(gap)
        out = self.engine.process_table(
            pa.table({"k": keys, "t": pa.array(times, pa.int64()),
                      "v": pa.array(values, pa.int64()), "g": pa.array(gaps, pa.int64())}),
            key="k", time="t", value="v", gap="g" if self.dynamic else None)
        self._deliver([Emit(Session(row["k"], row["session_start_ms"], row["session_end_ms"]),
                            row["collect"], None, bool(row.get("retracted", False)),
                            row["session_end_ms"] - 1)
                       for row in out.to_pylist()])
        self._flushed()

    @rule(ahead=st.sampled_from([*range(-20, 41), "end"]))
    def watermark(self, ahead: Any) -> None:
        # "end": the watermark at the int64 maximum closes everything (and makes every later
        # event late)
        w = INT64_MAX if ahead == "end" else self.base + ahead
        self.oracle.advance(w)
        self._deliver(self.engine.advance_watermark(w))
        self._flushed()

    # one rule for the four: each costs a RocksDB commit or open, so they come a sixth of
    # the steps rather than half
    @rule(action=st.sampled_from(["commit", "abort", "commit_close_reopen", "crash_reopen"]))
    def lifecycle(self, action: str) -> None:
        if action == "abort":
            self.engine.abort()
            self._roll_back()
            return
        if action != "crash_reopen":
            self.engine.commit({"seq": self.seq})
            self._remember()
            if action == "commit":
                return
        self.store = self._reopen_store()
        self.engine = self._engine()
        if action == "crash_reopen":
            self._roll_back()

    @precondition(lambda self: hasattr(self, "engine"))
    @rule(key=KEYS)
    def query(self, key: Any) -> None:
        key = self._key(key)
        stored = {(s.start, s.end): v for s, v in self.engine.sessions(key)}
        mine = {(s[0], s[1]): [e[1] for e in s[2]]
                for s in self.oracle.sessions.get(key, [])}
        for bounds, value in mine.items():
            if not self.oracle.closed(bounds[1]):
                assert stored.get(bounds) == value, (key, bounds)
        for bounds, value in stored.items():  # closed sessions may have expired, no more
            assert mine.get(bounds) == value, (key, bounds, value)

    # -- invariants -------------------------------------------------------------------------

    @invariant()
    def agrees_with_the_oracle(self) -> None:
        if not hasattr(self, "engine"):
            return
        assert self.late == self.oracle.dropped
        assert self.engine.metrics["dropped-records"] == self.late_calls
        w = self.oracle.w
        assert self.engine.watermark == (INT64_MIN if w is None else w)
        if self.update:
            got = sorted(((*row, v) for row, v in self.table.items()), key=repr)
            assert got == self.oracle.rows(closed_only=False)
        else:
            assert sorted(self.emitted, key=repr) == self.oracle.rows(closed_only=True)
            ends = [row[2] for row in self.emitted]
            assert ends == sorted(ends)

    def teardown(self) -> None:
        if hasattr(self, "store"):
            self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)


EngineOnRocksDB.TestCase.settings = settings(
    max_examples=30, stateful_step_count=25, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestEngineOnRocksDB = EngineOnRocksDB.TestCase


@pytest.mark.parametrize("first", [1, 3, 40])
def test_an_event_after_a_batch_closes_the_batch_sessions(make_store: Any, first: int) -> None:
    """``process`` after ``process_batch`` with ON_WINDOW_CLOSE hands the batch's open sessions
    back to the event path. That used to read their ends through a column view taken before the
    batch's sessions were placed (which grows the columns): an IndexError on the first event
    after any batch that added sessions."""
    windows = SessionWindows(10, 0)
    engine = SessionAggregator(make_store(retention_ms=windows.retention_ms), windows,
                               aggregations.collect(), emit=EmitStrategy.ON_WINDOW_CLOSE,
                               watermark="external")
    out = engine.process_batch([f"k{i}" for i in range(first)], list(range(first)),
                               list(range(first)))
    out += engine.process("k0", "late-comer", 5)
    out += engine.process("x", "new", 100)
    out += engine.advance_watermark(1_000)
    got = sorted((e.session.key, e.session.start, e.session.end, e.value) for e in out)
    want = sorted([(f"k{i}", i, i + 10, [i]) for i in range(1, first)]
                  + [("k0", 0, 15, [0, "late-comer"]), ("x", 100, 110, ["new"])])
    assert got == want


@pytest.mark.parametrize("other", [b"a", 0, ("a", 1)])
def test_process_table_never_relabels_a_key_of_another_type(other: Any) -> None:
    """A session of a key that ``process_batch`` gave (bytes, an int, a tuple) that closes
    during ``process_table`` with a string key column cannot be a row of that column. It used
    to be written there anyway, Arrow turning ``b"a"`` into ``"a"`` and ``0`` into ``"0"``: a
    row naming another key. It is refused, naming the column and the key."""
    windows = SessionWindows(1, 0)
    engine = SessionAggregator(InMemorySessionStore(retention_ms=windows.retention_ms),
                               windows, aggregations.collect(),
                               emit=EmitStrategy.ON_WINDOW_CLOSE, watermark="event_time")
    engine.process_batch([other], [1], [0])
    table = pa.table({"k": ["a"], "t": pa.array([5], pa.int64()), "v": pa.array([2], pa.int64())})
    with pytest.raises(TypeError, match=r"key column 'k' is string.* key " + re.escape(repr(other))):
        engine.process_table(table, key="k", time="t", value="v")


def test_process_table_casts_keys_of_the_same_kind() -> None:
    """Keys of the column's kind still come out in the column's own type (here large_string
    and int32 columns, while the engine holds them as Arrow strings and int64)."""
    for column, keys in [(pa.array(["a", "b"], pa.large_string()), ["a", "b"]),
                         (pa.array([7, 8], pa.int32()), [7, 8])]:
        windows = SessionWindows(1, 0)
        engine = SessionAggregator(InMemorySessionStore(retention_ms=windows.retention_ms),
                                   windows, aggregations.count(),
                                   emit=EmitStrategy.ON_WINDOW_CLOSE, watermark="event_time")
        engine.process_batch(keys[:1], [1], [0])
        out = engine.process_table(pa.table({"k": column, "t": pa.array([5, 6], pa.int64())}),
                                   key="k", time="t")
        out = pa.concat_tables([out, engine.advance_watermark_table(100)])
        assert out.schema.field("k").type == column.type
        assert sorted(out.column("k").to_pylist()) == [keys[0], keys[0], keys[1]]
