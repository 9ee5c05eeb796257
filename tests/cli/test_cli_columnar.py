"""The CLI feeds Arrow record batches to ``process_table``; batches it cannot take columnar
(nulls in an aggregated column, decimals) go row by row to ``process_batch``. Both must give the
independent oracle's sessions, with Spark's null rules."""

from __future__ import annotations

import decimal
import json
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sessionstore import SessionAggregator
from sessionstore.cli import main
from tests.oracle import sessionize as oracle_sessionize

GAP = 60_000
AGGS = ["n=count", "total=sum:amount", "lo=min:amount", "hi=max:amount", "all=collect:amount",
        "f=first:amount", "l=last:amount"]


def events(n: int, seed: int, null_every: int | None) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    rows = []
    t = 0
    for i in range(n):
        t += rng.randint(0, 800)  # some 20 minutes of events: few store segments
        amount = None if null_every is not None and i % null_every == 3 else rng.randint(-50, 99)
        # out of order within a few seconds: never late with --max-out-of-order 10s
        rows.append({"user": f"u{rng.randint(0, 150)}", "ts": t - rng.randint(0, 4_000),
                     "amount": amount})
    return rows


def expected(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    steps = [("event", r["user"], r["amount"], r["ts"]) for r in rows]
    sessions, dropped = oracle_sessionize(steps, GAP, out_of_orderness=10_000)
    assert dropped == []
    out = []
    for key, start, end, values in sessions:
        present = [v for v in values if v is not None]
        out.append({"user": key, "session_start_ms": start, "session_end_ms": end,
                    "n": len(values), "total": sum(present) if present else None,
                    "lo": min(present, default=None), "hi": max(present, default=None),
                    "all": present, "f": values[0], "l": values[-1]})
    return sorted(out, key=lambda r: (r["user"], r["session_start_ms"]))


def run(tmp_path: Path, rows: list[dict[str, Any]], name: str, *extra: str
        ) -> tuple[list[dict[str, Any]], dict[str, Any], Any]:
    source = tmp_path / f"{name}.parquet"
    pq.write_table(pa.Table.from_pylist(rows, pa.schema(
        [("user", pa.string()), ("ts", pa.int64()), ("amount", pa.int64())])), source)
    out = tmp_path / f"{name}.jsonl"
    argv = ["sessionize", str(source), "--key", "user", "--time", "ts", "--gap", "1m",
            "--max-out-of-order", "10s", "--out", str(out), "--no-progress",
            # the incremental path, whose batches these tests watch
            "--state", str(tmp_path / f"{name}-state"), *extra]
    for agg in AGGS:
        argv += ["--agg", agg]
    assert main(argv) == 0
    got = sorted((json.loads(line) for line in out.read_text().splitlines()),
                 key=lambda r: (r["user"], r["session_start_ms"]))
    return got, argv, out


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    calls = {"process_table": 0, "process_batch": 0}
    for name in calls:
        real = getattr(SessionAggregator, name)

        def counted(self: Any, *args: Any, _real: Any = real, _name: str = name,
                    **kwargs: Any) -> Any:
            calls[_name] += 1
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(SessionAggregator, name, counted)
    return calls


def test_batches_without_nulls_go_to_process_table_only(tmp_path, capsys, spy):
    rows = events(3_000, 1, null_every=None)
    got, _, _ = run(tmp_path, rows, "plain", "--batch-rows", "500")
    assert got == expected(rows)
    summary = json.loads(capsys.readouterr().out)
    assert spy == {"process_table": 6, "process_batch": 0}
    assert summary["metrics"]["cli-row-path-batches-total"] == 0


def test_batches_with_nulls_take_the_row_path_with_sparks_null_rules(tmp_path, capsys, spy):
    # nulls only in the rows of the second and fourth batch of 500
    rows = events(2_500, 2, null_every=None)
    for i in [*range(500, 1000, 7), *range(1500, 2000, 3)]:
        rows[i]["amount"] = None
    # one user whose every amount is null: its sums are null, its collects empty
    for i in range(500, 1000, 50):
        rows[i].update(user="nulls", amount=None)
    got, _, _ = run(tmp_path, rows, "nulls", "--batch-rows", "500")
    want = expected(rows)
    assert any(r["user"] == "nulls" and r["total"] is None and r["all"] == [] for r in want)
    assert got == want
    assert spy == {"process_table": 3, "process_batch": 2}
    assert json.loads(capsys.readouterr().out)["metrics"]["cli-row-path-batches-total"] == 2


def test_a_resumed_run_mixing_both_paths_equals_one_run(tmp_path, capsys):
    rows = events(4_000, 3, null_every=9)
    for row in rows[:1_000]:  # the first two batches have no null: columnar
        if row["amount"] is None:
            row["amount"] = 1
    whole, argv, out = run(tmp_path, rows, "whole", "--batch-rows", "500")
    assert whole == expected(rows)
    state = ["--state", str(tmp_path / "state"), "--commit-every", "1000"]
    calls = {"n": 0}
    real = SessionAggregator.process_batch

    def crash_once(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError(5, "simulated I/O error")
        return real(self, *args, **kwargs)

    pytest.MonkeyPatch.setattr(pytest.MonkeyPatch(), SessionAggregator, "process_batch",
                               crash_once)
    try:
        assert main([*argv, *state]) == 2
    finally:
        SessionAggregator.process_batch = real  # type: ignore[method-assign]
    assert main([*argv, *state]) == 0
    got = sorted((json.loads(line) for line in out.read_text().splitlines()),
                 key=lambda r: (r["user"], r["session_start_ms"]))
    assert got == whole


def test_decimal_sums_take_the_row_path_and_keep_their_type(tmp_path, capsys):
    rows = [{"user": "a", "ts": 0, "price": decimal.Decimal("1.25")},
            {"user": "a", "ts": 10, "price": decimal.Decimal("2.50")},
            {"user": "b", "ts": 0, "price": None}]
    source = tmp_path / "dec.parquet"
    pq.write_table(pa.Table.from_pylist(rows, pa.schema(
        [("user", pa.string()), ("ts", pa.int64()), ("price", pa.decimal128(6, 2))])), source)
    out = tmp_path / "dec.parquet.out.parquet"
    assert main(["sessionize", str(source), "--key", "user", "--time", "ts", "--gap", "1m",
                 "--agg", "total=sum:price", "--agg", "n=count", "--out", str(out),
                 "--no-progress", "--state", str(tmp_path / "state")]) == 0
    table = pq.read_table(out).sort_by("user")
    assert table.schema.field("total").type == pa.decimal128(16, 2)
    assert table.column("total").to_pylist() == [decimal.Decimal("3.75"), None]
    assert table.column("n").to_pylist() == [2, 1]
