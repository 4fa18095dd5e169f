"""The edge application: OpenAI-compatible HTTP and a WebSocket in, token streams out.

A request is authenticated, validated, admitted (load and rate limits), given an id and a
seed, published to the requests topic, and answered from its Redis token stream: relayed
as SSE when ``stream`` is true, gathered into one JSON body otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.staticfiles import StaticFiles

from services.edge.batch_runner import BatchRunner
from services.edge.config import EdgeSettings
from services.edge.errors import ApiError, bad_request
from services.edge.metrics import EdgeMetrics
from services.edge.middleware import BodyLimit, CountRequests
from services.edge.routes import (
    batches,
    dashboard,
    files,
    generate,
    ops,
    requests,
    tokens,
    ws,
)
from services.edge.routes.ops import STATIC
from services.edge.state import EdgeState
from shared.tasks import cancel_and_wait

log = logging.getLogger(__name__)

STOP_POLL_S = 0.2  # how soon a stop asked during the start is seen


def create_app(settings: EdgeSettings) -> FastAPI:
    """The edge application; its clients live for the app's lifespan."""
    metrics = EdgeMetrics()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state = EdgeState.build(settings, metrics)
        if not await _start_unless_stopped(app, state):
            await state.stop()
            yield  # uvicorn was asked to stop: it exits without serving
            return
        app.state.edge = state
        runner = BatchRunner(state)
        await runner.start()
        app.state.batches = runner
        try:
            yield
        finally:
            await runner.stop()
            await state.stop()

    app = FastAPI(title="tokenwire edge", version="0.2.0", lifespan=lifespan)
    for module in (generate, requests, tokens, files, batches, ws, ops, dashboard):
        app.include_router(module.router)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    add_error_handlers(app)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(CountRequests, metrics=metrics)  # outermost: counts 413s too
    return app


def add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> Response:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> Response:
        errors = exc.errors()
        if not errors:
            return bad_request("invalid request").response()
        first = errors[0]
        if first.get("type") == "json_invalid":  # its location is a byte offset, no field
            why = (first.get("ctx") or {}).get("error")
            msg = f"the body is not valid JSON: {why}" if why else "the body is not valid JSON"
            return bad_request(msg).response()
        param = ".".join(_field_path(first.get("loc", ()))) or None
        if first.get("type") == "extra_forbidden":
            return bad_request(
                f"'{param}' is not supported by this server",
                code="unsupported_parameter",
                param=param,
            ).response()
        msg = str(first.get("msg", "invalid value"))
        return bad_request(f"{param}: {msg}" if param else msg, param=param).response()

    @app.exception_handler(Exception)
    async def _fault(_: Request, exc: Exception) -> Response:
        # The edge's own fault: the API's error shape; the server logs the traceback.
        return ApiError(
            500,
            "internal error: the edge failed on this request (its log has the cause)",
            kind="server_error",
            code="internal_error",
        ).response()

    @app.exception_handler(HTTPException)
    async def _http(_: Request, exc: HTTPException) -> Response:
        codes = {404: "not_found", 405: "method_not_allowed"}
        err = ApiError(exc.status_code, str(exc.detail), code=codes.get(exc.status_code))
        resp = err.response()
        if exc.headers:
            resp.headers.update(exc.headers)
        return resp


# Where a request's parts sit in a validation error's location, and the names pydantic
# gives the members of a union ("str", "constrained-str", "list[constrained-str]"): a
# field name is an identifier, so never holds "-" or "[".
_LOCATIONS = ("body", "query", "path", "header")
_UNION_MEMBERS = ("str", "int", "float", "bool", "list", "dict", "none")


def _field_path(loc: Any) -> list[str]:
    """The field a validation error is about, as the client wrote it: without the request
    part and without the union member pydantic tried."""
    return [
        str(p)
        for p in loc
        if p not in _LOCATIONS
        and not (isinstance(p, str) and ("[" in p or "-" in p or p in _UNION_MEMBERS))
    ]


async def _start_unless_stopped(app: FastAPI, state: EdgeState) -> bool:
    """Start the edge's clients; False when the server was asked to stop first. Kafka
    refusing the producer keeps the start waiting (trying again), and uvicorn acts on a
    SIGTERM only once the application has started, so the start watches for it."""
    server = getattr(app.state, "server", None)
    start = asyncio.ensure_future(state.start())
    try:
        while True:
            done, _ = await asyncio.wait({start}, timeout=STOP_POLL_S)
            if done:
                start.result()
                return True
            if server is not None and server.should_exit:
                log.info("asked to stop while starting")
                return False
    finally:
        await cancel_and_wait(start)
