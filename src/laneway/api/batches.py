"""``/v1/batches``: create, retrieve, list (newest first, ``limit``/``after``), cancel.

A batch runs at its class: ``metadata.priority`` if given (within the
tenant's entitlements, else 403), else ``[batches] default_priority`` (P2).
Its lines queue for at most its ``completion_window`` (required, as at
OpenAI); past it the batch expires with the results it has. Validation (each line's JSON, custom_id,
url, model and parameters) happens after creation: the batch is
``validating``, then ``in_progress`` or ``failed`` with ``errors``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from laneway.api.files import tenant_of
from laneway.api.kept import check_can_keep, created, gone_or
from laneway.api.objects import after_param, batch_class, batch_object, limit_param, page
from laneway.api.params import authenticate, read_json
from laneway.batch.runner import BatchRunner
from laneway.batch.validate import ENDPOINTS
from laneway.batch.window import window_seconds
from laneway.config.schema import ServerConfig, TenantConfig
from laneway.errors import ClassNotAllowed, Conflict, InvalidRequest, NotFound
from laneway.store.base import BatchRecord, BatchStatus, Store

MAX_METADATA_KEYS = 16


def _parts(request: Request) -> tuple[ServerConfig, Store, BatchRunner]:
    state = request.app.state
    return state.runtime.config, state.store, state.batches


def _metadata(value: object) -> dict[str, str] | None:
    if value is None:
        return None
    ok = (
        isinstance(value, dict)
        and len(value) <= MAX_METADATA_KEYS
        and all(
            isinstance(k, str) and len(k) <= 64 and isinstance(v, str) and len(v) <= 512
            for k, v in value.items()
        )
    )
    if not ok or not isinstance(value, dict):
        raise InvalidRequest(
            f"metadata must be an object of at most {MAX_METADATA_KEYS} string keys (≤ 64 characters) "
            "and string values (≤ 512 characters)",
            param="metadata",
        )
    return dict(value)


def _entitled(cls: int | None, tenant: TenantConfig | None, config: ServerConfig) -> int:
    allowed = tenant.policy.allowed if tenant is not None else None
    names = config.scheduler.classes.names
    if cls is not None:
        if allowed is not None and cls not in allowed:
            raise ClassNotAllowed(
                f"tenant {tenant.name!r} may not use class {names[cls]}",  # type: ignore[union-attr]
                param="metadata.priority",
            )
        return cls
    default = config.batches.default_priority
    if tenant is None:
        return default
    fallback = tenant.policy.fallback(default)  # the most urgent allowed class not above it
    if fallback is None:
        raise ClassNotAllowed(
            f"tenant {tenant.name!r} may not use the batch class {names[default]}; "
            "set metadata.priority to an allowed class",
            param="metadata.priority",
        )
    return fallback


async def create(request: Request) -> Response:
    config, store, runner = _parts(request)
    tenant = authenticate(request, config)
    check_can_keep(request)
    body: Mapping[str, Any] = await read_json(request, config.max_body_bytes)
    file_id = body.get("input_file_id")
    if not isinstance(file_id, str) or not file_id:
        said = "is required" if file_id is None else f"must be a file id (a string), got {file_id!r}"
        raise InvalidRequest(f"input_file_id {said}", param="input_file_id")
    endpoint = body.get("endpoint")
    if endpoint is None:
        raise InvalidRequest(f"endpoint is required (one of: {', '.join(ENDPOINTS)})", param="endpoint")
    if not isinstance(endpoint, str) or endpoint not in ENDPOINTS:
        raise InvalidRequest(
            f"endpoint must be one of {', '.join(ENDPOINTS)}, got {endpoint!r}", param="endpoint"
        )
    window = body.get("completion_window")
    if window is None:  # OpenAI requires it too: no silent default
        raise InvalidRequest(
            "completion_window is required (e.g. '24h'; also s, m or d)", param="completion_window"
        )
    try:
        window_s = window_seconds(window)
    except ValueError as exc:
        raise InvalidRequest(str(exc), param="completion_window") from None
    metadata = _metadata(body.get("metadata"))
    cls = _entitled(batch_class(metadata, config), tenant, config)
    owner = tenant.name if tenant is not None else ""
    source = await store.get_file(file_id, owner)
    if source is None:
        raise await gone_or(
            store, file_id, owner, NotFound(f"no such file: {file_id}", param="input_file_id")
        )
    if source.purpose != "batch":
        raise InvalidRequest(
            f"file {file_id} has purpose {source.purpose!r}; a batch needs a 'batch' file",
            param="input_file_id",
        )
    now = int(time.time())
    record = BatchRecord(
        id="batch_" + uuid.uuid4().hex[:24],
        tenant=owner,
        endpoint=str(endpoint),
        input_file_id=file_id,
        completion_window=str(window),
        priority=cls,
        status=BatchStatus.VALIDATING,
        created_at=now,
        expires_at=now + window_s,
        metadata=metadata,
    )
    await store.create_batch(record)
    created(request, "batch", record.id, owner)
    runner.track(record.id)
    return JSONResponse(batch_object(record, config))


async def _batch(request: Request) -> tuple[ServerConfig, Store, BatchRunner, BatchRecord]:
    config, store, runner = _parts(request)
    tenant = tenant_of(request, config)
    batch_id = request.path_params["batch_id"]
    record = await store.get_batch(batch_id, tenant)
    if record is None:
        raise await gone_or(store, batch_id, tenant, NotFound(f"no such batch: {batch_id}", param="batch_id"))
    return config, store, runner, record


async def retrieve(request: Request) -> Response:
    config, _, _, record = await _batch(request)
    return JSONResponse(batch_object(record, config))


async def list_batches(request: Request) -> Response:
    config, store, _ = _parts(request)
    tenant = tenant_of(request, config)
    query = request.query_params
    records, more = await store.list_batches(tenant, limit=limit_param(query), after=after_param(query))
    return JSONResponse(page(records, more, lambda r: batch_object(r, config)))


async def cancel(request: Request) -> Response:
    config, store, runner, record = await _batch(request)
    moved = False
    for _ in range(3):  # the runner may move it (validating → in_progress) in between
        if record.status not in (BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS):
            break
        moved = await store.set_status(record.id, BatchStatus.CANCELLING, int(time.time()))
        record = await store.get_batch(record.id) or record
        if moved:
            runner.poke(record.id)
            break
    # cancelling again while it stops is answered with the batch; once it has ended, 409
    if not moved and record.status is not BatchStatus.CANCELLING:
        raise Conflict(
            f"batch {record.id} is {record.status.value}: it cannot be cancelled", param="batch_id"
        )
    return JSONResponse(batch_object(record, config))
