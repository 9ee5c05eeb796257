"""Nexmark q11-style bid stream: bidders with skewed activity, 10 s session gap.

Deterministic (seeded) and vectorised with numpy, so that generating millions of events costs
well under a second.
"""

from __future__ import annotations

import numpy as np


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
