"""Pydantic models of every message on the wire.

Producers in any language publish JSON that validates against these models; the JSON Schema
exported by ``tokenwire schema`` into ``shared/schemas/`` is generated from them.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

RequestId = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:-]+$")]
TenantId = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$")]

MAX_STOP_STRINGS = 8
MAX_PROMPT_TOKEN_IDS = 1 << 20
SEED_MAX = INT64_MAX = 2**63 - 1
# Token ids are 32-bit in every tokenizer; the bound also keeps an id within the 64 bits the
# wire's encoder writes (a larger one failed to encode where it was sent on).
TOKEN_ID_MAX = 2**31 - 1
TokenId = Annotated[int, Field(ge=0, le=TOKEN_ID_MAX)]


def new_request_id() -> str:
    """A fresh request id (``req-`` + 32 hex digits)."""
    return f"req-{uuid.uuid4().hex}"


def seed_of(request_id: str) -> int:
    """The 63-bit seed a request without one samples with, derived from its id: every
    consumption of the request (a redelivery, a takeover after a crash) draws the same
    tokens, so a resumed stream never splices two different samples."""
    digest = hashlib.blake2b(request_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") & SEED_MAX


class Wire(BaseModel):
    """Base of all wire messages: unknown fields are rejected (a typo never passes silently)."""

    model_config = ConfigDict(extra="forbid", strict=False, frozen=False)


class Priority(StrEnum):
    """A request's class: interactive requests are served before bulk ones."""

    # Declared in the order served: ``rank`` counts from here.
    INTERACTIVE = "interactive"
    BULK = "bulk"

    @property
    def rank(self) -> int:
        """0 for the class served first: the batcher's queue classes and the engine's
        scheduling order both count this way (lower first)."""
        return _PRIORITY_RANK[self]


_PRIORITY_RANK = {p: i for i, p in enumerate(Priority)}


class FinishReason(StrEnum):
    """Why a stream ended."""

    STOP = "stop"  # EOS, a stop string or a stop token id
    LENGTH = "length"  # max_tokens or the model's context
    CANCELLED = "cancelled"
    ERROR = "error"


class ToolCallFunction(Wire):
    """The function an assistant message called: its name and arguments (a JSON text)."""

    name: str = Field(min_length=1, max_length=64)
    arguments: str = Field(max_length=1_000_000)


