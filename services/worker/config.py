"""The worker's settings (``TW_*`` environment variables)."""

from __future__ import annotations

import os
import socket
from typing import Literal, Self

from pydantic import Field, model_validator

from services.worker.engine.speculation import SpecConfig
from shared.settings import FleetSettings


def _default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class WorkerSettings(FleetSettings):
    """The worker's settings (``TW_*``): model, device, engine sizes, intake and claim timing."""

    worker_id: str = Field(
        default_factory=_default_worker_id,
        description="this worker's name in heartbeats and claims (default: <hostname>-<pid>)",
    )
    model_dir: str = Field(
        description=(
            "a local Hugging Face model folder (one with no `config.json` is refused at start, "
            "in one line)"
        )
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="where the model runs; auto: CUDA when available"
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="the model's precision; auto: float32 on CPU, bfloat16 on CUDA"
    )
    quantize: Literal["none", "int8"] = Field(
        "none",
        description="int8: the linear layers' weights in int8, activations quantized per "
        "step (torch's dynamic quantization; CPU only)",
    )
    torch_threads: int = Field(0, ge=0, description="0: torch's default")
    cuda_graphs: bool = Field(
        True,
        description="replay decode steps from CUDA graphs on a GPU (rows padded to 1, 2, 4, 8 "
        "or a multiple of 16, up to 512; a failed capture turns them off with a warning)",
    )
    pad_products: bool = Field(
        True,
        description="on a CPU, pad the decode pass's products of a few rows with zero rows where "
        "the model's own products, timed at load, are faster at the larger count",
    )
    overlap: bool = Field(
        True,
        description="on a GPU, make a step's text (and send it) while the next forward pass "
        "runs: a pass is launched without waiting for the device and settled by the next step. "
        "A CPU runs its pass on the engine's thread, so there each step settles its own",
    )
    engine_nice: int = Field(
        5, ge=0, le=19, description="the engine process's niceness above the worker's"
    )
    kv_budget_tokens: int = Field(
        65_536,
        ge=16,
        description="the KV pool's size in tokens (the decoding rows' dense copies take as "
        "much memory again, allocated at start)",
    )
    kv_budget_bytes: int | None = Field(
        None,
        ge=1,
        description="the KV pool in bytes (replaces kv_budget_tokens): tokens from the model's "
        "layer, head and dtype layout",
    )
    max_running: int = Field(
        64, ge=1, description="most sequences the engine runs at once (the worker's slots)"
    )
    max_step_tokens: int = Field(
        1024, ge=1, description="tokens one engine step computes: decodes, then prefill chunks"
    )
    prefill_chunk: int = Field(
        256, ge=1, description="most prompt tokens of one sequence prefilled in a step"
    )
    prefix_cache: bool = Field(
        True, description="reuse the cached KV blocks of prompts' shared prefixes"
    )
    spec_ngram_k: int = Field(
        0,
        ge=0,
        le=16,
        description="n-gram speculation: draft tokens a decoding request guesses per step from "
        "its own prompt and output, verified in the same pass (0: off)",
    )
    spec_ngram_max_n: int = Field(
        4, ge=1, le=16, description="n-gram speculation: the longest suffix matched (down to 1)"
    )
    spec_draft_model: str = Field(
        "",
        description="draft-model speculation: a local model folder with the served model's "
        "tokenizer, or a preset name (built if missing), that guesses the next tokens",
    )
    spec_draft_k: int = Field(
        0,
        ge=0,
        le=16,
        description="draft-model speculation: tokens the draft model guesses per step for "
        "each decoding request, verified in the same pass (0: off)",
    )
    spec_max_running: int = Field(
        8,
        ge=0,
        description="speculation (either kind) stops while more sequences than this are running",
    )
    spec_step_tokens: int = Field(
        8,
        ge=1,
        description="speculation: the most draft tokens one step verifies; each request's "
        "share shrinks as the batch fills (k at one request, 1 at this many)",
    )
    max_waiting: int = Field(256, ge=1, description="pause Kafka consumption above this")
    heartbeat_interval_s: float = Field(
        1.0, gt=0, description="time between heartbeats (one also goes out when requests end)"
    )
    done_ttl_s: int = Field(
        3600, ge=1, description="how long a finished request's done marker stops a rerun"
    )
    claim_ttl_s: float = Field(10.0, gt=0, description="a dead worker's claims expire after this")
    session_timeout_ms: int = Field(10_000, ge=1000, description="Kafka group session timeout")
    drain_timeout_s: float = Field(
        20.0, ge=0, description="on SIGTERM, finish running work this long"
    )

    @model_validator(mode="after")
    def _one_speculation(self) -> Self:
        if self.spec_ngram_k and self.spec_draft_k:
            raise ValueError(
                "TW_SPEC_NGRAM_K and TW_SPEC_DRAFT_K are both set: a worker speculates one way"
            )
        if self.spec_draft_k and not self.spec_draft_model:
            raise ValueError("TW_SPEC_DRAFT_K needs TW_SPEC_DRAFT_MODEL (the guessing model)")
        if self.spec_draft_model and not self.spec_draft_k:
            raise ValueError("TW_SPEC_DRAFT_MODEL needs TW_SPEC_DRAFT_K (guesses per step)")
        return self

    @property
    def speculation(self) -> SpecConfig:
        """The engine's speculation: n-gram, the draft model's, or none."""
        if self.spec_draft_k:
            return SpecConfig(
                k=self.spec_draft_k,
                max_running=self.spec_max_running,
                method="draft",
                step_tokens=self.spec_step_tokens,
            )
        return SpecConfig(
            k=self.spec_ngram_k,
            max_n=self.spec_ngram_max_n,
            max_running=self.spec_max_running,
            step_tokens=self.spec_step_tokens,
        )
