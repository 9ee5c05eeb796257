"""Deterministic sample streams: a realistic clickstream and a Nexmark q11-style bid stream.

Both are seeded and vectorised with numpy, so millions of events cost well under a second. They
feed ``make run``, the CLI's ``sample`` and ``bench`` commands and the benchmark harness.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pyarrow as pa

PAGES = np.array(["/", "/search", "/product", "/cart", "/checkout", "/account", "/help"])
_CHECKOUT = int(np.flatnonzero(PAGES == "/checkout")[0])
#: The size of the bundled sample (``make run``, ``sessionstore sample``).
SAMPLE_EVENTS = 1_200_000


@dataclass
class Clickstream:
    """Columns of a generated clickstream, in arrival order."""

    users: np.ndarray  # int64 user ids
    times_ms: np.ndarray  # int64 event times
    page_codes: np.ndarray  # int64 indexes into PAGES
    amounts: np.ndarray  # int64 cents (0 when the click is not a purchase)

    @property
    def pages(self) -> np.ndarray:
        """The pages as str (built on use: a million-row str array costs a tenth of a second)."""
        pages: np.ndarray = PAGES[self.page_codes]
        return pages

    def __len__(self) -> int:
        return len(self.users)


def generate(n_events: int, n_users: int = 50_000, seed: int = 42,
             start_ms: int = 1_700_000_000_000, hours: float = 6.0,
             late_share: float = 0.001) -> Clickstream:
    """About ``n_events`` clicks by ``n_users`` users over ``hours`` of event time.

    Visits start uniformly over the period; a visit has a heavy-tailed number of clicks (mean
    about 8) separated by log-normal think times (median 20 s, a long tail past 30 minutes, so
    some visits split into several sessions). Arrival order is event time plus up to 5 s of
    jitter; ``late_share`` of the events arrive 1 to 60 minutes late.
    """
    rng = np.random.default_rng(seed)
    n_visits = max(1, n_events // 8)
    clicks = np.minimum(rng.geometric(1 / 8, size=n_visits), 500)
    total = int(clicks.sum())
    weights = 1.0 / np.arange(1, n_users + 1) ** 0.7
    weights /= weights.sum()
    visit_users = rng.choice(n_users, size=n_visits, p=weights).astype(np.int64)
    visit_starts = start_ms + rng.integers(0, int(hours * 3_600_000), size=n_visits)
    visit_of = np.repeat(np.arange(n_visits), clicks)
    think = (rng.lognormal(mean=3.0, sigma=1.3, size=total) * 1000).astype(np.int64)
    first = np.ones(total, dtype=bool)
    first[1:] = visit_of[1:] != visit_of[:-1]
    think[first] = 0
    csum = np.cumsum(think)
    visit_base = csum[np.flatnonzero(first)][visit_of]
    times = visit_starts[visit_of] + (csum - visit_base)
    users = visit_users[visit_of]
    jitter = rng.integers(0, 5_000, size=total)
    late = rng.random(total) < late_share
    jitter[late] += rng.integers(60_000, 3_600_000, size=int(late.sum()))
    arrival = np.argsort(times + jitter, kind="stable")
    codes = rng.integers(0, len(PAGES), size=total)
    amounts = np.where(codes == _CHECKOUT, rng.integers(100, 20_000, size=total), 0)
    return Clickstream(users[arrival], times[arrival].astype(np.int64), codes[arrival],
                       amounts[arrival].astype(np.int64))


def bid_stream(
    n_events: int, n_bidders: int = 20_000, events_per_second: int = 10_000, seed: int = 11
) -> tuple[np.ndarray, np.ndarray]:
    """Return (bidder ids as int64, event times in ms as int64), in arrival order.

    Bidders follow a Zipf-like popularity; event time advances at ``events_per_second`` with a
    little jitter (up to 200 ms out of order), as Nexmark's generator does.
    """
    rng = np.random.default_rng(seed)
    ranks = np.arange(1, n_bidders + 1, dtype=np.float64)
    weights = 1.0 / ranks**0.8
    weights /= weights.sum()
    bidders = rng.choice(n_bidders, size=n_events, p=weights).astype(np.int64)
    base = (np.arange(n_events, dtype=np.int64) * 1000) // events_per_second
    jitter = rng.integers(0, 200, size=n_events, dtype=np.int64)
    return bidders, base + jitter


def clickstream_table(n_events: int = SAMPLE_EVENTS, seed: int = 42) -> pa.Table:
    """:func:`generate`'s clickstream as an Arrow table in arrival order: ``user`` (text such
    as ``user17``), ``ts`` (int64 epoch milliseconds), ``page``, ``amount`` (int64 cents) and
    ``gap_ms``, a gap per event (int64 ms: an hour after the cart and the checkout, where
    people pause to pay, else 30 minutes)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    stream = generate(n_events, seed=seed)
    # text columns are built from a dictionary (a name per user, seven pages): formatting or
    # converting a million Python strings costs a tenth of a second or more each
    ids = pa.array(np.arange(int(stream.users.max(initial=0)) + 1))  # user ids are 0..n-1
    names = pc.binary_join_element_wise("user", pc.cast(ids, pa.string()), "")
    users = names.take(pa.array(stream.users))
    pages = pa.array(PAGES).take(pa.array(stream.page_codes))
    paying = np.isin(stream.page_codes, np.flatnonzero(np.isin(PAGES, ["/cart", "/checkout"])))
    gaps = np.where(paying, 3_600_000, 1_800_000).astype(np.int64)
    return pa.table({"user": users, "ts": stream.times_ms, "page": pages,
                     "amount": stream.amounts, "gap_ms": gaps})


def write_sample(path: str | Path, n_events: int = SAMPLE_EVENTS) -> Path:
    """Write :func:`clickstream_table` to ``path``: Parquet, CSV, TSV or JSON Lines by its
    extension (``.parquet``, ``.csv``, ``.tsv``, ``.jsonl``). Returns the path.

    Raises:
        ValueError: another extension, or ``n_events < 1``; naming the argument.
    """
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    if n_events < 1:
        raise ValueError(f"--events must be >= 1, got {n_events}")
    target = Path(path)
    suffix = target.suffix.lower()
    if suffix not in (".parquet", ".csv", ".tsv", ".jsonl"):
        raise ValueError(f"--out {str(path)!r}: unknown format {suffix or '(none)'!r}; use "
                         f".parquet, .csv, .tsv or .jsonl")
    table = clickstream_table(n_events)
    target.parent.mkdir(parents=True, exist_ok=True)
    if suffix == ".parquet":
        pq.write_table(table, target)
    elif suffix in (".csv", ".tsv"):
        pacsv.write_csv(table, target, pacsv.WriteOptions(
            delimiter="\t" if suffix == ".tsv" else ",", quoting_style="needed"))
    else:
        with open(target, "w") as handle:
            for row in table.to_pylist():
                handle.write(json.dumps(row) + "\n")
    return target
