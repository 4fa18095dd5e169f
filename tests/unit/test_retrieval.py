"""Retrieval's pure parts on plain data: passages cut from text, the FAISS index a size
gets and its recall against exact search on clustered vectors, versioned indexes on disk
(build, add, remove, corrupt files refused), the retriever following versions, and where
passages go in a prompt."""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Sequence
from pathlib import Path

import faiss
import numpy as np
import pytest

from shared.messages import ChatMessage, GenerateRequest, Retrieval
from shared.retrieval.chunking import ChunkSpec, chunk_text
from shared.retrieval.grounding import block, fit, ground, query_text
from shared.retrieval.retriever import Found, Query, Retriever
from shared.retrieval.store import (
    CorruptIndex,
    EmbedderMismatch,
    IndexStore,
    NoIndexes,
    Passage,
    UnknownIndex,
)
from shared.retrieval.vectors import FLAT_MAX, Clustered, IndexPlan, build, recall_at_k, tune_nprobe

DIM = 32


class HashEmbedder:
    """Unit vectors from a digest of the text: equal texts, equal vectors; no meaning."""

    identity = "emb-hash-test"

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        rows = []
        for t in texts:
            seed = int.from_bytes(hashlib.sha256(t.encode()).digest()[:8], "big")
            v = np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)
            rows.append(v / np.linalg.norm(v))
        return np.array(rows, np.float32).reshape(len(texts), DIM)


def test_passages_are_bounded_overlap_and_keep_short_paragraphs_whole() -> None:
    words = " ".join(f"word{i}." for i in range(400))
    text = "A short paragraph stays whole.\n\n" + words
    spec = ChunkSpec(max_chars=200, overlap=40)
    passages = chunk_text(text, spec)
    assert passages[0] == "A short paragraph stays whole."
    assert all(0 < len(p) <= 200 for p in passages)
    for a, b in itertools.pairwise(passages[1:]):
        assert b.split()[0] in a.split(), "consecutive passages share their seam"
    covered = set(" ".join(passages[1:]).split())
    assert covered == set(words.split())


def test_index_kind_follows_size() -> None:
    assert IndexPlan.for_size(FLAT_MAX - 1).kind == "flat"
    plan = IndexPlan.for_size(100_000)
    assert plan.kind == "ivf" and 100 <= plan.nlist <= 1000


def test_ivf_recall_at_10_against_exact_on_clustered_data() -> None:
    data = Clustered(384, clusters=200, seed=1)
    n = 20_000
    vectors = data.sample(n, seed=2)
    ids = np.arange(1000, 1000 + n, dtype=np.int64)
    plan = IndexPlan.for_size(n)
    index = build(vectors, ids, plan)
    nprobe = tune_nprobe(index, vectors, ids)
    assert plan.kind == "ivf" and 1 <= nprobe < plan.nlist
    queries = data.sample(500, seed=3)  # none of them indexed, none used for tuning
    _, truth = faiss.knn(queries, vectors, 10, metric=faiss.METRIC_INNER_PRODUCT)
    _, got = index.search(queries, 10)
    assert recall_at_k(got, ids[truth]) >= 0.95
    index.nprobe = 1  # a sanity check that the tuned value mattered on this data
    _, rough = index.search(queries, 10)
    assert recall_at_k(rough, ids[truth]) < recall_at_k(got, ids[truth])


def _docs(n: int, prefix: str = "doc") -> dict[str, list[str]]:
    return {f"{prefix}{d}": [f"{prefix} {d} passage {j}" for j in range(3)] for d in range(n)}


def test_versions_change_and_removed_passages_are_never_found(tmp_path: Path) -> None:
    store, emb = IndexStore(tmp_path), HashEmbedder()
    v1 = store.build("kb", _docs(5), emb.embed, emb.identity).version
    assert store.current_version("kb") == v1
    v2 = store.add("kb", {"doc1": ["doc 1 rewritten"]}, emb.embed, emb.identity).version
    v3 = store.remove("kb", ["doc2"]).version
    assert len({v1, v2, v3}) == 3 and store.current_version("kb") == v3
    loaded = store.load("kb")
    texts = {p.text for p in loaded.passages.values()}
    assert "doc 1 rewritten" in texts and "doc 1 passage 0" not in texts
    assert not any(t.startswith("doc 2 ") for t in texts)
    found = loaded.search(emb.embed(["doc 1 passage 0", "doc 2 passage 1"]), 20)
    assert all(p.doc != "doc2" and p.text != "doc 1 passage 0" for row in found for _, p in row)
    # A query equal to a passage finds it first (cosine 1).
    (best,) = loaded.search(emb.embed(["doc 1 rewritten"]), 1)
    assert best[0][1].text == "doc 1 rewritten" and best[0][0] > 0.999


