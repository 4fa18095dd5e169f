"""OpenAI-compatible request bodies and their mapping onto ``GenerateRequest``.

Every constraint the wire models enforce is repeated here, so a bad value is a 400 from
the request's validation (and shows in the OpenAPI schema), never an error further on. A
field the edge does not implement is refused (400 naming it), never ignored; OpenAI's
metadata fields (``user``, ``metadata``, ``store``) are accepted and not used, and an
explicit ``null`` means the field's default, as OpenAI allows.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from services.edge.retrieval import RetrievalBody
from services.edge.structured import (
    FUNCTION_NAME,
    call_schema,
    check_structure,
    forced_call,
    text_or_call,
)
from shared.messages import (
    MAX_PROMPT_TOKEN_IDS,
    MAX_STOP_STRINGS,
    SEED_MAX,
    TOKEN_ID_MAX,
    ChatMessage,
    GenerateRequest,
    Priority,
    ReplyTarget,
    SamplingParams,
    Structure,
    TokenId,
    ToolCall,
    ToolCallFunction,
)

StopString = Annotated[str, Field(min_length=1, max_length=256)]
StopList = Annotated[list[StopString], Field(max_length=MAX_STOP_STRINGS)]
# A response holds at most this many choices (prompts times ``n``).
MAX_CHOICES = 64
MAX_PROMPTS = 16
TokenIds = Annotated[list[TokenId], Field(min_length=1, max_length=MAX_PROMPT_TOKEN_IDS)]
PromptList = Annotated[list[str], Field(min_length=1, max_length=MAX_PROMPTS)]
TokenIdsList = Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_PROMPTS)]


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


class TextFormat(Strict):
    """``response_format: {"type": "text"}``: unconstrained (the default)."""

    type: Literal["text"]


class JsonObjectFormat(Strict):
    """``response_format: {"type": "json_object"}``: any JSON object."""

    type: Literal["json_object"]


class JsonSchemaSpec(Strict):
    """The ``json_schema`` of a response format. The output always follows the schema
    (``strict`` false is served strictly too)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str = Field(pattern=FUNCTION_NAME)
    description: str | None = Field(None, max_length=4096)
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class JsonSchemaFormat(Strict):
    """``response_format: {"type": "json_schema", "json_schema": {...}}``."""

    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec


ResponseFormat = Annotated[
    TextFormat | JsonObjectFormat | JsonSchemaFormat, Field(discriminator="type")
]


