"""A fleet across a cluster: two replicas of ``laneway serve`` on one real ``redis-server``, each
owning a node of declared GPUs. The leader places across both nodes; the replica that owns the
chosen node starts the engine (a real process, its child), and every replica reaches it."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx

from fleet_util import complete, engine_processes, parent_of, replicas, standin_model, wait_gone
from laneway.fault_harness import replica_toml
from laneway.testing import ServeProcess

NODES = (
    '[fleet.nodes.a]\ngpus = [ { id = "a0", vram_gb = 24 } ]\n'
    '[fleet.nodes.b]\ngpus = [ { id = "b0", vram_gb = 24 } ]\n'
)


LOG_TAIL = 120
MODELS = standin_model("small", 14, load_s=0.2) + standin_model("other", 14, load_s=0.2)


@contextlib.contextmanager
def _pair(
    tmp: Path,
    redis_url: str,
    *,
    first: str = "ra",
    models: str = MODELS,
    nodes: str = NODES,
    preload: str = '"small"',
) -> Iterator[tuple[ServeProcess, ServeProcess]]:
    """Replicas ``ra`` (owning node a) and ``rb`` (node b) of one cluster, ``first`` started
    first (it leads), the other once it is up; both ready."""
    prefix = f"f{uuid.uuid4().hex[:8]}:"
    started: dict[str, ServeProcess] = {}
    try:
        for name in (first, "rb" if first == "ra" else "ra"):
            text = replica_toml(tmp / name, redis_url, name, prefix) + (
                f'[fleet]\nnode = "{name[1]}"\npreload = [{preload}]\nswitch_wait_s = 1\n\n{nodes}\n{models}'
            )
            path = tmp / f"{name}.toml"
            path.write_text(text, encoding="utf-8")
            started[name] = ServeProcess(["--config", str(path)], tmp / f"{name}.log")
        for server in started.values():
            _wait_ready(server.url)
        yield started["ra"], started["rb"]
    except BaseException:  # (what each replica said, shown with the failure)
        for name, server in started.items():
            print(
                f"----- {name}'s log, its last {LOG_TAIL} lines",
                *server.text().splitlines()[-LOG_TAIL:],
                sep="\n",
            )
        raise
    finally:
        for server in started.values():
            server.stop()


def _wait_ready(url: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = httpx.get(url + "/readyz", timeout=5)
        if got.status_code == 200:
            return
        time.sleep(0.1)
    raise AssertionError(got.text)


def test_two_replicas_each_start_the_engines_of_their_own_node_and_both_reach_every_engine(
    tmp_path: Path, redis_url: str
) -> None:
    with _pair(tmp_path, redis_url) as (a, b):
        # the preload: placed on the first node, started by its owner alone
        mine = engine_processes(a.proc.pid, b.proc.pid)
        assert [(e["model"], e["gpus"], parent_of(pid)) for pid, e in mine.items()] == [
            ("small", "a0", a.proc.pid)
        ], mine
        # a request to the other replica runs on it all the same
        got = complete(b.url, "small")
        assert got.status_code == 200, got.text
        assert got.json()["laneway"]["worker"] == "small#1@a0"

        # a model with no room on a0: loaded on b0, started by the replica that owns node b,
        # for a request sent to the other one
        got = complete(a.url, "other")
        assert got.status_code == 200, got.text
        worker = got.json()["laneway"]["worker"]
        assert worker.endswith("@b0"), worker
        engines = engine_processes(a.proc.pid, b.proc.pid)
        placed = sorted(
            (e["model"], e["gpus"], "ra" if parent_of(pid) == a.proc.pid else "rb")
            for pid, e in engines.items()
        )
        assert placed == [("other", "b0", "rb"), ("small", "a0", "ra")], engines
        assert complete(b.url, "other").json()["laneway"]["worker"] == worker
        # each replica shows the fleet as the leader placed it, with the processes it started
        for server, own in ((a, "small#1@a0"), (b, worker)):
            deadline = time.monotonic() + 10
            while True:
                shown = replicas(server.url)
                states = {rid: (r["model"], r["gpus"], r["state"]) for rid, r in shown.items()}
                if states == {"small#1@a0": ("small", ["a0"], "ready"), worker: ("other", ["b0"], "ready")}:
                    break
                assert time.monotonic() < deadline, shown
                time.sleep(0.1)
            assert {rid for rid, r in shown.items() if r["pid"] is not None} == {own}, shown
        metrics = httpx.get(b.url + "/metrics", timeout=5).text
        assert 'laneway_gpu_vram_used_bytes{gpu="a0",node="a"} 1.4e+10' in metrics, metrics

        # a replica stopped takes its engines with it; the other goes on serving its own
        pids_b = [pid for pid, e in engines.items() if parent_of(pid) == b.proc.pid]
        b.stop()
        assert wait_gone(pids_b) == []
        assert complete(a.url, "small").status_code == 200
    assert "Traceback" not in a.text(), a.text()


def test_a_new_leader_keeps_the_engines_that_run_and_replaces_those_of_a_replica_killed(
    tmp_path: Path, redis_url: str
) -> None:
    # rb starts first: it leads; ra owns node a, where the preload goes
    with _pair(tmp_path, redis_url, first="rb") as (a, b):
        assert "replica rb leads" in b.text()
        assert complete(b.url, "small").json()["laneway"]["worker"] == "small#1@a0"
        got = complete(a.url, "other")
        assert got.status_code == 200, got.text
        assert got.json()["laneway"]["worker"].endswith("@b0")
        pids_b = list(engine_processes(b.proc.pid))
        assert len(pids_b) == 1

        b.proc.kill()  # (SIGKILL: the leader and node b's owner, gone at once)
        b.proc.wait(5)
        assert wait_gone(pids_b) == []
        _wait_for(a, "replica ra leads")
        # the engine that runs on node a is taken in, not started again
        got = complete(a.url, "small")
        assert got.status_code == 200, got.text
        assert got.json()["laneway"]["worker"] == "small#1@a0"
        # (and rb's too where Redis still said rb lived as ra took the lease: a machine under
        # load; rb is taken for dead after, and its engine given up, as below)
        assert re.search(r"\b[12] engines of the fleet taken in", a.text()), a.text()
        # node b has no owner now: "other" is loaded on node a (small, idle, makes room)
        got = complete(a.url, "other")
        assert got.status_code == 200, got.text
        assert got.json()["laneway"]["worker"].endswith("@a0")
        placed = list(engine_processes(a.proc.pid).values())
        assert [(e["model"], e["gpus"]) for e in placed] == [("other", "a0")], placed
    assert "Traceback" not in a.text(), a.text()


def test_a_model_whose_engine_fails_on_one_node_is_refused_by_every_replica_naming_why(
    tmp_path: Path, redis_url: str
) -> None:
    fails = "import sys; print('no weights here'); sys.exit(3)"
    broken = (
        "[fleet.models.broken]\nvram_gb = 30\nload_s = 0.2\nstop_grace_s = 5\n"
        f'command = ["{sys.executable}", "-c", "{fails}", "{{port}}"]\n'
    )
    nodes = NODES.replace('id = "b0", vram_gb = 24', 'id = "b0", vram_gb = 48')
    models = standin_model("small", 14, load_s=0.2) + broken
    with _pair(tmp_path, redis_url, models=models, nodes=nodes, preload="") as (a, b):
        # only b0 holds it: started by rb, for a request sent to ra
        got = complete(a.url, "broken")
        assert got.status_code == 503, got.text
        err = got.json()["error"]
        assert err["code"] == "model_unavailable" and "broken" in err["message"], err
        assert "exited with status 3" in err["message"], err
        assert int(got.headers["retry-after"]) >= 1
        # refused at once now, by either replica, while it backs off; the other model serves
        for server in (a, b):
            again = complete(server.url, "broken")
            assert again.status_code == 503, again.text
            assert again.json()["error"]["code"] == "model_unavailable", again.text
        assert complete(a.url, "small").status_code == 200
        assert b.text().count("starting broken#") == 1, b.text()


def test_an_adapter_is_loaded_by_the_engines_owner_and_a_request_sent_elsewhere_waits_for_it(
    tmp_path: Path, redis_url: str
) -> None:
    sql = tmp_path / "sql"
    sql.mkdir()
    (sql / "adapter_config.json").write_text('{"peft_type": "LORA", "r": 8}', encoding="utf-8")
    base = standin_model(
        "base",
        14,
        load_s=0.2,
        extra=f'max_adapters = 1\nenv = {{ VLLM_ALLOW_RUNTIME_LORA_UPDATING = "True" }}\n'
        f'[fleet.models.sql]\nadapter_of = "base"\npath = "{sql}"\nload_s = 0.5\n',
    ).replace("--load-s 0.2", "--load-s 0.2 --enable-lora --lora-load-s 0.5")
    with _pair(tmp_path, redis_url, models=base, preload='"base"') as (a, b):
        plain = complete(b.url, "base")
        got = complete(b.url, "sql")  # (rb sends it; ra loads the adapter into its engine first)
        assert got.status_code == 200, got.text
        answer = got.json()
        assert answer["model"] == "sql" and answer["laneway"]["worker"] == "base#1@a0"
        assert answer["choices"][0]["text"] != plain.json()["choices"][0]["text"]
        assert "adapter sql loaded into base#1@a0" in a.text()
        assert complete(a.url, "sql").status_code == 200


def test_an_owner_paused_past_its_liveness_gets_its_engines_back_into_placement(
    tmp_path: Path, redis_url: str
) -> None:
    with _pair(tmp_path, redis_url, first="rb") as (a, b):
        assert complete(b.url, "small").json()["laneway"]["worker"] == "small#1@a0"
        os.kill(a.proc.pid, signal.SIGSTOP)  # (past its liveness: taken for dead, node a offline)
        try:
            _wait_for(b, "node a: no replica starts engines there now")
        finally:
            os.kill(a.proc.pid, signal.SIGCONT)
        _wait_for(a, "was taken for dead")
        # its engine is told again under its new name: taken back, not started anew
        deadline = time.monotonic() + 20
        while True:
            got = complete(b.url, "small")
            if got.status_code == 200 and got.json()["laneway"]["worker"] == "small#1@a0":
                break
            assert time.monotonic() < deadline, got.text
            time.sleep(0.2)
        assert a.text().count("starting small#") == 1 and "starting small#" not in b.text()


def _wait_for(server: ServeProcess, line: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while line not in server.text():
        assert time.monotonic() < deadline, server.text()
        time.sleep(0.1)
