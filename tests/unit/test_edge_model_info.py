"""The edge counts prompt tokens as the worker does (transformers' tokenizer and chat
template), without loading transformers."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from services.edge.model_info import ModelInfo, TemplateError
from shared.messages import ChatMessage

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


def test_template_errors_are_typed(model_dir: str) -> None:
    info = ModelInfo.load(model_dir)
    bad = ChatMessage.model_construct(role="tool", content="x")  # type: ignore[arg-type]
    with pytest.raises(TemplateError, match="unsupported chat role"):
        info.count_chat([bad])


def test_without_a_model_folder_counts_are_estimates() -> None:
    info = ModelInfo.load("")
    assert info.context is None
    assert info.count_prompt("abcdefgh") == 3
    assert info.count_chat([ChatMessage(role="user", content="abcd")]) == 2 + 4
