"""``GET /v1/models`` and ``GET /v1/models/{model}``: what is served, under which names, with
what context."""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from laneway.api.params import authenticate
from laneway.api.state import runtime_of
from laneway.errors import ModelNotFound
from laneway.runtime import Runtime

STARTED = int(time.time())


def _model(runtime: Runtime, name: str) -> dict[str, object]:
    """A served model (or an alias of one: ``root`` names the model it stands for), with
    the names clients may use for it and, where its workers say, its context length."""
    served = runtime.config.aliases.get(name, name)
    out: dict[str, object] = {"id": name, "object": "model", "created": STARTED, "owned_by": "laneway"}
    out["root"] = served
    out["aliases"] = sorted(a for a, m in runtime.config.aliases.items() if m == served)
    lens = [n for n in runtime.contexts(served) if n is not None]
    if lens:
        out["max_model_len"] = min(lens)
    return out


async def models(request: Request) -> Response:
    runtime = runtime_of(request)
    config = runtime.config
    authenticate(request, config)
    names = [*runtime.models, *sorted(a for a, m in config.aliases.items() if m in runtime.models)]
    return JSONResponse({"object": "list", "data": [_model(runtime, m) for m in names]})


async def model(request: Request) -> Response:
    """``GET /v1/models/{id}`` (an id may hold slashes, as Hugging Face names do)."""
    runtime = runtime_of(request)
    config = runtime.config
    authenticate(request, config)
    name = request.path_params["model_id"]
    if config.aliases.get(name, name) not in runtime.models:
        raise ModelNotFound(f"the model {name!r} does not exist; served: {', '.join(runtime.models)}")
    return JSONResponse(_model(runtime, name))
