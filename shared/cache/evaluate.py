"""Figures of the semantic cache's decision on the labelled set: hit rate on paraphrases,
false hits among hits with a one-sided 95% upper bound, and the verifier
(``shared/cache/verify.py``) fitted and tuned on the tuning half.

    python -m shared.cache.evaluate              # tune on the tuning half, report both
                                                 # halves with the verifier in use, the
                                                 # guard alone beside it, and its cost
    python -m shared.cache.evaluate --alignment  # the guard with the word-alignment check
                                                 # (shared/cache/align.py) tuned with it
    python -m shared.cache.evaluate --dtype bfloat16  # the verifier in use on vectors of
                                                 # the embedder in bfloat16, as it serves
                                                 # on CPUs that run that faster

Tuning reads float32 vectors, the same on every CPU.
"""

from __future__ import annotations

import argparse
import functools
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from shared.cache.align import alignment
from shared.cache.guard import SEMANTIC_THRESHOLD, disagreement
from shared.cache.labelled import Pair, pairs
from shared.cache.verify import CANDIDATES, VERIFIER, Verifier, features, fit
from shared.embedding import Embedder, load_embedder


@dataclass(frozen=True, slots=True)
class Figures:
    """How a threshold (with the guard) does on one set of labelled pairs."""

    threshold: float
    positives: int
    negatives: int
    hits: int
    true_hits: int
    false_hits: int
    refused_by_guard: int  # negatives over the threshold that the guard refused
    align_threshold: float = 0.0
    refused_by_alignment: int = 0  # negatives the guard let through that alignment refused
    refused_by_verifier: int = 0  # negatives the guard let through that the verifier refused

    @property
    def hit_rate(self) -> float:
        """Share of paraphrase pairs served from the cache."""
        return self.true_hits / self.positives if self.positives else 0.0

    @property
    def false_hit_share(self) -> float:
        return self.false_hits / self.hits if self.hits else 0.0

    @property
    def false_hit_upper95(self) -> float:
        return upper_bound_95(self.false_hits, self.hits)

    def line(self, name: str) -> str:
        return (
            f"{name}: threshold {self.threshold:.2f}; paraphrase hit rate {self.hit_rate:.1%} "
            f"({self.true_hits}/{self.positives}); false hits {self.false_hits}/{self.hits} "
            f"hits = {self.false_hit_share:.2%} (95% upper bound {self.false_hit_upper95:.2%}); "
            f"{self.negatives} hard/unrelated negatives, {self.refused_by_guard} over the "
            "threshold refused by the guard"
            + (
                f", {self.refused_by_alignment} more by word alignment at "
                f"{self.align_threshold:.2f}"
                if self.align_threshold
                else ""
            )
            + (
                f", {self.refused_by_verifier} more by the verifier"
                if self.refused_by_verifier
                else ""
            )
        )


def upper_bound_95(k: int, n: int) -> float:
    """One-sided 95% Clopper-Pearson upper bound of a proportion ``k / n``."""
    if n == 0:
        return 1.0
    if k >= n:
        return 1.0
    lo, hi = k / n, 1.0
    for _ in range(60):  # the p at which P(X <= k | n, p) = 0.05
        mid = (lo + hi) / 2
        if _binom_cdf(k, n, mid) > 0.05:
            lo = mid
        else:
            hi = mid
    return hi


def _binom_cdf(k: int, n: int, p: float) -> float:
    return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k + 1))


def similarities(embedder: Embedder, labelled: Sequence[Pair]) -> np.ndarray:
    """Cosine similarity of each pair."""
    texts = sorted({t for p in labelled for t in (p.a, p.b)})
    vectors = dict(zip(texts, embedder.embed(texts), strict=True))
    return np.array([float(vectors[p.a] @ vectors[p.b]) for p in labelled], dtype=np.float32)


# The guard's verdict per pair, read once: tuning asks it of each pair at each threshold.
_disagreement = functools.lru_cache(maxsize=None)(disagreement)


