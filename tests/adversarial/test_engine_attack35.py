"""The engine on a RocksDB store that is committed, closed, reopened and rolled back at random,
against an oracle written here.

A hypothesis state machine drives one :class:`SessionAggregator` on a ``SessionStore`` in a
temporary directory: events one at a time and in batches, with disorder well beyond the grace
period (so some are late and dropped), watermark advances, commits, aborts, a close and reopen of
the store after a commit, and a close and reopen without one (a crash: everything since the last
commit is lost, output included). The configuration is drawn as hard as the input: a write-back
cache of 0, 1 or 2 sessions (or a large one), segment intervals down to 1 ms, the minimum
retention the engine accepts, both watermark modes and both gap conventions, and both emit
strategies.

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

    A session is ``[start, end, events]`` with events ``(t, seq)``; ``seq`` is the event's
    value, unique, so that a collected session names its events in (time, arrival) order.
    """

    def __init__(self, gap: int, grace: int, inclusive: bool, event_time: bool,
                 ooo: int) -> None:
        self.gap, self.grace, self.inclusive = gap, grace, inclusive
        self.event_time, self.ooo = event_time, ooo
        self.w: int | None = None  # None: no progress yet
        self.sessions: dict[Any, list[list[Any]]] = {}
        self.dropped: list[int] = []

    def closed(self, end: int) -> bool:
        return self.w is not None and end + self.grace <= self.w

    def event(self, key: Any, seq: int, t: int) -> None:
        if self.w is not None and self.w >= t + self.gap + self.grace:
            self.dropped.append(seq)
            return
        lo, hi = t, t + self.gap
        events = [(t, seq)]
        keep = []
        for s in self.sessions.get(key, []):
            if self.inclusive:
                reach = s[1] >= t and s[0] <= t + self.gap
            else:
                reach = s[1] > t and s[0] < t + self.gap
            if reach and not self.closed(s[1]):
                lo, hi = min(lo, s[0]), max(hi, s[1])
                events += s[2]
            else:
                keep.append(s)
        keep.append([lo, hi, sorted(events)])
        self.sessions[key] = keep
        if self.event_time:
            self.advance(t - self.ooo)

    def advance(self, w: int) -> None:
        self.w = w if self.w is None else max(self.w, w)

    def rows(self, closed_only: bool) -> list[tuple[Any, int, int, list[int]]]:
        return sorted(((k, s[0], s[1], [seq for _, seq in s[2]])
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
                update=st.booleans(), rocksdb=st.booleans(), tables=st.booleans())
    def configure(self, gap: int, grace: int, inclusive: bool, event_time: bool, ooo: int,
                  cache: int, segment: Any, extra_retention: int, update: bool,
                  rocksdb: bool, tables: bool) -> None:
        self.windows = SessionWindows(gap, grace, inclusive)
        self.event_time = event_time
        self.ooo = ooo if event_time else 0
        self.cache = cache
        # the minimum the engine accepts: gap + grace (+ out-of-orderness with event time)
        self.retention = gap + grace + self.ooo + extra_retention
        self.segment = gap if segment == "gap" else segment
        self.update = update
        self.rocksdb = rocksdb
        # process_table's output has one key type (its key column's): a run that uses it
        # keeps to string keys
        self.tables = tables
        self.oracle = Oracle(gap, grace, inclusive, event_time, self.ooo)
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
        return SessionAggregator(
            self.store, self.windows, aggregations.collect(),
            emit=EmitStrategy.ON_WINDOW_UPDATE if self.update else EmitStrategy.ON_WINDOW_CLOSE,
            watermark="event_time" if self.event_time else "external",
            max_out_of_orderness_ms=self.ooo, cache_max_sessions=self.cache,
            on_late=lambda key, value, t: self.late.append(value))

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

    # -- rules ------------------------------------------------------------------------------

    @rule(key=KEYS, step=st.integers(0, 12),
          jitter=st.sampled_from([0, 0, -1, -3, -9, -17, -30, -60]))
    def event(self, key: Any, step: int, jitter: int) -> None:
        self.base += step
        t = self._time(jitter)
        self.seq += 1
        key = self._key(key)
        self.oracle.event(key, self.seq, t)
        self._deliver(self.engine.process(key, self.seq, t))

    @rule(events=st.lists(st.tuples(KEYS, st.integers(0, 12),
                                    st.sampled_from([0, 0, -2, -11, -25, -70])),
                          min_size=1, max_size=12))
    def batch(self, events: list[tuple[Any, int, int]]) -> None:
        keys, values, times = [], [], []
        for key, step, jitter in events:
            self.base += step
            t = self._time(jitter)
            self.seq += 1
            key = self._key(key)
            self.oracle.event(key, self.seq, t)
            keys.append(key)
            values.append(self.seq)
            times.append(t)
        self._deliver(self.engine.process_batch(keys, values, times))

    @precondition(lambda self: getattr(self, "tables", False))
    @rule(events=st.lists(st.tuples(st.sampled_from(["a", "aa", "b"]), st.integers(0, 12),
                                    st.sampled_from([0, 0, -4, -13, -40])),
                          min_size=1, max_size=12))
    def table(self, events: list[tuple[str, int, int]]) -> None:
        """The same as ``batch``, as an Arrow table (one key type per column: strings)."""
        keys, values, times = [], [], []
        for key, step, jitter in events:
            self.base += step
            t = self._time(jitter)
            self.seq += 1
            self.oracle.event(key, self.seq, t)
            keys.append(key)
            values.append(self.seq)
            times.append(t)
        out = self.engine.process_table(
            pa.table({"k": keys, "t": pa.array(times, pa.int64()),
                      "v": pa.array(values, pa.int64())}), key="k", time="t", value="v")
        self._deliver([Emit(Session(row["k"], row["session_start_ms"], row["session_end_ms"]),
                            row["collect"], None, bool(row.get("retracted", False)),
                            row["session_end_ms"] - 1)
                       for row in out.to_pylist()])

    @rule(ahead=st.sampled_from([*range(-20, 41), "end"]))
    def watermark(self, ahead: Any) -> None:
        # "end": the watermark at the int64 maximum closes everything (and makes every later
        # event late)
        w = INT64_MAX if ahead == "end" else self.base + ahead
        self.oracle.advance(w)
        self._deliver(self.engine.advance_watermark(w))

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
        mine = {(s[0], s[1]): [seq for _, seq in s[2]]
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
    max_examples=50, stateful_step_count=30, deadline=None,
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
