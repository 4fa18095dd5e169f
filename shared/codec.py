"""orjson encoding of wire models, and decoding that says exactly what was wrong."""

from __future__ import annotations

from typing import TypeVar

import orjson
from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)


class DecodeError(ValueError):
    """Bytes that are not a valid message. ``reason`` is ``undecodable`` (not JSON) or
    ``invalid`` (JSON that does not validate); both are permanent, never retried."""

    retriable = False

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def encode(msg: BaseModel) -> bytes:
    """Serialize a model to compact JSON bytes (None fields left out). Integer dict keys
    (a logit bias's token ids) become JSON's string keys; decoding reads them back."""
    return orjson.dumps(
        msg.model_dump(mode="python", exclude_none=True), option=orjson.OPT_NON_STR_KEYS
    )


def decode(model: type[M], data: bytes | str) -> M:
    """Parse JSON bytes into ``model``, raising ``DecodeError`` with the reason."""
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise DecodeError("undecodable", str(exc)) from None
    try:
        return model.model_validate(obj)
    except ValidationError as exc:
        raise DecodeError("invalid", _summarize(exc)) from None


def _summarize(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        loc = ".".join(str(p) for p in err["loc"]) or "<root>"
        parts.append(f"{loc}: {err['msg']}")
    more = exc.error_count() - len(parts)
    return "; ".join(parts) + (f" (+{more} more)" if more > 0 else "")
