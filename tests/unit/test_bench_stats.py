"""The benchmark's interval for a median, on plain numbers."""

from __future__ import annotations

import math
import random

import pytest

from services.bench.stats import median_interval


def test_five_rounds_give_their_range_at_its_exact_coverage() -> None:
    got = median_interval([0.92, 0.75, 1.07, 0.88, 0.94])
    assert (got["low"], got["high"]) == (0.75, 1.07)
    assert got["coverage"] == pytest.approx(1 - 2 / 32)


def test_the_textbook_ranks_for_twenty_values_at_95_percent() -> None:
    values = list(range(1, 21))
    random.Random(3).shuffle(values)
    got = median_interval(values, confidence=0.95)
    # Ranks 6 and 15, as the sign-test tables give for n = 20.
    assert (got["low"], got["high"]) == (6, 15)
    assert got["coverage"] == pytest.approx(1 - 2 * sum(math.comb(20, i) for i in range(6)) / 2**20)
    assert got["coverage"] >= 0.95


def test_the_narrowest_interval_that_still_reaches_the_confidence() -> None:
    values = [float(v) for v in range(1, 13)]
    got = median_interval(values, confidence=0.9)
    assert (got["low"], got["high"]) == (3.0, 10.0)  # ranks 4 and 9 would cover only 85%
    assert got["coverage"] == pytest.approx(1 - 2 * (1 + 12 + 66) / 4096)


def test_too_few_values_give_the_range_with_the_coverage_it_has() -> None:
    got = median_interval([3.0, 1.0, 2.0], confidence=0.9)
    assert (got["low"], got["high"], got["coverage"]) == (1.0, 3.0, 0.75)
    one = median_interval([5.0])
    assert (one["low"], one["high"], one["coverage"]) == (5.0, 5.0, 0.0)
    assert math.isnan(median_interval([])["low"])
