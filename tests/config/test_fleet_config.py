"""``[fleet]`` in the server's configuration: the simulator's fleet words plus how to run
each model's engine; every mistake found at start, a line each."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from laneway.cli import main
from laneway.config import parse_config
from laneway.core import ConfigError

NODE = {"a": {"gpus": [{"id": "a0", "vram_gb": 24}, {"id": "a1", "vram_gb": 24, "cuda": 5}]}}


def fleet(**models: dict[str, Any]) -> dict[str, Any]:
    return {"fleet": {"nodes": NODE, "models": models}}


def test_a_fleet_gives_models_gpus_and_engine_commands() -> None:
    cfg = parse_config(
        fleet(
            chat={
                "vram_gb": 14,
                "slots": 8,
                "command": "vllm serve {path} --port {port} -tp {tp} --served-model-name {model}",
                "path": "/models/chat",
                "env": {"VLLM_LOGGING_LEVEL": "WARNING", "N": 3},
            }
        )
    )
    assert cfg.fleet is not None and cfg.workers == ()
    assert cfg.models == ("chat",)
    launch = cfg.fleet.launch["chat"]
    assert launch.argv(port=9001, model="chat", gpus=(5,)) == [
        "vllm", "serve", "/models/chat", "--port", "9001", "-tp", "1", "--served-model-name", "chat"
    ]  # fmt: skip
    assert launch.env == {"VLLM_LOGGING_LEVEL": "WARNING", "N": "3"}
    assert (launch.ready_path, launch.ready_timeout_s, launch.stop_grace_s) == ("/v1/models", 600.0, 30.0)
    assert cfg.fleet.cuda == {"a0": 0, "a1": 5}  # its place in its node, or its cuda key
    assert cfg.fleet.inventory.models["chat"].slots == 8


def test_every_mistake_is_a_line_naming_its_key() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(
            {
                "fleet": {
                    "nodes": {"a": {"gpus": [{"id": "a0", "vram_gb": 24, "cuda": -1}]}},
                    "models": {
                        "a": {"vram_gb": 10, "command": "serve --port 1"},
                        "b": {"vram_gb": 10, "command": "serve {port} {weights}"},
                        "c": {"vram_gb": 10},
                        "d": {"vram_gb": 10, "command": "serve {port} {path}", "ready_path": "v1"},
                        "e": {"vram_gb": 100, "command": "serve {port}"},
                        "f": {"vram_gb": 10, "command": "serve --port {port:d} {model!r}"},
                    },
                    "switch_wait": 3,
                    "hung_after_s": 0,
                }
            }
        )
    lines = str(info.value).splitlines()
    assert lines == [
        "fleet.switch_wait: unknown key "
        "(expected one of: nodes, models, preload, switch_wait_s, max_asleep, node, hung_after_s)",
        "fleet.nodes.a.gpus[0].cuda: expected a CUDA id >= 0, got -1",
        "fleet.models.a.command: must name {port}, the port its engine listens on",
        "fleet.models.b.command: unknown placeholder {weights} (known: {port}, {host}, {model}, {path}, "
        "{gpus}, {tp})",
        "fleet.models.c.command: required (the command that starts this model's engine)",
        "fleet.models.d.path: required, the command names {path}",
        "fleet.models.d.ready_path: expected a path starting with /, got 'v1'",
        "fleet.models.f.command: {port:d} in '{port:d}': a placeholder takes no conversion or format "
        "(write {port})",
        "fleet.models.f.command: {model!r} in '{model!r}': a placeholder takes no conversion or format "
        "(write {model})",
        "fleet.models.e: model 'e' needs 100 GB of VRAM on one GPU (100 GB each); no GPU group of this "
        "fleet can hold it (largest usable GPU: 24 GB after the KV reserve)",
        "fleet.hung_after_s: expected a number of seconds > 0, got 0",
    ]


def test_a_lora_adapter_is_a_model_loaded_into_its_bases_engine() -> None:
    cfg = parse_config(
        fleet(
            chat={"vram_gb": 14, "command": "vllm serve x --port {port} --enable-lora", "max_adapters": 2},
            sql={"adapter_of": "chat", "path": "/adapters/sql", "load_s": 2},
            poem={"adapter_of": "chat", "path": "/adapters/poem", "engine_model": "poem-v2"},
        )
    )
    assert cfg.fleet is not None
    assert cfg.models == ("chat", "sql", "poem")  # (each is asked for by its own name)
    assert set(cfg.fleet.launch) == {"chat"}  # (an adapter has no engine of its own)
    assert {n: (a.path, a.lora_name) for n, a in cfg.fleet.adapters.items()} == {
        "sql": ("/adapters/sql", "sql"),
        "poem": ("/adapters/poem", "poem-v2"),
    }
    inv = cfg.fleet.inventory
    assert (inv.models["sql"].adapter_of, inv.models["sql"].load_s, inv.models["poem"].load_s) == (
        "chat",
        2,
        1,
    )
    assert inv.models["chat"].max_adapters == 2 and inv.adapters == {"chat": ("sql", "poem")}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {**fleet(m={"vram_gb": 1, "command": "x {port}"}), "workers": [{"type": "simulated"}]},
            "workers: not beside [fleet]",
        ),
        (
            {
                **fleet(m={"vram_gb": 1, "command": "x {port}"}),
                "cluster": {"redis_url": "redis://127.0.0.1:6379/0", "replica": "r"},
            },
            "fleet.node: required in a [cluster] (the node whose GPUs this replica starts engines on; one of",
        ),
        (
            {
                "fleet": {**fleet(m={"vram_gb": 1, "command": "x {port}"})["fleet"], "node": "nowhere"},
                "cluster": {"redis_url": "redis://127.0.0.1:6379/0", "replica": "r"},
            },
            "fleet.node: expected the name of one of the fleet's nodes",
        ),
        (
            {"fleet": {**fleet(m={"vram_gb": 1, "command": "x {port}"})["fleet"], "node": "a"}},
            "fleet.node: only in a [cluster]",
        ),
        ({"fleet": {"nodes": NODE}}, "fleet.models: at least one model"),
        (
            {"fleet": {"models": {"m": {"vram_gb": 1, "command": "x {port}"}}}},
            "fleet.nodes: a table of nodes",
        ),
        (fleet(m={"vram_gb": 1, "command": "x {port}", "gpu": 2}), "fleet.models.m.gpu: unknown key"),
        (  # (a GPU's keys: its CUDA id's too)
            {
                "fleet": {
                    "nodes": {"a": {"gpus": [{"id": "g", "vram_gb": 9, "cuda_id": 0}]}},
                    "models": {"m": {"vram_gb": 1, "command": "x {port}"}},
                }
            },
            "fleet.nodes.a.gpus[0].cuda_id: unknown key (expected one of: id, vram_gb, kv_reserve_gb, "
            "reserved_for, cuda)",
        ),
        (  # (the keys it may have: the engine's too)
            fleet(m={"vram_gb": 1, "command": "x {port}", "isolate": True}),
            "fleet.models.m.isolate: unknown key (expected one of: vram_gb, gpus, load_s, slots, wake_s, "
            "adapter_of, max_adapters, command, path, env, engine_model, ready_path, ready_timeout_s, "
            "stop_grace_s)",
        ),
        (fleet(m={"vram_gb": 1, "command": "x {port", "gpus": 1}), "fleet.models.m.command: "),
        (fleet(m={"vram_gb": 1, "command": ["x", 3]}), "expected a string or a list of strings"),
        (fleet(m={"vram_gb": 1, "command": "x {port}", "stop_grace_s": 0}), "stop_grace_s: expected"),
        (
            {
                "fleet": {
                    "nodes": {
                        "a": {"gpus": [{"id": "g", "vram_gb": 9}, {"id": "h", "vram_gb": 9, "cuda": 0}]}
                    },
                    "models": {"m": {"vram_gb": 1, "command": "x {port}"}},
                }
            },
            "GPUs g and h have the same CUDA id 0",
        ),
        ({**fleet(m={"vram_gb": 1, "command": "x {port}"}), "models": {"m": {"aliases": ["mm"]}}}, None),
        (
            fleet(m={"vram_gb": 1, "command": "x {port}"}, a={"adapter_of": "m"}),
            "fleet.models.a.path: required, the directory of the adapter's weights",
        ),
        (
            fleet(
                m={"vram_gb": 1, "command": "x {port}"}, a={"adapter_of": "m", "path": "p", "command": "y"}
            ),
            "fleet.models.a.command: an adapter has no engine of its own",
        ),
        (
            fleet(m={"vram_gb": 1, "command": "x {port}"}, a={"adapter_of": "n", "path": "p"}),
            "fleet.models.a.adapter_of: unknown model 'n'",
        ),
        (
            fleet(
                m={"vram_gb": 1, "command": "x {port}"},
                a={"adapter_of": "m", "path": "p"},
                b={"adapter_of": "a", "path": "p"},
            ),
            "fleet.models.b.adapter_of: 'a' is an adapter itself, not a base model",
        ),
        (
            fleet(m={"vram_gb": 1, "command": "x {port}"}, a={"adapter_of": "m", "path": "p", "vram_gb": 1}),
            "fleet.models.a.vram_gb: an adapter runs in its base's engine, in the room its base holds for "
            "adapters (set max_adapters on 'm')",
        ),
        (
            fleet(m={"vram_gb": 1, "command": "x {port}", "max_adapters": 0}),
            "fleet.models.m.max_adapters: must be >= 1",
        ),
        (
            {
                "fleet": {
                    "nodes": NODE,
                    "models": {
                        "m": {"vram_gb": 1, "command": "x {port}"},
                        "a": {"adapter_of": "m", "path": "p"},
                    },
                    "preload": ["a"],
                }
            },
            "fleet.preload: 'a' is an adapter (loaded with its first request)",
        ),
    ],
)
def test_fleet_mistakes(data: dict[str, Any], message: str | None) -> None:
    if message is None:  # (aliases of a fleet's models are fine)
        assert parse_config(data).aliases == {"mm": "m"}
        return
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_config(data)


def test_serve_prints_every_mistake_on_its_own_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text(
        '[fleet.nodes.a]\ngpus = [{ id = "a0", vram_gb = 8 }]\n'
        '[fleet.models.x]\nvram_gb = 4\ncommand = "run"\n'
        '[fleet.models.y]\nvram_gb = 4\ncommand = "run {port} {oops}"\n',
        encoding="utf-8",
    )
    assert main(["serve", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"laneway: error: {cfg}: fleet.models.x.command: must name {{port}}, the port its engine listens on",
        f"laneway: error: {cfg}: fleet.models.y.command: unknown placeholder {{oops}} (known: {{port}}, "
        "{host}, {model}, {path}, {gpus}, {tp})",
    ]
    good = tmp_path / "good.toml"
    good.write_text(
        '[fleet.nodes.a]\ngpus = [{ id = "a0", vram_gb = 8 }]\n'
        '[fleet.models.x]\nvram_gb = 4\ncommand = "run {port}"\n',
        encoding="utf-8",
    )
    assert main(["serve", "--config", str(good), "--model", "builtin:tiny"]) == 2
    assert capsys.readouterr().err == (
        "laneway: error: argument --model: not with a [fleet] (its models and slots are configured)\n"
    )


def test_preloads_that_do_not_fit_together_are_one_line_at_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Only placing them shows it: refused before anything starts, not as a traceback of the
    server's start-up."""
    cfg = tmp_path / "fleet.toml"
    models = "".join(f'[fleet.models.{m}]\nvram_gb = 20\ncommand = "run {{port}}"\n' for m in "abc")
    cfg.write_text(
        '[fleet]\npreload = ["a", "b", "c"]\n'
        '[fleet.nodes.n]\ngpus = [{ id = "g0", vram_gb = 24 }, { id = "g1", vram_gb = 24 }]\n' + models,
        encoding="utf-8",
    )
    assert main(["serve", "--config", str(cfg)]) == 2
    assert capsys.readouterr().err == (
        f"laneway: error: {cfg}: preload: model 'c' does not fit next to a, b (preloaded before it)\n"
    )


def test_the_inventorys_mistakes_are_each_a_line_too() -> None:
    """Mistakes of the inventory (GPUs, models, preloads) are all named, not its first alone."""
    with pytest.raises(ConfigError) as info:
        parse_config(
            {
                "fleet": {
                    "nodes": {"a": {"gpus": [{"id": "a0", "vram_gb": "big"}, {"id": "a1", "vram": 24}]}},
                    "models": {
                        "m": {"vram_gb": 10, "command": "serve {port}", "gpu": 2},
                        "n": {"vram_gb": -1, "command": "serve {port}"},
                    },
                    "preload": ["m", "zzz"],
                }
            }
        )
    lines = str(info.value).splitlines()
    assert lines[0].startswith("fleet.nodes.a.gpus[0]") and "vram_gb" in lines[0], lines
    assert lines[1].startswith("fleet.nodes.a.gpus[1].vram: unknown key"), lines
    assert lines[2].startswith("fleet.models.m.gpu: unknown key"), lines
    assert lines[3].startswith("fleet.models.n"), lines
    assert lines[4:] == ["fleet.preload: unknown model 'zzz'"], lines
