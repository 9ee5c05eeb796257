"""Four reader threads query the committed view while the engine writes a million events."""

from __future__ import annotations

import random
import threading
from collections import Counter

from sessionstore import (
    EmitStrategy,
    ReadOnlySessionStore,
    SessionAggregator,
    SessionStore,
    SessionWindows,
    aggregations,
)
from sessionstore.sample import bid_stream

EVENTS = 1_000_000
COMMIT_EVERY = 50_000


def test_readers_see_consistent_committed_data_during_a_million_writes(tmp_path):
    windows = SessionWindows(10_000)
    store = SessionStore(tmp_path / "s", retention_ms=10**12)  # nothing expires: counts add up
    engine = SessionAggregator(store, windows, aggregations.count(),
                               emit=EmitStrategy.ON_WINDOW_CLOSE, max_out_of_orderness_ms=200)
    bidders, times = bid_stream(EVENTS, n_bidders=5_000)
    keys, stamps = bidders.tolist(), times.tolist()
    truth: dict[int, Counter] = {}
    engine.process_batch(keys[:1], [None], stamps[:1])
    engine.commit({"offset": 1})
    truth[store.committed_version] = Counter(keys[:1])
    errors: list[BaseException] = []
    reads = Counter()
    stop = threading.Event()

    def reader(seed: int) -> None:
        rng = random.Random(seed)
        try:
            with ReadOnlySessionStore(tmp_path / "s") as view:
                while not stop.is_set():
                    view.refresh()
                    version, offset = view.version, view.metadata["user"]["offset"]
                    expected = truth[version]
                    key = keys[rng.randrange(offset)]
                    sessions = view.fetch(key)
                    counted = sum(record[0] for _, record in sessions)
                    assert counted == expected[key], (version, key, counted, expected[key])
                    reads["point"] += 1
                    if rng.random() < 0.02:  # a whole-store read: every event exactly once
                        total = sum(record[0] for _, record in view.find_sessions(-(2**63),
                                                                                   2**63 - 1))
                        assert total == offset, (version, total, offset)
                        reads["full"] += 1
        except BaseException as exc:  # noqa: BLE001 - reported to the main thread
            errors.append(exc)

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    seen = Counter(keys[:1])
    for i in range(1, EVENTS, COMMIT_EVERY):
        j = min(i + COMMIT_EVERY, EVENTS)
        engine.process_batch(keys[i:j], [None] * (j - i), stamps[i:j])
        seen.update(keys[i:j])
        truth[store.committed_version + 1] = Counter(seen)
        engine.commit({"offset": j})
    stop.set()
    for thread in threads:
        thread.join(timeout=60)
    store.close()
    assert not errors, errors[0]
    assert reads["point"] > 100 and reads["full"] >= 1
    print(f"reads under load: {dict(reads)} across {len(threads)} threads")
