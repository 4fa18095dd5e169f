"""The edge's embedding batcher: lookups that arrive while a batch computes go together in
the next one, each gets its own text's vector, and a failing embedder fails only the
lookups of its batch."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import numpy as np
import pytest

from services.edge.semantic import EmbedBatcher, _meta
from shared.cache.align import WordVectors


class SlowEmbedder:
    """Vectors from text lengths, each call taking a while (as a forward pass does)."""

    identity = "fake"
    dim = 2

    def __init__(self, fail_on: str = "") -> None:
        self.calls: list[list[str]] = []
        self.fail_on = fail_on
        self.gate = threading.Event()

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.calls.append(list(texts))
        self.gate.wait(0.2)
        if self.fail_on in texts:
            raise RuntimeError("embedder failed")
        return np.array([[len(t), 1.0] for t in texts], dtype=np.float32)


@pytest.mark.timeout(10)
async def test_concurrent_lookups_share_batches() -> None:
    fake = SlowEmbedder()
    batcher = EmbedBatcher(lambda: fake)  # type: ignore[arg-type,return-value]
    texts = ["a", "bb", "ccc", "dddd", "eeeee"]
    first = asyncio.create_task(batcher.embed("z"))
    await asyncio.sleep(0.05)  # the first batch is computing; the rest queue behind it
    vectors = await asyncio.gather(*(batcher.embed(t) for t in texts))
    await first
    assert [int(v[0]) for v in vectors] == [1, 2, 3, 4, 5]
    assert fake.calls == [["z"], texts]
    assert (batcher.batches, batcher.texts) == (2, 6)


@pytest.mark.timeout(10)
async def test_a_failed_batch_fails_only_its_lookups() -> None:
    fake = SlowEmbedder(fail_on="bad")
    batcher = EmbedBatcher(lambda: fake)  # type: ignore[arg-type,return-value]
    with pytest.raises(RuntimeError):
        await batcher.embed("bad")
    assert int((await batcher.embed("fine"))[0]) == 4


@pytest.mark.timeout(10)
async def test_a_lookup_cancelled_before_its_batch_is_not_embedded() -> None:
    fake = SlowEmbedder()
    batcher = EmbedBatcher(lambda: fake)  # type: ignore[arg-type,return-value]
    first = asyncio.create_task(batcher.embed("z"))
    await asyncio.sleep(0.05)  # the first batch is computing
    dropped = asyncio.create_task(batcher.embed("answered-by-the-exact-cache"))
    kept = asyncio.create_task(batcher.embed("kept"))
    await asyncio.sleep(0)
    dropped.cancel()
    assert int((await kept)[0]) == 4
    await first
    assert fake.calls == [["z"], ["kept"]]


class WordEmbedder(SlowEmbedder):
    """Also hands each text's words: one per character, keyed by the character."""

    def embed_words(self, texts: Sequence[str]) -> tuple[np.ndarray, list[WordVectors]]:
        vectors = self.embed(texts)
        words = [WordVectors(tuple(t), np.ones((len(t), 2), dtype=np.float32)) for t in texts]
        return vectors, words


@pytest.mark.timeout(10)
async def test_word_vectors_come_from_the_same_batch() -> None:
    fake = WordEmbedder()
    batcher = EmbedBatcher(lambda: fake, words=True)  # type: ignore[arg-type,return-value]
    (va, wa), (vb, wb) = await asyncio.gather(batcher.embed_words("ab"), batcher.embed_words("c"))
    assert (int(va[0]), wa.keys, int(vb[0]), wb.keys) == (2, ("a", "b"), 1, ("c",))
    assert int((await batcher.embed("dddd"))[0]) == 4
    plain = EmbedBatcher(lambda: fake)  # type: ignore[arg-type,return-value]
    with pytest.raises(RuntimeError, match="without word vectors"):
        await plain.embed_words("ab")


def test_stored_word_vectors_come_back_with_the_entry() -> None:
    rows = np.array([[0.6, 0.8], [1.0, 0.0]], dtype=np.float32)
    fields = {"digest": "d", "text": "t", "context": "c", "sampling": "s", "embedder": "e"}
    meta = _meta({**fields, "words": ["git", "log"]}, rows.astype(np.float16).tobytes(), 2)
    assert meta.words is not None and meta.words.keys == ("git", "log")
    assert np.allclose(meta.words.vectors, rows, atol=1e-3)
    # Stored without word vectors, or with rows that do not fit the keys: none.
    assert _meta(dict(fields), None, 2).words is None
    assert _meta({**fields, "words": ["git"]}, rows.astype(np.float16).tobytes(), 2).words is None
