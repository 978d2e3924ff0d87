"""What the shared store can keep: new files, batches and stored responses are refused
while the cluster's Redis is known to have lost laneway's data, and a file or batch it lost
is answered 410, not 404 (a response not found then says it may have been lost: responses
are too many to note each one made).

Both only where the server is a replica of a cluster (:mod:`laneway.cluster.node`); a
server on its own data directory never refuses here.
"""

from __future__ import annotations

from starlette.requests import Request

from laneway.errors import Gone, NotFound, Unavailable
from laneway.store.base import Store

LOST_RETRY_S = 60.0


def check_can_keep(request: Request) -> None:
    """503 ``state_lost`` while the cluster's store lost its data and no one accepted it."""
    node = getattr(request.app.state, "node", None)
    why = node.refusal() if node is not None else None
    if why is not None:
        raise Unavailable(why, code="state_lost", retry_after_s=LOST_RETRY_S)


def maybe_lost(request: Request, missing: NotFound) -> NotFound:
    """``missing`` (a stored response not found), saying it may have been lost while the
    cluster's store is known to have lost its data."""
    node = getattr(request.app.state, "node", None)
    loss = getattr(node, "loss", None)  # (the loss known and not accepted: laneway.cluster.node)
    if loss is None:
        return missing
    return NotFound(f"{missing.message} (it may have been lost: {loss.message})", param=missing.param)


def created(request: Request, kind: str, object_id: str, tenant: str) -> None:
    """A batch or file was made (or a file deleted): the replica's journal notes it."""
    node = getattr(request.app.state, "node", None)
    if node is not None:
        node.created(kind, object_id, tenant)


async def gone_or(store: Store, object_id: str, tenant: str, missing: Exception) -> Exception:
    """For an id the store does not hold: 410 if it held it and lost it, else ``missing``."""
    info = await store.lost(object_id)
    if info is None or info.get("tenant") != tenant:
        return missing
    kind = info.get("kind", "object")
    return Gone(f"{kind} {object_id} was lost: {info.get('lost', 'the shared store lost it')}")
