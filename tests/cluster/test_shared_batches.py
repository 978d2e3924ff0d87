"""Two replicas sharing one Redis: a file uploaded to one is seen by the other, the batch
runners of both claim the lines of one batch, and when one replica is SIGKILLed the
other finishes its lines once their leases run out: every custom_id exactly once."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx

from cluster_util import replicas, upstream
from laneway.store.redis_db import RedisDB
from laneway.testing import StandInProcess

LINES = 200


def batch_file() -> bytes:
    line = {
        "method": "POST",
        "url": "/v1/completions",
        "body": {"model": "m", "prompt": "x", "max_tokens": 10},
    }
    return b"".join(json.dumps({"custom_id": f"l{i:03d}", **line}).encode() + b"\n" for i in range(LINES))


def test_two_replicas_share_a_batch_and_survive_one_killed(tmp_path: Path, redis_url: str) -> None:
    prefix = f"sb{time.monotonic_ns()}:"
    standin = StandInProcess(tmp_path / "standin.log", ("--slots", "8", "--ms-per-token", "5"))
    try:
        with replicas(tmp_path, redis_url, ["a", "b"], upstream("up", standin.url, 8), prefix=prefix) as reps:
            a, b = reps["a"], reps["b"]
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
                    json={
                        "input_file_id": f["id"],
                        "endpoint": "/v1/completions",
                        "completion_window": "24h",
                    },
                ).json()
                deadline = time.monotonic() + 30
                while ca.get(f"/batches/{made['id']}").json()["request_counts"]["completed"] < LINES // 4:
                    assert time.monotonic() < deadline
                    time.sleep(0.05)
                a.kill()  # with lines of the batch running there
                deadline = time.monotonic() + 60
                while (got := cb.get(f"/batches/{made['id']}").json())["status"] != "completed":
                    assert time.monotonic() < deadline, got["status"]
                    time.sleep(0.1)
                assert got["request_counts"] == {"total": LINES, "completed": LINES, "failed": 0}
                out = [
                    json.loads(x) for x in cb.get(f"/files/{got['output_file_id']}/content").text.splitlines()
                ]
    finally:
        standin.stop()
    ids = [o["custom_id"] for o in out]
    assert sorted(ids) == [f"l{i:03d}" for i in range(LINES)]  # each exactly once
    assert all(o["response"]["status_code"] == 200 for o in out)
    db = RedisDB(redis_url, prefix)
    try:
        rerun = [v for v in db.lines(made["id"]) if v.attempts > 1]
    finally:
        db.close()
    assert rerun, "some line was running on the killed replica and ran again"
