"""The first vertical slice end to end: HTTP edge → Kafka → batcher → worker → Redis → edge,
and Kafka producers → … → the completions topic. Real Kafka, Redis and service processes."""

from __future__ import annotations

import asyncio
import base64
import time
from pathlib import Path

import httpx
import orjson
import pytest
import redis.asyncio as aioredis
import torch
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from transformers import AutoModelForCausalLM, AutoTokenizer

from services.bench.prometheus import scrape
from shared import token_stream
from shared.codec import decode, encode
from shared.messages import Completion, DeadLetter, GenerateRequest, ReplyTarget, SamplingParams
from tests.integration.harness import Stack

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

PROMPT = "The function returns a list of"


async def sse_events(
    client: httpx.AsyncClient, url: str, body: dict[str, object]
) -> list[tuple[int | None, str]]:
    """(id, data) of every SSE event of one streamed response."""
    events: list[tuple[int | None, str]] = []
    async with client.stream("POST", url, json=body) as resp:
        assert resp.status_code == 200, await resp.aread()
        assert resp.headers["content-type"].startswith("text/event-stream")
        event_id = None
        async for line in resp.aiter_lines():
            if line.startswith("id: "):
                event_id = int(line[4:])
            elif line.startswith("data: "):
                events.append((event_id, line[6:]))
                event_id = None
    return events


async def test_streamed_completion_arrives_as_contiguous_events(stack: Stack) -> None:
    body = {
        "model": "tokenwire-tiny",
        "prompt": PROMPT,
        "max_tokens": 24,
        "stream": True,
        "temperature": 0,
    }
    async with httpx.AsyncClient(timeout=60) as client:
        events = await sse_events(client, stack.url() + "/v1/completions", body)
    assert events[-1] == (None, "[DONE]")
    chunks = [(i, orjson.loads(d)) for i, d in events[:-1]]
    assert len(chunks) >= 3
    assert [i for i, _ in chunks] == list(range(len(chunks)))
    assert all(c["object"] == "text_completion" for _, c in chunks)
    assert chunks[-1][1]["choices"][0]["finish_reason"] in ("length", "stop")
    assert all(c["choices"][0]["finish_reason"] is None for _, c in chunks[:-1])


async def test_non_streamed_completion_returns_full_text(stack: Stack) -> None:
    body = {"model": "tokenwire-tiny", "prompt": PROMPT, "max_tokens": 24, "temperature": 0}
    async with httpx.AsyncClient(timeout=60) as client:
        whole = (await client.post(stack.url() + "/v1/completions", json=body)).json()
        events = await sse_events(client, stack.url() + "/v1/completions", {**body, "stream": True})
    streamed = "".join(orjson.loads(d)["choices"][0]["text"] for _, d in events[:-1])
    assert whole["object"] == "text_completion"
    assert whole["choices"][0]["text"] == streamed
    assert whole["usage"]["completion_tokens"] >= 1
    assert whole["usage"]["prompt_tokens"] >= 1


async def _completions(
    stack: Stack, request_ids: set[str], within_s: float = 60
) -> dict[str, Completion]:
    consumer = AIOKafkaConsumer(
        stack.names.completions,
        bootstrap_servers=stack.env["TW_KAFKA_BOOTSTRAP"],
        auto_offset_reset="earliest",
    )
    await consumer.start()
    got: dict[str, Completion] = {}
    try:
        deadline = time.monotonic() + within_s
        while request_ids - got.keys() and time.monotonic() < deadline:
            for msgs in (await consumer.getmany(timeout_ms=500)).values():
                for m in msgs:
                    c = decode(Completion, m.value)
                    got[c.request_id] = c
    finally:
        await consumer.stop()
    return got


async def _produce(stack: Stack, *values: bytes) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=stack.env["TW_KAFKA_BOOTSTRAP"], acks="all")
    await producer.start()
    try:
        for v in values:
            await producer.send_and_wait(stack.names.requests, v)
    finally:
        await producer.stop()


def _greedy_request(prompt: str, max_tokens: int, topic: str) -> GenerateRequest:
    return GenerateRequest(
        prompt=prompt,
        sampling=SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True),
        stream=False,
        reply=ReplyTarget(redis=True, kafka_topic=topic),
    )


def _generate(model_dir: str, reqs: list[GenerateRequest], n: int) -> dict[str, list[int]]:
    """Hugging Face ``generate``'s greedy ``n`` tokens for each request's prompt."""
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    out = {}
    for r in reqs:
        ids = tok(r.prompt, return_tensors="pt")["input_ids"]
        with torch.inference_mode():
            ref = model.generate(ids, max_new_tokens=n, do_sample=False, eos_token_id=[])
        out[r.request_id] = ref[0, ids.shape[1] :].tolist()
    return out


