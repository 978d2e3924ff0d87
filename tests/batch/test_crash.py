"""Crash safety: a 300-line batch survives two SIGKILLs of the server; 300 results, each once."""

from __future__ import annotations

import json
import time
from pathlib import Path

from batch_util import chat_line, client, lines_of, submit
from laneway.store import LineState, SQLiteDB
from laneway.testing import ServeProcess

LINES = 300
CONFIG = """
[server]
data_dir = "{data}"
[batches]
poll_s = 0.1
[[workers]]
name = "sim0"
type = "simulated"
model = "sim"
slots = 4
tokens_per_s = 400
"""


def completed(url: str, batch_id: str) -> tuple[str, int]:
    b = client(url + "/v1").batches.retrieve(batch_id)
    return b.status, b.request_counts.completed if b.request_counts else 0


def wait_until(url: str, batch_id: str, at_least: int) -> int:
    deadline = time.monotonic() + 30
    while True:
        status, done = completed(url, batch_id)
        if done >= at_least or status == "completed":
            return done
        assert time.monotonic() < deadline, (status, done)
        time.sleep(0.05)


def test_batch_survives_two_sigkills(tmp_path: Path) -> None:
    cfg = tmp_path / "serve.toml"
    data = tmp_path / "data"
    cfg.write_text(CONFIG.format(data=data), encoding="utf-8")
    log = tmp_path / "server.log"
    server = ServeProcess(["--config", str(cfg)], log)
    try:
        c = client(server.url + "/v1")
        batch_id = submit(c, [chat_line(f"line-{i:03d}", max_tokens=10) for i in range(LINES)]).id
        seen = [wait_until(server.url, batch_id, 40)]
        for _ in range(2):
            server.kill()  # in the middle of the batch: lines running, results being written
            server = ServeProcess(["--config", str(cfg)], log)
            status, done = completed(server.url, batch_id)
            assert status == "in_progress" and done >= seen[-1]  # nothing written was lost
            seen.append(wait_until(server.url, batch_id, done + 40))
        deadline = time.monotonic() + 60
        while (b := client(server.url + "/v1").batches.retrieve(batch_id)).status != "completed":
            assert time.monotonic() < deadline, b.status
            time.sleep(0.1)
        assert (b.request_counts.total, b.request_counts.completed, b.request_counts.failed) == (
            LINES,
            LINES,
            0,
        )
        out = lines_of(client(server.url + "/v1"), b.output_file_id)
        ids = [o["custom_id"] for o in out]
        assert len(ids) == LINES and sorted(ids) == [f"line-{i:03d}" for i in range(LINES)]
        assert all(o["response"]["status_code"] == 200 for o in out)
    finally:
        server.stop()
    assert seen[0] < seen[1] < seen[2] < LINES, seen
    db = SQLiteDB(data)  # the server is gone: look at what the store remembers
    try:
        views = db.lines(batch_id)
        assert all(v.state is LineState.DONE for v in views)
        rerun = [v for v in views if v.attempts > 1]
        assert rerun, "some line was running at a kill and ran again"
        assert all(json.loads(v.result or "")["custom_id"] == v.custom_id for v in views)
    finally:
        db.close()
    assert log.read_text().count("will run again") == 2
