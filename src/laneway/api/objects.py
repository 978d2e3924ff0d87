"""OpenAI's file, batch and list objects, built from store records."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from starlette.datastructures import QueryParams

from laneway.api.params import parse_class, query_value
from laneway.config.schema import ServerConfig
from laneway.errors import InvalidRequest
from laneway.store.base import BatchRecord, FileRecord

DEFAULT_LIMIT = 20
MAX_LIMIT = 100


def file_object(r: FileRecord) -> dict[str, Any]:
    return {
        "id": r.id,
        "object": "file",
        "bytes": r.bytes,
        "created_at": r.created_at,
        "filename": r.filename,
        "purpose": r.purpose,
        "status": "processed",
        "expires_at": None,
        "status_details": None,
    }


def batch_object(r: BatchRecord, config: ServerConfig) -> dict[str, Any]:
    errors = None
    if r.errors:
        errors = {"object": "list", "data": list(r.errors)}
    return {
        "id": r.id,
        "object": "batch",
        "endpoint": r.endpoint,
        "errors": errors,
        "input_file_id": r.input_file_id,
        "completion_window": r.completion_window,
        "status": r.status.value,
        "output_file_id": r.output_file_id,
        "error_file_id": r.error_file_id,
        "created_at": r.created_at,
        "in_progress_at": r.in_progress_at,
        "expires_at": r.expires_at,
        "finalizing_at": r.finalizing_at,
        "completed_at": r.completed_at,
        "failed_at": r.failed_at,
        "expired_at": r.expired_at,
        "cancelling_at": r.cancelling_at,
        "cancelled_at": r.cancelled_at,
        "request_counts": {"total": r.total, "completed": r.completed, "failed": r.failed},
        "usage": {
            "input_tokens": r.input_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": r.output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": r.input_tokens + r.output_tokens,
        },
        "metadata": r.metadata,
        "laneway": {"priority": config.scheduler.classes[r.priority].name},
    }


def page(items: Sequence[Any], has_more: bool, render: Callable[[Any], dict[str, Any]]) -> dict[str, Any]:
    data = [render(i) for i in items]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": has_more,
    }


def limit_param(query: QueryParams, maximum: int = MAX_LIMIT) -> int:
    raw = query_value(query, "limit")
    if raw is None:
        return DEFAULT_LIMIT
    if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= maximum:
        raise InvalidRequest(f"limit must be a whole number from 1 to {maximum}, got {raw!r}", param="limit")
    return int(raw)


def after_param(query: QueryParams) -> str | None:
    """A list's ``after``: the id the page starts after (none: the first page)."""
    after = query_value(query, "after")
    if after is not None and not after:
        raise InvalidRequest("after must be an id (the last_id of the page before), got ''", param="after")
    return after


def order_param(query: QueryParams) -> str:
    """A list's ``order``: ``desc`` (newest first, the default) or ``asc``."""
    order = query_value(query, "order")
    if order is None:
        return "desc"
    if order not in ("asc", "desc"):
        raise InvalidRequest(f"order must be asc or desc, got {order!r}", param="order")
    return order


def batch_class(metadata: Mapping[str, str] | None, config: ServerConfig) -> int | None:
    """The class named by ``metadata.priority`` (None: the default)."""
    if metadata is None or metadata.get("priority") is None:
        return None
    return parse_class(metadata["priority"], config, "metadata.priority")
