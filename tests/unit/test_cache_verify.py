"""The semantic cache's verifier on plain vectors: which words count as left over, how
they are scored, the decision and its lowest passing similarity, and the fit."""

from __future__ import annotations

import numpy as np

from shared.cache.align import WordVectors
from shared.cache.verify import Verifier, features, fit, leftover_alignment


def unit(*rows: list[float]) -> np.ndarray:
    out = np.array(rows, dtype=np.float32)
    return out / np.linalg.norm(out, axis=1, keepdims=True)


GIT, HISTORY, FILE, SINGLE, LOG = unit(
    [1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1], [0, 0.9, 0.1, 0]
)


def words(**named: np.ndarray) -> WordVectors:
    return WordVectors(tuple(named), np.vstack(list(named.values())).astype(np.float32))


def test_shared_words_leave_nothing_over() -> None:
    a = words(git=GIT, history=HISTORY)
    b = words(history=HISTORY * 0.0 + FILE, git=GIT)  # same keys, other vectors: keys decide
    assert leftover_alignment(a, b) == (1.0, 1.0)


def test_an_added_word_without_a_counterpart_scores_low() -> None:
    short = words(git=GIT, history=HISTORY)
    longer = words(git=GIT, history=HISTORY, single=SINGLE, file=FILE)
    worst, mean = leftover_alignment(short, longer)
    assert worst == mean == 0.0
    assert leftover_alignment(longer, short) == (worst, mean)


def test_a_reworded_word_is_scored_by_its_best_match() -> None:
    a = words(git=GIT, history=HISTORY)
    b = words(git=GIT, log=LOG)
    worst, mean = leftover_alignment(a, b)
    close = float(HISTORY @ LOG)
    assert abs(worst - close) < 1e-6 and abs(mean - close) < 1e-6


def test_filler_is_never_left_over() -> None:
    a = words(git=GIT, history=HISTORY, using=SINGLE, best=FILE)
    b = words(git=GIT, history=HISTORY)
    assert leftover_alignment(a, b) == (1.0, 1.0)


def test_texts_without_content_words() -> None:
    none = WordVectors((), np.zeros((0, 4), dtype=np.float32))
    some = words(git=GIT)
    assert leftover_alignment(none, none) == (1.0, 1.0)
    assert leftover_alignment(none, some) == leftover_alignment(some, none) == (0.0, 0.0)


def test_decision_and_its_lowest_passing_similarity() -> None:
    verifier = Verifier((10.0, 2.0, 3.0), -14.0)
    a = words(git=GIT, history=HISTORY)
    b = words(git=GIT, history=HISTORY, single=SINGLE)
    assert abs(verifier.min_similarity() - 0.9) < 1e-9
    assert verifier.accepts(0.91, a, a) and not verifier.accepts(0.89, a, a)
    assert not verifier.accepts(0.99, a, b)  # the added word costs 5 points of score
    assert verifier.accepts(1.0 + 0.5, a, b)
    assert np.allclose(features(0.9, a, b), [0.9, 0.0, 0.0])


def test_fit_finds_the_boundary_of_separable_data() -> None:
    rng = np.random.default_rng(7)
    x = rng.uniform(0, 1, size=(600, 3))
    y = (x[:, 0] + 0.5 * x[:, 1] > 0.8).astype(np.float64)
    verifier = fit(x, y, l2=1e-4, steps=4000)
    predicted = x @ np.asarray(verifier.weights) + verifier.bias >= 0
    assert (predicted == (y == 1)).mean() > 0.95
    w_sim, w_worst, w_mean = verifier.weights
    assert w_sim > w_worst > 0 and abs(w_mean) < 0.25 * w_sim
