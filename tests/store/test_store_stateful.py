"""The RocksDB store and the in-memory model, driven side by side by random operations on
random configurations: retention, segment interval (down to 1 ms), value serde, kept versions."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import msgpack
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from sessionstore import InMemorySessionStore, ReadOnlySessionStore, Session, SessionStore
from tests.strategies import KEYS, VALUES, sessions

TIMES = st.integers(-2_500, 7_000)


class JsonSerde:
    def dumps(self, value: Any) -> bytes:
        return json.dumps(value).encode()

    def loads(self, data: bytes) -> Any:
        return json.loads(data)


class EmptyNoneSerde:
    """None is stored as zero bytes: an empty value must read back as a value, not a miss."""

    def dumps(self, value: Any) -> bytes:
        return b"" if value is None else b"v" + msgpack.packb(value)

    def loads(self, data: bytes) -> Any:
        return None if data == b"" else msgpack.unpackb(data[1:])


CONFIGS = st.fixed_dictionaries({
    "segment_interval_ms": st.one_of(st.just(1), st.integers(1, 50), st.integers(51, 3_000)),
    "retention_ms": st.one_of(st.just(0), st.integers(0, 100), st.integers(100, 8_000)),
    "value_serde": st.sampled_from([None, JsonSerde(), EmptyNoneSerde()]),
    "keep_versions": st.integers(1, 3),
})


def listed(results):
    return [(tuple(s), v) for s, v in results]


class StoreComparison(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="stateful-"))
        self.known: list[tuple[object, int, int]] = []
        self.disk: SessionStore | None = None
        self.model: InMemorySessionStore | None = None

    @initialize(config=CONFIGS)
    def configure(self, config):
        self.config = config
        self.disk = self._open()
        store_config = {k: v for k, v in config.items() if k != "keep_versions"}
        self.model = InMemorySessionStore(**store_config)
        self.committed: list[tuple[tuple[Any, ...], Any]] = []

    def _open(self) -> SessionStore:
        return SessionStore(self.dir / "db", **self.config)

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
        self.committed = listed(self.model.find_sessions(-(2**63), 2**63 - 1))

    @rule()
    def read_only_view(self):
        if self.disk.committed_version == 0:
            return
        with ReadOnlySessionStore(self.dir / "db",
                                  value_serde=self.config["value_serde"]) as view:
            assert view.version == self.model.committed_version
            assert view.metadata == self.model.committed_metadata
            assert listed(view) == self.committed

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

    @invariant()
    def keeps_the_configured_number_of_versions(self):
        on_disk = len(list((self.dir / "db" / "checkpoints").glob("v*"))) \
            if (self.dir / "db" / "checkpoints").exists() else 0
        assert on_disk == min(self.disk.committed_version, self.config["keep_versions"])

    def teardown(self):
        if self.disk is not None:
            self.disk.close()
        if self.model is not None:
            self.model.close()
        shutil.rmtree(self.dir, ignore_errors=True)


StoreComparison.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
TestStoreComparison = StoreComparison.TestCase
