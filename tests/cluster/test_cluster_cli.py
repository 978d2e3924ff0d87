"""``laneway cluster status`` and ``accept-loss`` against a real Redis: one-line errors for a
configuration without ``[cluster]`` or a Redis that cannot be reached; the status of a
cluster; a loss recorded in Redis accepted once (and nothing to accept then)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import redis

from laneway.testing import free_port


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "laneway.cli", "cluster", *args], capture_output=True, text=True, timeout=60
    )


def config(tmp_path: Path, url: str, prefix: str) -> Path:
    path = tmp_path / "r.toml"
    path.write_text(
        f'[cluster]\nredis_url = "{url}"\nreplica = "r1"\nkey_prefix = "{prefix}"\n'
        '[[workers]]\nname = "up"\ntype = "upstream"\nurl = "http://127.0.0.1:9/v1"\nmodel = "m"\n'
    )
    return path


def test_errors_are_one_line(tmp_path: Path) -> None:
    plain = tmp_path / "plain.toml"
    plain.write_text("[server]\nport = 8000\n")
    done = run("status", "--config", str(plain))
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "no [cluster] table" in done.stderr
    done = run("accept-loss", "--config", str(config(tmp_path, f"redis://127.0.0.1:{free_port()}/0", "x:")))
    assert done.returncode == 2 and done.stderr.startswith("laneway: error: cannot reach Redis"), done.stderr
    assert done.stderr.count("\n") == 1
    assert run("status").returncode == 2  # --config is required


def test_status_and_accepting_a_loss(tmp_path: Path, redis_url: str) -> None:
    prefix = f"cli{uuid.uuid4().hex[:8]}:"
    path = config(tmp_path, redis_url, prefix)
    r = redis.Redis.from_url(redis_url)
    try:
        r.set(prefix + "leader", "r2|g:3", px=10_000)
        r.set(prefix + "alive:r2.abc", "1", px=10_000)
        done = run("status", "--config", str(path))
        assert done.returncode == 0, done.stderr
        assert "leader: r2" in done.stdout and "r2.abc" in done.stdout and "lost: nothing" in done.stdout
        assert "configurations: the same on every replica alive" in done.stdout  # (none written)
        # two replicas that schedule by different settings: each difference named
        r.set(prefix + "alive:r3.def", "1", px=10_000)
        r.set(prefix + "config:r2", json.dumps({"policy": "laneway", "workers.up": {"slots": 4}}))
        r.set(prefix + "config:r3", json.dumps({"policy": "laneway", "workers.up": {"slots": 2}}))
        done = run("status", "--config", str(path))
        said = "configurations: replica 'r2' schedules by another configuration than replica 'r3'"
        assert said in done.stdout
        assert "(workers.up.slots: 4 here, 2 there)" in done.stdout, done.stdout
        r.set(prefix + "config:r3", json.dumps({"policy": "laneway", "workers.up": {"slots": 4}}))
        assert "configurations: the same" in run("status", "--config", str(path)).stdout
        assert "no loss to accept" in run("accept-loss", "--config", str(path)).stdout
        loss = {"kind": "empty", "at": time.time(), "by": "r3", "detail": "it holds no laneway data"}
        r.set(prefix + "lost", json.dumps(loss))
        assert "lost: Redis came back without laneway's data" in run("status", "--config", str(path)).stdout
        done = run("accept-loss", "--config", str(path))
        assert done.returncode == 0 and done.stdout.startswith("accepted: "), done
        assert r.get(prefix + "lost") is None
        assert json.loads(r.get(prefix + "lost:accepted"))["loss"]["by"] == "r3"
        assert "no loss to accept" in run("accept-loss", "--config", str(path)).stdout
    finally:
        for key in r.scan_iter(match=prefix + "*"):
            r.delete(key)
        r.close()
