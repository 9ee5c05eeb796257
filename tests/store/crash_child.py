"""Child process of the crash test: writes and commits in a loop until it is killed.

Step ``i`` is a pure function of ``i``, so the parent can rebuild exactly what any committed
version must contain (see :func:`apply_step`).
"""

from __future__ import annotations

import sys

from sessionstore import Session, SessionStore

RETENTION = 2_000
INTERVAL = 500


def apply_step(store, i: int) -> None:
    """The writes of step ``i``: puts across keys, one overwrite, one remove."""
    base = i * 37
    for j in range(25):
        key = f"user{(i * 7 + j) % 40}"
        store.put(Session(key, base + j, base + j + 50), [i, j])
    store.put(Session("hot", 0, base + 60), i)
    if i > 1:
        store.remove(Session("hot", 0, (i - 1) * 37 + 60))


def main(path: str) -> None:
    with SessionStore(path, retention_ms=RETENTION, segment_interval_ms=INTERVAL) as store:
        done = store.committed_metadata["step"] if store.committed_metadata else 0
        print("ready", flush=True)  # the parent times its kill from here, not from start-up
        i = done
        while True:
            i += 1
            apply_step(store, i)
            store.commit({"step": i})
            print(i, flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
