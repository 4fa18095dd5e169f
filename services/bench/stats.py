"""The benchmarks' statistics: percentiles, latency summaries and a distribution-free
interval for a median. Every benchmark takes its percentiles from here."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from typing import Any


def pct(values: Iterable[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` by nearest rank, ``x_(round(q (n-1)))``; NaN
    for no values."""
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))] if s else float("nan")


def summary(values: list[float]) -> dict[str, float]:
    """p50, p95 and p99 of ``values``."""
    return {"p50": pct(values, 0.5), "p95": pct(values, 0.95), "p99": pct(values, 0.99)}


def median_of(rows: list[dict[str, Any]], key: str) -> float:
    """The median of ``key`` over ``rows``."""
    return statistics.median(r[key] for r in rows)


def median_interval(values: list[float], confidence: float = 0.9) -> dict[str, float]:
    """A distribution-free interval for the median of ``values``: order statistics
    ``x_(k)`` and ``x_(n+1-k)`` with the largest ``k`` whose coverage, 1 - 2 P(B <= k-1)
    for B ~ Binomial(n, 1/2), is at least ``confidence``. With too few values for that,
    the whole range; ``coverage`` gives the interval's exact confidence either way."""
    s, n = sorted(values), len(values)
    if not n:
        return {"low": float("nan"), "high": float("nan"), "coverage": 0.0}

    def coverage(k: int) -> float:  # of [x_(k), x_(n+1-k)], k counted from 1
        return 1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2**n

    k = 1
    while k + 1 <= (n + 1) // 2 and coverage(k + 1) >= confidence:
        k += 1
    return {"low": s[k - 1], "high": s[n - k], "coverage": coverage(k)}
