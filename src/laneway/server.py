"""A server, wired: its workers, the runtime over the core (or over a cluster's leader), its
store and its batch runner, started in that order and closed in the reverse one.

The HTTP app (:mod:`laneway.api.app`) starts one at start-up and closes it at shutdown;
``laneway serve`` (:mod:`laneway.serve`) builds the workers and the socket around it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from laneway.backends.base import Worker
from laneway.backends.factory import build_workers
from laneway.backends.upstream import UpstreamWorker
from laneway.batch.runner import BatchRunner
from laneway.config.schema import ServerConfig
from laneway.runtime import Runtime
from laneway.store import Store, open_store
from laneway.tracing import Tracing

if TYPE_CHECKING:
    from laneway.cluster.node import Node


@dataclass
class Server:
    runtime: Runtime
    store: Store
    batches: BatchRunner
    node: Node | None = None  # (a replica of a cluster: scheduled by the cluster's leader)

    async def close(self) -> None:
        try:
            await self.batches.close()
            await self.runtime.close()
        finally:
            if self.node is not None:
                await self.node.close()
            await self.store.close()


async def start_server(
    config: ServerConfig, workers: Mapping[str, Worker] | None = None, store: Store | None = None
) -> Server:
    """The server of ``config``: on ``workers`` already built (tests, embedding), else on the
    workers it configures; on ``store`` (an opened store, which the server takes over), else
    on the store it configures (SQLite in its data directory, or its cluster's Redis)."""
    built = dict(workers) if workers is not None else await build_workers(config.workers, config.data_dir)
    runtime = Runtime(config, built)
    if config.otlp_traces_endpoint is not None:
        runtime.trace(Tracing(config.otlp_traces_endpoint))
    await runtime.calibrate()
    node = None
    if config.cluster is not None:  # scheduled by the cluster's leader (laneway.cluster)
        from laneway.cluster.node import join

        node = await join(runtime, config.cluster)
        for worker in built.values():  # (the leader's core counts their slots, by its configuration)
            if isinstance(worker, UpstreamWorker):
                worker.counted_elsewhere = True
    try:
        await runtime.start()  # (a fleet's preloaded engines: up to their ready timeout)
    except BaseException:  # (failed, or cancelled: a Ctrl-C while it started)
        await runtime.close()
        if node is not None:
            with contextlib.suppress(Exception):
                await node.close()
        if store is not None:
            await store.close()
        raise
    try:
        opened = store if store is not None else await open_store(config)
    except BaseException:
        await runtime.close()
        if node is not None:
            with contextlib.suppress(Exception):
                await node.close()
        raise
    # (in a cluster the runner's lines are owned by the replica's name in the cluster, so
    # that one taken for dead frees them only once its requests are gone)
    runner = BatchRunner(runtime, opened, owner=node.remote.home if node is not None else None)
    if node is not None:
        runner.paused = node.refusal
        runner.made = node.created
    server = Server(runtime, opened, runner, node)
    try:
        await runner.start()
    except BaseException:
        await server.close()
        raise
    return server