class _Common(Strict):
    model: str = Field(max_length=256)
    max_tokens: int | None = Field(None, ge=1, le=1_000_000)
    # Left out: the served model's default (its generation_config.json), as vLLM does.
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(
        None, ge=0, le=1_000_000, description="tokenwire extension; 0 disables"
    )
    min_p: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description="vLLM extension: keep only tokens at least this times as likely as the "
        "most likely one (after temperature); 0 disables",
    )
    seed: int | None = Field(None, ge=0, le=SEED_MAX)
    stop: StopString | StopList | None = None
    include_stop_str_in_output: bool = Field(
        False,
        description="vLLM extension: keep the stop string (or stop token's text) that ended "
        "the output at its end",
    )
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(
        1,
        ge=1,
        le=16,
        description="choices per prompt: the prompt is prefilled once and its KV blocks "
        "shared (prefix cache); each choice samples with a seed of its own",
    )
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
    stop_token_ids: list[TokenId] = Field(
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
    cache: Literal["default", "no-store", "no-cache"] = Field(
        "default",
        description="tokenwire extension: the response cache; default: answer from it and "
        "store the answer; no-cache: generate afresh (and store); no-store: store nothing",
    )
    retrieval: RetrievalBody | None = Field(
        None, description="tokenwire extension: ground the prompt in an index's passages"
    )
    response_format: ResponseFormat | None = Field(
        None, description="text, any JSON object, or JSON following a schema (constrained)"
    )

    @field_validator("response_format")
    @classmethod
    def _compiles(cls, fmt: ResponseFormat | None) -> ResponseFormat | None:
        structure = _format_structure(fmt)
        if structure is not None:
            check_structure(structure)
        return fmt

    def structure(self) -> Structure | None:
        """The grammar the output follows, if any."""
        return _format_structure(self.response_format)

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
        # ASCII digits alone: str.isdigit admits others ("²") that int() refuses.
        if not all(k.isascii() and k.isdigit() and int(k) <= TOKEN_ID_MAX for k in bias):
            raise ValueError("logit_bias keys must be token ids (as strings of digits)")
        return bias

    def token_biases(self) -> dict[int, float]:
        return {int(k): v for k, v in self.logit_bias.items()}

    @model_validator(mode="after")
    def _choices(self) -> _Common:
        total = len(self.inputs()) * self.n
        if total > MAX_CHOICES:
            raise ValueError(f"prompts times n is {total}; a response holds at most {MAX_CHOICES}")
        if total > 1 and self.resumable:
            raise ValueError("a resumable request has one choice (n 1 and one prompt)")
        return self

    def inputs(self) -> list[dict[str, Any]]:
        """Each prompt (or the conversation) as GenerateRequest fields."""
        raise NotImplementedError

    @property
    def choices(self) -> int:
        return len(self.inputs()) * self.n

    def to_request(
        self,
        request_id: str,
        tenant: str,
        max_tokens: int,
        *,
        unfollowed_grace_s: float | None = None,
    ) -> GenerateRequest:
        """The wire request of a body with one choice (``ValueError`` for more)."""
        if self.choices != 1:
            raise ValueError("n and a list of prompts are served over HTTP only: one choice here")
        [req] = self.to_requests(
            request_id, tenant, [max_tokens], unfollowed_grace_s=unfollowed_grace_s
        )
        return req

    def to_requests(
        self,
        request_id: str,
        tenant: str,
        max_tokens: list[int],
        *,
        unfollowed_grace_s: float | None = None,
    ) -> list[GenerateRequest]:
        """The wire requests of this body, one per choice (index ``prompt * n + j``), their
        seeds fixed now; ``max_tokens`` per prompt. One choice keeps ``request_id``;
        several are ``<request_id>-<index>``, choice ``j`` of a prompt seeded with the
        client's seed plus ``j`` (so the choices differ), or from its own id.
        ``unfollowed_grace_s`` applies unless the body is resumable: a request that a
        client disconnect cancels must also end when its edge dies (no edge is left to
        cancel it), so workers cancel it once nobody has followed its stream for that
        long."""
        grace = None if self.resumable else unfollowed_grace_s
        inputs = self.inputs()
        single = len(inputs) * self.n == 1
        out = []
        for p, (fields, limit) in enumerate(zip(inputs, max_tokens, strict=True)):
            for j in range(self.n):
                index = p * self.n + j
                seed = None if self.seed is None else (self.seed + j) % (SEED_MAX + 1)
                req = GenerateRequest(
                    request_id=request_id if single else f"{request_id}-{index}",
                    tenant=tenant,
                    priority=self.priority,
                    model=self.model,
                    sampling=self.sampling(limit, seed),
                    stream=self.stream,
                    reply=ReplyTarget(unfollowed_grace_s=grace),
                    retrieval=self.retrieval.to_wire() if self.retrieval else None,
                    **fields,
                )
                out.append(req.with_seed())
        return out

    def sampling(self, max_tokens: int, seed: int | None = None) -> SamplingParams:
        stop = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=self.min_p,
            seed=seed,
            stop=stop,
            include_stop_str_in_output=self.include_stop_str_in_output,
            stop_token_ids=self.stop_token_ids,
            ignore_eos=self.ignore_eos,
            min_tokens=self.min_tokens,
            logprobs=self.requested_logprobs(),
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            repetition_penalty=self.repetition_penalty,
            logit_bias=self.token_biases(),
            structure=self.structure(),
        )


def _format_structure(fmt: ResponseFormat | None) -> Structure | None:
    if isinstance(fmt, JsonObjectFormat):
        return Structure(kind="json_object")
    if isinstance(fmt, JsonSchemaFormat):
        return Structure(kind="json_schema", spec=json.dumps(fmt.json_schema.schema_))
    return None


class CompletionBody(_Common):
    """``POST /v1/completions``."""

    prompt: str | PromptList | TokenIds | TokenIdsList = Field(
        description="a string, token ids, or a list of either (a choice per prompt and n)"
    )
    logprobs: int | None = Field(
        None, ge=0, le=5, description="each token's log-probability and this many alternatives"
    )
    echo: bool = Field(False, description="each choice's text begins with its prompt")

    @model_validator(mode="after")
    def _echo(self) -> CompletionBody:
        if self.echo and self.logprobs is not None:
            raise ValueError(
                "echo with logprobs asks for the prompt's log-probabilities, which are not "
                "computed; use one or the other"
            )
        if self.echo and self.resumable:
            raise ValueError("a resumed stream does not repeat the prompt: echo is not resumable")
        return self

    def requested_logprobs(self) -> int | None:
        return self.logprobs

    def inputs(self) -> list[dict[str, Any]]:
        prompt = self.prompt
        if isinstance(prompt, str):
            return [{"prompt": prompt}]
        if all(isinstance(x, int) for x in prompt):
            return [{"prompt_token_ids": prompt}]
        key = "prompt" if isinstance(prompt[0], str) else "prompt_token_ids"
        return [{key: x} for x in prompt]


class TextPart(Strict):
    """A text part of a chat message's content (the only kind of part served)."""

    type: Literal["text"]
    text: str


class CalledFunction(Strict):
    """The function of an assistant message's tool call."""

    name: str = Field(pattern=FUNCTION_NAME)
    arguments: str = Field(max_length=1_000_000, description="a JSON text")


