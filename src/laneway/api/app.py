"""The HTTP application (Starlette): routes, error handlers, lifespan.

:func:`create_app` takes the configuration and, optionally, workers already
built (tests, embedding) and an opened store; the server they make
(:mod:`laneway.server`: workers, runtime, store, batch runner) starts at start-up and
closes at shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping

from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response
from starlette.routing import Route

from laneway.api import batches, completions, dashboard, files, health, models, queue, relay, responses
from laneway.api.dashboard import History
from laneway.api.errors import error_json, on_http_error, on_request_error, on_store_unavailable
from laneway.api.guard import Guard
from laneway.backends.base import Worker
from laneway.config.schema import ServerConfig
from laneway.errors import RequestError
from laneway.server import start_server
from laneway.store import Store, StoreUnavailable

ROUTES = [
    Route("/v1/chat/completions", completions.chat_completions, methods=["POST"]),
    Route("/v1/completions", completions.completions, methods=["POST"]),
    Route("/v1/embeddings", completions.embeddings, methods=["POST"]),
    Route("/v1/responses", responses.create, methods=["POST"]),
    Route("/v1/responses/input_tokens", responses.input_tokens, methods=["POST"]),
    Route("/v1/responses/compact", relay.relay_here, methods=["POST"]),  # (an upstream's, if any)
    Route("/v1/responses/{response_id}", responses.retrieve, methods=["GET"]),
    Route("/v1/responses/{response_id}", responses.delete, methods=["DELETE"]),
    Route("/v1/responses/{response_id}/input_items", responses.input_items, methods=["GET"]),
    Route("/v1/models", models.models, methods=["GET"]),
    Route("/v1/models/{model_id:path}", models.model, methods=["GET"]),
    Route("/v1/queue/estimate", queue.queue_estimate, methods=["GET"]),
    Route("/v1/files", files.upload, methods=["POST"]),
    Route("/v1/files", files.list_files, methods=["GET"]),
    Route("/v1/files/{file_id}", files.retrieve, methods=["GET"]),
    Route("/v1/files/{file_id}", files.delete, methods=["DELETE"]),
    Route("/v1/files/{file_id}/content", files.content, methods=["GET"]),
    Route("/v1/batches", batches.create, methods=["POST"]),
    Route("/v1/batches", batches.list_batches, methods=["GET"]),
    Route("/v1/batches/{batch_id}", batches.retrieve, methods=["GET"]),
    Route("/v1/batches/{batch_id}/cancel", batches.cancel, methods=["POST"]),
    Route("/", health.index, methods=["GET"]),
    Route("/metrics", health.metrics, methods=["GET"]),
    Route("/dashboard", dashboard.page, methods=["GET"]),
    Route("/dashboard/events", dashboard.events, methods=["GET"]),
    Route("/healthz", health.healthz, methods=["GET"]),
    Route("/readyz", health.readyz, methods=["GET"]),
    # last: any other POST under /v1 that names an upstream's model is passed through
    Route(relay.ROUTE, relay.relay, methods=["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"]),
]


def create_app(
    config: ServerConfig, workers: Mapping[str, Worker] | None = None, store: Store | None = None
) -> Starlette:
    """``store``: an opened store the app takes over (closed at shutdown); else the SQLite
    store in ``config.data_dir`` is opened at start-up."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # (a task: a Ctrl-C or SIGTERM while it starts — a fleet's engines may take minutes —
        # cancels it, laneway.stopping)
        app.state.starting = starting = asyncio.ensure_future(start_server(config, workers, store))
        try:
            server = await starting
        except asyncio.CancelledError:
            if not getattr(app.state, "stopping", False):
                raise
            yield  # (stopped before it served: uvicorn ends at once, nothing left to close)
            return
        finally:
            app.state.starting = None
        app.state.runtime = server.runtime
        app.state.node = server.node
        app.state.store = server.store
        app.state.batches = server.batches
        app.state.history = history = History()  # (the dashboard's last minutes)
        keeping = asyncio.get_running_loop().create_task(history.keep(server.runtime))
        try:
            yield
            if getattr(app.state, "stopping", False):  # (a signal: batch lines in flight have its grace)
                await server.batches.idle()
        finally:
            keeping.cancel()
            await server.close()

    app = Starlette(
        routes=ROUTES,
        lifespan=lifespan,
        exception_handlers={
            RequestError: on_request_error,
            HTTPException: on_http_error,
            StoreUnavailable: on_store_unavailable,
        },
        middleware=_middleware(config),
    )
    # "/v1/chat/completions/" is an unknown route (404 in OpenAI's shape), not a
    # redirect that clients would follow with a GET
    app.router.redirect_slashes = False
    return app


def _middleware(config: ServerConfig) -> list[Middleware]:
    """The guard; and CORS for the browser pages of ``allowed_origins`` (their preflight
    requests answered, their answers readable), where there are any."""
    out = [Middleware(Guard, allowed_origins=config.allowed_origins, bind_host=config.host)]
    if config.allowed_origins:
        out.append(
            Middleware(
                _Cors,
                allow_origins=list(config.allowed_origins),
                allow_methods=["GET", "POST", "DELETE"],
                allow_headers=["*"],
                expose_headers=["Retry-After"],
            )
        )
    return out


class _Cors(CORSMiddleware):
    """CORS; a preflight it refuses is answered in OpenAI's error shape, as any error."""

    def preflight_response(self, request_headers: Headers) -> Response:
        response = super().preflight_response(request_headers)
        if response.status_code != 400:
            return response
        refused = bytes(response.body).decode()  # ("Disallowed CORS origin, method")
        out = error_json(
            400,
            f"{refused}: a browser page's request that [server] allowed_origins does not allow",
            "invalid_request_error",
            "cors_disallowed",
        )
        for name, value in response.headers.items():
            if name not in ("content-length", "content-type"):
                out.headers[name] = value
        return out
