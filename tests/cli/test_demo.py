"""``make run``'s job (``python -m sessionstore.demo``): the sample is all there, so every event
counts, late arrivals included, and the sessions are the oracle's offline answer."""

from __future__ import annotations

import json

from sessionstore import demo
from sessionstore.sample import clickstream_table
from tests import oracle


def test_the_demo_keeps_every_event_and_writes_the_offline_sessions(tmp_path):
    # kills: the demo on the streaming engine, which dropped the sample's late events (515 of
    # 1.2M) and so wrote other sessions than the input holds
    n = 20_000
    out = tmp_path / "sessions.jsonl"
    assert demo.main(["--events", str(n), "--out", str(out), "--png",
                      str(tmp_path / "h.png")]) == 0
    events = clickstream_table(n)
    steps = [("event", u, (p, a), t) for u, t, p, a in zip(
        *[events.column(c).to_pylist() for c in ("user", "ts", "page", "amount")], strict=True)]
    sessions, dropped = oracle.sessionize(steps, gap=demo.GAP_MS, out_of_orderness=None)
    assert not dropped
    expected = {(k, s, e, len(v), sum(a for _, a in v), v[0][0], v[-1][0])
                for k, s, e, v in sessions}
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    got = {(r["user"], r["session_start_ms"], r["session_end_ms"], r["clicks"],
            r["revenue_cents"], r["landing_page"], r["exit_page"]) for r in rows}
    assert len(got) == len(rows) and got == expected
    assert sum(r["clicks"] for r in rows) == events.num_rows
    assert (tmp_path / "h.png").stat().st_size > 0
