"""Turns a request's prompt or chat messages into token ids, one rule wherever it is done:
the worker (transformers' tokenizer, what the model is fed), the edge and the batcher
(``PromptTokenizer``: the folder's ``tokenizer.json`` and chat template, without
transformers and so without torch). Unit tests check the two give the same ids."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from shared.messages import ChatMessage, GenerateRequest


class TemplateError(ValueError):
    """The chat template refused the conversation (e.g. an unsupported role)."""


class Prompts(Protocol):
    """What turning a request into ids needs of a tokenizer."""

    def render_chat(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> str: ...

    def encode(self, text: str, *, special_tokens: bool) -> list[int]: ...


def chat_token_ids(
    prompts: Prompts,
    messages: Sequence[ChatMessage],
    tools: list[dict[str, Any]] | None = None,
    chars: int | None = None,
) -> list[int]:
    """A conversation's token ids (of its rendered text's first ``chars`` characters);
    the template sees fields left unset as absent."""
    text = prompts.render_chat([m.model_dump(exclude_none=True) for m in messages], tools)
    return prompts.encode(text[:chars], special_tokens=False)


def request_token_ids(
    prompts: Prompts, req: GenerateRequest, chars: int | None = None
) -> list[int]:
    """The request's token ids; with ``chars``, of its rendered text's first ``chars``
    characters only (what routing needs), whose ids but the last few match the whole's."""
    if req.prompt_token_ids is not None:
        return list(req.prompt_token_ids)
    if req.messages is not None:
        return chat_token_ids(prompts, req.messages, req.tools, chars)
    return prompts.encode((req.prompt or "")[:chars], special_tokens=True)


class TransformersPrompts:
    """``Prompts`` over a transformers tokenizer."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def render_chat(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> str:
        text: str = self.tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, tokenize=False
        )
        return text

    def encode(self, text: str, *, special_tokens: bool) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=special_tokens)["input_ids"])


def prompt_token_ids(tokenizer: Any, req: GenerateRequest) -> list[int]:
    """The ids the model is fed, with transformers' ``tokenizer``; given ids are checked
    against its vocabulary."""
    if req.prompt_token_ids is not None:
        vocab = len(tokenizer)
        bad = next((t for t in req.prompt_token_ids if t >= vocab), None)
        if bad is not None:
            raise ValueError(f"prompt token id {bad} is outside the vocabulary (size {vocab})")
    return request_token_ids(TransformersPrompts(tokenizer), req)


class PromptTokenizer:
    """``Prompts`` from a model folder's ``tokenizer.json`` (the ``tokenizers`` library)
    and its Jinja chat template rendered as transformers renders it, for a fraction of
    transformers' start-up cost and memory (no torch)."""

    def __init__(self, tokenizer: Any, template: Any) -> None:
        self.tokenizer = tokenizer
        self.template = template  # None: the folder has no chat template

    @classmethod
    def load(cls, folder: str | Path) -> PromptTokenizer | None:
        """The folder's tokenizer, or None when it has no ``tokenizer.json``."""
        folder = Path(folder)
        if not (folder / "tokenizer.json").exists():
            return None
        from tokenizers import Tokenizer

        return cls(Tokenizer.from_file(str(folder / "tokenizer.json")), _chat_template(folder))

    def render_chat(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> str:
        if self.template is None:
            raise TemplateError("the model has no chat template")
        try:
            text: str = self.template.render(
                messages=messages, tools=tools, add_generation_prompt=True
            )
        except TemplateError:
            raise
        except Exception as exc:  # whatever the template's code raises: it refuses these
            raise TemplateError(f"{type(exc).__name__}: {exc}") from exc
        return text

    def encode(self, text: str, *, special_tokens: bool) -> list[int]:
        ids: list[int] = self.tokenizer.encode(text, add_special_tokens=special_tokens).ids
        return ids

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        text: str = self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)
        return text

    @property
    def vocab_size(self) -> int:
        size: int = self.tokenizer.get_vocab_size(with_added_tokens=True)
        return size


def load_prompts(folder: str | Path) -> Prompts:
    """A model folder's tokenizer for counting and routing: ``PromptTokenizer`` when the
    folder has a ``tokenizer.json``, else transformers' (which imports torch)."""
    fast = PromptTokenizer.load(folder)
    if fast is not None:
        return fast
    from transformers import AutoTokenizer

    from shared.logs import route_transformers_logs

    route_transformers_logs()
    return TransformersPrompts(AutoTokenizer.from_pretrained(folder, local_files_only=True))


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
