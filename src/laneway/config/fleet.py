"""``[fleet]``: the GPUs of this server and the models it starts on them itself.

The same words as the simulator's fleet file (``examples/fleet.toml``: nodes of GPUs
with their VRAM, KV reserve and ``reserved_for``; models with their VRAM, GPU count,
load time and slots; ``preload``), plus, for each model, how to run its engine::

    [fleet.models.chat]
    vram_gb = 14
    slots = 8
    command = "vllm serve {path} --port {port} --served-model-name {model} -tp {tp}"
    path = "/models/chat"
    env = { VLLM_LOGGING_LEVEL = "WARNING" }

The command (a string, split as a shell would, or a list of arguments) may name
``{port}`` (a free loopback port chosen at each launch; required), ``{host}``
(127.0.0.1), ``{model}`` (the model's name here), ``{path}`` (its ``path``),
``{gpus}`` (the CUDA ids of its GPUs, comma-separated) and ``{tp}`` (their number).
``CUDA_VISIBLE_DEVICES`` is set to ``{gpus}``; a GPU's CUDA id is its ``cuda`` key,
else its place in its node. The engine is ready once ``ready_path`` answers 200
(``ready_timeout_s`` at most); it is stopped with SIGTERM, then SIGKILL after
``stop_grace_s``.

A LoRA adapter is a model with ``adapter_of`` (its base) and ``path`` (its weights); it
has no command of its own: it is loaded into a running engine of its base (vLLM's
``/v1/load_lora_adapter``; the base's engine runs with ``--enable-lora`` and
``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``), as ``engine_model`` or its own name::

    [fleet.models.chat-sql]
    adapter_of = "chat"
    path = "/adapters/sql"
    load_s = 2

Every mistake is found at start: :func:`parse_fleet` raises one
:class:`~laneway.core.ConfigError` with a line per mistake, each naming its key.
"""

from __future__ import annotations

import math
import shlex
import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from laneway.core import ConfigError
from laneway.core.inventory import Inventory

PLACEHOLDERS = ("port", "host", "model", "path", "gpus", "tp")
LAUNCH_KEYS = (
    "command",
    "path",
    "env",
    "engine_model",
    "ready_path",
    "ready_timeout_s",
    "stop_grace_s",
)
FLEET_KEYS = ("nodes", "models", "preload", "switch_wait_s", "max_asleep", "node", "hung_after_s")


@dataclass(frozen=True)
class EngineLaunch:
    """How to run one model's engine (one process per replica)."""

    command: tuple[str, ...]  # argument templates
    path: str = ""
    env: Mapping[str, str] = field(default_factory=dict)
    engine_model: str | None = None  # the name its engine serves it under (None: the model's)
    ready_path: str = "/v1/models"
    ready_timeout_s: float = 600.0
    stop_grace_s: float = 30.0

    def argv(self, *, port: int, model: str, gpus: tuple[int, ...]) -> list[str]:
        values = {
            "port": str(port),
            "host": "127.0.0.1",
            "model": model,
            "path": self.path,
            "gpus": ",".join(map(str, gpus)),
            "tp": str(len(gpus)),
        }
        return [arg.format_map(values) for arg in self.command]


@dataclass(frozen=True)
class AdapterSource:
    """Where a LoRA adapter's weights are, and the name its base's engine serves it under."""

    path: str
    lora_name: str


@dataclass(frozen=True)
class FleetConfig:
    inventory: Inventory
    launch: Mapping[str, EngineLaunch]  # per model (not adapters)
    cuda: Mapping[str, int]  # per GPU id: its CUDA id on its node
    switch_wait_s: float = 60.0  # a request waits this long before replicas are drained for its model
    adapters: Mapping[str, AdapterSource] = field(default_factory=dict)  # per LoRA adapter
    # in a [cluster]: the node whose GPUs this replica starts engines on (every replica has
    # the same fleet and names its own node; the leader places across all of them)
    node: str | None = None
    # an engine it started that answers no health probe for this long is stopped (hung) and
    # gone as one that exited: another replica of its model may start
    hung_after_s: float = 30.0


def parse_fleet(data: object, class_names: tuple[str, ...]) -> FleetConfig:
    """``[fleet]`` → :class:`FleetConfig`; all its mistakes at once, a line each."""
    if not isinstance(data, Mapping):
        raise ConfigError("fleet: expected a table")
    errors: list[str] = []
    for k in data:
        if k not in FLEET_KEYS:
            errors.append(f"fleet.{k}: unknown key (expected one of: {', '.join(FLEET_KEYS)})")
    nodes = data.get("nodes")
    plain_nodes: dict[str, Any] = {}
    cuda: dict[str, int] = {}
    if isinstance(nodes, Mapping):
        for node, body in nodes.items():
            if not isinstance(body, Mapping) or not isinstance(body.get("gpus"), list):
                plain_nodes[node] = body  # (the inventory names what is wrong with it)
                continue
            gpus = []
            for i, g in enumerate(body["gpus"]):
                if isinstance(g, Mapping):
                    g = dict(g)
                    index = g.pop("cuda", i)
                    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
                        key = f"fleet.nodes.{node}.gpus[{i}].cuda"
                        errors.append(f"{key}: expected a CUDA id >= 0, got {index!r}")
                    else:
                        cuda[str(g.get("id", f"{node}-gpu{i}"))] = index
                gpus.append(g)
            plain_nodes[node] = {**body, "gpus": gpus}
    models = data.get("models")
    plain_models: dict[str, Any] = {}
    launch: dict[str, EngineLaunch] = {}
    adapters: dict[str, AdapterSource] = {}
    if isinstance(models, Mapping):
        for name, body in models.items():
            if not isinstance(body, Mapping):
                plain_models[name] = body
                continue
            plain_models[name] = {k: v for k, v in body.items() if k not in LAUNCH_KEYS}
            if "adapter_of" in body:
                source = _adapter(f"fleet.models.{name}", name, body, errors)
                if source is not None:
                    adapters[name] = source
                continue
            try:
                launch[name] = _launch(f"fleet.models.{name}", body)
            except ConfigError as exc:
                errors.extend(str(exc).splitlines())
    inventory: Inventory | None = None
    try:
        inventory = Inventory.from_dict(
            {
                **({"nodes": plain_nodes} if nodes is not None else {}),
                **({"models": plain_models} if models is not None else {}),
                **({"preload": data["preload"]} if "preload" in data else {}),
                **({"max_asleep": data["max_asleep"]} if "max_asleep" in data else {}),
            },
            class_names,
            LAUNCH_KEYS,
            ("cuda",),  # (taken out above)
        )
    except ConfigError as exc:
        errors.extend(f"fleet.{line}" for line in str(exc).splitlines())
    if inventory is not None:
        if not inventory.models:
            errors.append("fleet.models: at least one model, with the command that runs its engine")
        for gid, index in cuda.items():
            node = next(g.node for g in inventory.gpus if g.id == gid)
            twins = [g.id for g in inventory.nodes[node] if cuda.get(g.id) == index]
            if twins[0] != gid:
                errors.append(f"fleet.nodes.{node}: GPUs {twins[0]} and {gid} have the same CUDA id {index}")
        for name in inventory.models:
            if all(inventory.never(name, c) for c in range(len(class_names))):
                errors.append(f"fleet.models.{name}: {inventory.never(name, 0)}")
    wait = data.get("switch_wait_s", 60.0)
    if isinstance(wait, bool) or not isinstance(wait, int | float) or not wait >= 0:
        errors.append(f"fleet.switch_wait_s: expected a number of seconds >= 0, got {wait!r}")
    hung = data.get("hung_after_s", 30.0)
    if isinstance(hung, bool) or not isinstance(hung, int | float) or not 0 < hung < math.inf:
        errors.append(f"fleet.hung_after_s: expected a number of seconds > 0, got {hung!r}")
    node = data.get("node")
    if node is not None and (
        not isinstance(node, str) or (inventory is not None and node not in inventory.nodes)
    ):
        known = ", ".join(inventory.nodes) if inventory is not None else ""
        errors.append(f"fleet.node: expected the name of one of the fleet's nodes ({known}), got {node!r}")
    if errors:
        raise ConfigError("\n".join(dict.fromkeys(errors)))
    assert inventory is not None
    return FleetConfig(inventory, launch, cuda, float(wait), adapters, node, float(hung))


def _adapter(key: str, name: str, body: Mapping[str, Any], errors: list[str]) -> AdapterSource | None:
    """A LoRA adapter's source (``path``, ``engine_model``); its mistakes go to ``errors``."""
    bad = len(errors)
    for k in LAUNCH_KEYS:
        if k in body and k not in ("path", "engine_model"):
            errors.append(f"{key}.{k}: an adapter has no engine of its own (it is loaded into its base's)")
    path = body.get("path")
    if not isinstance(path, str) or not path:
        errors.append(f"{key}.path: required, the directory of the adapter's weights (got {path!r})")
    lora = body.get("engine_model", name)
    if not isinstance(lora, str) or not lora:
        errors.append(f"{key}.engine_model: expected a non-empty string, got {lora!r}")
    if len(errors) > bad:
        return None
    return AdapterSource(str(path), str(lora))


def _launch(key: str, body: Mapping[str, Any]) -> EngineLaunch:
    errors: list[str] = []
    command = body.get("command")
    argv: tuple[str, ...] = ()
    if command is None:
        errors.append(f"{key}.command: required (the command that starts this model's engine)")
    elif isinstance(command, str):
        try:
            argv = tuple(shlex.split(command))
        except ValueError as exc:
            errors.append(f"{key}.command: {exc}")
    elif isinstance(command, list) and all(isinstance(a, str) for a in command):
        argv = tuple(command)
    else:
        errors.append(f"{key}.command: expected a string or a list of strings, got {command!r}")
    if command is not None and not argv and not errors:
        errors.append(f"{key}.command: empty")
    named: set[str] = set()
    for arg in argv:
        try:
            parts = [(f, spec, conv) for _, f, spec, conv in string.Formatter().parse(arg) if f is not None]
        except ValueError as exc:
            errors.append(f"{key}.command: {exc} in {arg!r} (write a literal brace as {{{{ or }}}})")
            continue
        fields = [f for f, _, _ in parts]
        for f, spec, conv in parts:
            if f in PLACEHOLDERS and (spec or conv):  # (each value is a string, put as it is)
                errors.append(
                    f"{key}.command: {{{f}{'!' + conv if conv else ''}{':' + spec if spec else ''}}} in "
                    f"{arg!r}: a placeholder takes no conversion or format (write {{{f}}})"
                )
        for f in fields:
            if f not in PLACEHOLDERS:
                known = ", ".join("{" + p + "}" for p in PLACEHOLDERS)
                errors.append(f"{key}.command: unknown placeholder {{{f}}} (known: {known})")
            named.add(f)
    if argv and "port" not in named and not any(e.startswith(f"{key}.command") for e in errors):
        errors.append(f"{key}.command: must name {{port}}, the port its engine listens on")
    path = body.get("path", "")
    if not isinstance(path, str):
        errors.append(f"{key}.path: expected a string, got {path!r}")
    elif "path" in named and not path:
        errors.append(f"{key}.path: required, the command names {{path}}")
    env = body.get("env", {})
    if not isinstance(env, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str | int | float) and not isinstance(v, bool)
        for k, v in env.items()
    ):
        errors.append(f"{key}.env: expected a table of strings, got {env!r}")
        env = {}
    engine_model = body.get("engine_model")
    if engine_model is not None and (not isinstance(engine_model, str) or not engine_model):
        errors.append(f"{key}.engine_model: expected a non-empty string, got {engine_model!r}")
    ready_path = body.get("ready_path", "/v1/models")
    if not isinstance(ready_path, str) or not ready_path.startswith("/"):
        errors.append(f"{key}.ready_path: expected a path starting with /, got {ready_path!r}")
    times: dict[str, float] = {}
    for name, default in (("ready_timeout_s", 600.0), ("stop_grace_s", 30.0)):
        v = body.get(name, default)
        if isinstance(v, bool) or not isinstance(v, int | float) or not v > 0:
            errors.append(f"{key}.{name}: expected a number of seconds > 0, got {v!r}")
        else:
            times[name] = float(v)
    if errors:
        raise ConfigError("\n".join(errors))
    return EngineLaunch(
        argv,
        path,
        {k: str(v) for k, v in env.items()},
        engine_model,
        ready_path,
        times["ready_timeout_s"],
        times["stop_grace_s"],
    )
