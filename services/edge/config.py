"""The edge's settings (``TW_*`` environment variables)."""

from __future__ import annotations

from pydantic import Field

from shared.settings import CommonSettings


class EdgeSettings(CommonSettings):
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    model_name: str = Field("tokenwire-tiny", description="the model id clients ask for")
    request_timeout_s: float = Field(300.0, gt=0, description="give up on a silent stream")
    keepalive_s: float = Field(10.0, gt=0, description="SSE comment interval while waiting")
    max_body_bytes: int = Field(1_000_000, ge=1024)
