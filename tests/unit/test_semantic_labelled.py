"""The semantic cache's decision (threshold and guard) on the hand-labelled set: the
threshold in use is the one the tuning split gives, and on the held-out split (intents
written after the threshold and the guard were fixed) paraphrases hit at least half the
time. The false-hit target (at most 1% of hits, 95% upper bound at most 2%) is not met on
the held-out split: the edits left are ones a word-level guard cannot read (on the tuning
split, "chemical name" against "chemical formula", "square" against "square root"), at
similarities as high as paraphrases'.
That test is an expected failure, strict, so meeting it is noticed."""

from __future__ import annotations

import numpy as np
import pytest

from shared.cache.evaluate import Figures, figures, similarities, tune
from shared.cache.guard import SEMANTIC_THRESHOLD
from shared.cache.labelled import Pair, pairs
from shared.embedding import load_embedder


@pytest.fixture(scope="module")
def scored() -> dict[str, tuple[list[Pair], np.ndarray]]:
    embedder = load_embedder()
    out = {}
    for split in ("tuning", "held_out"):
        labelled = pairs(split)
        out[split] = (labelled, similarities(embedder, labelled))
    return out


def held_out(scored: dict[str, tuple[list[Pair], np.ndarray]]) -> Figures:
    labelled, sims = scored["held_out"]
    result = figures(labelled, sims, SEMANTIC_THRESHOLD)
    print(result.line("held-out"))
    return result


def test_threshold_is_the_tuned_one(scored: dict[str, tuple[list[Pair], np.ndarray]]) -> None:
    labelled, sims = scored["tuning"]
    assert tune(labelled, sims) == SEMANTIC_THRESHOLD


def test_held_out_paraphrase_hit_rate(scored: dict[str, tuple[list[Pair], np.ndarray]]) -> None:
    result = held_out(scored)
    assert result.positives >= 200 and result.negatives >= 200
    assert result.hit_rate >= 0.5
    # Nearly every hard negative over the threshold is refused by the guard.
    assert result.false_hits < result.refused_by_guard


@pytest.mark.xfail(strict=True, reason="held-out false hits 21/271 (7.75%; 95% upper bound 11.0%)")
def test_held_out_false_hits_meet_the_target(
    scored: dict[str, tuple[list[Pair], np.ndarray]],
) -> None:
    result = held_out(scored)
    assert result.false_hit_share <= 0.01 and result.false_hit_upper95 <= 0.02
