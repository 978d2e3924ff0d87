"""Stored responses while a cluster's shared store is known to have lost laneway's data
(``laneway.cluster.node``: until an operator restores it or accepts the loss): a response
to be stored is refused (503 ``state_lost``: nothing new is kept, as files and batches), one
not to be stored is served, and one not found says it may have been lost."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import httpx

from live_server import live_server, sim_config

LOSS = "Redis came back without laneway's data (its generation 3, this replica's 4)"


class LostNode:
    """What the server asks a cluster's node (the loss known, not accepted)."""

    def __init__(self) -> None:
        self.loss: SimpleNamespace | None = None

    def refusal(self) -> str | None:
        if self.loss is None:
            return None
        return f"{self.loss.message}: nothing new is kept until an operator restores it or accepts the loss"


def test_nothing_new_is_stored_and_a_response_not_found_may_have_been_lost(tmp_path: Path) -> None:
    node = LostNode()
    with live_server(sim_config(tmp_path)) as s, httpx.Client(base_url=s.base_url, timeout=30) as c:
        s.app.state.node = node  # type: ignore[attr-defined]
        ask = {"model": "sim", "input": "Hello there", "max_output_tokens": 5}
        kept = c.post("/responses", json=ask)
        assert kept.status_code == 200, kept.text
        node.loss = SimpleNamespace(message=LOSS)
        refused = c.post("/responses", json=ask)
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "state_lost", refused.text
        assert "nothing new is kept" in refused.json()["error"]["message"]
        unkept = c.post("/responses", json={**ask, "store": False})
        assert unkept.status_code == 200 and unkept.json()["store"] is False, unkept.text
        missing = c.get("/responses/resp_nowhere")
        assert missing.status_code == 404, missing.text
        assert "it may have been lost: Redis came back without" in missing.json()["error"]["message"]
        items = c.get("/responses/resp_nowhere/input_items")
        assert items.status_code == 404 and "may have been lost" in items.json()["error"]["message"]
        follow = c.post("/responses", json={**ask, "store": False, "previous_response_id": "resp_nowhere"})
        assert follow.status_code == 400 and "may have been lost" in follow.json()["error"]["message"]
        assert c.get("/responses/" + kept.json()["id"]).status_code == 200  # (what the store holds)
        node.loss = None  # (accepted: new responses are kept again)
        assert c.post("/responses", json=ask).status_code == 200
        gone = c.get("/responses/resp_nowhere")
        assert gone.status_code == 404 and "may have been lost" not in gone.json()["error"]["message"]
