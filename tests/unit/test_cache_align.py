"""The word-alignment check on plain arrays: words from sub-tokens, stopwords and
punctuation dropped, every word of each side matched, and the thresholds tuned with it."""

from __future__ import annotations

import numpy as np

from shared.cache.align import aligned, alignment, content_words
from shared.cache.evaluate import HIT_RATE_FLOOR, figures, tune_aligned
from shared.cache.labelled import Pair


def unit(*rows: list[float]) -> np.ndarray:
    out = np.array(rows, dtype=np.float32)
    return out / np.linalg.norm(out, axis=1, keepdims=True)


def test_words_are_the_mean_of_their_tokens_without_stopwords() -> None:
    # [CLS] the chem ##ical formula ? [SEP] [PAD]
    tokens = np.array(
        [[9, 9, 9], [5, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 2], [7, 7, 0], [9, 9, 9], [3, 3, 3]],
        dtype=np.float32,
    )
    word_ids = [None, 0, 1, 1, 2, 3, None, None]
    words = content_words(tokens, word_ids, ["the", "chemical", "formula", "?"])
    assert words.shape == (2, 3)
    assert np.allclose(words[0], unit([1, 1, 0])[0])  # "chemical": its two tokens' mean
    assert np.allclose(words[1], [0, 0, 1])  # "formula", normalised
    assert content_words(tokens, word_ids, ["The", "OF", "a", "!"]).shape == (0, 3)


def test_every_word_of_each_side_must_match() -> None:
    chemical, formula, name = unit([1, 0, 0, 0], [0, 1, 0, 0], [0, 0.3, 1, 0])
    same = np.stack([chemical, formula])
    assert alignment(same, same[::-1]) > 0.999
    # "chemical formula" against "chemical name": formula's best match is name (0.29).
    swapped = np.stack([chemical, name])
    assert abs(alignment(same, swapped) - float(formula @ name)) < 1e-6
    assert not aligned(same, swapped, 0.5)
    # A word only one side has ("square" against "square root") fails either way round.
    root = unit([0, 0, 0, 1])[0]
    assert alignment(same, np.vstack([same, root])) < 1e-6
    assert alignment(np.vstack([same, root]), same) < 1e-6


def test_a_near_word_matches() -> None:
    remove, delete, duplicates = unit([1, 0.2, 0], [1, 0.35, 0], [0, 0, 1])
    a, b = np.stack([remove, duplicates]), np.stack([delete, duplicates])
    assert aligned(a, b, 0.95)
    assert aligned(a.astype(np.float16), b.astype(np.float16), 0.95)


def test_empty_sides() -> None:
    none = np.zeros((0, 4), dtype=np.float32)
    some = unit([1, 0, 0, 0])
    assert alignment(none, none) == 1.0
    assert alignment(none, some) == alignment(some, none) == 0.0


def test_tuning_takes_the_alignment_that_removes_a_false_hit() -> None:
    # Four paraphrase pairs and a one-word edit, all over the similarity threshold; the
    # edit aligns worst, one paraphrase next.
    labelled = [Pair(f"alpha beta {i}", f"alpha beta {i}", True, "paraphrase") for i in range(4)]
    labelled.append(Pair("alpha beta 9", "alpha beta 9", False, "antonym"))
    sims = np.array([0.95, 0.95, 0.95, 0.95, 0.95], dtype=np.float32)
    aligns = np.array([0.9, 0.8, 0.7, 0.45, 0.4], dtype=np.float32)
    threshold, tau = tune_aligned(labelled, sims, aligns)
    found = figures(labelled, sims, threshold, aligns, tau)
    assert found.false_hits == 0 and found.refused_by_alignment == 1
    assert found.hit_rate == 1.0 >= HIT_RATE_FLOOR  # the lowest alignment that does it
    assert threshold == 0.95 and 0.4 < tau <= 0.45
