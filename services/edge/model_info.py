"""What the edge knows about the served model: its context length and a tokenizer to count
prompt tokens, so over-long prompts get a 400 here instead of an error from a worker.

Loaded with ``tokenizers`` and the model's Jinja chat template (not ``transformers``): the
counts match the worker's tokenizer (a unit test checks) for a fraction of the start-up
cost. Without a model folder, token counts are estimated and lengths are not checked.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shared.messages import ChatMessage
from shared.model_config import served_context

# Above this many characters, tokenizing moves off the event loop.
INLINE_TOKENIZE_CHARS = 16_384


@dataclass
class ModelInfo:
    """The served model's context length and, when known, its tokenizer."""

    context: int | None = None
    tokenizer: Any = None
    chat_template: Any = None

    @classmethod
    def load(cls, model_dir: str) -> ModelInfo:
        if not model_dir:
            return cls()
        folder = Path(model_dir)
        config = json.loads((folder / "config.json").read_text())
        context = served_context(config)
        tokenizer = template = None
        if (folder / "tokenizer.json").exists():
            from tokenizers import Tokenizer

            tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
            template = _chat_template(folder)
        return cls(context, tokenizer, template)

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
        ids: list[int] = self.tokenizer.encode(prompt).ids
        return ids

    def encode_chat(
        self, messages: Sequence[ChatMessage], tools: list[dict[str, Any]] | None = None
    ) -> list[int]:
        """The token ids of a conversation rendered with the model's chat template."""
        msgs = [m.model_dump(exclude_none=True) for m in messages]
        text = self.chat_template.render(messages=msgs, tools=tools, add_generation_prompt=True)
        ids: list[int] = self.tokenizer.encode(text, add_special_tokens=False).ids
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        """Text of token ids (special tokens dropped, as in completions)."""
        text: str = self.tokenizer.decode(list(ids), skip_special_tokens=True)
        return text

    def token_text(self, token_id: int) -> str:
        """One token's text (its id as text when no tokenizer is configured)."""
        if self.tokenizer is None:
            return str(token_id)
        text: str = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return text

    @property
    def vocab_size(self) -> int:
        size: int = self.tokenizer.get_vocab_size(with_added_tokens=True)
        return size


def estimate_tokens(text: str) -> int:
    """A rough count for rate limiting when no tokenizer is configured."""
    return len(text) // 4 + 1


class TemplateError(ValueError):
    """The chat template refused the conversation (e.g. an unsupported role)."""


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent)


def _chat_template(folder: Path) -> Any:
    source = None
    if (folder / "chat_template.jinja").exists():
        source = (folder / "chat_template.jinja").read_text()
    elif (folder / "tokenizer_config.json").exists():
        source = json.loads((folder / "tokenizer_config.json").read_text()).get("chat_template")
    if not isinstance(source, str):
        return None
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    env.filters["tojson"] = _tojson  # as transformers renders it (not HTML-escaped)
    return env.from_string(source)
