"""A Batch API input file checked as a whole, and its result lines (pure: no I/O).

Each line is read by the bulk runner's ``parse_line``, so it is validated with the same
request models as the HTTP endpoints (an unsupported parameter is refused the same way).
On top of that a batch needs every line to name the batch's endpoint and the served model
and every ``custom_id`` to be unique. As OpenAI does, a file that breaks any of this fails
the whole batch at validation (``status: "failed"`` with ``errors``), before any line runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from services.bulk.batch_file import BadLine, Job, parse_line, response_body
from services.edge.batch_store import line_request_id
from shared.messages import Completion, FinishReason

MAX_LINES = 50_000  # OpenAI's limit per batch
MAX_ERRORS = 100  # errors kept on a failed batch

# The HTTP status a worker's error code stands for in an error file line.
_STATUS = {"invalid_request": 400, "deadline_exceeded": 408}


@dataclass
class Checked:
    """A checked input file: its jobs in line order, or the errors that fail the batch."""

    jobs: list[Job] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)


def _lines(content: bytes) -> Iterator[tuple[int, bytes]]:
    for lineno, line in enumerate(content.splitlines(), 1):
        if line.strip():
            yield lineno, line


def check_file(
    content: bytes, *, batch_id: str, endpoint: str, model: str, tenant: str, reply_topic: str
) -> Checked:
    """Every line of ``content`` as a job whose request id is ``line_request_id``."""
    out = Checked()
    seen: set[str] = set()
    for index, (lineno, line) in enumerate(_lines(content)):
        if index >= MAX_LINES:
            out.errors.append(_error("too_many_lines", f"more than {MAX_LINES} lines", lineno))
            break
        rid = line_request_id(batch_id, index)
        item = parse_line(line, lineno, tenant, reply_topic, request_id=rid)
        if isinstance(item, BadLine):
            code = "invalid_json_line" if item.code == "invalid_json" else item.code
            out.errors.append(_error(code, item.message, lineno))
        elif item.url != endpoint:
            msg = f"the line's url is {item.url}; this batch's endpoint is {endpoint}"
            out.errors.append(_error("mismatched_endpoint", msg, lineno, "url"))
        elif item.request.model != model:
            msg = (
                f"the model '{item.request.model}' is not served here; this server serves '{model}'"
            )
            out.errors.append(_error("model_not_found", msg, lineno, "body.model"))
        elif item.custom_id in seen:
            msg = f"the custom_id '{item.custom_id}' is used by an earlier line"
            out.errors.append(_error("duplicate_custom_id", msg, lineno, "custom_id"))
        else:
            out.jobs.append(item)
        seen.add(item.custom_id)
    if not out.jobs and not out.errors:
        out.errors.append(_error("empty_file", "the input file has no request lines", None))
    del out.errors[MAX_ERRORS:]
    return out


def window(
    content: bytes, *, start: int, count: int, batch_id: str, tenant: str, reply_topic: str
) -> list[Job]:
    """The jobs of lines ``start`` to ``start + count`` of a file ``check_file`` passed:
    only those lines are parsed, so sending a large batch a window at a time stays cheap."""
    out = []
    for index, (lineno, line) in enumerate(_lines(content)):
        if index >= start + count:
            break
        if index >= start:
            rid = line_request_id(batch_id, index)
            item = parse_line(line, lineno, tenant, reply_topic, request_id=rid)
            if isinstance(item, Job):
                out.append(item)
    return out


def _error(code: str, message: str, line: int | None, param: str | None = None) -> dict[str, Any]:
    return {"code": code, "message": message, "param": param, "line": line}


def result_line(
    custom_id: str, endpoint: str, model: str, c: Completion, *, expired: bool = False
) -> tuple[bytes, bool]:
    """The line a finished request adds to the output file (True) or the error file: a
    failed request's ``response`` carries its status code and error body, as OpenAI's; a
    request cancelled with its batch has ``error.code`` ``batch_cancelled`` (or
    ``batch_expired``, when the batch ran out of its completion window)."""
    if c.error is None and c.finish_reason is FinishReason.CANCELLED:
        return cancelled_line(custom_id, c.request_id, expired=expired), False
    if c.error is not None:
        status = _STATUS.get(c.error.code, 500)
        kind = "invalid_request_error" if status < 500 else "server_error"
        body = {
            "error": {"message": c.error.message, "type": kind, "param": None, "code": c.error.code}
        }
        response = {"status_code": status, "request_id": c.request_id, "body": body}
        return _line(c.request_id, custom_id, response, None), False
    response = {
        "status_code": 200,
        "request_id": c.request_id,
        "body": response_body(endpoint, model, c),
    }
    return _line(c.request_id, custom_id, response, None), True


def cancelled_line(custom_id: str, request_id: str, *, expired: bool = False) -> bytes:
    """The error file line of a request its batch's cancellation (or expiry) stopped,
    in OpenAI's shape for lines that did not run: ``response`` null, ``error`` set."""
    if expired:
        error = {
            "code": "batch_expired",
            "message": "This request could not be executed before the completion window expired.",
        }
    else:
        error = {
            "code": "batch_cancelled",
            "message": "This request was cancelled with its batch before it finished.",
        }
    return _line(request_id, custom_id, None, error)


def _line(
    request_id: str, custom_id: str, response: dict[str, Any] | None, error: dict[str, Any] | None
) -> bytes:
    return orjson.dumps(
        {
            "id": f"batch_req_{request_id}",
            "custom_id": custom_id,
            "response": response,
            "error": error,
        }
    )
