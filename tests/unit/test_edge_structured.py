"""Structured output at the edge, on plain data: bodies to grammars, refusals, and a tool
call rendered whole and streamed (the streamed pieces add up to the whole)."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from pydantic import ValidationError

from services.edge.openai_api import ChatBody, CompletionBody
from services.edge.shapes import Shape
from services.edge.structured import split_call

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    },
    {"type": "function", "function": {"name": "noop"}},
]
MSGS = [{"role": "user", "content": "hi"}]


def chat(**kw: Any) -> ChatBody:
    return ChatBody.model_validate({"model": "m", "messages": MSGS, **kw})


def test_bodies_map_to_structures() -> None:
    assert chat().structure() is None
    assert chat(response_format={"type": "text"}).structure() is None
    obj = chat(response_format={"type": "json_object"}).structure()
    assert obj is not None and obj.kind == "json_object"
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "object"}}}
    done = CompletionBody.model_validate({"model": "m", "prompt": "x", "response_format": fmt})
    req = done.to_request("cmpl-1", "t", 4)
    assert req.sampling.structure is not None
    assert json.loads(req.sampling.structure.spec) == {"type": "object"}
    forced = chat(tools=TOOLS, tool_choice="required").structure()
    assert forced is not None and forced.kind == "json_schema"
    assert [o["properties"]["name"]["const"] for o in json.loads(forced.spec)["anyOf"]] == [
        "get_weather",
        "noop",
    ]
    named = chat(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "noop"}})
    spec = json.loads(named.structure().spec)  # type: ignore[union-attr]
    assert spec["properties"]["name"] == {"const": "noop"}
    auto = chat(tools=TOOLS).structure()
    assert auto is not None and auto.kind == "ebnf"
    assert chat(tools=TOOLS, tool_choice="none").structure() is None
    assert chat(tools=TOOLS).to_request("chatcmpl-1", "t", 4).tools == TOOLS


@pytest.mark.parametrize(
    ("patch", "param"),
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "frob"}},
                }
            },
            "response_format",
        ),
        ({"response_format": {"type": "yaml"}}, "response_format"),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
        ),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [TOOLS[1], TOOLS[1]]}, "tools"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 5}}}]},
            "tools",
        ),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages"),
        ({"messages": [{"role": "user", "content": "x", "tool_calls": []}]}, "messages"),
    ],
)
def test_bad_structures_are_refused_naming_the_field(patch: dict[str, Any], param: str) -> None:
    with pytest.raises(ValidationError) as err:
        chat(**patch)
    assert err.value.errors()[0]["loc"][0] == param


CALL = '{"name": "get_weather", "arguments": {"city": "Paris \\"x\\""}}'


def test_split_call() -> None:
    assert split_call(CALL) == ("get_weather", '{"city": "Paris \\"x\\""}')
    assert split_call(CALL[:-1]) is None
    assert split_call("hello") is None


def _sse_chunks(data: bytes) -> list[dict[str, Any]]:
    return [orjson.loads(line[6:]) for line in data.split(b"\n") if line.startswith(b"data: ")]


@pytest.mark.parametrize("cut", [1, 3, 7, 20])
def test_a_streamed_call_adds_up_to_the_whole(cut: int) -> None:
    rid = "chatcmpl-00000000aaaabbbbccccddddeeeeffff"
    whole = Shape(rid, "m", 0, tools=True).whole(CALL, {"finish_reason": "stop"})
    [call] = whole["choices"][0]["message"]["tool_calls"]
    assert whole["choices"][0]["finish_reason"] == "tool_calls"
    pieces = [CALL[i : i + cut] for i in range(0, len(CALL), cut)]
    shape = Shape(rid, "m", 0, tools=True)
    chunks: list[dict[str, Any]] = []
    for seq, piece in enumerate(pieces):
        ev: dict[str, Any] = {"seq": seq, "text": piece}
        if seq == len(pieces) - 1:
            ev["finish_reason"] = "stop"
        chunks += _sse_chunks(shape.sse(ev))
    deltas = [c["choices"][0]["delta"] for c in chunks]
    calls = [tc for d in deltas for tc in d.get("tool_calls", ())]
    assert calls[0]["id"] == call["id"] and calls[0]["function"]["name"] == "get_weather"
    assert deltas[0]["role"] == "assistant"
    args = "".join(tc["function"]["arguments"] for tc in calls)
    assert args == call["function"]["arguments"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_text_in_auto_streams_as_content() -> None:
    shape = Shape("chatcmpl-00000000aaaabbbbccccdddd", "m", 0, tools=True)
    out = _sse_chunks(shape.sse({"seq": 0, "text": "Hello"}))
    out += _sse_chunks(shape.sse({"seq": 1, "text": " {x}", "finish_reason": "stop"}))
    assert [c["choices"][0]["delta"].get("content") for c in out] == ["Hello", " {x}"]
    assert out[-1]["choices"][0]["finish_reason"] == "stop"
    plain = Shape("chatcmpl-00000000aaaabbbbccccdddd", "m", 0, tools=True)
    assert plain.whole("Hello", {"finish_reason": "stop"})["choices"][0]["message"] == {
        "role": "assistant",
        "content": "Hello",
    }
