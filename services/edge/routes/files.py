"""``/v1/files``: upload a Batch API input file, read a file's metadata or content, delete
it. Files are the tenant's: another tenant's file is a 404, like one that never existed.

The upload is ``multipart/form-data`` (fields ``file`` and ``purpose``), as the official
client sends it; it is parsed with the standard library's MIME parser (the body is at
most ``TW_MAX_BODY_BYTES``, already read whole by the body-limit middleware).
"""

from __future__ import annotations

from email.message import Message
from email.parser import BytesParser
from email.policy import HTTP
from typing import Annotated, Any

from fastapi import APIRouter, Path, Request
from starlette.responses import JSONResponse, Response

from services.edge.batch_store import FILE_PURPOSES, BatchStore, FileInfo
from services.edge.errors import bad_request, not_found
from services.edge.routes.common import ERROR_RESPONSES, Caller, JsonRoute, edge_state

router = APIRouter(responses=ERROR_RESPONSES, tags=["batches"], route_class=JsonRoute)

FileIdParam = Annotated[str, Path(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._-]+$")]

_UPLOAD_SCHEMA: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file", "purpose"],
                    "properties": {
                        "file": {"type": "string", "format": "binary"},
                        "purpose": {"type": "string", "enum": ["batch"]},
                    },
                }
            }
        },
    }
}


def batch_store(request: Request) -> BatchStore:
    store: BatchStore = request.app.state.batches.store
    return store


@router.post("/v1/files", openapi_extra=_UPLOAD_SCHEMA)
async def upload(request: Request, who: Caller) -> JSONResponse:
    """Store an uploaded JSONL file (purpose ``batch``) for ``POST /v1/batches``."""
    st = edge_state(request)
    form = _form(request.headers.get("content-type", ""), await request.body())
    purpose = form.get("purpose")
    if purpose is None:
        raise bad_request("the form field 'purpose' is required", param="purpose")
    if purpose[0] != b"batch":
        raise bad_request(
            "purpose must be 'batch' (the only purpose this server stores)", param="purpose"
        )
    part = form.get("file")
    if part is None or part[1] is None:
        raise bad_request("the form field 'file' (a file upload) is required", param="file")
    content, filename = part
    filename = filename or "upload.jsonl"
    with st.health.guard("file upload"):
        info = await batch_store(request).put_file(who.tenant, filename, "batch", content)
    return JSONResponse(info.to_openai())


def _form(content_type: str, body: bytes) -> dict[str, tuple[bytes, str | None]]:
    """The parts of a ``multipart/form-data`` body: name → (bytes, filename or None)."""
    if not content_type.lower().startswith("multipart/form-data"):
        raise bad_request("the upload must be multipart/form-data", param="file")
    head = f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode()
    msg = BytesParser(policy=HTTP).parsebytes(head + body)
    if not msg.is_multipart():
        raise bad_request("the multipart body could not be parsed", param="file")
    out: dict[str, tuple[bytes, str | None]] = {}
    for part in msg.iter_parts():
        if not isinstance(part, Message):
            continue
        name = part.get_param("name", header="content-disposition")
        if not isinstance(name, str):
            continue
        payload = part.get_payload(decode=True)
        out[name] = (payload if isinstance(payload, bytes) else b"", part.get_filename())
    return out


async def _owned(request: Request, who: Caller, file_id: str) -> FileInfo:
    with edge_state(request).health.guard("file lookup"):
        info = await batch_store(request).file(who.tenant, file_id)
    if info is None or info.purpose not in FILE_PURPOSES:
        raise not_found(f"no file '{file_id}'")
    return info


@router.get("/v1/files/{file_id}")
async def get_file(file_id: FileIdParam, request: Request, who: Caller) -> JSONResponse:
    """A file's metadata."""
    return JSONResponse((await _owned(request, who, file_id)).to_openai())


@router.get("/v1/files/{file_id}/content")
async def file_content(file_id: FileIdParam, request: Request, who: Caller) -> Response:
    """A file's bytes: an uploaded input, or a batch's output or error file (JSONL)."""
    await _owned(request, who, file_id)
    with edge_state(request).health.guard("file content"):
        content = await batch_store(request).content(file_id)
    if content is None:
        raise not_found(f"no file '{file_id}'")
    return Response(content, media_type="application/jsonl")


@router.delete("/v1/files/{file_id}")
async def delete_file(file_id: FileIdParam, request: Request, who: Caller) -> JSONResponse:
    """Delete a file (a batch already created from it keeps running from its record)."""
    await _owned(request, who, file_id)
    with edge_state(request).health.guard("file delete"):
        await batch_store(request).delete_file(file_id)
    return JSONResponse({"id": file_id, "object": "file", "deleted": True})
