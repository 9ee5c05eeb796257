"""The main job on the embedded default: a short store demo (the engine will replace it)."""

from __future__ import annotations

import logging
import tempfile

from sessionstore import Session, SessionStore

log = logging.getLogger("sessionstore.demo")


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with tempfile.TemporaryDirectory() as tmp, SessionStore(tmp, retention_ms=10_000) as store:
        for start, end in [(0, 99), (101, 200), (201, 300), (301, 400)]:
            store.put(Session("k", start, end), {"events": 1})
        version = store.commit({"source": "demo"})
        found = [tuple(s) for s, _ in store.find_sessions_to_merge("k", 150, 300)]
        log.info("committed version %d; KIP-94 find_sessions_to_merge(k, 150, 300) -> %s",
                 version, found)


if __name__ == "__main__":
    main()
