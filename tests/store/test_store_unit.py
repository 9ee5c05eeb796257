"""Unit tests of the store contract, run against both backends."""

from __future__ import annotations

from pathlib import Path

import pytest

from sessionstore import InMemorySessionStore, Session, SessionStore
from sessionstore.store import default_segment_interval_ms


def sessions(results):
    return [(s.key, s.start, s.end) for s, _ in results]


def test_kip94_find_sessions_to_merge_example(make_store):
    store = make_store(retention_ms=10_000)
    for start, end in [(0, 99), (101, 200), (201, 300), (301, 400)]:
        store.put(Session("k", start, end), f"{start}-{end}")
    found = list(store.find_sessions_to_merge("k", 150, 300))
    assert [s.start for s, _ in found] == [101, 201]
    assert [v for _, v in found] == ["101-200", "201-300"]


def test_kip94_segment_table(make_store):
    store = make_store(retention_ms=100_000, segment_interval_ms=1000)
    assert [store.segment_id(end) for end in (0, 500, 1000, 2000)] == [0, 0, 1, 2]


def test_default_segment_interval():
    assert default_segment_interval_ms(10_000) == 60_000
    assert default_segment_interval_ms(600_000) == 300_000
    store = InMemorySessionStore(retention_ms=3_600_000)
    assert store.segment_interval_ms == 1_800_000


def test_bounds_are_inclusive_at_both_edges(make_store):
    store = make_store(retention_ms=10_000, segment_interval_ms=100)
    store.put(Session("k", 10, 20), 1)
    assert sessions(store.find_sessions_to_merge("k", 20, 10)) == [("k", 10, 20)]
    assert sessions(store.find_sessions_to_merge("k", 21, 10)) == []
    assert sessions(store.find_sessions_to_merge("k", 20, 9)) == []
    assert sessions(store.find_sessions(20, 20)) == [("k", 10, 20)]
    assert sessions(store.find_sessions(21, 30)) == []
    assert sessions(store.find_sessions(0, 19)) == []


def test_negative_times_sort_correctly(make_store):
    store = make_store(retention_ms=10**9, segment_interval_ms=1000)
    for start, end in [(-5000, -4000), (-1, 0), (-3000, -1500), (5, 7), (-10**12, -10**12)]:
        store.put(Session("k", start, end), 0)
    assert [s.end for s, _ in store.fetch("k")] == [-4000, -1500, 0, 7]
    assert store.segment_id(-1) == -1
    assert sessions(store.find_sessions(-4000, -1)) == [("k", -5000, -4000), ("k", -3000, -1500)]


def test_fetch_orders_by_end_then_start(make_store):
    store = make_store(retention_ms=10**6, segment_interval_ms=1000)
    store.put(Session("k", 50, 100), "b")
    store.put(Session("k", 10, 100), "a")
    store.put(Session("k", 0, 5000), "d")
    store.put(Session("k", 0, 90), "z")
    assert [v for _, v in store.fetch("k")] == ["z", "a", "b", "d"]


def test_keys_sharing_a_prefix_never_see_each_other(make_store):
    store = make_store(retention_ms=10**6)
    store.put(Session("a", 0, 10), "a")
    store.put(Session("ab", 0, 10), "ab")
    store.put(Session(b"a", 0, 10), "bytes-a")
    store.put(Session(1, 0, 10), "int")
    store.put(Session(("a", 1), 0, 10), "tuple")
    store.put(Session(("a",), 0, 10), "tuple1")
    assert [v for _, v in store.fetch("a")] == ["a"]
    assert [v for _, v in store.fetch("ab")] == ["ab"]
    assert [v for _, v in store.fetch(b"a")] == ["bytes-a"]
    assert [v for _, v in store.fetch(1)] == ["int"]
    assert [(s.key, v) for s, v in store.fetch(("a", 1))] == [(("a", 1), "tuple")]
    assert [v for _, v in store.fetch(("a",))] == ["tuple1"]
    keys = {s.key for s, _ in store.find_sessions(0, 10)}
    assert keys == {"a", "ab", b"a", 1, ("a", 1), ("a",)}


def test_find_sessions_spans_keys_and_segments_in_end_order(make_store):
    store = make_store(retention_ms=10**6, segment_interval_ms=100)
    store.put(Session("y", 0, 250), 3)
    store.put(Session("x", 0, 50), 1)
    store.put(Session("z", 0, 150), 2)
    store.put(Session("x", 200, 250), 4)
    assert [v for _, v in store.find_sessions(0, 1000)] == [1, 2, 3, 4] or [
        v for _, v in store.find_sessions(0, 1000)
    ] == [1, 2, 4, 3]
    ends = [s.end for s, _ in store.find_sessions(0, 1000)]
    assert ends == sorted(ends)
    assert sessions(store.find_sessions(100, 200)) == [("z", 0, 150)]


