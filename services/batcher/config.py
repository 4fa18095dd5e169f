"""The batcher's settings (``TW_*`` environment variables)."""

from __future__ import annotations

import os
import socket

from pydantic import Field

from shared.settings import CommonSettings


class BatcherSettings(CommonSettings):
    batcher_id: str = Field(default_factory=lambda: f"batcher-{socket.gethostname()}-{os.getpid()}")
    window_min_ms: float = Field(50.0, ge=0)
    window_max_ms: float = Field(100.0, ge=0)
    max_batch_requests: int = Field(64, ge=1)
    heartbeat_refresh_ms: float = Field(100.0, gt=0)
