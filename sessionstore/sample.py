"""Deterministic sample streams: a realistic clickstream and a Nexmark q11-style bid stream.

Both are seeded and vectorised with numpy, so millions of events cost well under a second. They
feed ``make run``, the CLI's ``bench`` command and the benchmark harness.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PAGES = np.array(["/", "/search", "/product", "/cart", "/checkout", "/account", "/help"])


@dataclass
class Clickstream:
    """Columns of a generated clickstream, in arrival order."""

    users: np.ndarray  # int64 user ids
    times_ms: np.ndarray  # int64 event times
    pages: np.ndarray  # str pages
    amounts: np.ndarray  # int64 cents (0 when the click is not a purchase)

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
    pages = PAGES[rng.integers(0, len(PAGES), size=total)]
    amounts = np.where(pages == "/checkout", rng.integers(100, 20_000, size=total), 0)
    return Clickstream(users[arrival], times[arrival].astype(np.int64), pages[arrival],
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