def test_remove_and_fetch_session(make_store):
    store = make_store(retention_ms=10**6)
    store.put(Session("k", 1, 2), {"n": 1})
    assert store.fetch_session("k", 1, 2) == {"n": 1}
    assert store.fetch_session("k", 1, 3) is None
    store.remove(Session("k", 1, 2))
    assert store.fetch_session("k", 1, 2) is None
    assert list(store.fetch("k")) == []
    store.remove(Session("k", 1, 2))  # removing twice is harmless


def test_put_overwrites(make_store):
    store = make_store(retention_ms=10**6)
    store.put(Session("k", 1, 2), 1)
    store.put(Session("k", 1, 2), 2)
    assert [v for _, v in store.fetch("k")] == [2]
    assert len(list(store.find_sessions(0, 10))) == 1


def test_expiry_drops_whole_segments(make_store):
    store = make_store(retention_ms=1000, segment_interval_ms=500)
    store.put(Session("a", 0, 100), 1)
    store.put(Session("b", 0, 600), 2)
    store.put(Session("c", 0, 1400), 3)
    assert store.observed_stream_time == 1400
    # "a" is still in a held segment, but reads skip it as Kafka does: 100 < 1400 - 1000 + 1
    assert sessions(store.find_sessions(0, 10**6)) == [("b", 0, 600), ("c", 0, 1400)]
    # stream time 2100 -> min live segment (2100 - 1000) // 500 = 2: segments 0 and 1 go
    store.put(Session("d", 2000, 2100), 4)
    assert sessions(store.find_sessions(-10**6, 10**6)) == [("c", 0, 1400), ("d", 2000, 2100)]
    assert list(store.fetch("a")) == [] and list(store.fetch("b")) == []
    assert store.fetch_session("a", 0, 100) is None
    assert store.metrics["expired-segments"] == 2
    assert store.is_expired(999) and not store.is_expired(1000)
    assert store.expiry_boundary_ms(2100) == 1000
    assert store.expiry_boundary_ms(3000) == 2000


def test_late_put_into_expired_segment_is_dropped_and_counted(make_store):
    store = make_store(retention_ms=1000, segment_interval_ms=500)
    store.put(Session("a", 0, 5000), 1)
    assert store.put(Session("late", 0, 3999), 2) is False
    assert store.metrics["dropped-records"] == 1
    assert list(store.fetch("late")) == []
    assert store.put(Session("ok", 0, 4000), 3) is True
    assert store.metrics["dropped-records"] == 1


@pytest.mark.parametrize(
    "value",
    [None, True, 0, -1, 2**63 - 1, 1.5, "text", "ünïcödé", b"\x00\xff", [1, [2, [3]]],
     {"a": 1, "b": [1, 2]}, {1: "int keys"}, ""],
)
def test_value_round_trips(make_store, value):
    store = make_store(retention_ms=10**6)
    store.put(Session("k", 0, 1), value)
    assert store.fetch_session("k", 0, 1) == value


def test_tuples_in_values_come_back_as_lists(make_store):
    store = make_store(retention_ms=10**6)
    store.put(Session("k", 0, 1), (1, 2))
    assert store.fetch_session("k", 0, 1) == [1, 2]


def test_custom_serde(make_store):
    class Upper:
        def dumps(self, value):
            return value.upper().encode()

        def loads(self, data):
            return data.decode()

    store = make_store(retention_ms=10**6, value_serde=Upper())
    store.put(Session("k", 0, 1), "abc")
    assert store.fetch_session("k", 0, 1) == "ABC"


def test_unsupported_value_names_the_type(make_store):
    store = make_store(retention_ms=10**6)

    class Thing:
        pass

    with pytest.raises(TypeError, match="Thing"):
        store.put(Session("k", 0, 1), Thing())
    with pytest.raises(TypeError, match="set"):
        store.put(Session("k", 0, 1), {1, 2})
    assert list(store.fetch("k")) == []


