"""Retrieval's admission at the edge (refusals as 400s with their codes, the passages'
token budget) and the batcher's grounding of a dispatch, on a real index folder with a
stand-in embedder."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from services.batcher.grounding import Grounder
from services.batcher.metrics import BatcherMetrics
from services.edge.errors import ApiError
from services.edge.retrieval import (
    PASSAGE_RESERVE,
    RetrievalBody,
    admit_retrieval,
    embedder_identity,
)
from shared.embedding import EmbedderError
from shared.messages import ChatMessage, GenerateRequest, Retrieval
from shared.retrieval.retriever import Retriever
from shared.retrieval.store import IndexStore, RetrievalError
from shared.settings import CommonSettings
from tests.unit.test_retrieval import HashEmbedder


def _settings(root: Path) -> CommonSettings:
    return CommonSettings.from_env({"TW_INDEX_DIR": str(root)})


def _admit(root: Path, spec: RetrievalBody, max_tokens: int = 200, asked: bool = True) -> int:
    coro = admit_retrieval(_settings(root), spec, 2048, 100, max_tokens, asked)
    return asyncio.run(coro)


def test_refusals_carry_their_codes(tmp_path: Path) -> None:
    with pytest.raises(ApiError) as none:
        _admit(tmp_path, RetrievalBody(index="kb"))
    assert none.value.status == 400 and none.value.code == "no_indexes"
    emb = HashEmbedder()
    IndexStore(tmp_path).build("kb", {"d": ["text"]}, emb.embed, "emb-elsewhere")
    with pytest.raises(ApiError) as unknown:
        _admit(tmp_path, RetrievalBody(index="other"))
    assert unknown.value.code == "unknown_index" and unknown.value.param == "retrieval.index"
    with pytest.raises(ApiError) as alien:
        _admit(tmp_path, RetrievalBody(index="kb"))
    assert alien.value.code == "embedder_mismatch"


def test_the_budget_is_the_room_the_context_leaves(tmp_path: Path) -> None:
    emb = HashEmbedder()
    IndexStore(tmp_path).build("kb", {"d": ["text"]}, emb.embed, embedder_identity(""))
    spec = RetrievalBody(index="kb")
    assert _admit(tmp_path, spec, max_tokens=200) == 200
    assert spec.budget_tokens == 2048 - 100 - 200
    capped = RetrievalBody(index="kb", budget_tokens=50)
    _admit(tmp_path, capped)
    assert capped.budget_tokens == 50
    # A chat request whose max_tokens took the whole rest gives some of it to passages:
    # PASSAGE_RESERVE tokens, or half the rest when that is less.
    default = RetrievalBody(index="kb")
    left = _admit(tmp_path, default, max_tokens=2048 - 100, asked=False)
    reserve = min(PASSAGE_RESERVE, (2048 - 100) // 2)
    assert default.budget_tokens == reserve and left == 2048 - 100 - reserve
    assert default.to_wire().budget_tokens == reserve


def test_the_batcher_grounds_a_dispatch_and_refuses_what_it_cannot(tmp_path: Path) -> None:
    emb = HashEmbedder()
    store = IndexStore(tmp_path)
    store.build(
        "kb", {"d": ["The vault code is 7341.", "Bridges: seven."]}, emb.embed, emb.identity
    )
    grounder = Grounder(_settings(tmp_path))
    grounder.retriever = Retriever(store, lambda: emb)

    def chat(index: str, budget: int = 1024) -> GenerateRequest:
        question = ChatMessage(role="user", content="The vault code is 7341.")
        spec = Retrieval(index=index, top_k=1, budget_tokens=budget)
        return GenerateRequest(messages=[question], retrieval=spec)

    ok, missing, tight = asyncio.run(grounder.ground([chat("kb"), chat("nope"), chat("kb", 5)]))
    assert isinstance(ok, GenerateRequest) and ok.messages is not None
    assert (
        ok.messages[0].role == "system" and "[1] The vault code is 7341." in ok.messages[0].content
    )
    assert ok.grounding is not None and ok.grounding.version == store.current_version("kb")
    assert isinstance(missing, RetrievalError) and missing.code == "unknown_index"
    assert isinstance(tight, GenerateRequest) and tight.grounding is not None
    assert tight.grounding.passage_ids == [] and tight.messages == chat("kb").messages


def test_the_batcher_counts_its_retrievals(tmp_path: Path) -> None:
    emb = HashEmbedder()
    store = IndexStore(tmp_path)
    store.build(
        "kb", {"d": ["The vault code is 7341.", "Bridges: seven."]}, emb.embed, emb.identity
    )
    metrics = BatcherMetrics()
    grounder = Grounder(_settings(tmp_path), metrics=metrics.retrieval)
    grounder.retriever = Retriever(store, lambda: emb)

    def sample(name: str, **labels: str) -> float:
        return metrics.registry.get_sample_value(name, labels) or 0.0

    def chat(index: str, top_k: int) -> GenerateRequest:
        question = ChatMessage(role="user", content="What is the vault code?")
        return GenerateRequest(
            messages=[question], retrieval=Retrieval(index=index, top_k=top_k, budget_tokens=1024)
        )

    asyncio.run(grounder.ground([chat("kb", 2), chat("kb", 1), chat("nope", 1)]))
    assert sample("tw_batcher_retrievals_total", index="kb", result="ok") == 2
    # A name with no index behind it is no label value of its own.
    assert sample("tw_batcher_retrievals_total", index="nope", result="unknown_index") == 0
    assert sample("tw_batcher_retrievals_total", index="-", result="unknown_index") == 1
    assert sample("tw_batcher_retrieval_passages_total", index="kb") == 3
    assert sample("tw_batcher_retrieval_seconds_count") == 1
    # The embedder failing refuses the whole dispatch, each request counted.
    grounder.retriever = Retriever(store, _broken_embedder)
    asyncio.run(grounder.ground([chat("kb", 1), chat("kb", 1)]))
    assert sample("tw_batcher_retrievals_total", index="kb", result="retrieval_error") == 2
    assert sample("tw_batcher_retrieval_passages_total", index="kb") == 3
    assert sample("tw_batcher_retrieval_seconds_count") == 2


def _broken_embedder() -> HashEmbedder:
    raise EmbedderError("no embedding model here")
