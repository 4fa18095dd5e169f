"""OpenAI-style errors: one exception type that carries its HTTP status and headers."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response


class ApiError(Exception):
    """A request the edge refuses; rendered as OpenAI error JSON with ``status``."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        kind: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.code = code
        self.param = param
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self) -> Response:
        return Response(
            orjson.dumps(self.body()),
            status_code=self.status,
            media_type="application/json",
            headers=self.headers,
        )


def bad_request(message: str, *, code: str = "invalid_value", param: str | None = None) -> ApiError:
    return ApiError(400, message, code=code, param=param)


def not_found(message: str) -> ApiError:
    return ApiError(404, message, code="not_found")


def model_not_found(asked: str, served: str) -> ApiError:
    return ApiError(
        404,
        f"the model '{asked}' does not exist; this edge serves '{served}'",
        code="model_not_found",
        param="model",
    )


def unauthorized(message: str) -> ApiError:
    return ApiError(
        401,
        message,
        kind="authentication_error",
        code="invalid_api_key",
        headers={"WWW-Authenticate": "Bearer"},
    )


def forbidden(message: str, *, param: str | None = None) -> ApiError:
    """The key is valid but its policy does not allow this (OpenAI's 403)."""
    return ApiError(403, message, kind="permission_error", code="permission_denied", param=param)


def rate_limited(
    message: str, retry_after_s: float, *, code: str = "rate_limit_exceeded"
) -> ApiError:
    return ApiError(
        429,
        message,
        kind="rate_limit_error",
        code=code,
        headers={"Retry-After": str(max(1, int(retry_after_s + 0.999)))},
    )


def unavailable(message: str, *, code: str = "overloaded", retry_after_s: float = 1.0) -> ApiError:
    return ApiError(
        503,
        message,
        kind="server_error",
        code=code,
        headers={"Retry-After": str(max(1, int(retry_after_s + 0.999)))},
    )