@pytest.mark.parametrize(
    ("call", "exc", "match"),
    [
        (lambda s: s.put(Session(None, 0, 1), 1), ValueError, "None"),
        (lambda s: s.put(Session(("a", None), 0, 1), 1), ValueError, "None"),
        (lambda s: s.put(Session(1.5, 0, 1), 1), TypeError, "float"),
        (lambda s: s.put(Session(["a"], 0, 1), 1), TypeError, "list"),
        (lambda s: s.put(Session("k", 2, 1), 1), ValueError, "session.start must be <="),
        (lambda s: s.put(Session("k", 0.5, 1), 1), TypeError, "session.start"),
        (lambda s: s.put(Session("k", 0, "1"), 1), TypeError, "session.end"),
        (lambda s: s.put(Session("k", 0, True), 1), TypeError, "session.end"),
        (lambda s: s.put(Session("k", 0, 2**63), 1), ValueError, "session.end"),
        (lambda s: s.put(("k", 0), 1), TypeError, "session"),
        (lambda s: list(s.fetch(None)), ValueError, "None"),
        (lambda s: list(s.find_sessions_to_merge("k", "0", 1)), TypeError, "earliest_end_ms"),
        (lambda s: list(s.find_sessions(0, float("nan"))), TypeError, "latest_end_ms"),
        (lambda s: s.segment_id(1.0), TypeError, "timestamp_ms"),
        (lambda s: s.put(Session("x" * (2 << 20), 0, 1), 1), ValueError, "limit"),
        (lambda s: s.put(Session("\ud800", 0, 1), 1), ValueError, "UTF-8"),
    ],
)
def test_bad_arguments_raise_and_name_the_argument(make_store, call, exc, match):
    store = make_store(retention_ms=10**6)
    with pytest.raises(exc, match=match):
        call(store)
    assert list(store.find_sessions(-(2**63), 2**63 - 1)) == []


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"retention_ms": -1}, ValueError, "retention_ms must be >= 0, got -1"),
        ({"retention_ms": "1"}, TypeError, "retention_ms"),
        ({"retention_ms": 10, "segment_interval_ms": 0}, ValueError, "segment_interval_ms"),
        ({"retention_ms": 10, "value_serde": object()}, TypeError, "value_serde"),
    ],
)
def test_bad_constructor_arguments(make_store, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        make_store(**kwargs)


def test_commit_abort_and_metadata(make_store):
    store = make_store(retention_ms=10**6)
    assert store.committed_version == 0 and store.committed_metadata is None
    store.put(Session("k", 0, 1), 1)
    assert store.commit({"offset": 1}) == 1
    store.put(Session("k", 5, 6), 2)
    store.remove(Session("k", 0, 1))
    assert sessions(store.fetch("k")) == [("k", 5, 6)]  # reads see uncommitted writes
    store.abort()
    assert sessions(store.fetch("k")) == [("k", 0, 1)]
    assert store.committed_version == 1 and store.committed_metadata == {"offset": 1}
    assert store.observed_stream_time == 1
    with pytest.raises(TypeError):
        store.commit(object())
    assert store.committed_version == 1


def test_abort_restores_expired_segments(make_store):
    store = make_store(retention_ms=100, segment_interval_ms=100)
    store.put(Session("a", 0, 50), 1)
    store.commit()
    store.put(Session("b", 0, 1000), 2)
    assert list(store.fetch("a")) == []
    store.abort()
    assert sessions(store.fetch("a")) == [("a", 0, 50)]
    assert store.observed_stream_time == 50


def test_closed_store_refuses_calls(make_store):
    store = make_store(retention_ms=10)
    store.close()
    with pytest.raises(ValueError, match="closed"):
        store.put(Session("k", 0, 1), 1)
    store.close()


def test_rocksdb_reopen_shows_committed_state_only(tmp_path: Path):
    path = tmp_path / "s"
    with SessionStore(path, retention_ms=10**6) as store:
        store.put(Session("k", 0, 10), "committed")
        store.commit({"offset": 7})
        store.put(Session("k", 20, 30), "uncommitted")
    with SessionStore(path, retention_ms=10**6) as store:
        assert sessions(store.fetch("k")) == [("k", 0, 10)]
        assert store.committed_version == 1
        assert store.committed_metadata == {"offset": 7}
        assert store.observed_stream_time == 10
        store.put(Session("k", 40, 50), "second")
        assert store.commit() == 2
    with SessionStore(path, retention_ms=10**6) as store:
        assert [v for _, v in store.fetch("k")] == ["committed", "second"]
        assert store.committed_metadata is None


def test_rocksdb_keeps_interval_and_lock(tmp_path: Path):
    path = tmp_path / "s"
    store = SessionStore(path, retention_ms=10**6, segment_interval_ms=1000)
    store.put(Session("k", 0, 10), 1)
    with pytest.raises(ValueError, match="already open"):
        SessionStore(path, retention_ms=10**6)
    store.commit()
    store.close()
    with pytest.raises(ValueError, match="segment_interval_ms=5000 differs"):
        SessionStore(path, retention_ms=10**6, segment_interval_ms=5000)
    with SessionStore(path, retention_ms=10**6) as reopened:
        assert reopened.segment_interval_ms == 1000


def test_rocksdb_segments_are_column_families(tmp_path: Path):
    with SessionStore(tmp_path / "s", retention_ms=1000, segment_interval_ms=500) as store:
        store.put(Session("k", 0, 100), 1)
        store.put(Session("k", 0, 700), 1)
        assert store.live_segments() == [0, 1]
        store.put(Session("k", 0, 2600), 1)
        assert store.live_segments() == [5]