async def test_kafka_producer_gets_completion_identical_to_hf_generate(
    stack: Stack, model_dir: str
) -> None:
    prompts = ["The function returns", "Return a new list of", "If the argument is"]
    reqs = [_greedy_request(p, 20, stack.names.completions) for p in prompts]
    await _produce(stack, *(encode(r) for r in reqs))
    got = await _completions(stack, {r.request_id for r in reqs})
    assert got.keys() == {r.request_id for r in reqs}

    tok = AutoTokenizer.from_pretrained(model_dir)
    reference = _generate(model_dir, reqs, 20)
    for r in reqs:
        expected = reference[r.request_id]
        c = got[r.request_id]
        assert c.token_ids == expected, r.prompt
        assert c.text == tok.decode(expected, skip_special_tokens=True)
        assert c.finish_reason == "length"
        assert c.usage is not None and c.usage.completion_tokens == 20


async def test_bad_messages_go_to_dlq_and_serving_continues(stack: Stack) -> None:
    bad = [
        b"\xff\xfe not json",
        b'{"prompt": 5}',
        b'{"request_id": "bad-1", "prompt": "x", "sampling": {"max_tokens": -3}}',
        # Integers past 64 bits (a token id, a top_k sent as a numeric string): each
        # validated, and the wire's encoder failed on it where it was sent on.
        b'{"request_id": "bad-2", "prompt": "x", "sampling": {"logit_bias": {"%d": 1}}}' % 10**20,
        b'{"request_id": "bad-3", "prompt": "x", "sampling": {"top_k": "%d"}}' % 10**20,
    ]
    good = _greedy_request("The module", 4, stack.names.completions)
    await _produce(stack, *bad, encode(good))
    got = await _completions(stack, {good.request_id})
    assert good.request_id in got

    consumer = AIOKafkaConsumer(
        stack.names.requests_dlq,
        bootstrap_servers=stack.env["TW_KAFKA_BOOTSTRAP"],
        auto_offset_reset="earliest",
    )
    await consumer.start()
    letters: list[DeadLetter] = []
    try:
        deadline = time.monotonic() + 30
        while len(letters) < len(bad) and time.monotonic() < deadline:
            for msgs in (await consumer.getmany(timeout_ms=500)).values():
                letters += [decode(DeadLetter, m.value) for m in msgs]
    finally:
        await consumer.stop()
    assert sorted(base64.b64decode(dl.original_b64) for dl in letters) == sorted(bad)
    reasons = {base64.b64decode(dl.original_b64): dl for dl in letters}
    assert reasons[bad[0]].reason == "undecodable"
    assert reasons[bad[1]].reason == "invalid"
    assert "max_tokens" in reasons[bad[2]].detail
    assert reasons[bad[2]].request_id == "bad-1"
    assert reasons[bad[3]].reason == "invalid" and "logit_bias" in reasons[bad[3]].detail
    assert reasons[bad[4]].reason == "invalid" and "top_k" in reasons[bad[4]].detail
    assert all(dl.topic == stack.names.requests and dl.offset >= 0 for dl in letters)

    # A sender whose request id could be read gets an error event on its stream.
    client = aioredis.Redis.from_url(stack.env["TW_REDIS_URL"])
    try:
        for rid in ("bad-1", "bad-2", "bad-3"):
            events = [
                ev async for ev in token_stream.follow(client, stack.names, rid, idle_timeout_s=10)
            ]
            assert len(events) == 1 and events[0].error is not None
            assert events[0].error.code == "invalid"
    finally:
        await client.aclose()


async def test_draft_model_speculation_serves_the_tokens_of_plain_decoding(
    bare: Stack, model_dir: str, tmp_path: Path
) -> None:
    """A worker whose draft model (a folder: the tiny model's first three layers, loaded
    through ``from_pretrained``) guesses three tokens a step: its completions equal Hugging
    Face ``generate``'s, and its metrics count guesses kept and rejected."""
    draft_dir = tmp_path / "draft"
    draft = AutoModelForCausalLM.from_pretrained(model_dir)
    draft.model.layers = draft.model.layers[:3]
    draft.config.num_hidden_layers = 3
    if getattr(draft.config, "layer_types", None):
        draft.config.layer_types = draft.config.layer_types[:3]
    draft.save_pretrained(draft_dir)
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(draft_dir)
    bare.start("worker", TW_SPEC_DRAFT_MODEL=str(draft_dir), TW_SPEC_DRAFT_K="3")
    bare.start("batcher")
    await bare.wait_ready()
    prompts = ["The function returns", "Return a new list of", "If the argument is"]
    reqs = [_greedy_request(p, 24, bare.names.completions) for p in prompts]
    await _produce(bare, *(encode(r) for r in reqs))
    got = await _completions(bare, {r.request_id for r in reqs}, within_s=120)
    reference = _generate(model_dir, reqs, 24)
    for r in reqs:
        assert got[r.request_id].token_ids == reference[r.request_id], r.prompt
    await asyncio.sleep(1.5)  # a heartbeat refreshes the engine's counters
    metrics = await scrape(f"http://127.0.0.1:{bare.metrics_ports['worker']}/metrics")
    drafted = metrics["tw_spec_draft_tokens_total"]
    assert 0 < metrics["tw_spec_accepted_tokens_total"] < drafted