class ToolCallBody(Strict):
    """A tool call of an assistant message, as the response gave it."""

    id: str = Field(min_length=1, max_length=128)
    type: Literal["function"]
    function: CalledFunction


class ChatMessageBody(Strict):
    """One chat message as OpenAI clients send it; ``to_wire`` gives the wire message. A
    ``tool`` message answers a call (``tool_call_id``); an assistant message may carry
    the ``tool_calls`` it made (its content may then be null)."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] = ""
    tool_calls: list[ToolCallBody] | None = Field(None, max_length=128)
    tool_call_id: str | None = Field(None, min_length=1, max_length=128)

    @model_validator(mode="after")
    def _roles(self) -> ChatMessageBody:
        if self.tool_calls is not None and self.role != "assistant":
            raise ValueError("only assistant messages carry tool_calls")
        if (self.role == "tool") != (self.tool_call_id is not None):
            raise ValueError("a tool message needs tool_call_id, and only a tool message has one")
        return self

    def to_wire(self) -> ChatMessage:
        parts = self.content
        text = parts if isinstance(parts, str) else "".join(p.text for p in parts)
        role = "system" if self.role == "developer" else self.role
        calls = None
        if self.tool_calls:
            calls = [
                ToolCall(id=c.id, function=ToolCallFunction(**c.function.model_dump()))
                for c in self.tool_calls
            ]
        return ChatMessage(
            role=role, content=text, tool_calls=calls, tool_call_id=self.tool_call_id
        )


class FunctionDef(Strict):
    """A function the model may call: its parameters are a JSON schema of the arguments."""

    name: str = Field(pattern=FUNCTION_NAME)
    description: str | None = Field(None, max_length=4096)
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDef(Strict):
    """One entry of ``tools``."""

    type: Literal["function"]
    function: FunctionDef


class ChosenFunction(Strict):
    name: str = Field(pattern=FUNCTION_NAME)


class NamedToolChoice(Strict):
    """``tool_choice`` naming the one function to call."""

    type: Literal["function"]
    function: ChosenFunction


class ChatBody(_Common):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessageBody] = Field(min_length=1, max_length=1024)
    max_completion_tokens: int | None = Field(None, ge=1, le=1_000_000)
    logprobs: bool = Field(False, description="each output token's log-probability")
    top_logprobs: int | None = Field(
        None, ge=0, le=20, description="with logprobs: this many alternatives per token"
    )
    tools: list[ToolDef] | None = Field(None, min_length=1, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = Field(
        None, description="default: auto with tools, none without"
    )
    parallel_tool_calls: bool = Field(
        True,
        description="whether a choice may make several tool calls; each choice makes at most "
        "one, which either value allows",
    )

    @field_validator("tools")
    @classmethod
    def _tools_compile(cls, tools: list[ToolDef] | None) -> list[ToolDef] | None:
        if tools:
            names = [t.function.name for t in tools]
            if len(set(names)) != len(names):
                raise ValueError("tool function names must be unique")
            check_structure(forced_call(call_schema(_functions(tools))))
        return tools

    @field_validator("tool_choice")
    @classmethod
    def _choice_declared(
        cls, choice: str | NamedToolChoice | None, info: ValidationInfo
    ) -> str | NamedToolChoice | None:
        tools = info.data.get("tools")
        if choice not in (None, "none") and not tools:
            raise ValueError("tool_choice needs tools")
        if isinstance(choice, NamedToolChoice):
            if choice.function.name not in {t.function.name for t in tools or ()}:
                raise ValueError(f"tool_choice names '{choice.function.name}', not a declared tool")
        return choice

    @model_validator(mode="after")
    def _one_constraint(self) -> ChatBody:
        if self.calls_tools and _format_structure(self.response_format) is not None:
            raise ValueError(
                "response_format cannot be combined with tools unless tool_choice is none"
            )
        return self

    @property
    def calls_tools(self) -> bool:
        """Whether the output may be a tool call."""
        return bool(self.tools) and self.tool_choice != "none"

    def structure(self) -> Structure | None:
        if not self.calls_tools or not self.tools:
            return super().structure()
        functions = _functions(self.tools)
        choice = self.tool_choice
        if isinstance(choice, NamedToolChoice):
            named = [f for f in functions if f[0] == choice.function.name]
            return forced_call(call_schema(named))
        if choice == "required":
            return forced_call(call_schema(functions))
        return text_or_call(call_schema(functions))

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

    def wire_tools(self) -> list[dict[str, Any]] | None:
        """The tool definitions the chat template renders (OpenAI's shape)."""
        if not self.tools:
            return None
        return [t.model_dump(exclude_none=True) for t in self.tools]

    def inputs(self) -> list[dict[str, Any]]:
        return [{"messages": self.wire_messages(), "tools": self.wire_tools()}]


def _functions(tools: list[ToolDef]) -> list[tuple[str, dict[str, Any]]]:
    return [(t.function.name, t.function.parameters or {}) for t in tools]
