"""The edge's settings (``TW_*`` environment variables)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from services.edge.auth import parse_key_list
from shared.cache.guard import SEMANTIC_THRESHOLD
from shared.settings import CommonSettings
from shared.token_stream import LOG_TTL_S


class EdgeSettings(CommonSettings):
    """One edge process's configuration, read once at start-up."""

    host: str = Field("127.0.0.1", description="address the HTTP server listens on")
    port: int = Field(
        8000, ge=0, le=65535, description="the HTTP port: the API, /metrics, /healthz, /readyz"
    )
    model_dir: str = Field(
        "",
        description="local HF model folder: its tokenizer counts prompt tokens, its config "
        "gives the context length (empty: no prompt-length checks, estimated token counts)",
    )
    request_timeout_s: float = Field(300.0, gt=0, description="give up on a silent stream")
    keepalive_s: float = Field(10.0, gt=0, description="SSE comment interval while waiting")
    max_body_bytes: int = Field(1_000_000, ge=1024, description="larger bodies get 413")
    max_tokens_limit: int = Field(
        0, ge=0, description="largest max_tokens accepted (0: the model's context)"
    )

    # --- API keys ------------------------------------------------------------------------
    auth: Literal["off", "required"] = Field(
        "required",
        description="required: every API call needs a valid key (401 otherwise); off (the "
        "demo only): a known key still selects its tenant, any other call runs as tenant "
        "'default'",
    )
    key_pepper: str = Field(
        "",
        description="the deployment's secret pepper: keys are stored as HMAC-SHA-256 of "
        "the key under it (`tokenwire keys` needs it; keep it out of Redis)",
    )
    key_pepper_file: str = Field(
        "", description="a file holding the pepper, read when TW_KEY_PEPPER is empty"
    )
    api_keys: str = Field(
        "",
        description="comma-separated 'sha256hex=tenant' pairs, besides the Redis hash "
        "<prefix>:apikeys (sha256hex → tenant)",
    )

    # --- admission -----------------------------------------------------------------------
    rate_requests_per_min: int = Field(600, ge=0, description="per key; 0 disables")
    rate_tokens_per_min: int = Field(
        1_000_000, ge=0, description="per key, prompt + max_tokens; 0 disables"
    )
    max_queued_requests: int = Field(
        10_000, ge=0, description="503 while the batchers hold more; 0 disables"
    )
    load_refresh_s: float = Field(0.5, gt=0, description="how often batcher queues are read")

    # --- Kafka ---------------------------------------------------------------------------
    kafka_request_timeout_ms: int = Field(
        10_000,
        ge=1000,
        description="how long a request waits for Kafka to take it before 503 "
        "queue_unavailable (also the producer's request timeout)",
    )

    # --- Redis ---------------------------------------------------------------------------
    redis_max_connections: int = Field(
        256, ge=1, description="the Redis client's pool; a command beyond it waits its turn"
    )
    redis_timeout_s: float = Field(
        5.0, gt=0, description="Redis connect, reply and pool-wait limit (then 503)"
    )

    # --- streams -------------------------------------------------------------------------
    owner_ttl_s: int = Field(LOG_TTL_S, ge=1, description="how long a request can be resumed")
    cancel_wait_s: float = Field(5.0, gt=0, description="how long a cancel waits for the end")
    unfollowed_grace_s: float = Field(
        10.0,
        gt=0,
        le=3600,
        description="a request that a disconnect cancels (not resumable) is cancelled by "
        "its worker once no client has followed its stream for this long (its edge died)",
    )
    shutdown_grace_s: int = Field(
        5, ge=0, description="on SIGTERM, how long open streams may finish before closing"
    )

    # --- response caches -----------------------------------------------------------------
    semantic_cache: bool = Field(
        False,
        description="semantic response cache: a prompt close in meaning to a cached one (same "
        "context and sampling) is answered with its answer",
    )
    semantic_threshold: float = Field(
        SEMANTIC_THRESHOLD,
        gt=0,
        le=1,
        description="cosine similarity below which no semantic candidate is considered (a hit "
        "also needs the guard and the verifier; the default is the lowest the verifier tuned "
        "on the labelled set can pass)",
    )
    semantic_max_entries: int = Field(
        10_000, ge=1, description="semantic entries kept per tenant (oldest dropped first)"
    )

    @field_validator("api_keys")
    @classmethod
    def _keys_parse(cls, value: str) -> str:
        parse_key_list(value)  # fail at start-up, naming the variable
        return value
