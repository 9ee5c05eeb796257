"""The cache's write rule (``put``, ``remove``, ``put_merged`` and the event step's
``put_joined``, which the other two call) against a plain dict of what the store must hold:
after any mix of writes, merges, flushes and evictions, with any cache size (0 writes through,
1 and 2 evict all the time) and with or without the end index, the wrapped store holds exactly
the last value of every session put and not removed since, and every read through the cache
says the same in between."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sessionstore import InMemorySessionStore
from sessionstore.keyschema import encode_key
from sessionstore.store.caching import CachingSessionStore
from sessionstore.timeutil import INT64_MAX, INT64_MIN

KEYS = ["a", 7]
# few bounds, so that a session is put, removed and put again with the same bounds
BOUNDS = [(0, 5), (3, 9), (0, 9), (10, 12)]

_ops = st.lists(st.one_of(
    st.tuples(st.sampled_from(["put", "remove", "merge", "joined"]), st.sampled_from(KEYS),
              st.sampled_from(BOUNDS), st.integers(0, 3)),
    st.tuples(st.sampled_from(["flush", "evict"])),
), max_size=40)


def _stored(store: Any) -> dict[tuple[Any, int, int], Any]:
    return {(s.key, s.start, s.end): value
            for s, value in store.find_sessions(INT64_MIN, INT64_MAX)}


@settings(max_examples=150)
@given(ops=_ops, max_sessions=st.sampled_from([0, 1, 2, 1_000]), index_ends=st.booleans())
def test_the_store_holds_the_last_write_of_each_session(ops: list[Any], max_sessions: int,
                                                        index_ends: bool) -> None:
    store = InMemorySessionStore(retention_ms=INT64_MAX // 2)
    cache = CachingSessionStore(store, max_sessions, index_ends=index_ends)
    want: dict[tuple[Any, int, int], Any] = {}
    for n, op in enumerate(ops):
        if op[0] in ("flush", "evict"):
            cache.flush() if op[0] == "flush" else cache.evict()
            assert _stored(store) == want
            continue
        kind, key, (start, end), pick = op
        sid = (key, start, end)
        value = [n]
        if kind in ("put", "remove") and pick:
            cache.sessions_of(key, INT64_MIN)  # held, as the engine loads a key before writing
        if kind == "put":
            cache.put(sid, value)
            want[sid] = value
        elif kind == "remove":
            cache.remove(sid)
            want.pop(sid, None)
        else:
            # an event's merge: the view's sessions it replaces, then the new session
            view = cache.sessions_of(key, INT64_MIN)
            held = sorted(b for b in view if b != (start, end))
            if kind == "merge":
                joined = [b for i, b in enumerate(held) if (pick >> i) & 1]
                if (start, end) in view and pick & 1:
                    joined.append((start, end))
                cache.put_merged(key, view, joined, sid, value)
            else:  # put_joined: at most one session replaced, as the fused event step does
                if max_sessions == 0:
                    continue  # nothing is held: the event step takes sessions_of's path
                one = (start, end) if (start, end) in view else (
                    held[pick % len(held)] if held and pick else None)
                if one is not None and one != (start, end) and (start, end) in view:
                    continue  # put_joined's contract: the new bounds are not another session's
                cache.put_joined(key, view, one, start, end, value)
            for b in joined if kind == "merge" else ([] if one is None else [one]):
                want.pop((key, b[0], b[1]), None)
            want[sid] = value
        for (k, s, e), v in want.items():
            assert cache.fetch_session(k, s, e) == v
    taken = cache.take_closed(INT64_MIN + 1, INT64_MAX)
    if taken is not None:  # the end index knows every session: it hands them all, in order
        assert index_ends and max_sessions > 0
        assert [((s.key, s.start, s.end), v) for s, v in taken] == sorted(
            want.items(), key=lambda kv: (kv[0][2], encode_key(kv[0][0]), kv[0][1]))
    cache.flush()
    assert _stored(store) == want
    cache.evict()
    assert _stored(store) == want


def test_a_session_put_back_after_its_removal_is_removed_from_the_store() -> None:
    """A flushed session merged away (a removal pending), put back with the same bounds and
    removed again: the store loses it. The view must remember that the store holds the
    session; a put that marked it "never written" dropped the second removal."""
    for put_back in ("put", "put_joined"):
        store = InMemorySessionStore(retention_ms=1_000)
        cache = CachingSessionStore(store, 100, index_ends=True)
        view = cache.sessions_of("k", INT64_MIN)
        cache.put(("k", 0, 5), [1])
        cache.flush()
        cache.put_merged("k", view, [(0, 5)], ("k", 0, 9), [2])  # (0, 5) merged away
        if put_back == "put":
            cache.put(("k", 0, 5), [3])
        else:
            cache.put_joined("k", view, None, 0, 5, [3])
        cache.remove(("k", 0, 9))
        cache.remove(("k", 0, 5))
        cache.flush()
        assert _stored(store) == {}, put_back
