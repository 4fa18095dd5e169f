"""The worker's settings (``TW_*`` environment variables)."""

from __future__ import annotations

import os
import socket
from typing import Literal

from pydantic import Field

from shared.settings import CommonSettings


def _default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class WorkerSettings(CommonSettings):
    worker_id: str = Field(default_factory=_default_worker_id)
    model_dir: str = Field(description="a local Hugging Face model folder")
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    torch_threads: int = Field(0, ge=0, description="0: torch's default")
    engine_nice: int = Field(
        5, ge=0, le=19, description="the engine process's niceness above the worker's"
    )
    kv_budget_tokens: int = Field(65_536, ge=16)
    kv_budget_bytes: int | None = Field(
        None,
        ge=1,
        description="the KV pool in bytes (replaces kv_budget_tokens): tokens from the model's "
        "layer, head and dtype layout",
    )
    block_size: int = Field(16, ge=1, le=1024)
    max_running: int = Field(64, ge=1)
    max_step_tokens: int = Field(1024, ge=1)
    prefill_chunk: int = Field(256, ge=1)
    prefix_cache: bool = True
    max_waiting: int = Field(256, ge=1, description="pause Kafka consumption above this")
    heartbeat_interval_s: float = Field(1.0, gt=0)
    heartbeat_ttl_s: float = Field(3.0, gt=0)
    done_ttl_s: int = Field(3600, ge=1)
    claim_ttl_s: float = Field(10.0, gt=0, description="a dead worker's claims expire after this")
    session_timeout_ms: int = Field(10_000, ge=1000, description="Kafka group session timeout")
    drain_timeout_s: float = Field(
        20.0, ge=0, description="on SIGTERM, finish running work this long"
    )
