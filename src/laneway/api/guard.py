"""The first and last lines of defence.

A browser page of another origin may make the browser of whoever visits it send
a ``POST`` here (a form, or ``fetch`` with a "simple" content type) with no
preflight: without API keys, that would run requests or batches at the
visitor's laneway. A request with an ``Origin`` header that is neither this
server's own nor in ``allowed_origins`` is refused with 403 before it does
anything, unless its method only reads (``GET``, ``HEAD``, ``OPTIONS``: the
browser keeps their answers from the page). Clients that are not browsers send
no ``Origin``. On a server bound to one address (the default, 127.0.0.1), a
page is its own only under a name of that address (``localhost`` for
loopback): a page of a name made to resolve to 127.0.0.1 (DNS rebinding) is
foreign.

And an error no handler expected answers 500, and the connection stays usable.

Starlette's own catch-all answers 500 but raises the error again to the
server, which then drops the client's keep-alive connection (and the next
request on it fails). This middleware sits inside it: it logs the error once,
answers 500 in OpenAI's shape when nothing was sent yet, ends a response that
was under way, and returns normally.
"""

from __future__ import annotations

import logging

from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from laneway.api.errors import error_json

log = logging.getLogger("laneway.api")


READING = frozenset({"GET", "HEAD", "OPTIONS"})


LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "[::1]", "::1"})
ANY_ADDRESS = frozenset({"", "0.0.0.0", "::", "[::]"})


def own_names(bind_host: str) -> frozenset[str] | None:
    """The host names a page of this server may have (``None``: any, when it listens on
    every address and may be reached under any name)."""
    host = bind_host.lower()
    if host in ANY_ADDRESS:
        return None
    if host in LOOPBACK_NAMES or host.startswith("127."):
        return LOOPBACK_NAMES | {host}
    return frozenset({host, f"[{host}]"})


class Guard:
    def __init__(self, app: ASGIApp, allowed_origins: tuple[str, ...] = (), bind_host: str = "") -> None:
        self.app = app
        self.any_origin = "*" in allowed_origins
        self.origins = frozenset(allowed_origins)
        self.names = own_names(bind_host)

    def foreign(self, scope: Scope) -> str | None:
        """The ``Origin`` of a request that may not come from it, else ``None``."""
        origin = host = None
        twice = False  # an Origin or Host header given twice: no browser sends that
        for name, value in scope["headers"]:
            if name == b"origin":
                twice = twice or origin is not None
                origin = value.decode("latin-1").lower()
            elif name == b"host":
                twice = twice or host is not None
                host = value.decode("latin-1").lower()
        if origin is None:
            return None
        if twice:
            return origin
        if self.any_origin or origin in self.origins:
            return None
        own = origin.partition("://")[2]
        if host is None or own != host or not origin.startswith(("http://", "https://")):
            return origin
        if self.names is not None:
            name = host if host.endswith("]") else host.rsplit(":", 1)[0]
            if name not in self.names:  # (a name that resolves here, not this server's)
                return origin
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["method"] not in READING and not self.any_origin:
            origin = self.foreign(scope)
            if origin is not None:
                response = error_json(
                    403,
                    f"a request from the page of another origin ({origin[:200]}) is refused; "
                    "[server] allowed_origins lists the origins that may send them",
                    "invalid_request_error",
                    "cross_origin",
                )
                await response(scope, receive, send)
                return
        started = ended = False

        async def watched(message: Message) -> None:
            nonlocal started, ended
            if message["type"] == "http.response.start":
                started = True
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                ended = True
            await send(message)

        try:
            await self.app(scope, receive, watched)
        except ClientDisconnect:  # the client left (or was closed) while its body arrived
            return
        except Exception:
            log.exception("unhandled error on %s %s", scope.get("method"), scope.get("path"))
            if not started:
                response = error_json(
                    500, "internal error; the server log has the details", "server_error", "internal_error"
                )
                await response(scope, receive, send)
            elif not ended:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
