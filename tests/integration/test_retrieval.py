"""Retrieval end to end, on real Kafka, Redis and FAISS: an index of a few thousand
templated facts, a question whose answer is in one of them, and the prompt the worker
runs (the request in the batch it consumes, whose token count equals the usage it
reports) holding that passage. The passage is then replaced while the stack serves, and
the same question gets the new text and never the old; then removed. Bad input: an
unknown index or one of another embedder is a 400 at the edge, and on the Kafka-only path
a dead letter with the reason and an error event, the batcher serving on."""

from __future__ import annotations

import asyncio
import os
import random
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import httpx
import numpy as np
import pytest
from transformers import AutoTokenizer

from shared.codec import decode, encode
from shared.embedding import load_embedder
from shared.messages import Batch, DeadLetter, GenerateRequest, Retrieval, SamplingParams
from shared.prompts import prompt_token_ids
from shared.retrieval.store import IndexStore
from tests.conftest import new_prefix
from tests.integration.conftest import ARTIFACTS
from tests.integration.harness import ROOT, Stack, StreamRecorder, make_stack, produce, read_topic

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]

QUESTION = "What is the access code of the Larkspur vault?"
OLD = "The access code of the Larkspur vault is 7341."
NEW = "The access code of the Larkspur vault was changed to 9052."
FACTS = 2000

_TEMPLATES = (
    "{a} was born in {c} in {y}.",
    "The river {a} flows into the {b} sea near {c}.",
    "{a} wrote a book about {b} in {y}.",
    "The town of {c} is famous for its {b} festival.",
    "{a} keeps {n} goats on a farm outside {c}.",
    "The {b} bridge in {c} is {n} metres long.",
)
_WORDS = ("amber", "basalt", "cedar", "dune", "ember", "fjord", "garnet", "heron", "iris")


def _facts(seed: int = 7) -> list[str]:
    rng = random.Random(seed)

    def name() -> str:
        return "".join(rng.choice("bcdfglmnprstv") + rng.choice("aeiou") for _ in range(3)).title()

    return [
        rng.choice(_TEMPLATES).format(
            a=name(),
            b=rng.choice(_WORDS),
            c=name(),
            y=rng.randint(1700, 2020),
            n=rng.randint(2, 900),
        )
        for _ in range(FACTS)
    ]


def _write_corpus(folder: Path) -> Path:
    """Fact files (each fact a paragraph, so a passage) and the vault's own document."""
    facts = _facts()
    for i in range(0, FACTS, 100):
        (folder / f"facts-{i // 100:02d}.txt").write_text("\n\n".join(facts[i : i + 100]))
    vault = folder / "vault.txt"
    vault.write_text(OLD)
    return vault


def _build_indexes(root: Path, corpus: Path) -> Path:
    """An index ``kb`` over the corpus, built with the serving embedder, and ``alien``,
    an index whose vectors claim another embedder; returns the vault's document."""
    from services.retrieval.cli import read_documents
    from shared.retrieval.chunking import ChunkSpec

    vault = _write_corpus(corpus)
    emb = load_embedder()
    store = IndexStore(root)
    manifest = store.build(
        "kb", read_documents([str(corpus)], ChunkSpec()), emb.embed, emb.identity
    )
    assert manifest.count == FACTS + 1
    alien = np.eye(1, 384, dtype=np.float32)
    store.build("alien", {"x": ["a passage"]}, lambda t: np.repeat(alien, len(t), 0), "emb-other")
    return vault


@pytest.fixture(scope="module")
async def rstack(
    infra: dict[str, str], model_dir: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[Stack, Path, Path]]:
    """A stack serving the indexes of a fresh folder (built while the services start):
    the stack, the index folder and the vault's document."""
    ARTIFACTS.mkdir(exist_ok=True)
    root = tmp_path_factory.mktemp("indexes")
    st = make_stack(new_prefix("retrieval"), infra, model_dir, ARTIFACTS)
    st.env["TW_INDEX_DIR"] = str(root)
    await st.create_topics()
    for kind in ("worker", "batcher", "edge"):
        st.start(kind)
    try:
        vault = await asyncio.to_thread(_build_indexes, root, tmp_path_factory.mktemp("corpus"))
        await st.wait_ready()
        yield st, root, vault
    finally:
        st.stop_all()


def _chat(question: str, index: str = "kb", top_k: int = 4) -> dict[str, object]:
    return {
        "model": "tokenwire-tiny",
        "messages": [
            {"role": "system", "content": "Answer from the passages."},
            {"role": "user", "content": question},
        ],
        "max_tokens": 4,
        "temperature": 0,
        "retrieval": {"index": index, "top_k": top_k},
    }


async def _ask(st: Stack, body: dict[str, object]) -> httpx.Response:
    async with httpx.AsyncClient(timeout=120, headers=st.auth_headers()) as client:
        return await client.post(st.url() + "/v1/chat/completions", json=body)


