"""A minimal streaming client for the edge (used by ``tokenwire ask`` and the demo)."""

from __future__ import annotations

import os
from typing import TextIO

import httpx
import orjson


async def stream_completion(url: str, prompt: str, max_tokens: int, model: str, out: TextIO) -> str:
    """POST a streamed completion and write each text delta to ``out`` as it arrives."""
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "stream": True,
        "temperature": 0.8,
        "seed": 7,
    }
    text = []
    key = os.environ.get("TW_API_KEY")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with (
        httpx.AsyncClient(timeout=120, headers=headers) as client,
        client.stream("POST", f"{url}/v1/completions", json=body) as resp,
    ):
        if resp.status_code != 200:
            raise SystemExit(f"edge answered {resp.status_code}: {(await resp.aread()).decode()}")
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = orjson.loads(line[6:])
            if "error" in chunk:
                raise SystemExit(f"error: {chunk['error']['message']}")
            delta = chunk["choices"][0]["text"]
            text.append(delta)
            out.write(delta)
            out.flush()
    out.write("\n")
    return "".join(text)
