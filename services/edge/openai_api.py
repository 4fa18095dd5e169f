"""OpenAI-compatible request bodies and their mapping onto ``GenerateRequest``.

Every constraint the wire models enforce is repeated here, so a bad value is a 400 from
the request's validation (and shows in the OpenAPI schema), never an error further on. A
field the edge does not implement is refused (400 naming it), never ignored; OpenAI's
metadata fields (``user``, ``metadata``, ``store``) are accepted and not used, and an
explicit ``null`` means the field's default, as OpenAI allows.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from shared.messages import (
    MAX_STOP_STRINGS,
    SEED_MAX,
    ChatMessage,
    GenerateRequest,
    Priority,
    ReplyTarget,
    SamplingParams,
)

StopString = Annotated[str, Field(min_length=1, max_length=256)]
StopList = Annotated[list[StopString], Field(max_length=MAX_STOP_STRINGS)]
PromptList = Annotated[list[str], Field(min_length=1, max_length=1)]


class Strict(BaseModel):
    """A request object that refuses fields it does not define and reads ``null`` as
    "the default"."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if v is not None}
        return data


class StreamOptions(Strict):
    """OpenAI's ``stream_options``: whether the last streamed chunk carries the usage."""

    include_usage: bool = False


class _Common(Strict):
    model: str = Field(max_length=256)
    max_tokens: int | None = Field(None, ge=1, le=1_000_000)
    # Left out: the served model's default (its generation_config.json), as vLLM does.
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(
        None, ge=0, le=1_000_000, description="tokenwire extension; 0 disables"
    )
    seed: int | None = Field(None, ge=0, le=SEED_MAX)
    stop: StopString | StopList | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1, le=1, description="only one choice per request")
    user: str | None = Field(None, max_length=256, description="accepted, not used")
    metadata: dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]] = (
        Field(default_factory=dict, max_length=16, description="accepted, not used")
    )
    store: bool = Field(False, description="accepted, not used (nothing is stored)")
    priority: Priority = Field(Priority.INTERACTIVE, description="tokenwire extension")
    ignore_eos: bool = Field(False, description="tokenwire extension: run to max_tokens")
    min_tokens: int = Field(
        0,
        ge=0,
        le=1_000_000,
        description="vLLM extension: EOS and stop_token_ids cannot end the completion "
        "before this many tokens",
    )
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(
        None, gt=0.0, le=10.0, description="vLLM extension (Hugging Face's definition)"
    )
    logit_bias: dict[str, Annotated[float, Field(ge=-100, le=100)]] = Field(
        default_factory=dict, max_length=300, description="token id (as a string): bias"
    )
    stop_token_ids: list[Annotated[int, Field(ge=0)]] = Field(
        default_factory=list,
        max_length=64,
        description="vLLM extension: token ids that end the completion, as EOS does",
    )
    return_token_ids: bool = Field(
        False,
        description="vLLM extension: each choice (each streamed chunk's too) carries the ids "
        "of the tokens it holds (the completion's; prompt ids are not returned)",
    )
    resumable: bool = Field(
        False,
        description="tokenwire extension: keep generating when the client disconnects, "
        "so it can resume with GET /v1/requests/{id}/stream (otherwise a disconnect cancels)",
    )

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    def requested_logprobs(self) -> int | None:
        """How many alternatives to report with each token's log-probability; None: none."""
        return None

    @field_validator("logit_bias")
    @classmethod
    def _token_ids(cls, bias: dict[str, float]) -> dict[str, float]:
        if not all(k.isdigit() for k in bias):
            raise ValueError("logit_bias keys must be token ids (as strings of digits)")
        return bias

    def token_biases(self) -> dict[int, float]:
        return {int(k): v for k, v in self.logit_bias.items()}

    def request_input(self) -> dict[str, Any]:
        """The prompt or the messages, as GenerateRequest fields."""
        raise NotImplementedError

    def to_request(
        self,
        request_id: str,
        tenant: str,
        max_tokens: int,
        *,
        unfollowed_grace_s: float | None = None,
    ) -> GenerateRequest:
        """The wire request for this body, its seed fixed now. ``unfollowed_grace_s``
        applies unless the body is resumable: a request that a client disconnect cancels
        must also end when its edge dies (no edge is left to cancel it), so workers
        cancel it once nobody has followed its stream for that long."""
        grace = None if self.resumable else unfollowed_grace_s
        return GenerateRequest(
            request_id=request_id,
            tenant=tenant,
            priority=self.priority,
            model=self.model,
            sampling=self.sampling(max_tokens),
            stream=self.stream,
            reply=ReplyTarget(unfollowed_grace_s=grace),
            **self.request_input(),
        ).with_seed()

    def sampling(self, max_tokens: int) -> SamplingParams:
        stop = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            seed=self.seed,
            stop=stop,
            stop_token_ids=self.stop_token_ids,
            ignore_eos=self.ignore_eos,
            min_tokens=self.min_tokens,
            logprobs=self.requested_logprobs(),
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            repetition_penalty=self.repetition_penalty,
            logit_bias=self.token_biases(),
        )


class CompletionBody(_Common):
    """``POST /v1/completions``."""

    prompt: str | PromptList = Field(description="a string (or a list holding one)")
    logprobs: int | None = Field(
        None, ge=0, le=5, description="each token's log-probability and this many alternatives"
    )

    def requested_logprobs(self) -> int | None:
        return self.logprobs

    def prompt_text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]

    def request_input(self) -> dict[str, Any]:
        return {"prompt": self.prompt_text()}


class TextPart(Strict):
    """A text part of a chat message's content (the only kind of part served)."""

    type: Literal["text"]
    text: str


class ChatMessageBody(Strict):
    """One chat message as OpenAI clients send it; ``to_wire`` gives the wire message."""

    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]

    def to_wire(self) -> ChatMessage:
        parts = self.content
        text = parts if isinstance(parts, str) else "".join(p.text for p in parts)
        role = "system" if self.role == "developer" else self.role
        return ChatMessage(role=role, content=text)


class ChatBody(_Common):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessageBody] = Field(min_length=1, max_length=1024)
    max_completion_tokens: int | None = Field(None, ge=1, le=1_000_000)
    logprobs: bool = Field(False, description="each output token's log-probability")
    top_logprobs: int | None = Field(
        None, ge=0, le=20, description="with logprobs: this many alternatives per token"
    )

    @model_validator(mode="after")
    def _top_needs_logprobs(self) -> ChatBody:
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self

    def requested_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def wire_messages(self) -> list[ChatMessage]:
        return [m.to_wire() for m in self.messages]

    def request_input(self) -> dict[str, Any]:
        return {"messages": self.wire_messages()}
