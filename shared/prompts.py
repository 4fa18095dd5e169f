"""Turns a request's prompt or chat messages into token ids with the model's tokenizer."""

from __future__ import annotations

from typing import Any

from shared.messages import GenerateRequest


def prompt_token_ids(tokenizer: Any, req: GenerateRequest) -> list[int]:
    if req.prompt_token_ids is not None:
        vocab = len(tokenizer)
        bad = next((t for t in req.prompt_token_ids if t >= vocab), None)
        if bad is not None:
            raise ValueError(f"prompt token id {bad} is outside the vocabulary (size {vocab})")
        return list(req.prompt_token_ids)
    if req.messages is not None:
        msgs = [m.model_dump(exclude_none=True) for m in req.messages]
        text = tokenizer.apply_chat_template(
            msgs, tools=req.tools, add_generation_prompt=True, tokenize=False
        )
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    return list(tokenizer(req.prompt or "")["input_ids"])
