"""What crosses the pipe between a worker and its engine process: the engine's settings, the
requests it takes, what each step returns and its counters (pure: no torch, no I/O), so
that the worker's own process runs without importing torch."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from operator import attrgetter
from typing import Any

from services.worker.engine.request import Status
from services.worker.engine.speculation import SpecConfig

GREEDY_BELOW = 1e-5


@dataclass(frozen=True, slots=True)
class SamplingConfig:
    """How one request picks its tokens (resolved: no field left to a default)."""

    temperature: float = 0.0  # below GREEDY_BELOW: greedy
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    presence_penalty: float = 0.0  # OpenAI: minus this for each token already generated
    frequency_penalty: float = 0.0  # OpenAI: minus this times its count in the output
    repetition_penalty: float = 1.0  # Hugging Face: tokens of the prompt and output
    logit_bias: tuple[tuple[int, float], ...] = ()  # OpenAI: added to these tokens' logits
    min_p: float = 0.0  # vLLM: keep tokens at least this times as likely as the top one

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW

    @property
    def penalizes(self) -> bool:
        """Whether penalties change this request's logits (by the tokens it has seen)."""
        return bool(
            self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
        )

    @property
    def adjusts(self) -> bool:
        """Whether penalties or biases change this request's logits."""
        return self.penalizes or bool(self.logit_bias)


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """The engine's sizes: KV pool and blocks, running cap, tokens per step, prefill chunk, prefix cache."""

    block_size: int = 16
    kv_budget_tokens: int = 65_536
    # When set, the KV pool's size in bytes instead: tokens from the model's own layout.
    kv_budget_bytes: int | None = None
    max_running: int = 64
    max_step_tokens: int = 1024
    prefill_chunk: int = 256
    enable_prefix_cache: bool = True
    speculation: SpecConfig = field(default_factory=SpecConfig)  # n-gram drafts (k 0: off)
    cuda_graphs: bool = True  # decode steps replayed from CUDA graphs, on a GPU
    pad_products: bool = True  # a CPU's products of a few rows padded where faster (direct.py)
    # On a GPU, a step's text made while the next pass runs (each pass settled by the next
    # step); a CPU runs its pass at launch, so there each step settles its own.
    overlap: bool = True


@dataclass(slots=True)
class EngineRequest:
    """A request as the engine takes it: token ids plus how to sample and when to stop."""

    request_id: str
    prompt_ids: list[int]
    max_tokens: int = 16
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    stop: Sequence[str] = ()
    stop_token_ids: Sequence[int] = ()
    include_stop: bool = False  # keep the stop string (or stop id's text) that ended it
    ignore_eos: bool = False
    min_tokens: int = 0  # EOS and stop token ids cannot end it before this many tokens
    logprobs: int | None = None  # each token's log-probability and this many alternatives
    structure: tuple[str, str] | None = None  # (kind, spec): a grammar the output follows
    priority: int = 0


@dataclass(frozen=True, slots=True)
class TokenLogprobs:
    """A sampled token's log-probability under the model (before any sampling filter)
    and the most likely tokens' ``(id, log-probability)``, best first."""

    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(slots=True)  # not frozen: a step builds one per request, and frozen ones cost 7x
class StepOutput:
    """What one request produced in one step (not changed once returned)."""

    request_id: str
    token_ids: list[int]
    text: str
    finish: Status | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    error: str | None = None
    error_code: str = "invalid_request"  # the request's input, or "engine_error"
    logprobs: list[TokenLogprobs] | None = None  # one per token id, when asked for

    def __reduce__(self) -> tuple[type[StepOutput], tuple[Any, ...]]:
        # Pickled as the constructor's arguments: a step sends one per running request,
        # and a slotted dataclass's default (a state dict per object) took 2.6x the time.
        return StepOutput, _step_output_fields(self)


_step_output_fields = attrgetter(*(f.name for f in fields(StepOutput)))


@dataclass(slots=True)
class EngineStats:
    """The engine's counters and gauges, sent to the worker with each step."""

    running: int = 0
    waiting: int = 0
    steps: int = 0
    kv_blocks: int = 0
    kv_used_blocks: int = 0
    kv_peak_used_blocks: int = 0
    kv_cached_blocks: int = 0
    block_size: int = 16
    kv_groups: int = 1  # layer groups drawing on the pool: a token takes a block slot in each
    kv_bytes_per_token: int = 0  # every layer's keys and values of one token
    prefix_hit_tokens: int = 0
    prefilled_tokens: int = 0
    decoded_tokens: int = 0
    preemptions: int = 0
    finished: int = 0
    request_errors: int = 0  # requests ended by a failure of their own in a step
    spec_verifications: int = 0  # decodes that carried a draft
    spec_draft_tokens: int = 0  # draft tokens proposed and verified
    spec_accepted_tokens: int = 0  # of those, the ones the model agreed with
    step_seconds: float = 0.0
    gc_frozen_objects: int = 0  # what the engine's process keeps out of GC scans (loaded)

    @property
    def free_kv_tokens(self) -> int:
        """Tokens a new request can surely get: with layer groups, each of its tokens takes
        a slot in every group (a sliding group's share stops at its window, so a long
        request can get more than this; never less)."""
        return (self.kv_blocks - self.kv_used_blocks) * self.block_size // self.kv_groups
