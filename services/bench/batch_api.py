"""The Batch API end to end through the official ``openai`` client: build an input file of
``lines`` requests, upload it, create a batch, follow it to the end and check its output
(every ``custom_id`` exactly once). ``tokenwire bench batch-api`` runs it against a running
stack; the integration tests use the same pieces with an edge restarted midway."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import openai
import orjson
from openai.types import Batch

ENDED = ("completed", "failed", "cancelled", "expired")


def input_file(
    lines: int,
    *,
    endpoint: str,
    model: str,
    max_tokens: int,
    tag: str = "job",
    extra: dict[str, Any] | None = None,
) -> tuple[bytes, list[str]]:
    """A JSONL batch input of ``lines`` requests for ``endpoint`` (each body with
    ``extra`` added), and their custom ids."""
    ids = [f"{tag}-{i:05d}" for i in range(lines)]
    out = []
    for i, cid in enumerate(ids):
        body: dict[str, Any] = {
            "model": model,
            "max_tokens": max_tokens,
            "temperature": 0,
            **(extra or {}),
        }
        if endpoint == "/v1/chat/completions":
            body["messages"] = [{"role": "user", "content": f"Tell me about item {i}."}]
        else:
            body["prompt"] = f"Item {i}: the function"
        line = {"custom_id": cid, "method": "POST", "url": endpoint, "body": body}
        out.append(orjson.dumps(line))
    return b"\n".join(out) + b"\n", ids


async def start_batch(
    client: openai.AsyncOpenAI, content: bytes, endpoint: str, name: str = "input.jsonl"
) -> Batch:
    """Upload ``content`` (purpose ``batch``) and create a batch over it."""
    f = await client.files.create(file=(name, content), purpose="batch")
    return await client.batches.create(
        input_file_id=f.id,
        endpoint=endpoint,  # type: ignore[arg-type]
        completion_window="24h",
    )


async def wait_for(
    client: openai.AsyncOpenAI,
    batch_id: str,
    done: Callable[[Batch], bool],
    *,
    within_s: float,
    on_poll: Callable[[Batch], Awaitable[None] | None] | None = None,
) -> Batch:
    """Poll the batch until ``done`` holds for it; TimeoutError after ``within_s``."""
    deadline = time.monotonic() + within_s
    while True:
        b = await client.batches.retrieve(batch_id)
        if on_poll is not None:
            res = on_poll(b)
            if res is not None:
                await res
        if done(b):
            return b
        if time.monotonic() > deadline:
            raise TimeoutError(f"batch {batch_id} still {b.status}: {b.request_counts}")
        await asyncio.sleep(0.25)


async def lines_of(client: openai.AsyncOpenAI, file_id: str | None) -> list[dict[str, Any]]:
    """A result file's lines (none for no file)."""
    if file_id is None:
        return []
    raw = (await client.files.content(file_id)).content
    return [orjson.loads(line) for line in raw.splitlines() if line.strip()]


async def run(
    url: str, api_key: str, *, lines: int, endpoint: str, model: str, max_tokens: int
) -> dict[str, Any]:
    """One batch of ``lines`` requests from upload to output; the figures of the run."""
    client = openai.AsyncOpenAI(base_url=url.rstrip("/") + "/v1", api_key=api_key, max_retries=2)
    content, ids = input_file(lines, endpoint=endpoint, model=model, max_tokens=max_tokens)
    t0 = time.monotonic()
    batch = await start_batch(client, content, endpoint)
    end = await wait_for(client, batch.id, lambda b: b.status in ENDED, within_s=24 * 3600)
    took = time.monotonic() - t0
    out = await lines_of(client, end.output_file_id)
    errs = await lines_of(client, end.error_file_id)
    seen = [r["custom_id"] for r in out + errs]
    return {
        "batch": end.id,
        "status": end.status,
        "lines": lines,
        "output_lines": len(out),
        "error_lines": len(errs),
        "each_custom_id_once": sorted(seen) == sorted(ids),
        "seconds": round(took, 1),
        "requests_per_s": round(lines / took, 1) if took > 0 else None,
    }
