"""The semantic cache's decision (threshold, guard and verifier) on the hand-labelled set:
the verifier in use is the one the tuning split gives, the threshold is the lowest it can
pass, and on the held-out split (intents written by others after the guard and verifier
were fixed) the guard and the verifier refuse most hard negatives over the threshold and
the verifier serves fewer false hits than the guard alone. Neither target is met there:
paraphrases hit 36% of the time (target 50%) and 21% of hits are false (target 1%): an
added restriction ("... including untracked files"), roles swapped in other words
("download from the server" against "copy to the server"), a comparison turned ("over
100 MB" against "smaller than 100 MB"). Those two tests are expected failures, strict, so
meeting them is noticed."""

from __future__ import annotations

import numpy as np
import pytest

from shared.cache.evaluate import (
    Figures,
    candidate_threshold,
    figures,
    tune,
    tune_verifier,
    verdicts,
    verifier_features,
)
from shared.cache.guard import SEMANTIC_THRESHOLD
from shared.cache.labelled import Pair, pairs
from shared.cache.verify import VERIFIER
from shared.embedding import load_embedder

Scored = dict[str, tuple[list[Pair], np.ndarray]]


@pytest.fixture(scope="module")
def scored() -> Scored:
    embedder = load_embedder(dtype="float32")  # the reference: the same on every CPU
    out = {}
    for split in ("tuning", "held_out"):
        labelled = pairs(split)
        out[split] = (labelled, verifier_features(embedder, labelled))
    return out


def served(scored: Scored, split: str) -> Figures:
    """What the cache serves: the threshold, the guard and the verifier in use."""
    labelled, feats = scored[split]
    result = figures(labelled, feats[:, 0], SEMANTIC_THRESHOLD, verdicts=verdicts(VERIFIER, feats))
    print(result.line(split))
    return result


def test_verifier_and_threshold_are_the_tuned_ones(scored: Scored) -> None:
    labelled, feats = scored["tuning"]
    tuned = tune_verifier(labelled, feats)
    assert np.allclose(tuned.weights, VERIFIER.weights, atol=2e-4)
    assert abs(tuned.bias - VERIFIER.bias) <= 2e-4
    assert candidate_threshold(VERIFIER) == SEMANTIC_THRESHOLD
    assert served(scored, "tuning").hit_rate >= 0.55


def test_held_out_hard_negatives_mostly_refused(scored: Scored) -> None:
    result = served(scored, "held_out")
    assert result.positives >= 200 and result.negatives >= 200
    # Most hard negatives over the threshold are refused by the guard or verifier.
    assert result.false_hits < result.refused_by_guard
    assert result.refused_by_verifier > 0


@pytest.mark.xfail(strict=True, reason="held-out paraphrase hit rate 36.3% (287/790)")
def test_held_out_paraphrase_hit_rate(scored: Scored) -> None:
    assert served(scored, "held_out").hit_rate >= 0.5


def test_verifier_serves_fewer_false_hits_than_the_guard_alone(scored: Scored) -> None:
    """On the held-out split, against the guard with its threshold tuned as before it
    (the highest keeping the tuning hit rate)."""
    tuning, tuning_feats = scored["tuning"]
    threshold = tune(tuning, tuning_feats[:, 0])
    labelled, feats = scored["held_out"]
    alone = figures(labelled, feats[:, 0], threshold)
    print(alone.line("held_out, guard alone"))
    with_verifier = served(scored, "held_out")
    assert with_verifier.false_hit_share < alone.false_hit_share
    assert with_verifier.false_hit_upper95 < alone.false_hit_upper95


@pytest.mark.xfail(strict=True, reason="held-out false hits 76/363 (20.9%; 95% upper bound 24.8%)")
def test_held_out_false_hits_meet_the_target(scored: Scored) -> None:
    result = served(scored, "held_out")
    assert result.false_hit_share <= 0.01 and result.false_hit_upper95 <= 0.02
