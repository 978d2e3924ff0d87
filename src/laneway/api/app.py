"""The HTTP application (Starlette): routes, error handlers, lifespan.

:func:`create_app` takes the configuration and, optionally, workers already
built (tests, embedding); otherwise the workers of the configuration are
built at start-up and closed at shutdown, together with the runtime.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.routing import Route

from laneway.api import batches, completions, dashboard, files, info
from laneway.api.errors import on_http_error, on_request_error, on_store_unavailable
from laneway.api.guard import Guard
from laneway.backends.base import Worker
from laneway.config.schema import ServerConfig
from laneway.errors import RequestError
from laneway.runtime import CHECKPOINTS, Runtime, build_workers
from laneway.runtime.batches import BatchRunner
from laneway.store import Store, StoreUnavailable, open_store

ROUTES = [
    Route("/v1/chat/completions", completions.chat_completions, methods=["POST"]),
    Route("/v1/completions", completions.completions, methods=["POST"]),
    Route("/v1/embeddings", completions.embeddings, methods=["POST"]),
    Route("/v1/models", info.models, methods=["GET"]),
    Route("/v1/models/{model_id:path}", info.model, methods=["GET"]),
    Route("/v1/queue/estimate", info.queue_estimate, methods=["GET"]),
    Route("/v1/files", files.upload, methods=["POST"]),
    Route("/v1/files", files.list_files, methods=["GET"]),
    Route("/v1/files/{file_id}", files.retrieve, methods=["GET"]),
    Route("/v1/files/{file_id}", files.delete, methods=["DELETE"]),
    Route("/v1/files/{file_id}/content", files.content, methods=["GET"]),
    Route("/v1/batches", batches.create, methods=["POST"]),
    Route("/v1/batches", batches.list_batches, methods=["GET"]),
    Route("/v1/batches/{batch_id}", batches.retrieve, methods=["GET"]),
    Route("/v1/batches/{batch_id}/cancel", batches.cancel, methods=["POST"]),
    Route("/", info.index, methods=["GET"]),
    Route("/metrics", info.metrics, methods=["GET"]),
    Route("/dashboard", dashboard.page, methods=["GET"]),
    Route("/dashboard/events", dashboard.events, methods=["GET"]),
    Route("/healthz", info.healthz, methods=["GET"]),
    Route("/readyz", info.readyz, methods=["GET"]),
]


def create_app(
    config: ServerConfig, workers: Mapping[str, Worker] | None = None, store: Store | None = None
) -> Starlette:
    """``store``: an opened store the app takes over (closed at shutdown); else the SQLite
    store in ``config.data_dir`` is opened at start-up."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        built = dict(workers) if workers is not None else await build_workers(config.workers, config.data_dir)
        types = {w.name: w.type for w in config.workers}
        runtime = Runtime(
            config, built, can_checkpoint={n: CHECKPOINTS.get(types.get(n, "local"), True) for n in built}
        )
        app.state.runtime = runtime
        await runtime.calibrate()
        node = None
        if config.cluster is not None:  # scheduled by the cluster's leader (laneway.cluster)
            from laneway.cluster.node import join

            node = await join(runtime, config.cluster)
        app.state.node = node
        await runtime.start()
        try:
            opened = store if store is not None else await open_store(config)
        except BaseException:
            await runtime.close()
            raise
        app.state.store = opened
        # (in a cluster the runner's lines are owned by the replica's name in the cluster, so
        # that one taken for dead frees them only once its requests are gone)
        runner = BatchRunner(runtime, opened, owner=node.remote.home if node is not None else None)
        if node is not None:
            runner.paused = node.refusal
        app.state.batches = runner
        try:
            await runner.start()
            yield
        finally:
            try:
                await runner.close()
                await runtime.close()
            finally:
                if node is not None:
                    await node.close()
                await opened.close()

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
                CORSMiddleware,
                allow_origins=list(config.allowed_origins),
                allow_methods=["GET", "POST", "DELETE"],
                allow_headers=["*"],
                expose_headers=["Retry-After"],
            )
        )
    return out
