"""The sentence embedder: deterministic unit vectors, paraphrases nearer than unrelated
texts, batching that changes nothing, an identity that follows the model's files, and
bfloat16 arithmetic whose vectors agree with float32's."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from shared.embedding import Embedder, EmbedderError, load_embedder, model_identity


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return load_embedder(dtype="float32")


def test_same_text_same_unit_vector(embedder: Embedder) -> None:
    a = embedder.embed(["How do I reverse a list in Python?"])
    b = embedder.embed(["How do I reverse a list in Python?"])
    assert a.shape == (1, 384) and a.dtype == np.float32
    assert np.array_equal(a, b)
    assert abs(float(np.linalg.norm(a[0])) - 1.0) < 1e-5


def test_paraphrase_nearer_than_unrelated(embedder: Embedder) -> None:
    q, para, other = embedder.embed(
        [
            "How do I reverse a list in Python?",
            "What is the way to reverse a Python list?",
            "The weather in Lisbon is warm in September.",
        ]
    )
    assert float(q @ para) > 0.8
    assert float(q @ other) < 0.3


def test_batch_equals_one_by_one(embedder: Embedder) -> None:
    texts = ["a", "a much longer sentence that pads the others in its batch", "hello world"]
    batched = embedder.embed(texts)
    single = np.stack([embedder.embed_one(t) for t in texts])
    assert np.allclose(batched, single, atol=1e-5)
    assert embedder.embed([]).shape == (0, 384)


def test_identity_follows_files(embedder: Embedder, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(embedder.model_dir, copy)
    assert model_identity(copy, 256) == embedder.identity
    assert model_identity(copy, 128) != embedder.identity
    (copy / "config.json").write_text((copy / "config.json").read_text() + "\n")
    assert model_identity(copy, 256) != embedder.identity


def test_missing_folder_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(EmbedderError, match="does not exist"):
        Embedder(tmp_path / "nowhere")
    with pytest.raises(EmbedderError, match="no model files"):
        model_identity(tmp_path, 256)


def test_word_vectors_come_with_the_same_sentence_vectors(embedder: Embedder) -> None:
    texts = ["What is the chemical formula of table salt?", "Hi!", "What is the time?"]
    pooled, words = embedder.embed_words(texts)
    assert np.allclose(pooled, embedder.embed(texts), atol=1e-5)
    # chemical, formula, table, salt; "hi"; "time" (stopwords and "?" dropped)
    assert [w.vectors.shape for w in words] == [(4, 384), (1, 384), (1, 384)]
    assert [w.keys for w in words] == [("chemical", "formula", "table", "salt"), ("hi",), ("time",)]
    assert np.allclose(np.linalg.norm(words[0].vectors, axis=1), 1.0, atol=1e-5)
    # A word's vector does not depend on the padding its batch needed.
    alone = embedder.embed_words(texts[1:2])[1][0]
    assert np.allclose(alone.vectors, words[1].vectors, atol=1e-4)


def test_bfloat16_agrees_with_float32(embedder: Embedder) -> None:
    """Forced bfloat16 (what "auto" picks on a CPU with native bfloat16 instructions):
    sentence vectors within the agreement the choice checks, word vectors close, the same
    identity (entries and indexes stay shared with float32 embedders)."""
    bf16 = load_embedder(dtype="bfloat16")
    assert bf16.dtype == "bfloat16" and bf16.identity == embedder.identity
    texts = [
        "How do I reverse a list in Python?",
        "What is the chemical formula of table salt?",
        "Hi!",
        "Write a SQL query to get the second highest salary from the employees table.",
    ]
    want_pooled, want_words = embedder.embed_words(texts)
    got_pooled, got_words = bf16.embed_words(texts)
    assert got_pooled.dtype == np.float32
    assert float((want_pooled * got_pooled).sum(axis=1).min()) >= 0.999
    for want, got in zip(want_words, got_words, strict=True):
        assert got.keys == want.keys
        assert float((want.vectors * got.vectors).sum(axis=1).min()) >= 0.99


def test_auto_picks_a_dtype_and_unknown_ones_are_refused(embedder: Embedder) -> None:
    assert load_embedder().dtype in ("float32", "bfloat16")
    with pytest.raises(EmbedderError, match="not one of"):
        Embedder(embedder.model_dir, dtype="float16")
