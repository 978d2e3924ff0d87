"""Crash soak: a big batch through ``laneway serve`` killed (SIGKILL) again and again.

    python bench/crash_soak.py [--lines 10000] [--kills 20] [--slots 8] [--uploads 10]
        [--seed 0] [--json out.json]
    python bench/crash_soak.py --redis [--lines 10000] [--kills 20] [--slots 8] [--seed 0]

1. **Baseline**: a batch of ``--lines`` completion lines on a simulated worker,
   uninterrupted: the time from creation to ``completed``.
2. **Soak**: the same batch on a fresh data directory while the server is
   killed ``--kills`` times, each at a random moment (uniform within the first
   ``--max-gap-s`` seconds after it is ready again), and restarted. At the end,
   every ``custom_id`` must be in the output exactly once, answered 200, with
   nothing in the error file; the overhead is the soak's time ÷ the baseline's,
   given with and without the restarts themselves.
3. **Uploads and creation**: ``--uploads`` rounds of killing the server while
   it receives a large upload, and as many while it creates a batch; after
   each restart every file listed has its whole content, and every batch is a
   whole one (no half-made object).

With ``--redis``: three replicas of ``laneway serve`` on one Redis (append-only
file, ``appendfsync always``) in front of two stand-in engines of ``--slots``
each, one batch of ``--lines`` lines, and ``--kills`` faults drawn at random one
after another (Redis killed and started again from its data, Redis stopped,
the leader or another replica killed and started again, or stopped past its
liveness). At the end every ``custom_id`` must be in the output exactly once,
nothing in the error file, no engine over its slots and no request run twice
at once (the stand-ins keep each request's time).

Everything runs on 127.0.0.1; every wait is bounded.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from laneway.testing import ServeProcess

LIMIT_S = 1800.0  # any one batch
err = Console(stderr=True)


def config(data: Path, slots: int) -> str:
    return (
        f'[server]\ndata_dir = "{data}"\n[batches]\npoll_s = 0.1\n'
        f'[[workers]]\nname = "sim0"\ntype = "simulated"\nmodel = "sim"\nslots = {slots}\n'
        "tokens_per_s = 160\n"  # 8 tokens a line: 50 ms on a slot
    )


def batch_file(lines: int) -> bytes:
    return b"".join(
        json.dumps(
            {
                "custom_id": f"line-{i:05d}",
                "method": "POST",
                "url": "/v1/completions",
                "body": {"model": "sim", "prompt": f"p{i}", "max_tokens": 8},
            }
        ).encode()
        + b"\n"
        for i in range(lines)
    )


def create(url: str, content: bytes) -> str:
    with httpx.Client(base_url=url + "/v1", timeout=120) as c:
        f = c.post("/files", files={"file": ("in.jsonl", content)}, data={"purpose": "batch"})
        f.raise_for_status()
        b = c.post(
            "/batches",
            json={"input_file_id": f.json()["id"], "endpoint": "/v1/completions", "completion_window": "24h"},
        )
        b.raise_for_status()
        return str(b.json()["id"])


def status(url: str, batch_id: str) -> dict[str, Any]:
    r = httpx.get(f"{url}/v1/batches/{batch_id}", timeout=30)
    r.raise_for_status()
    return dict(r.json())


def wait_done(url: str, batch_id: str, until: float) -> dict[str, Any]:
    while True:
        b = status(url, batch_id)
        if b["status"] in ("completed", "failed", "cancelled", "expired"):
            return b
        if time.monotonic() > until:
            raise RuntimeError(f"batch {batch_id} still {b['status']}")
        time.sleep(0.1)


def content_of(url: str, file_id: str) -> list[dict[str, Any]]:
    r = httpx.get(f"{url}/v1/files/{file_id}/content", timeout=120)
    r.raise_for_status()
    return [json.loads(line) for line in r.text.splitlines() if line.strip()]


def baseline(args: argparse.Namespace, tmp: Path, content: bytes) -> float:
    cfg = tmp / "base.toml"
    cfg.write_text(config(tmp / "base-data", args.slots))
    server = ServeProcess(["--config", str(cfg)], tmp / "base.log")
    try:
        t0 = time.monotonic()
        bid = create(server.url, content)
        b = wait_done(server.url, bid, t0 + LIMIT_S)
        took = time.monotonic() - t0
        assert b["status"] == "completed", b
        return took
    finally:
        server.stop()


def soak(args: argparse.Namespace, tmp: Path, content: bytes) -> dict[str, Any]:
    rng = random.Random(args.seed)
    cfg = tmp / "soak.toml"
    cfg.write_text(config(tmp / "soak-data", args.slots))
    log = tmp / "soak.log"
    server = ServeProcess(["--config", str(cfg)], log)
    restarts_s = 0.0
    try:
        t0 = time.monotonic()
        bid = create(server.url, content)
        progress = []
        for k in range(args.kills):
            time.sleep(rng.uniform(0.0, args.max_gap_s))
            done = status(server.url, bid)["request_counts"]["completed"]
            server.kill()
            r0 = time.monotonic()
            server = ServeProcess(["--config", str(cfg)], log)
            restarts_s += time.monotonic() - r0
            after = status(server.url, bid)
            progress.append(after["request_counts"]["completed"])
            if after["request_counts"]["completed"] < done:
                raise RuntimeError(f"kill {k + 1}: {done} lines were done, {progress[-1]} after")
            err.print(f"kill {k + 1}/{args.kills}: {progress[-1]} of {args.lines} lines done")
        b = wait_done(server.url, bid, time.monotonic() + LIMIT_S)
        took = time.monotonic() - t0
        out = content_of(server.url, b["output_file_id"]) if b.get("output_file_id") else []
        errors = content_of(server.url, b["error_file_id"]) if b.get("error_file_id") else []
    finally:
        server.stop()
    ids = [o["custom_id"] for o in out]
    want = [f"line-{i:05d}" for i in range(args.lines)]
    reran = log.read_text().count("will run again")
    return {
        "status": b["status"],
        "total_s": took,
        "restarts_s": restarts_s,
        "output_lines": len(out),
        "error_lines": len(errors),
        "each_once": sorted(ids) == want,
        "duplicates": len(ids) - len(set(ids)),
        "missing": len(set(want) - set(ids)),
        "all_200": all(o["response"]["status_code"] == 200 for o in out),
        "restarts_that_requeued_lines": reran,
        "progress": progress,
    }


def uploads(args: argparse.Namespace, tmp: Path, content: bytes) -> dict[str, Any]:
    """Kill the server while it takes an upload, and while it makes a batch; then check."""
    cfg = tmp / "up.toml"
    cfg.write_text(config(tmp / "up-data", args.slots))
    log = tmp / "up.log"
    rng = random.Random(args.seed + 1)
    big = content * max(1, (8 << 20) // max(1, len(content)))  # ~8 MB: a while to send
    half_made = 0
    rounds = 0
    server = ServeProcess(["--config", str(cfg)], log)
    try:
        for phase in ("upload", "create"):
            for _ in range(args.uploads):
                rounds += 1
                file_id: list[str] = []
                if phase == "create":
                    with httpx.Client(base_url=server.url + "/v1", timeout=120) as c:
                        f = c.post("/files", files={"file": ("in.jsonl", content)}, data={"purpose": "batch"})
                        file_id.append(f.json()["id"])

                def send(url: str = server.url, phase: str = phase, file_id: list[str] = file_id) -> None:
                    try:
                        with httpx.Client(base_url=url + "/v1", timeout=60) as c:
                            if phase == "upload":
                                c.post(
                                    "/files", files={"file": ("big.jsonl", big)}, data={"purpose": "batch"}
                                )
                            else:
                                for _ in range(20):
                                    c.post(
                                        "/batches",
                                        json={
                                            "input_file_id": file_id[0],
                                            "endpoint": "/v1/completions",
                                            "completion_window": "24h",
                                        },
                                    )
                    except httpx.HTTPError:
                        pass  # the server was killed under it

                t = threading.Thread(target=send)
                t.start()
                time.sleep(rng.uniform(0.0, 0.3))
                server.kill()
                t.join(60)
                server = ServeProcess(["--config", str(cfg)], log)
                half_made += check_whole(server.url, {len(big), len(content)})
    finally:
        server.stop()
    return {"rounds": rounds, "half_made_objects": half_made}


def check_whole(url: str, sizes: set[int]) -> int:
    """Objects that are not whole: a file whose content is not what its size says, or a
    batch that names a file that is gone or has no status."""
    bad = 0
    with httpx.Client(base_url=url + "/v1", timeout=120) as c:
        files = c.get("/files", params={"limit": 10000}).json()["data"]
        for f in files:
            if f["purpose"] != "batch":
                continue
            got = c.get(f"/files/{f['id']}/content").content
            if len(got) != f["bytes"] or len(got) not in sizes:
                bad += 1
        for b in c.get("/batches", params={"limit": 100}).json()["data"]:
            if c.get(f"/files/{b['input_file_id']}").status_code != 200 or not b.get("status"):
                bad += 1
    return bad


def report(r: dict[str, Any], console: Console) -> None:
    t = Table(title=f"crash soak: {r['lines']} lines, {r['kills']} SIGKILLs")
    t.add_column("figure")
    t.add_column("value", justify="right")
    s = r["soak"]
    t.add_row("uninterrupted", f"{r['baseline_s']:.1f} s")
    t.add_row("with the kills", f"{s['total_s']:.1f} s (of which restarting {s['restarts_s']:.1f} s)")
    t.add_row(
        "overhead", f"{r['overhead']:.2f}× ({r['overhead_without_restarts']:.2f}× without the restarts)"
    )
    t.add_row("final status", s["status"])
    t.add_row("every custom_id exactly once", "yes" if s["each_once"] else "NO")
    t.add_row("duplicates / missing / errors", f"{s['duplicates']} / {s['missing']} / {s['error_lines']}")
    t.add_row("every line answered 200", "yes" if s["all_200"] else "NO")
    t.add_row("restarts that requeued running lines", str(s["restarts_that_requeued_lines"]))
    u = r["uploads"]
    t.add_row(
        "kills during upload / batch creation",
        f"{u['rounds']} rounds, {u['half_made_objects']} half-made objects",
    )
    console.print(t)


FAULTS = (
    "redis-kill",  # Redis SIGKILL, started again from its data after 1-4 s
    "redis-stop",  # Redis SIGSTOP for 2-8 s
    "leader-kill",  # the leader SIGKILL, started again
    "replica-kill",  # a replica that does not lead SIGKILL, started again
    "leader-stop",  # the leader SIGSTOP for 4-8 s (past its lease and liveness)
    "replica-stop",  # a replica SIGSTOP for 4-8 s
)


def cluster_soak(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """``--redis``: a batch of ``--lines`` through three replicas on one Redis while ``--kills``
    faults of :data:`FAULTS`, drawn at random, come one after another; then every line must be
    answered exactly once, no engine over its slots, no request run twice at once."""
    from laneway.fault_harness import Cluster

    rng = random.Random(args.seed)
    c = Cluster(tmp, replicas=3, upstreams=2, slots=args.slots, ms_per_token=10, lease_s=2)
    done_by: list[tuple[str, int]] = []
    try:
        t0 = time.monotonic()
        bid = c.create_batch(args.lines, max_tokens=20)
        for k in range(args.kills):
            time.sleep(rng.uniform(1.0, args.max_gap_s + 1.0))
            kind = rng.choice(FAULTS)
            leader = c.leader() or c.live()[0]
            others = [n for n in c.live() if n != leader]
            if kind == "redis-kill":
                c.redis_kill_restart(rng.uniform(1.0, 4.0))
            elif kind == "redis-stop":
                c.redis_pause(rng.uniform(2.0, 8.0))
            elif kind in ("leader-kill", "replica-kill"):
                name = leader if kind == "leader-kill" or not others else rng.choice(others)
                c.kill(name)
                c.start_replica(name)
            else:
                name = leader if kind == "leader-stop" or not others else rng.choice(others)
                c.pause(name, rng.uniform(4.0, 8.0))
            with contextlib.suppress(httpx.HTTPError, KeyError, ValueError):
                done = c.batch(bid).json()["request_counts"]["completed"]
                done_by.append((kind, done))
            err.print(f"fault {k + 1}/{args.kills}: {kind}; {done_by[-1][1] if done_by else '?'} lines done")
        b = c.wait_batch(bid, LIMIT_S)
        took = time.monotonic() - t0
        ids = c.output_ids(b.get("output_file_id"))
        errors = c.output_ids(b.get("error_file_id"))
        peaks = c.peaks()
        twice = c.twice_at_once()
    finally:
        c.close()
    expected = {f"b{i:05d}" for i in range(args.lines)}
    seen = set(ids)
    return {
        "status": b.get("status"),
        "faults": [kind for kind, _ in done_by],
        "total_s": took,
        "lost": len(expected - seen),
        "duplicated": len(ids) - len(seen),
        "error_lines": len(errors),
        "peaks": peaks,
        "slots": args.slots,
        "twice_at_once": len(twice),
    }


def report_cluster(r: dict[str, Any], console: Console) -> None:
    got = r["cluster"]
    t = Table(title=f"Redis and process faults over a batch of {r['lines']} lines (three replicas)")
    t.add_column("fault")
    t.add_column("times", justify="right")
    for kind in FAULTS:
        t.add_row(kind, str(got["faults"].count(kind)))
    console.print(t)
    s = Table(title="Every line once, within the slots")
    for col in ("status", "lost", "duplicated", "error lines", "peak / slots", "run twice at once", "took s"):
        s.add_column(col, justify="right")
    s.add_row(
        str(got["status"]),
        str(got["lost"]),
        str(got["duplicated"]),
        str(got["error_lines"]),
        f"{max(got['peaks'])} / {got['slots']}",
        str(got["twice_at_once"]),
        f"{got['total_s']:.0f}",
    )
    console.print(s)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lines", type=int, default=10_000)
    p.add_argument("--kills", type=int, default=20)
    p.add_argument("--slots", type=int, default=8)
    p.add_argument("--max-gap-s", type=float, default=2.0, help="longest run between two kills")
    p.add_argument("--uploads", type=int, default=10, help="kill rounds during upload, and during creation")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, metavar="FILE")
    p.add_argument(
        "--redis",
        action="store_true",
        help="three replicas on one Redis; --kills faults of Redis and of the replicas instead",
    )
    args = p.parse_args(argv)
    if args.redis:
        with tempfile.TemporaryDirectory(prefix="crash-soak-redis-") as d:
            err.print(f"cluster soak: {args.lines} lines, {args.kills} faults")
            result = {"lines": args.lines, "kills": args.kills, "cluster": cluster_soak(args, Path(d))}
        report_cluster(result, Console())
        if args.json is not None:
            args.json.write_text(json.dumps(result, indent=2) + "\n")
        got = result["cluster"]
        ok = (
            got["status"] == "completed"
            and not got["lost"]
            and not got["duplicated"]
            and not got["error_lines"]
        )
        ok = ok and max(got["peaks"]) <= args.slots and not got["twice_at_once"]
        return 0 if ok else 1
    content = batch_file(args.lines)
    with tempfile.TemporaryDirectory(prefix="crash-soak-") as d:
        tmp = Path(d)
        err.print(f"baseline: {args.lines} lines uninterrupted")
        base = baseline(args, tmp, content)
        err.print(f"soak: {args.kills} kills")
        got = soak(args, tmp, content)
        err.print(f"uploads: {args.uploads} kills during upload, {args.uploads} during creation")
        up = uploads(args, tmp, content)
    result = {
        "lines": args.lines,
        "kills": args.kills,
        "baseline_s": base,
        "soak": got,
        "overhead": got["total_s"] / base,
        "overhead_without_restarts": (got["total_s"] - got["restarts_s"]) / base,
        "uploads": up,
    }
    report(result, Console())
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    ok = got["each_once"] and got["all_200"] and got["error_lines"] == 0 and up["half_made_objects"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
