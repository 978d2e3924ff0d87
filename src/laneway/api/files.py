"""``/v1/files``: upload (multipart, purpose ``batch``, JSONL), list, retrieve, content, delete.

A tenant sees only its own files: another tenant's file id is a 404.
"""

from __future__ import annotations

import re
import time
import uuid

from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Message, Receive

from laneway.api.kept import check_can_keep, created, gone_or
from laneway.api.objects import after_param, file_object, limit_param, order_param, page
from laneway.api.params import authenticate
from laneway.config.schema import ServerConfig
from laneway.errors import ClassNotAllowed, InvalidRequest, NotFound, PayloadTooLarge
from laneway.store.base import FileRecord, Store

PURPOSES = ("batch",)
FORM_OVERHEAD = 64 << 10  # multipart headers and the purpose field, on top of the file
FORM_LINES = 16  # ... and their lines


def tenant_of(request: Request, config: ServerConfig) -> str:
    tenant = authenticate(request, config)
    return tenant.name if tenant is not None else ""


def _store(request: Request) -> Store:
    store: Store = request.app.state.store
    return store


def _config(request: Request) -> ServerConfig:
    config: ServerConfig = request.app.state.runtime.config
    return config


async def upload(request: Request) -> Response:
    config = _config(request)
    who = authenticate(request, config)
    if who is not None and who.policy.allowed == frozenset():  # (a key for /metrics alone)
        raise ClassNotAllowed(
            f"tenant {who.name!r} may run no class (allowed = []): it has no batches to upload files for"
        )
    tenant = who.name if who is not None else ""
    limit = config.batches.max_file_bytes
    declared = request.headers.get("content-length")
    if (
        declared is not None
        and declared.isascii()
        and declared.isdigit()
        and int(declared) > limit + FORM_OVERHEAD
    ):
        raise PayloadTooLarge(f"the upload is {declared} bytes; files may have at most {limit}")
    if not request.headers.get("content-type", "").lower().startswith("multipart/form-data"):
        raise InvalidRequest("upload a file as multipart/form-data with fields 'file' and 'purpose'")
    check_can_keep(request)
    # a body without a length (chunked) is counted as it arrives: past the limit it is a 413
    # then, not once the whole of it has been spooled to disk
    request = Request(
        request.scope, _bounded(request.receive, limit + FORM_OVERHEAD, limit, config.batches.max_lines)
    )
    async with request.form(max_files=1, max_fields=8) as form:
        given = list(dict.fromkeys(str(v) for v in form.getlist("purpose")))
        if len(given) > 1:  # (as a parameter given twice anywhere: refused, not read at a guess)
            raise InvalidRequest(
                f"purpose is given different values ({', '.join(map(repr, given))}): give it once",
                param="purpose",
            )
        purpose = form.get("purpose")
        if purpose is None or purpose == "":
            raise InvalidRequest(f"purpose is required (one of: {', '.join(PURPOSES)})", param="purpose")
        if purpose not in PURPOSES:
            raise InvalidRequest(
                f"purpose must be one of: {', '.join(PURPOSES)}; got {purpose!r}", param="purpose"
            )
        upload = form.get("file")
        if upload is None:
            raise InvalidRequest("file is required (the JSONL file, as a multipart file part)", param="file")
        if not isinstance(upload, UploadFile):
            raise InvalidRequest("file must be a file part (with a filename), not a text field", param="file")
        content = await upload.read(limit + 1)
        filename = upload.filename or "upload.jsonl"
    if len(content) > limit:
        raise PayloadTooLarge(f"the file is over the limit of {limit} bytes")
    max_lines = config.batches.max_lines  # (exactly, now the form's own lines are apart)
    if content.count(b"\n") >= max_lines and sum(1 for x in content.split(b"\n") if x.strip()) > max_lines:
        raise _too_many(max_lines)
    record = FileRecord(
        "file-" + uuid.uuid4().hex[:24], tenant, str(purpose), filename, len(content), int(time.time())
    )
    await _store(request).put_file(record, content)
    created(request, "file", record.id, tenant)
    return JSONResponse(file_object(record))


_BLANK = re.compile(rb"(?=\n\n)")


def _too_many(max_lines: int) -> InvalidRequest:
    err = InvalidRequest(
        f"the file has more than {max_lines} lines; a batch takes at most {max_lines} "
        "requests (split it in several files)",
        param="file",
    )
    err.code = "too_many_requests"
    return err


def _bounded(receive: Receive, most: int, limit: int, max_lines: int) -> Receive:
    """``receive``, raising :class:`PayloadTooLarge` once the body is past ``most`` bytes, and a
    400 once it holds more lines than a batch takes (blank lines aside; the form's own few
    lines allowed for): a file too long for any batch is refused as it arrives, not after."""
    got = 0
    lines = 0
    last = b""

    async def bounded() -> Message:
        nonlocal got, lines, last
        message = await receive()
        if message["type"] == "http.request":
            body = message.get("body", b"")
            got += len(body)
            if got > most:
                raise PayloadTooLarge(f"the upload is over the limit of {limit} bytes for a file")
            if body:
                blank = len(_BLANK.findall(body)) + (last == b"\n" and body[:1] == b"\n")
                lines += body.count(b"\n") - blank
                last = body[-1:]
                if lines > max_lines + FORM_LINES:
                    raise _too_many(max_lines)
        return message

    return bounded


async def list_files(request: Request) -> Response:
    tenant = tenant_of(request, _config(request))
    query = request.query_params
    limit = limit_param(query, maximum=10_000)
    records, more = await _store(request).list_files(
        tenant,
        limit=limit,
        after=after_param(query),
        purpose=query.get("purpose"),
        oldest_first=order_param(query) == "asc",
    )
    return JSONResponse(page(records, more, file_object))


async def _file(request: Request) -> tuple[str, str]:
    tenant = tenant_of(request, _config(request))
    return tenant, request.path_params["file_id"]


def _missing(file_id: str) -> NotFound:
    return NotFound(f"no such file: {file_id}", param="file_id")


async def retrieve(request: Request) -> Response:
    tenant, file_id = await _file(request)
    store = _store(request)
    record = await store.get_file(file_id, tenant)
    if record is None:
        raise await gone_or(store, file_id, tenant, _missing(file_id))
    return JSONResponse(file_object(record))


async def content(request: Request) -> Response:
    tenant, file_id = await _file(request)
    store = _store(request)
    data = await store.file_content(file_id, tenant)
    if data is None:
        raise await gone_or(store, file_id, tenant, _missing(file_id))
    return Response(data, media_type="application/octet-stream")


async def delete(request: Request) -> Response:
    tenant, file_id = await _file(request)
    store = _store(request)
    if not await store.delete_file(file_id, tenant):
        raise await gone_or(store, file_id, tenant, _missing(file_id))
    created(request, "deleted", file_id, tenant)
    return JSONResponse({"id": file_id, "object": "file", "deleted": True})
