"""OpenAI-compatible request bodies and their mapping onto ``GenerateRequest``."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from shared.messages import ChatMessage, GenerateRequest, Priority, SamplingParams


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str
    max_tokens: int | None = Field(None, ge=1, le=1_000_000)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0, description="tokenwire extension")
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: Literal[1] = 1
    user: str | None = None
    priority: Priority = Priority.INTERACTIVE

    def sampling(self, default_max_tokens: int) -> SamplingParams:
        stop = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        return SamplingParams(
            max_tokens=self.max_tokens or default_max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            seed=self.seed,
            stop=stop,
        )


class CompletionBody(_Common):
    prompt: str = Field(max_length=4_000_000)

    def to_request(self, tenant: str, default_max_tokens: int = 16) -> GenerateRequest:
        return GenerateRequest(
            tenant=tenant,
            priority=self.priority,
            model=self.model,
            prompt=self.prompt,
            sampling=self.sampling(default_max_tokens),
            stream=self.stream,
        ).with_seed()


class ChatBody(_Common):
    messages: list[ChatMessage] = Field(min_length=1, max_length=1024)

    def to_request(self, tenant: str, default_max_tokens: int = 256) -> GenerateRequest:
        return GenerateRequest(
            tenant=tenant,
            priority=self.priority,
            model=self.model,
            messages=self.messages,
            sampling=self.sampling(default_max_tokens),
            stream=self.stream,
        ).with_seed()
