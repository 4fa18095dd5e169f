"""Sliding-window models served through the whole stack (edge → Kafka → batcher → worker →
Redis → edge): Mistral with a 16-token window, and Gemma 2 (sliding and full layers
interleaved: KV in layer groups), prompts several windows long, streamed over HTTP,
token-identical to ``generate`` (before the runner bounded its masks by the window, none of
the Mistral outputs was), and the heartbeat's KV bytes per token from the layers that keep
a token. The requests leave temperature out, and the model's generation_config.json says
0: greedy only if its defaults are applied."""

from __future__ import annotations

import random
from pathlib import Path

import httpx
import orjson
import pytest
import redis.asyncio as aioredis
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from shared.codec import decode
from shared.messages import WorkerHeartbeat
from tests.conftest import new_prefix
from tests.integration.conftest import ARTIFACTS
from tests.integration.harness import make_stack
from tests.integration.test_handoff import WORDS
from tests.tiny_models import ARCHS, WINDOW, build_tiny

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

NEW = 24


async def streamed_text(http: httpx.AsyncClient, url: str, model: str, prompt: str) -> str:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": NEW,
        "stream": True,
    }
    text = []
    async with http.stream("POST", f"{url}/v1/completions", json=body) as resp:
        assert resp.status_code == 200, await resp.aread()
        async for line in resp.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = orjson.loads(line[6:])
                text.append(chunk["choices"][0]["text"])
    return "".join(text)


@pytest.mark.parametrize("name", ["mistral-window", "gemma2"])
async def test_a_sliding_window_model_through_the_whole_stack(
    name: str, infra: dict[str, str], model_dir: str, tmp_path: Path
) -> None:
    folder = str(build_tiny(name, tmp_path / name, model_dir))
    gen_config = Path(folder) / "generation_config.json"
    gen_config.write_text(
        orjson.dumps({**orjson.loads(gen_config.read_text()), "temperature": 0.0}).decode()
    )
    rng = random.Random(31)
    prompts = [" ".join(rng.choices(WORDS, k=rng.randint(40, 100))) for _ in range(6)]
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    expected = []
    for p in prompts:
        ids = tok(p, return_tensors="pt")["input_ids"]
        assert ids.shape[1] > 2 * WINDOW
        with torch.inference_mode():
            out = model.generate(ids, max_new_tokens=NEW, do_sample=False, eos_token_id=[])
        expected.append(tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True))

    st = make_stack(new_prefix("window"), infra, folder, ARTIFACTS)
    await st.create_topics()
    for service in ("worker", "batcher", "edge"):
        st.start(service, TW_MODEL_NAME=name)
    try:
        await st.wait_ready()
        async with httpx.AsyncClient(timeout=120, headers=st.auth_headers()) as http:
            got = [await streamed_text(http, st.url(), name, p) for p in prompts]
        redis = aioredis.Redis.from_url(st.env["TW_REDIS_URL"])
        try:
            [wid] = await redis.zrange(st.names.workers_index, 0, -1)
            raw = await redis.get(st.names.heartbeat(wid.decode()))
        finally:
            await redis.aclose()
        st.check_alive()
    finally:
        st.stop_all()
    assert got == expected
    arch = ARCHS[name]
    kv_heads, head_dim, layers = arch.kv
    # Gemma 2's sliding layers hold a window per sequence, not a token per token.
    kept = arch.windows.count(None) if len(set(arch.windows)) > 1 else layers
    beat = decode(WorkerHeartbeat, raw)
    assert beat.kv_bytes_per_token == 2 * kept * kv_heads * head_dim * 4
