"""Two ``laneway serve`` replicas sharing one Redis (``[cluster]``): a file uploaded to one
is seen by the other, both run the lines of one batch, and when one is SIGKILLed the
other finishes its lines once their leases run out: every custom_id exactly once."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx

from laneway.testing import ServeProcess

LINES = 200
CONFIG = """
[server]
data_dir = "{data}"
[cluster]
redis_url = "{redis}"
replica = "{name}"
key_prefix = "{prefix}"
[batches]
poll_s = 0.1
lease_s = 2
[[workers]]
name = "sim-{name}"
type = "simulated"
model = "sim"
slots = 4
tokens_per_s = 200
"""


def replica(tmp: Path, redis_url: str, name: str, prefix: str) -> ServeProcess:
    cfg = tmp / f"{name}.toml"
    cfg.write_text(CONFIG.format(data=tmp / name, redis=redis_url, name=name, prefix=prefix))
    return ServeProcess(["--config", str(cfg)], tmp / f"{name}.log")


def batch_file() -> bytes:
    line = {
        "method": "POST",
        "url": "/v1/completions",
        "body": {"model": "sim", "prompt": "x", "max_tokens": 10},
    }
    return b"".join(json.dumps({"custom_id": f"l{i:03d}", **line}).encode() + b"\n" for i in range(LINES))


def test_two_replicas_share_a_batch_and_survive_one_killed(tmp_path: Path, redis_url: str) -> None:
    prefix = f"shared-{time.monotonic_ns()}:"
    a = replica(tmp_path, redis_url, "a", prefix)
    b = replica(tmp_path, redis_url, "b", prefix)
    try:
        assert "replica a: files and batches shared in Redis" in a.text()
        with (
            httpx.Client(base_url=a.url + "/v1", timeout=30) as ca,
            httpx.Client(base_url=b.url + "/v1", timeout=30) as cb,
        ):
            f = ca.post(
                "/files", files={"file": ("in.jsonl", batch_file())}, data={"purpose": "batch"}
            ).json()
            assert cb.get(f"/files/{f['id']}").json()["bytes"] == f["bytes"]  # seen by the other replica
            made = cb.post(
                "/batches",
                json={"input_file_id": f["id"], "endpoint": "/v1/completions", "completion_window": "24h"},
            ).json()
            deadline = time.monotonic() + 30
            while (
                done := ca.get(f"/batches/{made['id']}").json()["request_counts"]["completed"]
            ) < LINES // 4:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            a.kill()  # with lines of the batch running there
            deadline = time.monotonic() + 60
            while (got := cb.get(f"/batches/{made['id']}").json())["status"] != "completed":
                assert time.monotonic() < deadline, got["status"]
                time.sleep(0.1)
            assert got["request_counts"] == {"total": LINES, "completed": LINES, "failed": 0}
            out = [json.loads(x) for x in cb.get(f"/files/{got['output_file_id']}/content").text.splitlines()]
    finally:
        a.stop()
        b.stop()
    ids = [o["custom_id"] for o in out]
    assert sorted(ids) == [f"l{i:03d}" for i in range(LINES)]  # each exactly once
    workers = {o["response"]["body"]["laneway"]["worker"] for o in out}
    assert workers == {"sim-a", "sim-b"}, workers  # both replicas ran lines of it
    assert done >= LINES // 4
