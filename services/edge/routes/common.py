"""What every route needs: the edge state and the caller."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Annotated, Any

import orjson
from fastapi import Depends, Request, Security
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.responses import Response

from services.edge.auth import Principal, bearer_token
from services.edge.errors import unauthorized
from services.edge.state import EdgeState

# Declares the scheme in the OpenAPI document; the header itself is parsed below, so that
# a malformed one is a 401 (where keys are required) rather than a missing one.
_bearer = HTTPBearer(auto_error=False, description="an API key: 'Authorization: Bearer twk-…'")

ERROR_RESPONSES: dict[int | str, dict[str, object]] = {
    code: {"description": text}
    for code, text in {
        400: "invalid parameters (OpenAI error JSON)",
        401: "missing or invalid API key",
        404: "no such request for this tenant",
        413: "request body too large",
        429: "rate limited (see Retry-After)",
        503: "overloaded or a dependency is down (see Retry-After)",
    }.items()
}


class _OrjsonRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = orjson.loads(await self.body())
        return self._json


class JsonRoute(APIRoute):
    """A route whose JSON body is parsed by orjson: strict UTF-8, so an unpaired surrogate
    escape ("\\ud800") is a JSON error (400), where the standard library's parser made it a
    str that no tokenizer or encoder takes (a 500). orjson's error is a
    ``json.JSONDecodeError``, which FastAPI answers as it answers any malformed body."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def handle(request: Request) -> Response:
            return await handler(_OrjsonRequest(request.scope, request.receive))

        return handle


def edge_state(request: Request) -> EdgeState:
    state: EdgeState = request.app.state.edge
    return state


async def principal(
    request: Request, _: Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)]
) -> Principal:
    """The caller, from ``Authorization: Bearer <key>``."""
    header = request.headers.get("authorization")
    key = bearer_token(header)
    st = edge_state(request)
    if header is not None and key is None and st.keys.required:
        raise unauthorized("malformed Authorization header: expected 'Bearer <key>'")
    with st.health.guard("api key lookup"):
        return await st.keys.authenticate(key)


Caller = Annotated[Principal, Depends(principal)]
