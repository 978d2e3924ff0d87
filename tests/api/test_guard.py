"""An error no handler expected: a 500 in OpenAI's shape, logged once, and the
client's keep-alive connection stays usable for its next request."""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
import pytest

from live_server import live_server, sim_config


def test_a_500_keeps_the_connection(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with live_server(sim_config(tmp_path)) as server:
        store = server.app.state.store  # type: ignore[attr-defined]

        async def broken(*args: object, **kw: object) -> object:
            raise RuntimeError("store broke")

        real = store.list_files
        store.list_files = broken
        with httpx.Client(base_url=server.base_url, timeout=10) as c, caplog.at_level(logging.ERROR):
            sockets: list[object] = []

            def trace(event: str, info: dict[str, object]) -> None:
                if event == "connection.connect_tcp.complete":
                    sockets.append(info["return_value"])

            r = c.get("/files", extensions={"trace": trace})
            assert r.status_code == 500
            assert r.json()["error"] == {
                "message": "internal error; the server log has the details",
                "type": "server_error",
                "code": "internal_error",
                "param": None,
            }
            store.list_files = real
            r = c.get("/files", extensions={"trace": trace})
            assert r.status_code == 200 and r.json()["object"] == "list"
            assert len(sockets) == 1  # the second request went on the same connection
        logged = [rec for rec in caplog.records if rec.exc_info and "store broke" in str(rec.exc_info[1])]
        assert len(logged) == 1
