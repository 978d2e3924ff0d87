"""A fleet whose engine is a real vLLM: laneway starts it on a declared GPU, sends it
requests, stops it (and every process it started) to make room for another model, and
starts it again — its real load time measured and kept."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import httpx

from fleet_util import complete, fleet_toml, replicas, standin_model, wait_gone
from laneway.testing import serve_process


def _group(pgid: int) -> list[int]:
    """The processes of process group ``pgid`` (an engine and what it started)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                out.append(int(entry.name))
    return out


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def test_laneway_starts_switches_and_stops_a_real_vllm(vllm_paths: tuple[Path, Path], tmp_path: Path) -> None:
    venv, model = vllm_paths
    vllm = (
        "[fleet.models.tiny]\nvram_gb = 10\nslots = 4\nload_s = 30\n"
        f"path = '{model}'\n"
        f"command = '{venv}/bin/vllm serve {{path}} --host {{host}} --port {{port}} --dtype float32 "
        "--max-model-len 2048 --max-num-seqs 4 --enforce-eager --served-model-name {model}'\n"
        "env = { VLLM_CPU_KVCACHE_SPACE = '1', HF_HUB_OFFLINE = '1', VLLM_NO_USAGE_STATS = '1' }\n"
        "ready_timeout_s = 300\nstop_grace_s = 20\n"
    )
    gpus = '[fleet.nodes.n]\ngpus = [ { id = "g0", vram_gb = 24, cuda = 3 } ]\n'
    cfg = fleet_toml(tmp_path, vllm + standin_model("other", 20), gpus=gpus)
    with serve_process("--config", str(cfg), log=tmp_path / "serve.log") as server:
        got = complete(server.url, "tiny", max_tokens=8, temperature=0)
        assert got.status_code == 200, got.text
        body = got.json()
        assert body["usage"]["completion_tokens"] == 8
        ((rid, rep),) = replicas(server.url).items()
        assert body["laneway"]["worker"] == rid and rep["state"] == "ready"
        pid = int(rep["pid"])
        env = _environ(pid)
        assert env["CUDA_VISIBLE_DEVICES"] == "3"  # the GPU's declared CUDA id
        assert (env["LANEWAY_REPLICA"], env["LANEWAY_MODEL"], env["LANEWAY_GPUS"]) == (rid, "tiny", "g0")
        engines = _group(pid)
        assert pid in engines
        # the direct answer equals laneway's (the engine is the one laneway started)
        direct = httpx.post(
            str(rep["url"]) + "/completions",
            json={"model": "tiny", "prompt": "hello fleet", "max_tokens": 8, "temperature": 0},
            timeout=60,
        ).json()
        assert direct["choices"][0]["text"] == body["choices"][0]["text"]

        # another model needs the GPU: vLLM and every process it started are stopped
        assert complete(server.url, "other").status_code == 200
        assert wait_gone(engines, 30) == []
        assert [r["model"] for r in replicas(server.url).values()] == ["other"]

        # and vLLM again; its measured load time is what the dashboard and /metrics give
        assert complete(server.url, "tiny", max_tokens=4).status_code == 200
        metrics = httpx.get(server.url + "/metrics", timeout=5).text
        assert 'laneway_model_load_seconds_count{model="tiny"} 2.0' in metrics
        total = float(metrics.split('laneway_model_load_seconds_sum{model="tiny"} ', 1)[1].split()[0])
        assert 2 < total < 600, total  # (two real starts)
        log = server.text()
        # laneway killed outright: vLLM and every process it started go with it
        (again,) = [int(r["pid"]) for r in replicas(server.url).values() if r["model"] == "tiny"]
        group = _group(again)
        assert len(group) >= 2, group  # (vLLM's API server and its engine core)
        server.kill()
        assert wait_gone(group, 60) == [], [Path(f"/proc/{p}/cmdline").read_bytes()[:80] for p in group]
    assert "Traceback" not in log, log
    print(f"vLLM started twice through the fleet in {total:.1f} s in all", file=sys.stderr)
    assert not os.path.exists(f"/proc/{pid}")


def test_lora_adapters_are_loaded_into_a_real_vllm_and_swapped_when_it_is_full(
    vllm_paths: tuple[Path, Path], tmp_path: Path
) -> None:
    from lora_util import make_adapter

    venv, model = vllm_paths
    sql = make_adapter(model, tmp_path / "sql", seed=1)
    poem = make_adapter(model, tmp_path / "poem", seed=2)
    vllm = (
        "[fleet.models.tiny]\nvram_gb = 10\nslots = 4\nload_s = 30\nmax_adapters = 1\n"
        f"path = '{model}'\n"
        f"command = '{venv}/bin/vllm serve {{path}} --host {{host}} --port {{port}} --dtype float32 "
        "--max-model-len 2048 --max-num-seqs 4 --enforce-eager --served-model-name {model} "
        "--enable-lora --max-loras 1 --max-lora-rank 8'\n"
        "env = { VLLM_CPU_KVCACHE_SPACE = '1', HF_HUB_OFFLINE = '1', VLLM_NO_USAGE_STATS = '1', "
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING = 'True' }\n"
        "ready_timeout_s = 300\nstop_grace_s = 20\n"
        f"[fleet.models.sql]\nadapter_of = 'tiny'\npath = '{sql}'\n"
        f"[fleet.models.poem]\nadapter_of = 'tiny'\npath = '{poem}'\n"
    )
    gpus = '[fleet.nodes.n]\ngpus = [ { id = "g0", vram_gb = 24 } ]\n'
    cfg = fleet_toml(tmp_path, vllm, gpus=gpus, preload='"tiny"')
    with serve_process("--config", str(cfg), log=tmp_path / "serve.log") as server:
        ((rid, rep),) = replicas(server.url).items()
        texts = {}
        # (asked for, then the adapters the engine holds: sql stays while only the base runs;
        # poem takes the one adapter room once sql runs nothing)
        for name, held in (("tiny", []), ("sql", ["sql"]), ("tiny", ["sql"]), ("poem", ["poem"])):
            got = complete(server.url, name, max_tokens=8, temperature=0)
            assert got.status_code == 200, got.text
            assert got.json()["model"] == name and got.json()["laneway"]["worker"] == rid
            texts.setdefault(name, got.json()["choices"][0]["text"])
            served = httpx.get(str(rep["url"]) + "/models", timeout=10).json()["data"]
            assert sorted(m["id"] for m in served if m.get("parent") == "tiny") == held, (name, served)
        # each adapter changes the answer, and laneway's is the engine's own for that adapter
        assert len(set(texts.values())) == 3, texts
        direct = httpx.post(
            str(rep["url"]) + "/completions",
            json={"model": "poem", "prompt": "hello fleet", "max_tokens": 8, "temperature": 0},
            timeout=60,
        ).json()
        assert direct["choices"][0]["text"] == texts["poem"]
        metrics = httpx.get(server.url + "/metrics", timeout=5).text
        assert 'laneway_adapter_unloads_total{adapter="sql"} 1.0' in metrics
        log = server.text()
    assert "Traceback" not in log, log