class ToolCall(Wire):
    """A call an assistant message made, as OpenAI's ``tool_calls`` entries."""

    id: str = Field(min_length=1, max_length=128)
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatMessage(Wire):
    """One message of a conversation. A ``tool`` message answers the assistant's call
    ``tool_call_id``; an assistant message may carry the ``tool_calls`` it made."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str = Field(max_length=1_000_000)
    tool_calls: list[ToolCall] | None = Field(None, max_length=128)
    tool_call_id: str | None = Field(None, max_length=128)

    @model_validator(mode="after")
    def _tool_fields(self) -> ChatMessage:
        if self.tool_calls is not None and self.role != "assistant":
            raise ValueError("only assistant messages carry tool_calls")
        if (self.role == "tool") != (self.tool_call_id is not None):
            raise ValueError("a tool message needs tool_call_id, and only a tool message has one")
        return self


class Structure(Wire):
    """A grammar the output must follow (constrained decoding): any JSON object, a JSON
    schema (``spec``: its JSON text), a regular expression or an EBNF grammar (xgrammar's
    dialect). The output ends only once the grammar is complete."""

    kind: Literal["json_object", "json_schema", "regex", "ebnf"]
    spec: str = Field("", max_length=1_000_000)

    @model_validator(mode="after")
    def _spec_given(self) -> Structure:
        if self.kind != "json_object" and not self.spec:
            raise ValueError(f"a {self.kind} structure needs a spec")
        return self


MODEL_DEFAULT = "left out: the model's default (its generation_config.json), else "


class SamplingParams(Wire):
    """How to pick tokens. ``temperature == 0`` means greedy. A sampling field left out
    takes the served model's default."""

    max_tokens: int = Field(16, ge=1, le=1_000_000)
    temperature: float | None = Field(None, ge=0.0, le=100.0, description=MODEL_DEFAULT + "1.0")
    top_p: float | None = Field(None, gt=0.0, le=1.0, description=MODEL_DEFAULT + "1.0")
    top_k: int | None = Field(
        None, ge=0, le=1_000_000, description=MODEL_DEFAULT + "0; 0 disables top-k"
    )
    min_p: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description=MODEL_DEFAULT + "0.0; keep only tokens at least this times as likely as "
        "the most likely one (after temperature); 0 disables min-p",
    )
    seed: int | None = Field(None, ge=0, le=SEED_MAX)
    stop: list[Annotated[str, Field(min_length=1, max_length=256)]] = Field(
        default_factory=list, max_length=MAX_STOP_STRINGS
    )
    stop_token_ids: list[TokenId] = Field(default_factory=list, max_length=64)
    ignore_eos: bool = False
    include_stop_str_in_output: bool = Field(
        False,
        description="keep the stop string (or stop token's text) that ended the output at "
        "its end, instead of cutting it",
    )
    min_tokens: int = Field(
        0,
        ge=0,
        le=1_000_000,
        description="EOS and stop_token_ids cannot end the request before this many tokens "
        "(stop strings still can)",
    )
    presence_penalty: float = Field(
        0.0, ge=-2.0, le=2.0, description="subtracted from each token already generated"
    )
    frequency_penalty: float = Field(
        0.0, ge=-2.0, le=2.0, description="subtracted per occurrence in the output so far"
    )
    repetition_penalty: float | None = Field(
        None,
        gt=0.0,
        le=10.0,
        description=MODEL_DEFAULT + "1.0; tokens of the prompt and output: positive logits "
        "divided by it, negative multiplied (as Hugging Face)",
    )
    logit_bias: dict[TokenId, Annotated[float, Field(ge=-100, le=100)]] = Field(
        default_factory=dict, max_length=300, description="token id: added to its logit"
    )
    logprobs: int | None = Field(
        None,
        ge=0,
        le=20,
        description="report each token's log-probability and this many most likely "
        "alternatives (None: no log-probabilities)",
    )
    structure: Structure | None = Field(
        None, description="constrain the output to a grammar (None: unconstrained)"
    )

    @model_validator(mode="after")
    def _min_within_max(self) -> SamplingParams:
        if self.min_tokens > self.max_tokens:
            raise ValueError("min_tokens must not exceed max_tokens")
        return self


class ReplyTarget(Wire):
    """Where results go: token events on the request's Redis channel (default), and/or one
    ``Completion`` record on a Kafka topic for consumers that do not stream."""

    redis: bool = True
    kafka_topic: str | None = Field(
        None, min_length=1, max_length=249, pattern=r"^[A-Za-z0-9._-]+$"
    )
    unfollowed_grace_s: float | None = Field(
        None,
        gt=0,
        le=3600,
        description="cancel the request once no client has followed its token stream for "
        "this long (edges set it for streams that a disconnect cancels)",
    )


class CacheResult(StrEnum):
    """Where an answer came from: generated (``miss``), or replayed from the exact or the
    semantic response cache."""

    MISS = "miss"
    EXACT = "exact"
    SEMANTIC = "semantic"


class CacheMode(StrEnum):
    """A request's ``cache`` field: ``default`` looks up and stores,
    ``no-cache`` skips the lookup but stores the fresh answer, ``no-store`` looks up but
    stores nothing."""

    DEFAULT = "default"
    NO_STORE = "no-store"
    NO_CACHE = "no-cache"

    @property
    def looks_up(self) -> bool:
        return self is not CacheMode.NO_CACHE

    @property
    def stores(self) -> bool:
        return self is not CacheMode.NO_STORE


