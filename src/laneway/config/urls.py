"""URLs in a configuration: read once, with what Python's parser refuses taken as no URL."""

from __future__ import annotations

from urllib.parse import SplitResult, urlsplit


def split(url: str) -> SplitResult | None:
    """``url``'s parts, or ``None`` where it is no URL (a ``[`` not closed, a port that is
    not a number or out of range)."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (read for its check)
    except ValueError:
        return None
    return parts


def is_http(url: str) -> bool:
    """Whether ``url`` is an http(s) URL with a host (and a port, if any, that is one), with
    no space or control character in it (a trailing space would be sent on every call)."""
    if any(c.isspace() or not c.isprintable() for c in url):
        return False
    parts = split(url)
    return parts is not None and parts.scheme in ("http", "https") and bool(parts.hostname)


def is_otlp_traces(url: str) -> bool:
    """Whether ``url`` is an OTLP/HTTP traces endpoint: an http(s) URL with a path (the
    exporter posts to it as given; a collector serves ``/v1/traces``, not ``/``)."""
    parts = split(url) if is_http(url) else None
    return parts is not None and parts.path.strip("/") != ""
