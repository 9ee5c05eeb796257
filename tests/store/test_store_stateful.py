"""The RocksDB store and the in-memory model, driven side by side by random operations."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from sessionstore import InMemorySessionStore, Session, SessionStore
from tests.strategies import KEYS, VALUES, sessions

RETENTION = 1_500
INTERVAL = 400
TIMES = st.integers(-2_500, 7_000)


def listed(results):
    return [(tuple(s), v) for s, v in results]


class StoreComparison(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="stateful-"))
        self.disk = self._open()
        self.model = InMemorySessionStore(retention_ms=RETENTION, segment_interval_ms=INTERVAL)
        self.known: list[tuple[object, int, int]] = []

    def _open(self) -> SessionStore:
        return SessionStore(self.dir / "db", retention_ms=RETENTION, segment_interval_ms=INTERVAL)

    @rule(session=sessions(), value=VALUES)
    def put(self, session, value):
        self.known.append(session)
        assert self.disk.put(Session(*session), value) == self.model.put(Session(*session), value)

    @rule(data=st.data())
    def remove_known(self, data):
        if self.known:
            session = data.draw(st.sampled_from(self.known))
            self.disk.remove(Session(*session))
            self.model.remove(Session(*session))

    @rule(session=sessions())
    def remove_any(self, session):
        self.disk.remove(Session(*session))
        self.model.remove(Session(*session))

    @rule(metadata=st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1), st.dictionaries(st.text(max_size=3), st.integers(0, 10**6), max_size=2)))
    def commit(self, metadata):
        assert self.disk.commit(metadata) == self.model.commit(metadata)

    @rule()
    def abort(self):
        self.disk.abort()
        self.model.abort()

    @rule()
    def close_and_reopen(self):
        self.disk.close()
        self.disk = self._open()
        self.model.abort()  # closing discards uncommitted writes, as abort does

    @rule(key=KEYS)
    def fetch(self, key):
        assert listed(self.disk.fetch(key)) == listed(self.model.fetch(key))

    @rule(key=KEYS, earliest=TIMES, latest=TIMES)
    def find_sessions_to_merge(self, key, earliest, latest):
        assert listed(self.disk.find_sessions_to_merge(key, earliest, latest)) == listed(
            self.model.find_sessions_to_merge(key, earliest, latest)
        )

    @rule(earliest=TIMES, latest=TIMES)
    def find_sessions(self, earliest, latest):
        assert listed(self.disk.find_sessions(earliest, latest)) == listed(
            self.model.find_sessions(earliest, latest)
        )

    @rule(session=sessions())
    def fetch_session(self, session):
        assert self.disk.fetch_session(*session) == self.model.fetch_session(*session)

    @invariant()
    def same_versions_and_time(self):
        assert self.disk.committed_version == self.model.committed_version
        assert self.disk.committed_metadata == self.model.committed_metadata
        assert self.disk.observed_stream_time == self.model.observed_stream_time
        # dropped puts are compared through put()'s return value: metrics are per process

    def teardown(self):
        self.disk.close()
        self.model.close()
        shutil.rmtree(self.dir, ignore_errors=True)


StoreComparison.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
TestStoreComparison = StoreComparison.TestCase