def test_ivf_index_takes_adds_and_removes_in_place(tmp_path: Path) -> None:
    store, emb = IndexStore(tmp_path), HashEmbedder()
    m = store.build("big", _docs(FLAT_MAX // 3 + 10), emb.embed, emb.identity)
    assert m.kind == "ivf"
    store.remove("big", ["doc7"])
    m2 = store.add("big", {"fresh": ["a fresh passage"]}, emb.embed, emb.identity)
    assert (m2.kind, m2.nlist) == (m.kind, m.nlist) and m2.count == m.count - 3 + 1
    loaded = store.load("big")
    loaded.index.nprobe = loaded.index.nlist  # exhaustive: any stale vector would show
    hits = loaded.search(emb.embed(["doc 7 passage 0", "a fresh passage"]), 5)
    assert all(p.doc != "doc7" for _, p in hits[0])
    assert hits[1][0][1].text == "a fresh passage"


def test_corrupt_and_missing_indexes_are_refused_with_a_reason(tmp_path: Path) -> None:
    store, emb = IndexStore(tmp_path), HashEmbedder()
    with pytest.raises(NoIndexes):
        store.current_version("kb")
    m = store.build("kb", _docs(3), emb.embed, emb.identity)
    with pytest.raises(UnknownIndex, match=r"'other'.*kb"):
        store.current_version("other")
    with pytest.raises(EmbedderMismatch):
        store.add("kb", {"x": ["y"]}, emb.embed, "emb-another")
    path = tmp_path / "kb" / m.version / "index.faiss"
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(CorruptIndex, match=r"index\.faiss does not match"):
        store.load("kb")


def test_retriever_follows_the_current_version(tmp_path: Path) -> None:
    store, emb = IndexStore(tmp_path), HashEmbedder()
    store.build("kb", _docs(4), emb.embed, emb.identity)
    retriever = Retriever(store, lambda: emb)
    q = Query("kb", "doc 3 passage 2", 2)
    (first,) = retriever.retrieve([q])
    assert isinstance(first, Found) and first.passages[0].text == "doc 3 passage 2"
    store.remove("kb", ["doc3"])
    second, missing = retriever.retrieve([q, Query("nope", "x", 1)])
    assert isinstance(second, Found) and second.version != first.version
    assert all(p.doc != "doc3" for p in second.passages)
    assert isinstance(missing, UnknownIndex)
    other = Retriever(store, lambda: type("E", (HashEmbedder,), {"identity": "emb-x"})())
    (refused,) = other.retrieve([q])
    assert isinstance(refused, EmbedderMismatch)


def _passages(*texts: str) -> list[Passage]:
    return [Passage(i, "d", t) for i, t in enumerate(texts)]


def test_passages_go_after_the_system_prompt_within_the_budget() -> None:
    ps = _passages("alpha " * 50, "beta", "gamma")
    chosen = fit(ps, budget=len(block(_passages("beta", "gamma"))) + 12, count=len)
    assert [p.text for p in chosen] == ["beta", "gamma"]  # the long one is skipped
    chat = GenerateRequest(
        messages=[
            ChatMessage(role="system", content="You are terse."),
            ChatMessage(role="user", content="What is beta?"),
        ],
        retrieval=Retrieval(index="kb"),
    )
    assert query_text(chat) == "What is beta?"
    grounded = ground(chat, "kb", "000002-ab", chosen)
    assert grounded.messages is not None and len(grounded.messages) == 2
    assert grounded.messages[0].content.startswith("You are terse.\n\n")
    assert "[1] beta\n[2] gamma" in grounded.messages[0].content
    assert grounded.retrieval is None and grounded.grounding is not None
    assert grounded.grounding.passage_ids == [1, 2]
    bare = GenerateRequest(messages=[ChatMessage(role="user", content="hi")])
    bare_grounded = ground(bare, "kb", "v", chosen)
    assert bare_grounded.messages is not None and bare_grounded.messages[0].role == "system"
    prompt = ground(GenerateRequest(prompt="Q: beta?"), "kb", "v", chosen).prompt
    assert prompt is not None and prompt.endswith("\n\nQ: beta?") and "[1] beta" in prompt


def test_a_version_pruned_while_read_gives_way_to_the_current(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, emb = IndexStore(tmp_path), HashEmbedder()
    v1 = store.build("kb", _docs(2), emb.embed, emb.identity).version
    store.add("kb", {"a": ["one"]}, emb.embed, emb.identity)
    v3 = store.add("kb", {"b": ["two"]}, emb.embed, emb.identity).version
    assert not (tmp_path / "kb" / v1).exists()  # only the two newest versions are kept
    stale = iter([v1])  # a reader that read CURRENT just before two changes
    real = store.current_version
    monkeypatch.setattr(store, "current_version", lambda name: next(stale, None) or real(name))
    (found,) = Retriever(store, lambda: emb).retrieve([Query("kb", "two", 1)])
    assert isinstance(found, Found) and found.version == v3
    assert found.passages[0].text == "two"
