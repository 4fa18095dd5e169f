"""Structured output through the real stack with the official client: json_object and a
strict json_schema (chat and completions, streamed and not), tools with each tool_choice
(the call parses into the declared function's arguments), the 400s for a schema that
does not compile and a tool_choice naming an undeclared function, and a bad grammar sent
straight to Kafka ending in an error from the worker."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import jsonschema_rs
import openai
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from shared.codec import decode, encode
from shared.messages import Completion, GenerateRequest, ReplyTarget, SamplingParams, Structure
from tests.integration.harness import Stack

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

MODEL = "tokenwire-tiny"
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "age": {"type": "integer", "minimum": 0, "maximum": 99},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
    },
    "required": ["name", "age", "tags"],
}
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
}
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "add two numbers",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}},
                "required": ["a"],
            },
        },
    },
]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]


def client(stack: Stack) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=stack.url("edge") + "/v1", api_key="x", max_retries=0)


async def test_json_schema_strict_and_json_object(stack: Stack) -> None:
    api = client(stack)
    fmt: Any = {
        "type": "json_schema",
        "json_schema": {"name": "person", "schema": PERSON, "strict": True},
    }
    chat = await api.chat.completions.create(
        model=MODEL, messages=ASK, response_format=fmt, temperature=0, max_tokens=120
    )
    assert chat.choices[0].finish_reason == "stop"
    jsonschema_rs.validate(PERSON, json.loads(chat.choices[0].message.content or ""))

    parts = []
    stream = await api.chat.completions.create(
        model=MODEL, messages=ASK, response_format=fmt, temperature=0, max_tokens=120, stream=True
    )
    async for chunk in stream:
        if chunk.choices:
            parts.append(chunk.choices[0].delta.content or "")
    assert "".join(parts) == chat.choices[0].message.content

    text = await api.completions.create(
        model=MODEL,
        prompt="A person as JSON:",
        max_tokens=120,
        temperature=0,
        extra_body={"response_format": fmt},
    )
    jsonschema_rs.validate(PERSON, json.loads(text.choices[0].text))

    obj = await api.chat.completions.create(
        model=MODEL,
        messages=ASK,
        response_format={"type": "json_object"},
        temperature=1.0,
        seed=3,
        max_tokens=64,
    )
    content = obj.choices[0].message.content or ""
    assert content.startswith("{")
    if obj.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(content), dict)
    short = await api.chat.completions.create(
        model=MODEL, messages=ASK, response_format=fmt, temperature=0, max_tokens=3
    )
    assert short.choices[0].finish_reason == "length"


def _assemble(chunks: list[dict[str, Any]]) -> tuple[str, str, str, str]:
    """(call id, name, arguments, finish_reason) assembled from a streamed tool call's
    chunks (as JSON objects)."""
    call_id = name = finish = ""
    arguments = []
    for chunk in chunks:
        for choice in chunk.get("choices") or ():
            for tc in choice["delta"].get("tool_calls") or ():
                assert tc["index"] == 0
                call_id = tc.get("id") or call_id
                fn = tc.get("function") or {}
                name = fn.get("name") or name
                if fn.get("arguments"):
                    arguments.append(fn["arguments"])
            finish = choice.get("finish_reason") or finish
    return call_id, name, "".join(arguments), finish


async def _streamed_call(api: openai.AsyncOpenAI, **kw: Any) -> tuple[str, tuple[str, ...]]:
    """The response id, and (call id, name, arguments, finish_reason) of a streamed call."""
    stream = await api.chat.completions.create(model=MODEL, messages=ASK, stream=True, **kw)
    chunks = [chunk.model_dump() async for chunk in stream]
    return chunks[0]["id"], _assemble(chunks)


async def _resumed_call(stack: Stack, rid: str) -> tuple[str, ...]:
    """The call of request ``rid`` as a resume from its first event renders it."""
    async with httpx.AsyncClient(timeout=30) as http:
        r = await http.get(stack.url("edge") + f"/v1/requests/{rid}/stream")
    data = [line[6:] for line in r.text.splitlines() if line.startswith("data: {")]
    return _assemble([json.loads(d) for d in data])


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "add"}}])
async def test_forced_tool_calls_parse_into_the_declared_arguments(
    stack: Stack, choice: Any
) -> None:
    api = client(stack)
    kw: Any = {"tools": TOOLS, "tool_choice": choice, "temperature": 0, "max_tokens": 80}
    whole = await api.chat.completions.create(model=MODEL, messages=ASK, **kw)
    first = whole.choices[0]
    assert first.finish_reason == "tool_calls"
    assert first.message.content is None
    [call] = first.message.tool_calls or []
    assert call.type == "function" and call.id.startswith("call_")
    fn = call.function
    if isinstance(choice, dict):
        assert fn.name == "add"
    jsonschema_rs.validate(PARAMS[fn.name], json.loads(fn.arguments))
    rid, (streamed_id, *streamed) = await _streamed_call(api, **kw)
    assert streamed_id.startswith("call_") and streamed_id != call.id  # one per request
    assert streamed == [fn.name, fn.arguments, "tool_calls"]
    # A resumed stream renders the call as the live one did (any edge: it is recorded).
    assert await _resumed_call(stack, rid) == (streamed_id, *streamed)
    two = await api.chat.completions.create(model=MODEL, messages=ASK, n=2, **kw)
    calls = [(c.message.tool_calls or [])[0] for c in two.choices]
    assert [c.function.arguments for c in calls] == [fn.arguments] * 2  # greedy
    assert len({c.id for c in calls}) == 2  # one id per choice


async def test_auto_and_none_and_a_conversation_with_tool_results(stack: Stack) -> None:
    api = client(stack)
    history: list[Any] = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    ]
    for choice in ("auto", "none"):
        kw: Any = {"tools": TOOLS, "tool_choice": choice, "temperature": 0, "max_tokens": 40}
        out = await api.chat.completions.create(model=MODEL, messages=history, **kw)
        first = out.choices[0]
        if first.message.tool_calls:  # auto chose a call: it must be a declared one
            assert choice == "auto" and first.finish_reason == "tool_calls"
            fn = first.message.tool_calls[0].function
            jsonschema_rs.validate(PARAMS[fn.name], json.loads(fn.arguments))
        else:
            assert first.finish_reason in ("stop", "length")
            assert not (first.message.content or "").startswith("{") or choice == "none"
        # The tool definitions and the call's result are in the prompt.
        plain = await api.chat.completions.create(
            model=MODEL, messages=ASK, temperature=0, max_tokens=1
        )
        assert out.usage and plain.usage
        assert out.usage.prompt_tokens > plain.usage.prompt_tokens + 40


async def test_bad_structures_are_400(stack: Stack) -> None:
    api = client(stack)
    bad_schema: Any = {
        "type": "json_schema",
        "json_schema": {"name": "x", "schema": {"type": "frob"}},
    }
    with pytest.raises(openai.BadRequestError) as err:
        await api.chat.completions.create(model=MODEL, messages=ASK, response_format=bad_schema)
    assert err.value.body["param"] == "response_format"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as err:
        await api.chat.completions.create(
            model=MODEL,
            messages=ASK,
            tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "launch"}},
        )
    assert err.value.body["param"] == "tool_choice"  # type: ignore[index]
    assert "launch" in err.value.body["message"]  # type: ignore[index]
    bad_tool: Any = [{"type": "function", "function": {"name": "f", "parameters": {"type": 5}}}]
    with pytest.raises(openai.BadRequestError) as err:
        await api.chat.completions.create(model=MODEL, messages=ASK, tools=bad_tool)
    assert err.value.body["param"] == "tools"  # type: ignore[index]


async def test_a_grammar_the_worker_cannot_compile_ends_in_an_error_not_a_crash(
    stack: Stack,
) -> None:
    """A Kafka producer bypasses the edge's check: the worker answers that request with an
    error and serves the next one."""
    topic = stack.names.completions

    def request(spec: str) -> GenerateRequest:
        return GenerateRequest(
            prompt="A person as JSON:",
            sampling=SamplingParams(
                max_tokens=120, temperature=0, structure=Structure(kind="json_schema", spec=spec)
            ),
            stream=False,
            reply=ReplyTarget(kafka_topic=topic),
        )

    bad, good = request('{"type": "frob"}'), request(json.dumps(PERSON))
    producer = AIOKafkaProducer(bootstrap_servers=stack.env["TW_KAFKA_BOOTSTRAP"], acks="all")
    await producer.start()
    try:
        for r in (bad, good):
            await producer.send_and_wait(stack.names.requests, encode(r), key=r.request_id.encode())
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=stack.env["TW_KAFKA_BOOTSTRAP"], auto_offset_reset="earliest"
    )
    await consumer.start()
    got: dict[str, Completion] = {}
    try:
        deadline = time.monotonic() + 90
        while {bad.request_id, good.request_id} - got.keys() and time.monotonic() < deadline:
            for msgs in (await consumer.getmany(timeout_ms=500)).values():
                for m in msgs:
                    c = decode(Completion, m.value)
                    got[c.request_id] = c
    finally:
        await consumer.stop()
    failed = got[bad.request_id]
    assert failed.finish_reason == "error" and failed.error is not None
    assert "frob" in failed.error.message
    assert got[good.request_id].finish_reason == "stop"
    jsonschema_rs.validate(PERSON, json.loads(got[good.request_id].text))
