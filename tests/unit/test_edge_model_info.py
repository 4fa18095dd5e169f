"""The edge counts prompt tokens as the worker does (transformers' tokenizer and chat
template), without loading transformers."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from services.edge.model_info import ModelInfo
from shared.messages import ChatMessage, GenerateRequest, ToolCall, ToolCallFunction
from shared.model_config import served_context
from shared.prompts import TemplateError, prompt_token_ids

PROMPTS = ["", "The function returns", "héllo wörld <|user|> x\n\n  y", "a" * 3000]
CHATS = [
    [ChatMessage(role="user", content="Return the list")],
    [
        ChatMessage(role="system", content="be nice"),
        ChatMessage(role="user", content="What does <|assistant|> mean?"),
        ChatMessage(role="assistant", content="A marker."),
        ChatMessage(role="user", content="Thanks!\n"),
    ],
]


def test_counts_match_the_worker_tokenizer(model_dir: str) -> None:
    info = ModelInfo.load(model_dir)
    tok = AutoTokenizer.from_pretrained(model_dir)
    assert info.context == 2048
    for p in PROMPTS:
        assert info.count_prompt(p) == len(tok(p)["input_ids"])
    for msgs in CHATS:
        text = tok.apply_chat_template(
            [m.model_dump() for m in msgs], add_generation_prompt=True, tokenize=False
        )
        assert info.count_chat(msgs) == len(tok(text, add_special_tokens=False)["input_ids"])


def test_counts_with_tools_match_the_worker(model_dir: str) -> None:
    info = ModelInfo.load(model_dir)
    tok = AutoTokenizer.from_pretrained(model_dir)
    tools = [
        {
            "type": "function",
            "function": {
                "name": "f",
                "description": "<a> & 'b' é",
                "parameters": {"type": "object", "properties": {"x": {"type": "string"}}},
            },
        }
    ]
    call = ToolCall(id="c1", function=ToolCallFunction(name="f", arguments='{"x": "<y>"}'))
    msgs = [
        ChatMessage(role="user", content="hi"),
        ChatMessage(role="assistant", content="", tool_calls=[call]),
        ChatMessage(role="tool", content="done", tool_call_id="c1"),
    ]
    req = GenerateRequest(messages=msgs, tools=tools)
    ids = prompt_token_ids(tok, req)
    assert info.encode_chat(msgs, tools) == ids
    text = tok.decode(ids)
    assert '"description": "<a> & \'b\' é"' in text and "Result of c1: done" in text
    assert '{"name": "f", "arguments": {"x": "<y>"}}' in text


def test_template_errors_are_typed(model_dir: str) -> None:
    info = ModelInfo.load(model_dir)
    bad = ChatMessage.model_construct(role="robot", content="x")  # type: ignore[arg-type]
    with pytest.raises(TemplateError, match="unsupported chat role"):
        info.count_chat([bad])


def test_without_a_model_folder_counts_are_estimates() -> None:
    info = ModelInfo.load("")
    assert info.context is None
    assert info.count_prompt("abcdefgh") == 3
    assert info.count_chat([ChatMessage(role="user", content="abcd")]) == 2 + 4


def test_the_edge_admits_the_context_the_worker_serves() -> None:
    """Rope variants that change with the batch are served up to their original context;
    the edge refuses longer prompts up front, as the worker would (one rule for both)."""
    plain = {"max_position_embeddings": 4096}
    dynamic = {
        **plain,
        "rope_parameters": {"rope_type": "dynamic", "original_max_position_embeddings": 1024},
    }
    longrope = {
        **plain,
        "original_max_position_embeddings": 2048,
        "rope_scaling": {"type": "longrope"},
    }
    per_type = {
        **plain,
        "rope_parameters": {
            "full_attention": {"rope_type": "yarn", "original_max_position_embeddings": 512},
            "sliding_attention": {"rope_type": "default"},
        },
    }
    assert served_context(plain) == 4096
    assert served_context(dynamic) == 1024
    assert served_context(longrope) == 2048
    assert served_context(per_type) == 4096  # yarn does not change with the batch
    assert served_context({"n_positions": 1024}) == 1024
    assert served_context({}) is None
