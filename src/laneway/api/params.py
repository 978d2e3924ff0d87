"""Reading a request over HTTP: the JSON body (size-limited), the key, the priority.

The body itself (the job, what to forward) is read by :mod:`laneway.protocol.requests`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from starlette.datastructures import Headers, QueryParams
from starlette.requests import Request

from laneway.config.schema import ServerConfig, TenantConfig
from laneway.errors import InvalidRequest, PayloadTooLarge, Unauthorized, UnsupportedEncoding
from laneway.protocol import json_input

PRIORITY_HEADER = "x-laneway-priority"


async def read_json(request: Request, limit: int) -> dict[str, Any]:
    """The body as a JSON object; 413 past ``limit`` bytes, 400 if it is not JSON."""
    return (await read_json_sized(request, limit))[0]


async def read_json_sized(request: Request, limit: int) -> tuple[dict[str, Any], int]:
    """:func:`read_json`, and the body's size in bytes."""
    raw = await read_body(request, limit)
    return json_object(raw), len(raw)


def json_object(raw: bytes) -> dict[str, Any]:
    """``raw`` read by the strict reader as a JSON object (400 if it is not one)."""
    body = json_input.loads(raw)
    if not isinstance(body, dict):
        raise InvalidRequest("the body must be a JSON object")
    return body


async def read_body(request: Request, limit: int) -> bytes:
    """The body's bytes: 413 past ``limit`` bytes, 415 compressed."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isascii() and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"the request body is {declared} bytes; the limit is {limit}")
    encoding = request.headers.get("content-encoding")
    if encoding is not None and encoding.strip().lower() not in ("", "identity"):
        raise UnsupportedEncoding(
            f"the request body is sent with Content-Encoding {encoding!r}: send it uncompressed",
            param="Content-Encoding",
        )
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"the request body is over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def authenticate(request: Request, config: ServerConfig) -> TenantConfig | None:
    """The tenant the key belongs to (``None`` when keys are not required): a bearer key, or
    Anthropic's ``x-api-key`` header (what its clients send)."""
    if not config.auth:
        return None
    headers = request.headers
    keys = []
    for header in headers.getlist("authorization"):
        scheme, _, key = header.partition(" ")
        if scheme.lower() == "bearer" and key.strip():
            keys.append(key.strip())
    keys += (key.strip() for key in headers.getlist("x-api-key") if key.strip())
    if not keys:
        raise Unauthorized("missing API key: send 'Authorization: Bearer <key>' (or 'x-api-key: <key>')")
    different = len(set(keys))
    if different > 1:  # (one taken at a guess would bill a request to a tenant it may not be)
        raise Unauthorized(f"{different} different API keys were sent (Authorization, x-api-key): send one")
    tenant = config.tenant_for_key(keys[0])
    if tenant is None:
        raise Unauthorized("invalid API key")
    return tenant


def parse_class(value: object, config: ServerConfig, param: str) -> int:
    try:
        return config.scheduler.classes.parse(value)
    except ValueError as exc:
        raise InvalidRequest(str(exc), param=param) from None


def _tier(body: Mapping[str, Any], config: ServerConfig) -> int | None:
    """The class the body's ``service_tier`` names (``None``: none given, or a tier that names
    no class)."""
    tier = body.get("service_tier")
    if tier is None:
        return None
    if not isinstance(tier, str) or tier not in config.service_tiers:
        known = ", ".join(config.service_tiers)
        raise InvalidRequest(f"unknown service_tier {tier!r}: expected one of {known}", param="service_tier")
    name = config.service_tiers[tier]
    return parse_class(name, config, "service_tier") if name is not None else None


def priority_header(headers: Headers) -> str | None:
    """The ``X-Laneway-Priority`` header's value (``None`` without one): sent once, or the same
    value again; two values are refused rather than one taken at a guess. HTTP carries the
    header as bytes, read here as UTF-8 (what a client sends ``"P1 é"`` as), so an error
    message shows the value the client wrote."""
    values = list(dict.fromkeys(v.strip() for v in headers.getlist(PRIORITY_HEADER)))
    if len(values) > 1:
        shown = ", ".join(repr(_utf8(v)) for v in values)
        raise InvalidRequest(
            f"X-Laneway-Priority is sent with {len(values)} different values ({shown}): send one",
            param="X-Laneway-Priority",
        )
    return _utf8(values[0]) if values else None


def query_value(query: QueryParams, name: str) -> str | None:
    """The query parameter ``name`` (``None`` without one): given once, or the same value
    again; two values are refused, as for the header."""
    values = list(dict.fromkeys(query.getlist(name)))
    if len(values) > 1:
        shown = ", ".join(repr(v) for v in values)
        message = f"{name} is given {len(values)} different values ({shown}): give one"
        raise InvalidRequest(message, param=name)
    return values[0] if values else None


def _utf8(value: str) -> str:
    """A header value as its client wrote it: the bytes (which the server reads as latin-1)
    as UTF-8, where they are."""
    try:
        return value.encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        return value


def priority(
    body: Mapping[str, Any],
    headers: Headers,
    tenant: TenantConfig | None,
    config: ServerConfig,
    *,
    tiers: bool = True,
) -> int:
    """Body ``priority`` (or ``laneway.priority``), else the ``X-Laneway-Priority`` header,
    else ``service_tier`` (``tiers``: read; a pass-through's is the upstream's), else the
    tenant's default class, else the server's. Each one given is checked, whichever wins."""
    ext = body.get("laneway")
    nested = ext.get("priority") if isinstance(ext, dict) else None
    given = body.get("priority")
    rank = parse_class(given, config, "priority") if given is not None else None
    inner = parse_class(nested, config, "laneway.priority") if nested is not None else None
    if rank is not None and inner is not None and inner != rank:
        raise InvalidRequest(
            f"priority {given!r} and laneway.priority {nested!r} differ: send one", param="laneway.priority"
        )
    header = priority_header(headers)
    said = parse_class(header, config, "X-Laneway-Priority") if header else None
    tier = _tier(body, config) if tiers else None
    for chosen in (rank, inner, said, tier):
        if chosen is not None:
            return chosen
    if tenant is not None and tenant.policy.default_class is not None:
        return tenant.policy.default_class
    return config.default_priority