def figures(
    labelled: Sequence[Pair],
    sims: np.ndarray,
    threshold: float,
    aligns: np.ndarray | None = None,
    align_threshold: float = 0.0,
    verdicts: np.ndarray | None = None,
) -> Figures:
    """What the cache decides for each pair at ``threshold``: a hit needs the similarity
    and no disagreement (and, given ``aligns``, a word alignment of ``align_threshold``;
    given ``verdicts``, the verifier's score of the pair at least 0)."""
    hits = true_hits = false_hits = refused = unaligned = unverified = 0
    for n, (pair, sim) in enumerate(zip(labelled, sims, strict=True)):
        if sim < threshold:
            continue
        if _disagreement(pair.a, pair.b) is not None:
            refused += 0 if pair.same else 1
            continue
        if aligns is not None and aligns[n] < align_threshold:
            unaligned += 0 if pair.same else 1
            continue
        if verdicts is not None and verdicts[n] < 0:
            unverified += 0 if pair.same else 1
            continue
        hits += 1
        true_hits += pair.same
        false_hits += not pair.same
    positives = sum(p.same for p in labelled)
    return Figures(
        threshold,
        positives,
        len(labelled) - positives,
        hits,
        true_hits,
        false_hits,
        refused,
        align_threshold if aligns is not None else 0.0,
        unaligned,
        unverified,
    )


def scores(embedder: Embedder, labelled: Sequence[Pair]) -> tuple[np.ndarray, np.ndarray]:
    """Cosine similarity and word alignment of each pair, from one forward pass a text."""
    texts = sorted({t for p in labelled for t in (p.a, p.b)})
    pooled, words = embedder.embed_words(texts)
    at = {t: i for i, t in enumerate(texts)}
    sims = [float(pooled[at[p.a]] @ pooled[at[p.b]]) for p in labelled]
    aligns = [alignment(words[at[p.a]].vectors, words[at[p.b]].vectors) for p in labelled]
    return np.array(sims, dtype=np.float32), np.array(aligns, dtype=np.float32)


def verifier_features(embedder: Embedder, labelled: Sequence[Pair]) -> np.ndarray:
    """The verifier's features of each pair (``(pairs, 3)``), one forward pass a text."""
    texts = sorted({t for p in labelled for t in (p.a, p.b)})
    pooled, words = embedder.embed_words(texts)
    at = {t: i for i, t in enumerate(texts)}
    rows = [
        features(float(pooled[at[p.a]] @ pooled[at[p.b]]), words[at[p.a]], words[at[p.b]])
        for p in labelled
    ]
    return np.array(rows, dtype=np.float64)


# The paraphrase hit rate the threshold keeps on the tuning split: the target (50%) and a
# margin for the held-out split's paraphrases, which embed a little further apart.
HIT_RATE_FLOOR = 0.55


def tune(labelled: Sequence[Pair], sims: np.ndarray) -> float:
    """The highest threshold (0.70 to 0.99, by 0.01) at which paraphrases of ``labelled``
    still hit at least ``HIT_RATE_FLOOR`` of the time: false hits only fall as the
    threshold rises, so this is the fewest the floor allows. (No threshold gives none at
    that rate: the false hits left are edits the guard cannot read, at similarities as high
    as paraphrases'.)"""
    best = 0.70
    for step in range(70, 100):
        threshold = step / 100
        if figures(labelled, sims, threshold).hit_rate >= HIT_RATE_FLOOR:
            best = threshold
    return best


def tune_aligned(
    labelled: Sequence[Pair], sims: np.ndarray, aligns: np.ndarray
) -> tuple[float, float]:
    """The similarity and alignment thresholds with the fewest false hits on ``labelled``
    while paraphrases hit at least ``HIT_RATE_FLOOR`` of the time, over alignment
    thresholds 0 to 0.9 (by 0.02) and similarity thresholds 0.70 to 0.99 (by 0.01); ties go
    to more true hits, then the higher similarity threshold (as :func:`tune`), then the
    lower alignment threshold."""
    best: tuple[tuple[int, int, float], float, float] | None = None
    for align_step in range(0, 46):
        tau = align_step / 50
        for step in range(70, 100):
            found = figures(labelled, sims, step / 100, aligns, tau)
            if found.hit_rate < HIT_RATE_FLOOR:
                break
            key = (found.false_hits, -found.true_hits, -found.threshold)
            if best is None or key < best[0]:
                best = (key, step / 100, tau)
    return (best[1], best[2]) if best else (0.70, 0.0)


