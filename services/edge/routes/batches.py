"""``/v1/batches``: create a batch from an uploaded file, read it, list them, cancel it.

A created batch is ``validating``; the edges' batch runners (``services/edge/
batch_runner.py``) take it from there: ``in_progress`` while its lines run at bulk
priority, ``finalizing`` while the output and error files are written, then
``completed`` (or ``failed`` at validation, ``cancelling``/``cancelled``, ``expired``).
Batches are the tenant's: another tenant's batch is a 404.
"""

from __future__ import annotations

import time
from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import JSONResponse

from services.edge.batch_store import (
    CANCELLED,
    COMPLETION_WINDOW_S,
    ENDED,
    BatchRecord,
    new_batch_id,
)
from services.edge.errors import ApiError, bad_request, forbidden, not_found
from services.edge.routes.common import ERROR_RESPONSES, Caller, JsonRoute, edge_state
from services.edge.routes.files import batch_store
from shared.messages import Priority

router = APIRouter(responses=ERROR_RESPONSES, tags=["batches"], route_class=JsonRoute)

BatchIdParam = Annotated[str, Path(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._-]+$")]
MetadataValue = Annotated[str, Field(max_length=512)]


class CreateBatch(BaseModel):
    """The body of ``POST /v1/batches`` (OpenAI's; other fields are refused)."""

    model_config = ConfigDict(extra="forbid")

    input_file_id: str = Field(min_length=1, max_length=128)
    endpoint: Literal["/v1/chat/completions", "/v1/completions"]
    completion_window: Literal["24h"]
    metadata: dict[Annotated[str, Field(max_length=64)], MetadataValue] | None = Field(
        None, max_length=16
    )


@router.post("/v1/batches")
async def create(body: CreateBatch, request: Request, who: Caller) -> JSONResponse:
    """Create a batch over an uploaded ``batch`` file; its lines are checked next
    (``validating``), and a file with a bad line fails the batch as a whole."""
    st = edge_state(request)
    store = batch_store(request)
    # A batch's lines run at bulk priority on the served model: the key must allow both.
    if not who.may_use_model(st.settings.model_name):
        raise ApiError(
            404,
            f"this API key cannot use the model '{st.settings.model_name}' its batches run on",
            code="model_not_found",
        )
    if not who.may_use_priority(Priority.BULK):
        raise forbidden("this API key may not use priority 'bulk', which batches run at")
    with st.health.guard("batch create"):
        info = await store.file(who.tenant, body.input_file_id)
        if info is None:
            raise not_found(f"no file '{body.input_file_id}'")
        if info.purpose != "batch":
            raise bad_request(
                f"the file '{info.id}' has purpose '{info.purpose}'; a batch needs 'batch'",
                param="input_file_id",
            )
        now = int(time.time())
        rec = BatchRecord(
            id=new_batch_id(),
            tenant=who.tenant,
            endpoint=body.endpoint,
            input_file_id=info.id,
            model=st.settings.model_name,
            created_at=now,
            expires_at=now + COMPLETION_WINDOW_S,
            metadata=body.metadata,
        )
        await store.create(rec)
    return JSONResponse(rec.to_openai())


@router.get("/v1/batches/{batch_id}")
async def retrieve(batch_id: BatchIdParam, request: Request, who: Caller) -> JSONResponse:
    """A batch: status, ``request_counts``, and its file ids once written."""
    return JSONResponse((await _owned(request, who, batch_id)).to_openai())


@router.get("/v1/batches")
async def list_batches(
    request: Request,
    who: Caller,
    after: Annotated[str | None, Query(max_length=128, description="a batch id")] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> JSONResponse:
    """The caller's batches, newest first, ``limit`` at a time after the batch ``after``."""
    store = batch_store(request)
    with edge_state(request).health.guard("batch list"):
        ids, more = await store.page(who.tenant, after, limit)
        recs = [r for r in [await store.get(i, who.tenant) for i in ids] if r is not None]
    data = [r.to_openai() for r in recs]
    return JSONResponse(
        {
            "object": "list",
            "data": data,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
            "has_more": more,
        }
    )


@router.post("/v1/batches/{batch_id}/cancel")
async def cancel(batch_id: BatchIdParam, request: Request, who: Caller) -> JSONResponse:
    """Cancel a batch: it is ``cancelling`` while its running requests are stopped on the
    workers, then ``cancelled``, with the lines that finished in its output file."""
    store = batch_store(request)
    with edge_state(request).health.guard("batch cancel"):
        rec = await _owned(request, who, batch_id)
        if rec.status in ENDED - {"cancelled"}:
            raise ApiError(
                409,
                f"the batch is {rec.status}; only a running batch can be cancelled",
                code="batch_not_cancellable",
            )
        if rec.status in ("validating", "in_progress"):
            await store.update(batch_id, cancel_requested=CANCELLED)
            await store.move(batch_id, "cancelling", from_=("validating", "in_progress"))
        rec = await _owned(request, who, batch_id)
    return JSONResponse(rec.to_openai())


async def _owned(request: Request, who: Caller, batch_id: str) -> BatchRecord:
    with edge_state(request).health.guard("batch lookup"):
        rec = await batch_store(request).get(batch_id, who.tenant)
    if rec is None:
        raise not_found(f"no batch '{batch_id}'")
    return rec
