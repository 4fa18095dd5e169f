"""Streaming clients of the edge: each sends short greedy ``/v1/completions`` requests with
SSE, one after another, and keeps every event's ``id:`` with the time it arrived.

A refusal the service means to be temporary (503 while Redis or Kafka is away, 429) is
retried after its ``Retry-After``, and a connection the edge refuses (it is being
restarted) after a second: the request counts once, with its retries. This client is
httpx rather than the benchmark's ``SsePool``, which hands on ``data:`` payloads only,
without the ``id:`` lines or a refusal's ``Retry-After``.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field, replace
from typing import Any

import httpx
import orjson

from services.chaos.accounting import Expect, Outcome, check_stream, stream_outcome
from services.chaos.stack import ChaosError

PROMPTS = (
    "The function returns",
    "def parse(line):",
    "The list of values",
    "If the value is missing",
    "import os",
    "The module exports",
    "class Stream:",
    "Return the result",
)
RETRIED = (429, 503)
MAX_RETRY_AFTER_S = 10.0


@dataclass
class StreamRun:
    """One streamed request as its client saw it."""

    request_id: str = ""
    events: list[tuple[int, float]] = field(default_factory=list)  # (id, arrival)
    finish: str | None = None  # the final event's finish reason; "error" for an error
    done: bool = False  # ``data: [DONE]`` came
    started_at: float = 0.0  # the 200 response began (monotonic)
    ended_at: float = 0.0
    retries: int = 0
    refused: str = ""  # why it was never taken (a final refusal, or refusals past patience)
    cut: str = ""  # what closed the connection before [DONE]
    refusal: str = ""  # the last temporary refusal: status and error code

    def feed(self, line: str, now: float) -> None:
        """One line of the event stream."""
        if line.startswith("id:"):
            self.events.append((int(line[3:]), now))
        elif line.startswith("data:"):
            data = line[5:].strip()
            if data == "[DONE]":
                self.done = True
            elif '"finish_reason":null' not in data:
                self.finish = _finish_of(orjson.loads(data)) or self.finish

    def outcome(self, expect: Expect = Expect.OK) -> Outcome:
        if self.refused:
            return Outcome(completed=False, retries=self.retries, why=self.refused)
        check = check_stream(self.events, self.started_at, None if self.done else self.ended_at)
        out = stream_outcome(check, self.finish, self.done, expect, self.retries)
        if self.cut and not out.completed:
            out = replace(out, why=f"{out.why} (connection cut: {self.cut})")
        return replace(out, request_id=self.request_id)


def _finish_of(chunk: dict[str, Any]) -> str | None:
    if "error" in chunk:
        return "error"
    choices = chunk.get("choices") or [{}]
    reason = choices[0].get("finish_reason")
    return str(reason) if reason is not None else None


def _code_of(body: bytes) -> str:
    """The error code of an OpenAI error body ("?" if it has none)."""
    try:
        error = orjson.loads(body).get("error") or {}
    except (orjson.JSONDecodeError, AttributeError):
        return "?"
    return str(error.get("code") or "?")


def retry_after(headers: httpx.Headers) -> float:
    try:
        return min(MAX_RETRY_AFTER_S, max(0.1, float(headers.get("retry-after", "1"))))
    except ValueError:
        return 1.0


class Edge:
    """Streamed completions through one edge."""

    def __init__(self, url: str, api_key: str | None, *, patience_s: float = 150.0) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.AsyncClient(
            base_url=url,
            headers=headers,
            timeout=httpx.Timeout(10.0, read=60.0),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
        )
        self.patience_s = patience_s  # how long a request is retried before it is given up
        self.model = "tokenwire-tiny"

    async def __aenter__(self) -> Edge:
        try:
            models = (await self.http.get("/v1/models")).raise_for_status().json()
        except httpx.HTTPError as exc:
            await self.http.aclose()
            raise ChaosError(f"the edge at {self.http.base_url} lists no model: {exc}") from None
        self.model = str(models["data"][0]["id"])
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.http.aclose()

    async def answers(self) -> str:
        """One short request, not streamed and not retried: "" when it is answered, else
        what came back instead."""
        body = {**self.body(PROMPTS[0], 1), "stream": False}
        try:
            resp = await self.http.post("/v1/completions", json=body, timeout=30.0)
        except httpx.TransportError as exc:
            return f"no answer ({type(exc).__name__})"
        if resp.status_code == 200:
            return ""
        return f"{resp.status_code} {_code_of(resp.content)}"

    def body(self, prompt: str, max_tokens: int, **extra: Any) -> dict[str, Any]:
        """A greedy streamed request of exactly ``max_tokens`` tokens, never answered from
        the response cache (the prompts repeat; what is measured is the pipeline)."""
        return {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "cache": "no-cache",
            **extra,
        }

    async def stream(self, body: dict[str, Any], run: StreamRun | None = None) -> StreamRun:
        """Send ``body`` until the edge takes it (or refuses it for good) and follow its
        stream to the end; ``run`` fills in as events arrive."""
        run = run or StreamRun()
        give_up = time.monotonic() + self.patience_s
        while True:
            try:
                wait = await self._once(body, run)
            except httpx.TransportError as exc:  # no answer at all: the edge is away
                wait, why = 1.0, f"no answer ({type(exc).__name__})"
            else:
                if wait is None:
                    return run
                why = f"refused ({run.refusal}, Retry-After {wait:g} s)"
            if time.monotonic() + wait > give_up:
                run.refused = f"{why} for {self.patience_s:.0f} s"
                return run
            run.retries += 1
            await asyncio.sleep(wait)

    async def _once(self, body: dict[str, Any], run: StreamRun) -> float | None:
        """One try: the seconds to wait before the next, or None when it is settled."""
        async with self.http.stream("POST", "/v1/completions", json=body) as resp:
            if resp.status_code in RETRIED:
                run.refusal = f"{resp.status_code} {_code_of(await resp.aread())}"
                return retry_after(resp.headers)
            if resp.status_code != 200:
                text = (await resp.aread()).decode(errors="replace")[:200]
                run.refused = f"HTTP {resp.status_code}: {text}"
                return None
            run.request_id = resp.headers.get("x-request-id", "")
            run.started_at = time.monotonic()
            try:
                async for line in resp.aiter_lines():
                    run.feed(line, time.monotonic())
            except httpx.TransportError as exc:  # judged as a stream without [DONE]
                run.cut = type(exc).__name__
            run.ended_at = time.monotonic()
            return None


class Load:
    """``streams`` clients, each sending one short greedy streamed request after another
    from ``start()`` until ``finish()``, which lets the requests in flight end."""

    def __init__(self, edge: Edge, streams: int, max_tokens: int) -> None:
        self.edge = edge
        self.streams = streams
        self.max_tokens = max_tokens
        self.runs: list[StreamRun] = []
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._client(i)) for i in range(self.streams)]

    async def _client(self, index: int) -> None:
        n = 0
        while not self._stop.is_set():
            prompt = PROMPTS[(index + n) % len(PROMPTS)]
            run = StreamRun()
            self.runs.append(run)
            await self.edge.stream(self.edge.body(prompt, self.max_tokens), run)
            n += 1

    async def finish(self, within_s: float) -> list[Outcome]:
        """Stop sending; wait up to ``within_s`` for the requests in flight. Returns an
        outcome per request sent (one still running then is lost)."""
        self._stop.set()
        _, late = await asyncio.wait(self._tasks, timeout=within_s)
        for task in late:
            task.cancel()
        ended = await asyncio.gather(*self._tasks, return_exceptions=True)
        for end in ended:  # a client that failed (not one cancelled here) is a bug
            if isinstance(end, BaseException) and not isinstance(end, asyncio.CancelledError):
                raise end
        return [self._judge(run) for run in self.runs]

    def _judge(self, run: StreamRun) -> Outcome:
        if not run.done and not run.ended_at and not run.refused:
            why = "still running at the end" if run.request_id else "not taken by the end"
            return Outcome(False, retries=run.retries, why=why, request_id=run.request_id)
        return run.outcome(Expect.OK)