class CacheStore(Wire):
    """Set by an edge after a cache miss: the worker stores the finished request's events
    (finished by stop or length) as exact-cache entry ``digest`` of the request tenant's
    scope (or the shared one) at cache generation ``generation``, for ``ttl_s`` seconds."""

    digest: str = Field(pattern=r"^[0-9a-f]{16,128}$")
    generation: int = Field(0, ge=0, le=INT64_MAX)
    ttl_s: int = Field(ge=1, le=90 * 86400)
    shared: bool = Field(False, description="the scope every tenant shares, not the tenant's")
    retrieval_version: str | None = Field(
        None,
        max_length=64,
        description="the retrieval index version in the key: stored only if the request was "
        "grounded on that version",
    )


class Retrieval(Wire):
    """Ground the prompt in a knowledge-base index: the batcher embeds the last user
    message (or the prompt), takes the ``top_k`` nearest passages that fit
    ``budget_tokens`` and places them after the system prompt. An unknown index, or one
    built with another embedder, fails the request (error event, dead letter)."""

    index: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$")
    top_k: int = Field(4, ge=1, le=50)
    budget_tokens: int = Field(
        1024,
        ge=0,
        le=1_000_000,
        description="most prompt tokens the passages may add; the producer keeps prompt + "
        "this + max_tokens within the model's context (edges do)",
    )


class Grounding(Wire):
    """The retrieval a batcher applied to a request: the index version searched and the
    passages placed in the prompt (best first)."""

    index: str = Field(max_length=64)
    version: str = Field(max_length=64)
    passage_ids: list[Annotated[int, Field(ge=0, le=INT64_MAX)]] = Field(
        default_factory=list, max_length=50
    )


class GenerateRequest(Wire):
    """A generation request, as published to the requests topic (keyed by request id)."""

    v: Literal[1] = 1
    request_id: RequestId = Field(default_factory=new_request_id)
    created_at: float = Field(default_factory=time.time, description="unix seconds")
    tenant: TenantId = "default"
    priority: Priority = Priority.INTERACTIVE
    model: str | None = Field(None, max_length=256)
    prompt: str | None = Field(None, max_length=4_000_000)
    messages: list[ChatMessage] | None = Field(None, min_length=1, max_length=1024)
    prompt_token_ids: list[TokenId] | None = Field(
        None,
        min_length=1,
        max_length=MAX_PROMPT_TOKEN_IDS,
        description="the prompt as token ids of the served model's vocabulary",
    )
    tools: list[dict[str, Any]] | None = Field(
        None,
        max_length=128,
        description="tool definitions (OpenAI's shape) the chat template renders into the prompt",
    )
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    stream: bool = True
    reply: ReplyTarget = Field(default_factory=ReplyTarget)
    deadline: float | None = Field(None, description="unix seconds; past it the request fails")
    retrieval: Retrieval | None = Field(
        None, description="passages to retrieve into the prompt (cleared once applied)"
    )
    grounding: Grounding | None = Field(None, description="the retrieval applied (batcher)")
    cache: CacheMode | None = Field(
        None,
        description="the exact response cache for a request sent straight to Kafka, looked "
        "up by the batcher (edges look requests up before queueing them and leave it unset)",
    )
    cache_store: CacheStore | None = Field(
        None, description="store the answer in the response cache (set by edges and batchers)"
    )

    @model_validator(mode="after")
    def _one_input(self) -> GenerateRequest:
        given = [self.prompt, self.messages, self.prompt_token_ids]
        if sum(x is not None for x in given) != 1:
            raise ValueError(
                "exactly one of 'prompt', 'messages' and 'prompt_token_ids' must be given"
            )
        if self.prompt_token_ids is not None and self.retrieval is not None:
            raise ValueError("retrieval needs a text prompt or messages, not token ids")
        return self

    @property
    def prompt_chars(self) -> int:
        """Characters of the prompt or of all message contents (token ids: their count)."""
        if self.messages is not None:
            return sum(len(m.content) for m in self.messages)
        if self.prompt_token_ids is not None:
            return len(self.prompt_token_ids)
        return len(self.prompt or "")

    def with_seed(self) -> GenerateRequest:
        """This request with a seed set (``seed_of`` its id if the producer gave none)."""
        if self.sampling.seed is not None:
            return self
        sampling = self.sampling.model_copy(update={"seed": seed_of(self.request_id)})
        return self.model_copy(update={"sampling": sampling})