async def _batched(st: Stack, request_ids: Sequence[str]) -> dict[str, GenerateRequest]:
    """The requests as the worker consumed them: from the batches on the batches topic."""
    want = set(request_ids)

    def found(values: list[bytes]) -> bool:
        return want <= {r.request_id for v in values for r in decode(Batch, v).requests}

    values = await read_topic(st.env["TW_KAFKA_BOOTSTRAP"], st.names.batches, found, 30)
    reqs = {r.request_id: r for v in values for r in decode(Batch, v).requests}
    return {rid: reqs[rid] for rid in request_ids}


async def _worker_prompts(st: Stack, model_dir: str, n: int = 1) -> list[str]:
    """Ask the question ``n`` times at once; the system message each worker ran, checked
    to be the prompt it counted (usage.prompt_tokens)."""
    # Each its own max_tokens: identical requests in flight together share one generation
    # (miss coalescing), and this reads what the worker ran for each. The cache is still
    # looked up, so an answer grounded on an older index version would show (not batched).
    bodies_in = [{**_chat(QUESTION), "max_tokens": 4 + i} for i in range(n)]
    answers = await asyncio.gather(*(_ask(st, b) for b in bodies_in))
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
    bodies = [a.json() for a in answers]
    ran = await _batched(st, [b["id"] for b in bodies])
    tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    systems = []
    for b in bodies:
        req = ran[b["id"]]
        assert req.grounding is not None and req.grounding.index == "kb"
        assert req.retrieval is None and req.messages is not None
        assert b["usage"]["prompt_tokens"] == len(prompt_token_ids(tok, req))
        assert req.messages[0].content.startswith("Answer from the passages.\n\n")
        systems.append(req.messages[0].content)
    return systems


async def test_the_worker_runs_the_passage_and_then_its_replacement(
    rstack: tuple[Stack, Path, Path], model_dir: str
) -> None:
    st, root, vault = rstack
    (before,) = await _worker_prompts(st, model_dir)
    assert OLD in before
    v1 = IndexStore(root).current_version("kb")

    vault.write_text(NEW)  # the document's new version, through the CLI while serving
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "services.cli", "index", "add", "kb", str(vault),
        cwd=ROOT, env={**os.environ, "TW_INDEX_DIR": str(root)},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()
    assert b"index kb updated" in out
    assert IndexStore(root).current_version("kb") != v1
    after = await _worker_prompts(st, model_dir, n=3)
    assert all(NEW in s and OLD not in s for s in after)

    IndexStore(root).remove("kb", [str(vault)])
    gone = await _worker_prompts(st, model_dir, n=2)
    assert all("Larkspur" not in s for s in gone)


async def test_bad_retrieval_is_a_400_at_the_edge(rstack: tuple[Stack, Path, Path]) -> None:
    st = rstack[0]
    unknown = await _ask(st, _chat(QUESTION, index="nope"))
    assert unknown.status_code == 400
    assert unknown.json()["error"]["code"] == "unknown_index"
    assert "kb" in unknown.json()["error"]["message"]
    alien = await _ask(st, _chat(QUESTION, index="alien"))
    assert alien.status_code == 400 and alien.json()["error"]["code"] == "embedder_mismatch"
    bad = await _ask(st, {**_chat(QUESTION), "retrieval": {"index": "kb", "k": 3}})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "retrieval.k"


async def test_bad_retrieval_on_kafka_is_a_dead_letter_and_an_error_event(
    rstack: tuple[Stack, Path, Path],
) -> None:
    st = rstack[0]

    def req(index: str) -> GenerateRequest:
        return GenerateRequest(
            prompt=QUESTION,
            sampling=SamplingParams(max_tokens=3, temperature=0),
            retrieval=Retrieval(index=index, top_k=2),
        )

    bad = [req("nope"), req("alien")]
    good = req("kb")
    async with StreamRecorder(st.env["TW_REDIS_URL"], st.names) as rec:
        await produce(
            st.env["TW_KAFKA_BOOTSTRAP"],
            st.names.requests,
            [encode(r) for r in [*bad, good]],
            [r.request_id.encode() for r in [*bad, good]],
        )
        await rec.wait_finished({r.request_id for r in [*bad, good]}, within_s=90)
        errors = [rec.final_event(r.request_id).error for r in bad]
        assert [e.code if e else None for e in errors] == ["unknown_index", "embedder_mismatch"]
        assert rec.final_event(good.request_id).error is None
    ids = {r.request_id for r in bad}

    def lettered(values: list[bytes]) -> bool:
        return ids <= {decode(DeadLetter, v).request_id for v in values}

    values = await read_topic(st.env["TW_KAFKA_BOOTSTRAP"], st.names.requests_dlq, lettered, 30)
    reasons = {decode(DeadLetter, v).request_id: decode(DeadLetter, v).reason for v in values}
    assert reasons[bad[0].request_id] == "unknown_index"
    assert reasons[bad[1].request_id] == "embedder_mismatch"
    st.check_alive()
