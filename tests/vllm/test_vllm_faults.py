"""An upstream that is down, dies, hangs or serves another model: clients get a clear answer fast,
and work goes back to it as soon as a probe finds it healthy."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from laneway.config import WorkerConfig
from laneway.testing import VllmProcess, free_port, serve_process, vllm_process
from live_server import LiveServer, live_server
from vllm_helpers import CLIENT, stream, upstream_config

PROBE_S = 0.5
HOLD_S = 1.0
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "temperature": 0}


def ask(server: LiveServer, **extra: object) -> httpx.Response:
    return CLIENT.post(server.base_url + "/chat/completions", json={**CHAT, **extra})


def ready(server: LiveServer) -> httpx.Response:
    return CLIENT.get(server.url + "/readyz")


def no_worker_503(r: httpx.Response) -> None:
    assert r.status_code == 503, r.text
    err = r.json()["error"]
    assert err["code"] == "no_healthy_worker" and "tiny" in err["message"]
    assert int(r.headers["Retry-After"]) >= 1 and err["estimated_wait_s"] is None  # (not known)


@pytest.fixture(scope="module")
def port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def gateway_first(port: int, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """laneway started before its upstream (nothing listens on ``port`` yet)."""
    cfg = upstream_config(
        tmp_path_factory.mktemp("faults"), f"http://127.0.0.1:{port}/v1", slots=2, stall_timeout_s=2.0
    )
    cfg = replace(cfg, probe_interval_s=PROBE_S, unavailable_hold_s=HOLD_S)
    with live_server(cfg) as server:
        yield server


def test_upstream_down_at_start_then_up(
    gateway_first: LiveServer, port: int, vllm_paths: tuple[Path, Path], tmp_path: Path
) -> None:
    r = ready(gateway_first)
    assert r.status_code == 503 and "could not connect" in r.json()["workers"]["v0"]["detail"]
    t0 = time.monotonic()
    no_worker_503(ask(gateway_first))
    assert HOLD_S <= time.monotonic() - t0 < HOLD_S + 2.0  # held, then answered: no class-timeout hang
    est = CLIENT.get(gateway_first.base_url + "/queue/estimate", params={"model": "tiny"}).json()
    assert est["estimated_wait_s"] is None  # it cannot run: no estimate of 0
    venv, model = vllm_paths
    with vllm_process(venv, model, tmp_path / "vllm.log", port=port):
        up = time.monotonic()
        r = ask(gateway_first)
        assert r.status_code == 200, r.text
        assert time.monotonic() - up < PROBE_S + 1.0  # dispatched within a probe interval
        assert ready(gateway_first).status_code == 200


def test_upstream_killed_mid_stream_then_restarted(
    gateway_first: LiveServer, port: int, vllm_paths: tuple[Path, Path], tmp_path: Path
) -> None:
    venv, model = vllm_paths
    server = VllmProcess(venv, model, port, tmp_path / "vllm.log")
    try:
        chunks: list[object] = []
        errors: list[BaseException] = []

        def long_stream() -> None:
            try:
                chunks.extend(
                    stream(gateway_first.base_url, "chat", {**CHAT, "max_tokens": 1500, "ignore_eos": True})
                )
            except BaseException as exc:
                errors.append(exc)

        t = threading.Thread(target=long_stream)
        t.start()
        deadline = time.monotonic() + 30
        while not any(tk.tokens > 20 for tk in list(gateway_first.runtime.tickets.values())):
            assert time.monotonic() < deadline, "the stream never started"
            time.sleep(0.01)
        server.kill()
        t.join(30)
        assert not t.is_alive()
        # the stream ends at once with an error event (it had sent text: not retried elsewhere)
        assert not errors and chunks and "error" in chunks[-1]  # type: ignore[operator]
        no_worker_503(ask(gateway_first))
        server = VllmProcess(venv, model, port, tmp_path / "vllm.log")
        up = time.monotonic()
        r = ask(gateway_first)
        assert r.status_code == 200, r.text
        assert time.monotonic() - up < PROBE_S + 1.0
    finally:
        server.stop()


def test_a_hung_upstream_is_taken_out_and_new_work_goes_to_the_other(
    vllm_paths: tuple[Path, Path], tmp_path: Path
) -> None:
    """A SIGSTOPped vLLM answers nothing: its streams fail after the stall timeout (retried on the
    other worker when they had sent nothing), its probes time out, and new requests go to the other
    worker (here a laneway with the built-in engine, served under the same name)."""
    venv, model = vllm_paths
    with (
        vllm_process(venv, model, tmp_path / "vllm.log") as vllm,
        serve_process(
            "--model",
            "builtin:tiny",
            "--slots",
            "4",
            "--data-dir",
            str(tmp_path / "other"),
            log=tmp_path / "other.log",
        ) as other,
    ):
        cfg = upstream_config(tmp_path, vllm.url, slots=2, stall_timeout_s=2.0)
        spare = WorkerConfig(
            "b0",
            type="upstream",
            url=other.url + "/v1",
            model="builtin:tiny",
            served_name="tiny",
            slots=4,
            token_ids="none",
        )
        cfg = replace(cfg, workers=(*cfg.workers, spare), probe_interval_s=PROBE_S)
        with live_server(cfg) as gw:
            assert ask(gw).status_code == 200
            vllm.pause()
            try:
                t0 = time.monotonic()
                answers: list[httpx.Response] = []
                threads = [threading.Thread(target=lambda: answers.append(ask(gw))) for _ in range(8)]
                for th in threads:
                    th.start()
                for th in threads:
                    th.join(60)
                took = time.monotonic() - t0
                assert len(answers) == 8 and all(r.status_code == 200 for r in answers), [
                    r.text for r in answers
                ]
                assert took < 2.0 + 3 * 2.5  # at most a stall, never a hang
                assert gw.runtime.recovery.down == {"v0"}
                assert all(r.json()["laneway"]["worker"] == "b0" for r in answers[-4:])
            finally:
                vllm.unpause()
            deadline = time.monotonic() + 10
            while gw.runtime.recovery.down and time.monotonic() < deadline:
                time.sleep(0.1)
            assert not gw.runtime.recovery.down  # probed healthy again


def test_a_model_the_upstream_does_not_serve_is_reported(vllm: VllmProcess, tmp_path: Path) -> None:
    cfg = upstream_config(tmp_path, vllm.url)
    cfg = replace(cfg, workers=(replace(cfg.workers[0], model="no-such-model"),), unavailable_hold_s=0.0)
    with live_server(cfg) as gw:
        r = ready(gw)
        assert r.status_code == 503
        assert "does not serve model 'no-such-model' (it serves: tiny)" in r.json()["workers"]["v0"]["detail"]
        no_worker_503(ask(gw))  # at once: no hold configured
