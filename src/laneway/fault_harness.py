"""A cluster of ``laneway serve`` replicas on loopback with faults to inject, and what to check.

For the fault-injection tests (``tests/cluster/test_faults.py``) and
``bench/crash_soak.py``: one real ``redis-server`` (append-only file on, its
data in a folder of its own, so it can be killed and started again from it, from an
older copy or empty), stand-in engines (:mod:`laneway.standin`) as upstreams, and
replicas that share them. Requests carry a ``#KEY#`` in their prompts, so that
the stand-ins can tell whether one ran twice at once; each stand-in counts the
most requests it had open at once.

Everything runs on 127.0.0.1; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from laneway.testing import RedisProcess, ServeProcess, StandInProcess


def replica_toml(
    data: Path,
    redis_url: str,
    name: str,
    prefix: str,
    *,
    lease_s: float = 2.0,
    probe_interval_s: float | None = None,
    extra: str = "",
) -> str:
    """A replica's configuration but its workers (fast batch polling, short line leases)."""
    probe = f"probe_interval_s = {probe_interval_s}\n" if probe_interval_s is not None else ""
    return (
        f'[server]\ndata_dir = "{data}"\n{probe}'
        f'[cluster]\nredis_url = "{redis_url}"\nreplica = "{name}"\nkey_prefix = "{prefix}"\n'
        f"[batches]\npoll_s = 0.1\nlease_s = {lease_s}\n{extra}\n"
    )


def upstream_toml(name: str, url: str, slots: int, *, token_ids: str | None = None) -> str:
    """An upstream worker of the stand-in's model, served as ``m``."""
    ids = f'token_ids = "{token_ids}"\n' if token_ids is not None else ""
    return (
        f'\n[[workers]]\nname = "{name}"\ntype = "upstream"\nurl = "{url}"\nmodel = "standin"\n'
        f'served_name = "m"\nslots = {slots}\n{ids}'
    )


OVERLAP_S = 0.1  # two spans of one request that overlap by more than this: it ran twice at once


@dataclass
class Outcome:
    key: str
    replica: str
    status: int  # -1: no answer (the connection failed)
    text: str
    t0: float
    t1: float


@dataclass
class Load:
    """Chat requests at a steady pace, to the replicas in turn, until stopped."""

    outcomes: list[Outcome] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None


