"""The batcher's settings (``TW_*`` environment variables)."""

from __future__ import annotations

import os
import socket

from pydantic import Field, field_validator

from services.batcher.routing import RoutingMode
from services.batcher.sources import Source, parse_sources
from shared.settings import FleetSettings


class BatcherSettings(FleetSettings):
    """The batcher's settings (``TW_*``): window, batch and queue limits, routing."""

    batcher_id: str = Field(
        default_factory=lambda: f"batcher-{socket.gethostname()}-{os.getpid()}",
        description="this batcher's name in its batches and status "
        "(default: batcher-<hostname>-<pid>)",
    )
    window_min_ms: float = Field(50.0, ge=0, description="the shortest batching window")
    window_max_ms: float = Field(
        100.0, ge=0, description="the longest batching window, reached as workers saturate"
    )
    target_wait_ms: float = Field(200.0, gt=0, description="queue wait that shrinks the window")
    max_batch_requests: int = Field(
        64, ge=1, description="most requests one dispatch takes; this many queued go at once"
    )
    heartbeat_refresh_ms: float = Field(20.0, gt=0, description="how stale a worker view may be")
    slot_hold_ms: float = Field(
        1000.0,
        gt=0,
        description="a worker slot reserved this long before a heartbeat stays reserved "
        "(the batch may not have reached the worker when it counted): the longest hand-off",
    )
    routing: RoutingMode = Field(RoutingMode.AFFINITY, description="how a request picks a worker")
    affinity_tolerance: int = Field(
        4, ge=0, description="load imbalance (requests) accepted to keep a prefix on its worker"
    )
    model_dir: str = Field("", description="tokenizer for prefix-affinity routing (optional)")
    interactive_reserve: int = Field(2, ge=0, description="slots per worker bulk never takes")
    fair_quantum_tokens: int = Field(64, ge=1, description="DRR credit per turn")
    max_queued_requests: int = Field(10_000, ge=1, description="pause consumption above this")
    max_queued_tokens: int = Field(
        4_000_000, ge=1, description="pause consumption above this (prompt + max_tokens)"
    )
    request_sources: str = Field(
        "",
        description="backend services with requests topics of their own, the tenants "
        "(and priorities) each may speak for and the reply topics it may name besides its "
        "own <prefix>.completions.to-<svc>: "
        "'svc:tenant,tenant[:bulk,interactive[:topic,topic]]' joined by ';', '*' for any "
        "tenant or priority (services/batcher/sources.py); empty: the shared requests "
        "topic alone, which speaks for any tenant",
    )
    kafka_request_timeout_ms: int = Field(
        30_000, ge=1000, description="a batch or dead letter unacknowledged this long is retried"
    )

    @field_validator("request_sources")
    @classmethod
    def _sources_parse(cls, v: str) -> str:
        parse_sources(v)
        return v

    @property
    def sources(self) -> tuple[Source, ...]:
        return parse_sources(self.request_sources)
