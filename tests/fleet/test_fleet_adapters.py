"""LoRA adapters in a live fleet: loaded into a running engine of their base as their
requests come (vLLM's runtime adapter endpoints, spoken by the stand-in engine), the least
recently used idle one unloaded to make room, and a load that fails a 503 naming why."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import httpx

from fleet_util import complete, fleet_toml, replicas
from laneway.testing import serve_process


def _adapter_dir(root: Path, name: str) -> Path:
    d = root / name
    d.mkdir()
    (d / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8}), encoding="utf-8")
    return d


def _fleet(tmp: Path, max_adapters: int, adapters: dict[str, Path]) -> Path:
    command = (
        f'"{sys.executable}" -m laneway.standin --port {{port}} --model {{model}} --ms-per-token 20 '
        "--slots 4 --enable-lora --lora-load-s 0.3"
    )
    models = (
        f"[fleet.models.base]\nvram_gb = 14\nslots = 4\nload_s = 1\nmax_adapters = {max_adapters}\n"
        f"command = '{command}'\nstop_grace_s = 5\n"
        'env = { VLLM_ALLOW_RUNTIME_LORA_UPDATING = "True" }\n'
    )
    for name, path in adapters.items():
        models += f'[fleet.models.{name}]\nadapter_of = "base"\npath = "{path}"\nload_s = 0.5\n'
    # one GPU: no room for a second replica of the base (where there is, one is loaded
    # into it for work waiting on a full replica, as for the base's own requests)
    one_gpu = '[fleet.nodes.a]\ngpus = [ { id = "a0", vram_gb = 24 } ]\n'
    return fleet_toml(tmp, models, preload='"base"', gpus=one_gpu)


def _stats(server_url: str) -> dict[str, object]:
    ((_, base),) = replicas(server_url).items()
    out: dict[str, object] = httpx.get(str(base["url"]).removesuffix("/v1") + "/stats", timeout=5).json()
    return out


def test_adapters_are_loaded_into_their_bases_engine_and_swapped_when_it_is_full(tmp_path: Path) -> None:
    sql, poem = _adapter_dir(tmp_path, "sql"), _adapter_dir(tmp_path, "poem")
    cfg = _fleet(tmp_path, 1, {"sql": sql, "poem": poem})
    with serve_process("--config", str(cfg), log=tmp_path / "serve.log") as server:
        ((rid, _),) = replicas(server.url).items()
        base = complete(server.url, "base")
        got = complete(server.url, "sql")
        assert got.status_code == 200, got.text
        answer = got.json()
        assert answer["model"] == "sql" and answer["laneway"]["worker"] == rid
        # the engine ran it as the adapter: other words than its base for the same prompt
        assert answer["choices"][0]["text"] != base.json()["choices"][0]["text"]
        assert _stats(server.url)["adapters"] == ["sql"]
        assert replicas(server.url)[rid]["adapters"] == ["sql"]
        assert complete(server.url, "sql").status_code == 200  # (held: no second load)
        assert _stats(server.url)["adapter_loads"] == 1

        # two sql requests run while poem waits for the only adapter room; then sql goes
        results: dict[str, httpx.Response] = {}

        def ask(key: str, model: str, tokens: int) -> None:
            results[key] = complete(server.url, model, max_tokens=tokens)

        threads = [
            threading.Thread(target=ask, args=("s1", "sql", 40)),
            threading.Thread(target=ask, args=("s2", "sql", 40)),
        ]
        for t in threads:
            t.start()
        # poem is asked once both sql requests run in the engine (asked at once, it might
        # reach laneway first, take the room and leave sql to be loaded again after it)
        deadline = time.monotonic() + 30
        while _stats(server.url)["open"] != 2:
            assert time.monotonic() < deadline, _stats(server.url)
            time.sleep(0.02)
        threads.append(threading.Thread(target=ask, args=("p1", "poem", 4)))
        threads[-1].start()
        for t in threads:
            t.join(60)
        assert {k: r.status_code for k, r in results.items()} == {"s1": 200, "s2": 200, "p1": 200}
        stats = _stats(server.url)
        assert stats["adapters"] == ["poem"]
        assert (stats["adapter_loads"], stats["adapter_unloads"], stats["peak_adapters"]) == (2, 1, 1)
        metrics = httpx.get(server.url + "/metrics", timeout=5).text
        assert 'laneway_adapter_loads_total{adapter="sql",outcome="loaded"} 1.0' in metrics
        assert 'laneway_adapter_unloads_total{adapter="sql"} 1.0' in metrics
        log = server.text()
    assert "adapter poem loaded into" in log and "Traceback" not in log, log


def test_an_adapter_that_cannot_be_loaded_is_a_503_naming_why_and_the_base_still_serves(
    tmp_path: Path,
) -> None:
    cfg = _fleet(tmp_path, 2, {"ghost": tmp_path / "no-such-adapter", "sql": _adapter_dir(tmp_path, "sql")})
    with serve_process("--config", str(cfg), log=tmp_path / "serve.log") as server:
        got = complete(server.url, "ghost")
        assert got.status_code == 503, got.text
        err = got.json()["error"]
        assert err["code"] == "model_unavailable"
        assert "ghost" in err["message"] and "No adapter found" in err["message"], err
        assert int(got.headers["retry-after"]) >= 1
        again = complete(server.url, "ghost")  # (backing off: refused at once, the same reason)
        assert again.status_code == 503 and "No adapter found" in again.json()["error"]["message"]
        assert complete(server.url, "base").status_code == 200
        assert complete(server.url, "sql").status_code == 200
        ready = httpx.get(server.url + "/readyz", timeout=5).json()
        assert "ghost" in ready["fleet"]["failing"], ready