class Cluster:
    def __init__(
        self,
        tmp: Path,
        *,
        replicas: int = 3,
        upstreams: int = 2,
        slots: int = 16,
        ms_per_token: float = 5.0,
        lease_s: float = 2.0,
        extra: str = "",
        fsync: str = "always",
    ) -> None:
        self.tmp = tmp
        self.prefix = f"f{uuid.uuid4().hex[:8]}:"
        self.slots = slots
        self.lease_s = lease_s
        self.extra = extra
        self.redis = RedisProcess(tmp / "redis", fsync=fsync)
        self.standins: list[StandInProcess] = []
        self.replicas: dict[str, ServeProcess] = {}
        self.killed: dict[str, list[float]] = {}
        self.faults: list[tuple[str, float, float]] = []  # (what, from, until): wall clock
        try:
            for i in range(upstreams):
                args = ("--slots", str(slots), "--ms-per-token", str(ms_per_token))
                self.standins.append(StandInProcess(tmp / f"standin{i}.log", args))
            self.workers = "".join(upstream_toml(f"up{i}", s.url, slots) for i, s in enumerate(self.standins))
            for i in range(replicas):
                self.start_replica(f"r{i + 1}")
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ processes
    def start_replica(self, name: str) -> ServeProcess:
        cfg = self.tmp / f"{name}.toml"
        text = replica_toml(
            self.tmp / name,
            self.redis.url,
            name,
            self.prefix,
            lease_s=self.lease_s,
            probe_interval_s=0.5,
            extra=self.extra,
        )
        cfg.write_text(text + self.workers)
        proc = ServeProcess(["--config", str(cfg)], self.tmp / f"{name}.log", ready=False)
        self.replicas[name] = proc
        return proc

    def live(self) -> list[str]:
        return [n for n, p in self.replicas.items() if p.proc.poll() is None]

    def leader(self) -> str | None:
        import redis

        with contextlib.suppress(redis.RedisError), redis.Redis.from_url(self.redis.url) as r:
            raw = r.get(self.prefix + "leader")
            if raw is not None:
                return str(raw.decode().rpartition("|")[0])
        return None

    def pause(self, name: str, seconds: float) -> None:
        """SIGSTOP replica ``name`` for ``seconds`` (a GC pause, a throttled container)."""
        pid = self.replicas[name].proc.pid
        t0 = time.time()
        os.kill(pid, signal.SIGSTOP)
        time.sleep(seconds)
        os.kill(pid, signal.SIGCONT)
        self.faults.append((f"SIGSTOP {name} {seconds:g} s", t0, time.time()))

    def kill(self, name: str) -> None:
        self.replicas[name].kill()
        self.killed.setdefault(name, []).append(time.time())
        self.faults.append((f"SIGKILL {name}", time.time(), time.time()))

    def close(self) -> None:
        for p in self.replicas.values():
            with contextlib.suppress(Exception):
                if p.proc.poll() is None:
                    os.kill(p.proc.pid, signal.SIGCONT)
                p.stop()
        for s in self.standins:
            with contextlib.suppress(Exception):
                s.stop()
        with contextlib.suppress(Exception):
            self.redis.stop()

    # ------------------------------------------------------------------ Redis faults
    def redis_kill_restart(self, down_s: float) -> None:
        """SIGKILL Redis, and start it again from its own data after ``down_s``."""
        t0 = time.time()
        self.redis.kill()
        time.sleep(down_s)
        self.redis.restart()
        self.faults.append((f"Redis SIGKILL, back after {down_s:g} s", t0, time.time()))

    def redis_pause(self, seconds: float) -> None:
        t0 = time.time()
        self.redis.pause()
        time.sleep(seconds)
        self.redis.unpause()
        self.faults.append((f"Redis SIGSTOP {seconds:g} s", t0, time.time()))

    def redis_restart_from(self, data: Path | None) -> None:
        """Restart Redis from an older copy of its data (``None``: empty)."""
        t0 = time.time()
        self.redis.kill()
        self.redis.restart(data=data, empty=data is None)
        what = "empty" if data is None else "from an older copy"
        self.faults.append((f"Redis restarted {what}", t0, time.time()))

    # ------------------------------------------------------------------ load
    def chat_load(
        self,
        per_s: float = 10.0,
        max_tokens: int = 20,
        timeout_s: float = 120.0,
        long_every: int = 0,
        long_tokens: int = 600,
    ) -> Load:
        """Chat requests (P0 and P1 in turn) at ``per_s``, to the live replicas in turn; with
        ``long_every``, every so many is a long P3 one (``long_tokens``), preemptible."""
        load = Load()

        async def one(c: httpx.AsyncClient, n: int) -> None:
            live = self.live()
            name = live[n % len(live)]
            key = f"c{n}"
            long = long_every > 0 and n % long_every == 0
            body = {
                "model": "m",
                "messages": [{"role": "user", "content": f"#{key}# hello"}],
                "max_tokens": long_tokens if long else max_tokens,
                "priority": "P3" if long else "P0" if n % 2 else "P1",
            }
            t0 = time.time()
            try:
                r = await c.post(self.replicas[name].url + "/v1/chat/completions", json=body)
                load.outcomes.append(Outcome(key, name, r.status_code, r.text[:300], t0, time.time()))
            except httpx.HTTPError as exc:
                load.outcomes.append(Outcome(key, name, -1, repr(exc), t0, time.time()))

        async def run() -> None:
            pending: set[asyncio.Task[None]] = set()
            async with httpx.AsyncClient(timeout=timeout_s) as c:
                n = 0
                while not load.stop.is_set() and n < 100_000:
                    task = asyncio.create_task(one(c, n))
                    pending.add(task)
                    task.add_done_callback(pending.discard)
                    n += 1
                    await asyncio.sleep(1 / per_s)
                if pending:
                    await asyncio.wait(pending, timeout=timeout_s + 5)

        load.thread = threading.Thread(target=asyncio.run, args=(run(),), daemon=True)
        load.thread.start()
        return load

    def stop_load(self, load: Load) -> None:
        load.stop.set()
        if load.thread is not None:
            load.thread.join(180)

    # ------------------------------------------------------------------ batches
    def url(self) -> str:
        return self.replicas[self.live()[0]].url

    def create_batch(self, lines: int, max_tokens: int = 20) -> str:
        rows = []
        for i in range(lines):
            body = {"model": "m", "prompt": f"#b{i:05d}# go", "max_tokens": max_tokens}
            rows.append({"custom_id": f"b{i:05d}", "method": "POST", "url": "/v1/completions", "body": body})
        data = "".join(json.dumps(r) + "\n" for r in rows).encode()
        with httpx.Client(base_url=self.url() + "/v1", timeout=60) as c:
            f = c.post("/files", files={"file": ("in.jsonl", data)}, data={"purpose": "batch"})
            f.raise_for_status()
            b = c.post(
                "/batches",
                json={
                    "input_file_id": f.json()["id"],
                    "endpoint": "/v1/completions",
                    "completion_window": "24h",
                },
            )
            b.raise_for_status()
            return str(b.json()["id"])

    def batch(self, batch_id: str) -> httpx.Response:
        return httpx.get(self.url() + f"/v1/batches/{batch_id}", timeout=30)

    def wait_batch(self, batch_id: str, timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        last: dict[str, Any] = {}
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError, ValueError):
                r = self.batch(batch_id)
                last = {"http_status": r.status_code, **r.json()}
                if last.get("status") in ("completed", "failed", "expired", "cancelled"):
                    return last
            time.sleep(0.25)
        return last

    def line_owners(self, batch_id: str) -> dict[str, int]:
        """Replica -> how many of the batch's lines it runs now (as the store says)."""
        import redis

        out: dict[str, int] = {}
        with redis.Redis.from_url(self.redis.url) as r:
            for owner in r.hvals(f"{self.prefix}lown:{batch_id}"):
                name = owner.decode().split(".")[0]
                out[name] = out.get(name, 0) + 1
        return out

    def output_ids(self, file_id: str | None) -> list[str]:
        if not file_id:
            return []
        r = httpx.get(self.url() + f"/v1/files/{file_id}/content", timeout=60)
        r.raise_for_status()
        return [json.loads(x)["custom_id"] for x in r.text.splitlines()]

    # ------------------------------------------------------------------ what the upstreams saw
    def peaks(self) -> list[int]:
        out = []
        for s in self.standins:
            stats = httpx.get(s.url.removesuffix("/v1") + "/stats", timeout=10).json()
            out.append(int(stats["peak_requests"]))
        return out

    def twice_at_once(self) -> list[str]:
        """Requests that ran twice at once (on one stand-in or on two)."""
        spans: dict[str, list[tuple[float, float]]] = {}
        now = time.time()
        for s in self.standins:
            got = httpx.get(s.url.removesuffix("/v1") + "/spans", timeout=30).json()
            for key, t0, t1 in got["spans"]:
                spans.setdefault(key, []).append((t0, t1))
            for key, t0 in got["open"]:
                spans.setdefault(key, []).append((t0, now))
        twice = []
        for key, ss in spans.items():
            ss.sort()
            for (_, a1), (b0, _) in itertools.pairwise(ss):
                if a1 - b0 > OVERLAP_S:
                    twice.append(key)
                    break
        return sorted(twice)


@contextlib.contextmanager
def cluster(tmp: Path, **kw: Any) -> Iterator[Cluster]:
    c = Cluster(tmp, **kw)
    try:
        yield c
    finally:
        c.close()