class Usage(Wire):
    """Token counts of a finished request."""

    prompt_tokens: int = Field(ge=0)
    completion_tokens: int = Field(ge=0)
    cached_tokens: int = Field(0, ge=0, description="prompt tokens served from the prefix cache")

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class ErrorInfo(Wire):
    """Why a request failed: a stable code and a message for people."""

    code: str = Field(max_length=64)
    message: str = Field(max_length=4096)


class TopLogprob(Wire):
    """One of the most likely tokens at a position, with its log-probability."""

    token_id: int = Field(ge=0)
    logprob: float


class TokenLogprob(Wire):
    """A generated token's log-probability under the model (before sampling filters) and
    the most likely alternatives at its position, best first."""

    token_id: int = Field(ge=0)
    logprob: float
    top: list[TopLogprob] = Field(default_factory=list, max_length=20)


class TokenEvent(Wire):
    """One event on a request's stream. ``seq`` is contiguous from 0; the last event of a
    stream carries ``finish_reason`` (and ``usage``), or ``error``."""

    request_id: RequestId
    seq: int = Field(ge=0)
    text: str = ""
    token_ids: list[int] = Field(default_factory=list)
    finish_reason: FinishReason | None = None
    usage: Usage | None = None
    error: ErrorInfo | None = None
    logprobs: list[TokenLogprob] | None = Field(
        None, description="one per token id, when the request asked for them"
    )
    text_offset: int | None = Field(
        None, ge=0, description="with logprobs: characters of the completion before this text"
    )

    @property
    def final(self) -> bool:
        return self.finish_reason is not None


def error_event(request_id: str, seq: int, code: str, message: str) -> TokenEvent:
    """A final event reporting that a request could not be served."""
    return TokenEvent(
        request_id=request_id,
        seq=seq,
        finish_reason=FinishReason.ERROR,
        error=ErrorInfo(code=code, message=message[:4096]),
    )


class Completion(Wire):
    """A finished request, as written to the completions topic (keyed by request id)."""

    request_id: RequestId
    tenant: TenantId = "default"
    text: str = ""
    token_ids: list[int] = Field(default_factory=list)
    finish_reason: FinishReason
    usage: Usage | None = None
    error: ErrorInfo | None = None
    created_at: float
    finished_at: float = Field(default_factory=time.time)
    worker_id: str | None = None
    cache: CacheResult = Field(
        CacheResult.MISS, description="generated, or replayed from a response cache"
    )


class Batch(Wire):
    """A group of requests handed by a batcher to one worker partition of the batches topic."""

    batch_id: str = Field(default_factory=lambda: f"bat-{uuid.uuid4().hex}")
    created_at: float = Field(default_factory=time.time)
    batcher_id: str = ""
    requests: list[GenerateRequest] = Field(min_length=1)


