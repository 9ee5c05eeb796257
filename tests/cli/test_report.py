"""The --summary table: whole keys (a very long one cut with a marker), and durations that say
what they measure."""

from __future__ import annotations

import pyarrow as pa

from sessionstore.report import KEY_WIDTH_MAX, SessionSummary


def test_keys_are_whole_and_the_window_says_what_it_measures():
    summary = SessionSummary("events")
    long_key = "quadfather.lerc.nasa.gov"  # 24 characters: cut at 20 before
    huge_key = "x" * (KEY_WIDTH_MAX + 15)
    summary.add_table(pa.table({"host": [long_key, "b", huge_key],
                                "session_start_ms": [0, 0, 0],
                                "session_end_ms": [90_000, 1_000, 30_000],
                                "events": [3, 9, 1]}), ["host"])
    text = summary.table()
    lines = text.splitlines()
    assert "window (first event to last + gap)" in lines[0]
    longest = text.split("longest sessions:")[1].split("busiest sessions:")[0].splitlines()
    assert "window (first event to last + gap)" in longest[1]
    assert longest[2].split()[0] == long_key  # the whole key
    assert longest[2].split()[3] == "1m30s"
    cut = longest[3].split()[0]
    assert cut.endswith("…") and len(cut) == KEY_WIDTH_MAX and huge_key.startswith(cut[:-1])
    # the columns stay aligned: every row's first event starts where the header's does
    column = longest[1].index("first event (UTC)")
    assert all(row[column:column + 4] == "1970" for row in longest[2:] if row)
    busiest = text.split("busiest sessions:")[1].splitlines()
    assert busiest[2].split()[0] == "b" and busiest[2].split()[-1] == "9"
