"""What the edge knows about the served model: its context length and a tokenizer to count
prompt tokens, so over-long prompts get a 400 here instead of an error from a worker.

The tokenizer is ``shared.prompts.PromptTokenizer`` (not ``transformers``): the counts
match the worker's tokenizer (a unit test checks) for a fraction of the start-up cost.
Without a model folder, token counts are estimated and lengths are not checked.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shared.messages import ChatMessage
from shared.model_config import served_context
from shared.prompts import PromptTokenizer, chat_token_ids

# Above this many characters, tokenizing moves off the event loop.
INLINE_TOKENIZE_CHARS = 16_384


@dataclass
class ModelInfo:
    """The served model's context length and, when known, its tokenizer."""

    context: int | None = None
    tokenizer: PromptTokenizer | None = None

    @classmethod
    def load(cls, model_dir: str) -> ModelInfo:
        if not model_dir:
            return cls()
        config = json.loads((Path(model_dir) / "config.json").read_text())
        return cls(served_context(config), PromptTokenizer.load(model_dir))

    @property
    def chat_template(self) -> Any:
        return None if self.tokenizer is None else self.tokenizer.template

    def count_prompt(self, prompt: str) -> int:
        """Prompt tokens as the worker counts them (special tokens added)."""
        if self.tokenizer is None:
            return estimate_tokens(prompt)
        return len(self.encode_prompt(prompt))

    def count_chat(
        self, messages: Sequence[ChatMessage], tools: list[dict[str, Any]] | None = None
    ) -> int:
        """Tokens of the conversation (and its tools) rendered with the chat template."""
        if self.tokenizer is None or self.chat_template is None:
            extra = json.dumps(tools) if tools else ""
            return estimate_tokens("".join(m.content for m in messages) + extra) + 4 * len(messages)
        return len(self.encode_chat(messages, tools))

    def encode_prompt(self, prompt: str) -> list[int]:
        """A prompt's token ids as the worker computes them (special tokens added)."""
        assert self.tokenizer is not None
        return self.tokenizer.encode(prompt, special_tokens=True)

    def encode_chat(
        self, messages: Sequence[ChatMessage], tools: list[dict[str, Any]] | None = None
    ) -> list[int]:
        """The token ids of a conversation rendered with the model's chat template."""
        assert self.tokenizer is not None
        return chat_token_ids(self.tokenizer, messages, tools)

    def decode(self, ids: Sequence[int]) -> str:
        """Text of token ids (special tokens dropped, as in completions)."""
        assert self.tokenizer is not None
        return self.tokenizer.decode(ids)

    def token_text(self, token_id: int) -> str:
        """One token's text (its id as text when no tokenizer is configured)."""
        if self.tokenizer is None:
            return str(token_id)
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    @property
    def vocab_size(self) -> int:
        assert self.tokenizer is not None
        return self.tokenizer.vocab_size


def estimate_tokens(text: str) -> int:
    """A rough count for rate limiting when no tokenizer is configured."""
    return len(text) // 4 + 1
