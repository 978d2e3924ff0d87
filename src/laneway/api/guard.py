"""The last line of defence: an error no handler expected answers 500, and the
connection stays usable.

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


class Guard:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
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