# The verifier is fitted on the tuning pairs at least this similar: the pairs a threshold
# cannot settle, not unrelated ones that any threshold refuses.
FIT_FLOOR = 0.70


def tune_verifier(labelled: Sequence[Pair], feats: np.ndarray) -> Verifier:
    """The verifier fitted on ``labelled`` (pairs of similarity >= ``FIT_FLOOR``), its
    bias then raised as far as paraphrases that pass the guard still hit at least
    ``HIT_RATE_FLOOR`` of the time: the fewest false hits the floor allows, as
    :func:`tune` does for the threshold. Weights and bias are rounded to 4 places (as
    ``VERIFIER`` is written down)."""
    y = np.array([p.same for p in labelled], dtype=np.float64)
    near = feats[:, 0] >= FIT_FLOOR
    fitted = fit(feats[near], y[near])
    weights = tuple(round(w, 4) for w in fitted.weights)
    raw = feats @ np.asarray(weights)
    passes = np.array([_disagreement(p.a, p.b) is None for p in labelled])
    kept = np.sort(raw[passes & (y == 1)])[::-1]  # paraphrase scores, best first
    need = math.ceil(HIT_RATE_FLOOR * int(y.sum()))
    cut = float(kept[need - 1]) if need <= len(kept) else float(kept[-1])
    # Rounding up keeps the cut's own pair in (score >= 0).
    bias = math.ceil(-cut * 1e4) / 1e4
    return Verifier((weights[0], weights[1], weights[2]), bias)


def verdicts(verifier: Verifier, feats: np.ndarray) -> np.ndarray:
    """The verifier's score of each pair (served when >= 0)."""
    return np.asarray(feats @ np.asarray(verifier.weights) + verifier.bias)


def candidate_threshold(verifier: Verifier) -> float:
    """The similarity below which the index need not look (the verifier's lowest passing
    similarity, rounded down to 0.01): the default ``TW_SEMANTIC_THRESHOLD``."""
    return math.floor(verifier.min_similarity() * 100) / 100