class WorkerHeartbeat(Wire):
    """A worker's load and cache summary, refreshed about every second in Redis."""

    worker_id: str
    at: float = Field(default_factory=time.time)
    partitions: list[int] = Field(default_factory=list)
    free_slots: int = Field(0, description="max running - running - waiting (negative: queued)")
    free_kv_tokens: int = 0
    kv_bytes_per_token: int = Field(0, description="KV memory of one token in this model")
    running: int = 0
    waiting: int = 0
    kv_used_tokens: int = 0
    prefix_hashes: list[int] = Field(
        default_factory=list, description="hashes of the worker's hottest cached prefix blocks"
    )
    block_size: int = Field(
        0,
        ge=0,
        description="tokens per KV block the prefix hashes are cut at (0: not advertised, an "
        "older worker; a batcher routes to a worker only if it matches its own)",
    )
    affinity_depth: int = Field(
        0,
        ge=0,
        description="leading blocks of a prompt the prefix hashes reach (0: not advertised, an "
        "older worker; a batcher routes to a worker only if it matches its own)",
    )
    context_tokens: int = Field(
        0,
        ge=0,
        description="the served model's context length: an edge without the model folder "
        "checks prompts and max_tokens against it (0: not advertised)",
    )
    decoded_tokens: int = Field(
        0, ge=0, description="tokens generated since the worker started (a rate from two beats)"
    )
    prefilled_tokens: int = Field(0, ge=0, description="prompt tokens computed since it started")
    prefix_hit_tokens: int = Field(
        0, ge=0, description="prompt tokens served from its prefix cache since it started"
    )
    ttft_le: list[float] = Field(
        default_factory=list,
        description="upper bounds (seconds) of the time-to-first-token buckets of ttft_counts",
    )
    ttft_counts: list[int] = Field(
        default_factory=list,
        description="requests whose first token came within each bound of ttft_le, since the "
        "worker started (cumulative, as Prometheus buckets), then all of them: one more "
        "entry than ttft_le (quantiles over a span from two beats)",
    )


class EdgeHeartbeat(Wire):
    """An edge's address and traffic, refreshed about every second in Redis (for
    ``tokenwire status`` and the dashboard; nothing routes on it)."""

    edge_id: str
    at: float = Field(default_factory=time.time)
    ttl_s: float = Field(gt=0, description="the key lives this long: an edge silent longer is gone")
    address: str = Field(description="where the edge serves HTTP, as it was configured")
    started_at: float
    open_streams: int = Field(0, ge=0, description="token streams being relayed now")
    requests: int = Field(0, ge=0, description="HTTP requests answered since it started")
    submitted: int = Field(0, ge=0, description="generation requests published since it started")
    rejected: int = Field(0, ge=0, description="requests refused before Kafka since it started")
    serving: bool = Field(True, description="whether Redis and the shared subscriber answer it")


class BatcherStatus(Wire):
    """A batcher's queue, refreshed in Redis so edges can shed load (429/503) early."""

    batcher_id: str
    at: float = Field(default_factory=time.time)
    queued_requests: int = 0
    queued_tokens: int = 0
    paused: bool = False
    queued_by_priority: dict[str, int] = Field(
        default_factory=dict, description="queued requests per priority class"
    )
    window_ms: float = Field(0.0, ge=0, description="the batching window it applies now")


class CancelRequest(Wire):
    """Broadcast on the cancel channel; the worker holding the request aborts it."""

    request_id: RequestId
    tenant: TenantId = "default"
    at: float = Field(default_factory=time.time)


class DeadLetter(Wire):
    """A message that could not be served, with the reason and where it came from."""

    reason: str = Field(description="machine-readable cause, e.g. 'undecodable', 'invalid'")
    detail: str = ""
    topic: str
    partition: int
    offset: int
    key: str | None = None
    original_b64: str = Field(
        description="the original message's bytes in base64: all of them, or only the first "
        "ones when 'truncated'"
    )
    original_size: int = Field(
        0, ge=0, description="length of the whole original message in bytes (0 in older records)"
    )
    original_sha256: str = Field(
        "", description="hex SHA-256 of the whole original message (empty in older records)"
    )
    truncated: bool = Field(
        False, description="whether original_b64 holds only the first bytes of the message"
    )
    request_id: str | None = None
    at: float = Field(default_factory=time.time)


WIRE_MODELS: tuple[type[Wire], ...] = (
    GenerateRequest,
    TokenEvent,
    Completion,
    Batch,
    WorkerHeartbeat,
    EdgeHeartbeat,
    BatcherStatus,
    CancelRequest,
    DeadLetter,
)
