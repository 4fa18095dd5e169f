"""The OpenAI batch file formats (pure): input lines to requests, results to output lines.

Input line: ``{"custom_id", "method": "POST", "url": "/v1/chat/completions" |
"/v1/completions", "body": {...}}``. Output line: ``{"id", "custom_id", "response":
{"status_code", "request_id", "body"} | null, "error": {"code", "message"} | null}``.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from pydantic import ValidationError

from services.edge.openai_api import ChatBody, CompletionBody
from shared.codec import encode
from shared.kafka_io import too_large
from shared.messages import CacheMode, Completion, GenerateRequest, Priority

ENDPOINTS: dict[str, type[CompletionBody] | type[ChatBody]] = {
    "/v1/completions": CompletionBody,
    "/v1/chat/completions": ChatBody,
}
DEFAULT_MAX_TOKENS = 256


@dataclass(frozen=True, slots=True)
class Job:
    """A valid input line: its custom id, endpoint and the request to submit, with the
    line's ``cache`` field (the Batch API has the batcher look eligible lines up)."""

    custom_id: str
    url: str
    request: GenerateRequest
    cache: CacheMode = CacheMode.DEFAULT


@dataclass(frozen=True, slots=True)
class BadLine:
    """An input line that cannot be submitted, and why (it becomes an error line)."""

    custom_id: str
    code: str
    message: str


def parse_line(
    line: bytes, lineno: int, tenant: str, reply_topic: str, *, request_id: str | None = None
) -> Job | BadLine:
    """One input line as a bulk-priority request, or why it cannot be one. ``request_id``
    names the request (a fresh ``bulk-`` id by default)."""
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        return BadLine(f"line-{lineno}", "invalid_json", str(exc))
    if not isinstance(obj, dict):
        return BadLine(f"line-{lineno}", "invalid_request", "a line must be a JSON object")
    custom_id = obj.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return BadLine(f"line-{lineno}", "invalid_request", "custom_id must be a non-empty string")
    if obj.get("method", "POST") != "POST":
        return BadLine(custom_id, "invalid_request", "method must be POST")
    url = obj.get("url")
    body_model = ENDPOINTS.get(url) if isinstance(url, str) else None
    if body_model is None or not isinstance(url, str):
        return BadLine(custom_id, "invalid_request", f"url must be one of {sorted(ENDPOINTS)}")
    try:
        body = body_model.model_validate(obj.get("body"))
        req = body.to_request(
            request_id or f"bulk-{uuid.uuid4().hex}",
            tenant,
            body.requested_max_tokens() or DEFAULT_MAX_TOKENS,
        )
    except (ValidationError, ValueError) as exc:
        return BadLine(custom_id, "invalid_request", _first_error(exc))
    reply = req.reply.model_copy(update={"kafka_topic": reply_topic, "redis": False})
    req = req.model_copy(update={"priority": Priority.BULK, "reply": reply})
    if (why := too_large(len(encode(req)))) is not None:
        return BadLine(custom_id, "request_too_large", why)
    return Job(custom_id, url, req, CacheMode(body.cache))


def _first_error(exc: Exception) -> str:
    if isinstance(exc, ValidationError) and exc.errors():
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        return f"body.{loc}: {err['msg']}" if loc else str(err["msg"])
    return str(exc)


def result_line(job: Job, c: Completion) -> bytes:
    """The output line for a finished request."""
    if c.error is not None:
        return error_line(job.custom_id, c.error.code, c.error.message, c.request_id)
    response = {
        "status_code": 200,
        "request_id": c.request_id,
        "body": response_body(job.url, job.request.model, c),
    }
    return orjson.dumps(
        {
            "id": f"batch_req_{c.request_id}",
            "custom_id": job.custom_id,
            "response": response,
            "error": None,
        }
    )


def response_body(url: str, model: str | None, c: Completion) -> dict[str, Any]:
    """The body the HTTP endpoint ``url`` would have answered for a finished request."""
    chat = url.endswith("chat/completions")
    finish = c.finish_reason.value
    if chat:
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": c.text},
            "finish_reason": finish,
        }
    else:
        choice = {"index": 0, "text": c.text, "logprobs": None, "finish_reason": finish}
    usage = None
    if c.usage is not None:
        usage = {
            "prompt_tokens": c.usage.prompt_tokens,
            "completion_tokens": c.usage.completion_tokens,
            "total_tokens": c.usage.total_tokens,
        }
    return {
        "id": ("chatcmpl-" if chat else "cmpl-") + c.request_id,
        "object": "chat.completion" if chat else "text_completion",
        "created": int(c.created_at),
        "model": model,
        "choices": [choice],
        "usage": usage,
    }


def error_line(custom_id: str, code: str, message: str, request_id: str | None = None) -> bytes:
    rid = request_id or uuid.uuid4().hex
    return orjson.dumps(
        {
            "id": f"batch_req_{rid}",
            "custom_id": custom_id,
            "response": None,
            "error": {"code": code, "message": message},
        }
    )


def done_ids(out: Path) -> set[str]:
    """custom_ids already in the output file. A torn last line (the writer was killed
    mid-write) is cut off so appending starts on a clean line."""
    if not out.exists():
        return set()
    data = out.read_bytes()
    keep = data.rfind(b"\n") + 1
    if keep < len(data):
        with out.open("r+b") as fh:
            fh.truncate(keep)
    ids = set()
    for line in data[:keep].splitlines():
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(obj, dict) and isinstance(obj.get("custom_id"), str):
            ids.add(obj["custom_id"])
    return ids