def alignment_cost(embedder: Embedder, labelled: Sequence[Pair], rounds: int = 200) -> str:
    """What the alignment check adds to a lookup, measured here: the word vectors' share
    of one text's embedding, and one check against a candidate, beside the embedding."""
    text = labelled[0].a
    plain, with_words = [], []
    for _ in range(rounds // 4):
        start = time.perf_counter()
        embedder.embed([text])
        plain.append(time.perf_counter() - start)
        start = time.perf_counter()
        embedder.embed_words([text])
        with_words.append(time.perf_counter() - start)
    texts = sorted({t for p in labelled[:rounds] for t in (p.a, p.b)})
    _, words = embedder.embed_words(texts)
    at = {t: i for i, t in enumerate(texts)}
    checks = [(words[at[p.a]].vectors, words[at[p.b]].vectors) for p in labelled[:rounds]]
    start = time.perf_counter()
    for a, b in checks:
        alignment(a, b)
    check = (time.perf_counter() - start) / len(checks)
    embed_ms = float(np.median(plain)) * 1e3
    words_ms = float(np.median(with_words)) * 1e3
    return (
        f"one text embedded: {embed_ms:.2f} ms p50, with its word vectors {words_ms:.2f} ms "
        f"({words_ms / embed_ms:.2f}x); one alignment check {check * 1e6:.1f} us "
        f"({check * 1e3 / embed_ms:.2%} of the embedding)"
    )


def verifier_cost(embedder: Embedder, labelled: Sequence[Pair], rounds: int = 200) -> str:
    """What the verifier adds to a lookup, measured here, alternating in one process: one
    text embedded with its word vectors against without, and one verifier check."""
    text = labelled[0].a
    plain, with_words = [], []
    for _ in range(rounds // 2):
        start = time.perf_counter()
        embedder.embed([text])
        plain.append(time.perf_counter() - start)
        start = time.perf_counter()
        embedder.embed_words([text])
        with_words.append(time.perf_counter() - start)
    texts = sorted({t for p in labelled[:rounds] for t in (p.a, p.b)})
    pooled, words = embedder.embed_words(texts)
    at = {t: i for i, t in enumerate(texts)}
    checks = [
        (float(pooled[at[p.a]] @ pooled[at[p.b]]), words[at[p.a]], words[at[p.b]])
        for p in labelled[:rounds]
    ]
    start = time.perf_counter()
    for sim, a, b in checks:
        VERIFIER.accepts(sim, a, b)
    check = (time.perf_counter() - start) / len(checks)
    start = time.perf_counter()
    for p in labelled[:rounds]:
        disagreement(p.a, p.b)  # uncached: as a lookup runs it
    guard = (time.perf_counter() - start) / len(labelled[:rounds])
    embed_ms = float(np.median(plain)) * 1e3
    words_ms = float(np.median(with_words)) * 1e3
    return (
        f"one text embedded: {embed_ms:.2f} ms p50, with its word vectors {words_ms:.2f} ms "
        f"(+{words_ms - embed_ms:.2f} ms, {words_ms / embed_ms:.2f}x); one verifier check "
        f"{check * 1e6:.1f} us ({check * 1e3 / embed_ms:.2%} of the embedding), beside the "
        f"guard's {guard * 1e6:.1f} us a candidate; at most {CANDIDATES} candidates a lookup"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--alignment", action="store_true", help="tune and report with the word-alignment check"
    )
    parser.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="the embedder's arithmetic (default: float32, the tuning reference)",
    )
    args = parser.parse_args()
    embedder = load_embedder(dtype=args.dtype)
    tuning = pairs("tuning")
    if args.alignment:
        held = pairs("held_out")
        tuning_scores, held_scores = scores(embedder, tuning), scores(embedder, held)
        threshold, tau = tune_aligned(tuning, *tuning_scores)
        print(f"tuned with word alignment: threshold {threshold:.2f}, alignment {tau:.2f}")
        sims, aligns = tuning_scores
        print(figures(tuning, sims, threshold, aligns, tau).line("tuning"))
        sims, aligns = held_scores
        print(figures(held, sims, threshold, aligns, tau).line("held-out"))
        guard_alone = tune(tuning, tuning_scores[0])
        print(f"at the guard's own tuned threshold {guard_alone:.2f}, by alignment threshold:")
        for tau in (0.3, 0.4, 0.5, 0.6):
            for name, labelled, (sims, aligns) in (
                ("tuning", tuning, tuning_scores),
                ("held-out", held, held_scores),
            ):
                print("  " + figures(labelled, sims, guard_alone, aligns, tau).line(name))
        import torch

        torch.set_num_threads(1)  # as the edge runs its lookups (services/edge/semantic.py)
        print(alignment_cost(embedder, held))
        return
    held = pairs("held_out")
    tuning_feats, held_feats = (
        verifier_features(embedder, tuning),
        verifier_features(embedder, held),
    )
    tuned = tune_verifier(tuning, tuning_feats)
    print(
        f"tuned verifier: {tuned} (in use: {VERIFIER}); candidate threshold "
        f"{candidate_threshold(tuned):.2f} (in use: {SEMANTIC_THRESHOLD:.2f})"
    )
    for name, labelled, feats in (("tuning", tuning, tuning_feats), ("held-out", held, held_feats)):
        sims = feats[:, 0]
        print(
            figures(labelled, sims, SEMANTIC_THRESHOLD, verdicts=verdicts(VERIFIER, feats)).line(
                name
            )
        )
    guard_alone = tune(tuning, tuning_feats[:, 0])
    print(f"the guard alone, threshold tuned as before ({guard_alone:.2f}):")
    for name, labelled, feats in (("tuning", tuning, tuning_feats), ("held-out", held, held_feats)):
        print("  " + figures(labelled, feats[:, 0], guard_alone).line(name))
    import torch

    torch.set_num_threads(1)  # as the edge runs its lookups (services/edge/semantic.py)
    print(verifier_cost(embedder, held))


if __name__ == "__main__":
    main()
