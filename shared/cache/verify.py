"""The semantic cache's verifier: whether a candidate the index found (similar enough, and
passing the guard) may serve a prompt, from its similarity and how well the words that the
two prompts do not share are matched by the other prompt's words.

A sentence vector is a mean, so one word added or changed moves it little: "the git commit
history" and "the git commit history of a single file" are 0.90 apart, as close as many
paraphrases. What tells them apart is the words left over once the words both texts say
are set aside ("single", "file"): a paraphrase's leftover words have a counterpart in the
other text ("deduplicate" against "remove duplicates"), an edit's often have none. Each
leftover word is scored by its best cosine to a content word of the other text (the
encoder's contextual word vectors, :mod:`shared.cache.align`); the worst and the mean of
those, with the sentence similarity, go into a logistic score fitted on the labelled
set's tuning split (:func:`fit`, ``python -m shared.cache.evaluate``). A candidate is
served when the score is at least 0.

Pure numpy (no torch, no I/O): the embedder hands it each text's :class:`WordVectors`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shared.cache.align import WordVectors

# Nearest entries a semantic lookup checks (guard and verifier on each, in order).
CANDIDATES = 8

# Words that paraphrases add freely ("the best way to", "tell me", "using Python") and
# that are not stopwords of the alignment: never counted as left over.
FILLER = frozenset("using use way get tell name best".split())


def leftover_alignment(a: WordVectors, b: WordVectors) -> tuple[float, float]:
    """The worst and the mean, over content words of either text whose key the other
    lacks, of the word's best cosine to a content word of the other: (1, 1) when no word
    is left over, (0, 0) when only one text has content words."""
    if len(a.keys) == 0 or len(b.keys) == 0:
        return (1.0, 1.0) if len(a.keys) == len(b.keys) else (0.0, 0.0)
    sims = a.vectors.astype(np.float32) @ b.vectors.astype(np.float32).T
    in_a, in_b = set(a.keys), set(b.keys)
    best = [float(sims[i].max()) for i, k in enumerate(a.keys) if _left_over(k, in_b)]
    best += [float(sims[:, j].max()) for j, k in enumerate(b.keys) if _left_over(k, in_a)]
    if not best:
        return 1.0, 1.0
    return min(best), sum(best) / len(best)


def _left_over(key: str, other: set[str]) -> bool:
    return key not in other and key not in FILLER


def features(similarity: float, a: WordVectors, b: WordVectors) -> np.ndarray:
    """The verifier's inputs for one pair: similarity, worst and mean leftover alignment."""
    worst, mean = leftover_alignment(a, b)
    return np.array([similarity, worst, mean], dtype=np.float64)


@dataclass(frozen=True, slots=True)
class Verifier:
    """A logistic score over :func:`features`; a candidate is served when it is >= 0."""

    weights: tuple[float, float, float]  # similarity, worst and mean leftover alignment
    bias: float

    def score(self, similarity: float, a: WordVectors, b: WordVectors) -> float:
        return float(features(similarity, a, b) @ np.asarray(self.weights) + self.bias)

    def accepts(self, similarity: float, a: WordVectors, b: WordVectors) -> bool:
        """Whether a candidate at ``similarity`` with these word vectors may serve."""
        return self.score(similarity, a, b) >= 0.0

    def min_similarity(self) -> float:
        """The lowest similarity at which any candidate can pass (every word aligned):
        the index need not look below it."""
        w_sim, w_worst, w_mean = self.weights
        return -(self.bias + max(w_worst, 0.0) + max(w_mean, 0.0)) / w_sim


# Fitted and tuned on the labelled set's tuning split by
# ``shared.cache.evaluate.tune_verifier`` (tests/unit/test_semantic_labelled.py checks it
# is what tuning gives and reads the held-out split's figures).
VERIFIER = Verifier((11.115, 1.6486, 2.8764), -11.5122)


def fit(x: np.ndarray, y: np.ndarray, l2: float = 1e-2, steps: int = 3000) -> Verifier:
    """Logistic regression of labels ``y`` (1: may share an answer) on feature rows ``x``
    by gradient descent on standardised features (L2 penalty ``l2``), returned in the
    features' own units."""
    mu, sd = x.mean(axis=0), x.std(axis=0) + 1e-9
    z = (x - mu) / sd
    w, b = np.zeros(z.shape[1]), 0.0
    for _ in range(steps):
        p = 1.0 / (1.0 + np.exp(-(z @ w + b)))
        w -= 0.5 * (z.T @ (p - y) / len(y) + l2 * w)
        b -= 0.5 * float((p - y).mean())
    raw = w / sd
    return Verifier((float(raw[0]), float(raw[1]), float(raw[2])), float(b - raw @ mu))
