"""What a request's handler finds on the app: the parts of the server (:mod:`laneway.server`)
that the lifespan put there."""

from __future__ import annotations

from starlette.requests import Request

from laneway.runtime import Runtime


def runtime_of(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime
