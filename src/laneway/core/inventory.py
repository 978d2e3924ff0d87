"""The GPU fleet as configuration: nodes of GPUs, and the model catalogue.

- :class:`GpuSpec`: one GPU — its node, total VRAM, the VRAM kept free for
  KV cache (``kv_reserve_gb``) and, optionally, the classes it is reserved for.
- :class:`ModelSpec`: one model — the VRAM of one replica (``vram_gb``),
  spread evenly over ``gpus`` GPUs of one node (tensor parallel), its load
  time and how many sequences a replica runs at once (``slots``); or a LoRA
  adapter (``adapter_of``: its base model), which runs inside a replica of its
  base (at most the base's ``max_adapters`` at once in one replica) and whose
  ``load_s`` is the time to load it there.
- :class:`Inventory`: both, validated, with :meth:`Inventory.never` answering
  "could any GPU group of this fleet ever hold this model?".

Built from plain data with :meth:`Inventory.from_dict` (what a TOML file gives).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from laneway.core.errors import ConfigError


@dataclass(frozen=True, slots=True)
class GpuSpec:
    id: str
    node: str
    vram_gb: float
    kv_reserve_gb: float = 0.0
    reserved_for: frozenset[int] | None = None  # class ranks; None: any class

    def __post_init__(self) -> None:
        if not self.vram_gb > 0:  # (NaN fails too)
            raise ConfigError(f"gpus.{self.id}.vram_gb: must be > 0")
        if not 0 <= self.kv_reserve_gb < self.vram_gb:
            raise ConfigError(f"gpus.{self.id}.kv_reserve_gb: must be >= 0 and below vram_gb")
        if self.reserved_for is not None and not self.reserved_for:
            raise ConfigError(f"gpus.{self.id}.reserved_for: empty, no class could use this GPU")

    @property
    def usable_gb(self) -> float:
        """VRAM that model weights may take: the KV-cache reserve is always held."""
        return self.vram_gb - self.kv_reserve_gb

    def admits(self, cls: int) -> bool:
        return self.reserved_for is None or cls in self.reserved_for


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    vram_gb: float  # the whole replica; each of its GPUs holds vram_gb / gpus
    gpus: int = 1
    load_s: float = 30.0
    slots: int = 4
    wake_s: float | None = None  # its engine has a sleep mode: evicted, it sleeps; woken in this long
    adapter_of: str | None = None  # a LoRA adapter of this base model (it runs in the base's engine)
    max_adapters: int = 1  # (a base) adapters one replica holds at once (vLLM's --max-loras)

    def __post_init__(self) -> None:
        if self.adapter_of is None and not self.vram_gb > 0:  # (NaN fails too)
            raise ConfigError(f"models.{self.name}.vram_gb: must be > 0")
        if self.max_adapters < 1:
            raise ConfigError(f"models.{self.name}.max_adapters: must be >= 1")
        if self.wake_s is not None and not self.wake_s >= 0:
            raise ConfigError(f"models.{self.name}.wake_s: must be >= 0")
        if self.gpus < 1:
            raise ConfigError(f"models.{self.name}.gpus: must be >= 1")
        if not self.load_s >= 0:
            raise ConfigError(f"models.{self.name}.load_s: must be >= 0")
        if self.slots < 1:
            raise ConfigError(f"models.{self.name}.slots: must be >= 1")

    @property
    def per_gpu_gb(self) -> float:
        return self.vram_gb / self.gpus


@dataclass(frozen=True)
class Inventory:
    gpus: tuple[GpuSpec, ...]
    models: Mapping[str, ModelSpec] = field(default_factory=dict)
    preload: tuple[str, ...] = ()  # models loaded at start-up, one replica each
    max_asleep: int = 2  # replicas asleep at once (their weights in host memory); more: the oldest stops

    def __post_init__(self) -> None:
        if not self.gpus:
            raise ConfigError("gpus: at least one GPU is required")
        seen: set[str] = set()
        for g in self.gpus:
            if g.id in seen:
                raise ConfigError(f"gpus.{g.id}: duplicate GPU id")
            seen.add(g.id)
        for name, m in self.models.items():
            if name != m.name:
                raise ConfigError(f"models.{name}: name mismatch ({m.name!r})")
            if m.adapter_of is not None:
                base = self.models.get(m.adapter_of)
                if base is None:
                    raise ConfigError(f"models.{name}.adapter_of: unknown model {m.adapter_of!r}")
                if base.adapter_of is not None:
                    raise ConfigError(
                        f"models.{name}.adapter_of: {m.adapter_of!r} is an adapter itself, not a base model"
                    )
        for name in self.preload:
            if name not in self.models:
                raise ConfigError(f"preload: unknown model {name!r}")
            if self.models[name].adapter_of is not None:
                raise ConfigError(f"preload: {name!r} is an adapter (loaded with its first request)")
        if self.max_asleep < 0:
            raise ConfigError("max_asleep: must be >= 0")

    def base(self, model: str) -> ModelSpec:
        """The model whose replicas serve ``model``: itself, or an adapter's base."""
        spec = self.models[model]
        return spec if spec.adapter_of is None else self.models[spec.adapter_of]

    @property
    def adapters(self) -> dict[str, tuple[str, ...]]:
        """Each base model's adapters (bases without any are left out)."""
        out: dict[str, list[str]] = {}
        for m in self.models.values():
            if m.adapter_of is not None:
                out.setdefault(m.adapter_of, []).append(m.name)
        return {k: tuple(v) for k, v in out.items()}

    @property
    def nodes(self) -> dict[str, list[GpuSpec]]:
        out: dict[str, list[GpuSpec]] = {}
        for g in self.gpus:
            out.setdefault(g.node, []).append(g)
        return out

    def never(self, model: str | None, cls: int) -> str | None:
        """Why no GPU group could ever hold ``model`` for class ``cls`` (None: some could)."""
        if model is None:
            return "this fleet serves named models only: the request names none"
        spec = self.models.get(model)
        if spec is None:
            known = ", ".join(sorted(self.models)) or "none"
            return f"unknown model {model!r} (known: {known})"
        if spec.adapter_of is not None:
            why = self.never(spec.adapter_of, cls)
            return None if why is None else f"adapter {model!r} of {spec.adapter_of!r}: {why}"
        for gpus in self.nodes.values():
            fit = [g for g in gpus if g.usable_gb >= spec.per_gpu_gb and g.admits(cls)]
            if len(fit) >= spec.gpus:
                return None
        where = f"{spec.gpus} GPUs of one node" if spec.gpus > 1 else "one GPU"
        for gpus in self.nodes.values():  # (it would fit, on GPUs kept for other classes)
            fit = [g for g in gpus if g.usable_gb >= spec.per_gpu_gb]
            if len(fit) >= spec.gpus:
                kept = ", ".join(g.id for g in fit if not g.admits(cls))
                return (
                    f"model {model!r} needs {spec.vram_gb:g} GB of VRAM on {where}; the GPUs that can "
                    f"hold it ({kept}) are reserved for other classes than this request's"
                )
        biggest = max(g.usable_gb for g in self.gpus)
        return (
            f"model {model!r} needs {spec.vram_gb:g} GB of VRAM on {where} "
            f"({spec.per_gpu_gb:g} GB each); no GPU group of this fleet can hold it "
            f"(largest usable GPU: {biggest:g} GB after the KV reserve)"
        )

    @classmethod
    def from_dict(
        cls,
        data: Mapping[str, Any],
        class_names: tuple[str, ...] = ("P0", "P1", "P2", "P3"),
        more_model_keys: tuple[str, ...] = (),
        more_gpu_keys: tuple[str, ...] = (),
    ) -> Inventory:
        """Build from ``{"nodes": {NODE: {"gpus": [{id, vram_gb, kv_reserve_gb?,
        reserved_for?}, ...]}}, "models": {NAME: {vram_gb, gpus?, load_s?, slots?, wake_s?,
        max_adapters?} or {adapter_of, load_s?}}}``;
        errors name the key (and a model's unknown key, the keys it may have: these and
        ``more_model_keys``, what the caller took out of each model's table before; so for a
        GPU's, ``more_gpu_keys``)."""
        errors: list[str] = []  # (every mistake, a line each)
        gpus: list[GpuSpec] = []
        _keep(errors, _known, data, "", ("nodes", "models", "preload", "max_asleep"))
        nodes = data.get("nodes")
        if not isinstance(nodes, Mapping) or not nodes:
            errors.append("nodes: a table of nodes, each with a list of gpus, is required")
            nodes = {}
        for node, body in nodes.items():
            if isinstance(body, Mapping):
                _keep(errors, _known, body, f"nodes.{node}.", ("gpus",))
            items = body.get("gpus") if isinstance(body, Mapping) else None
            if not isinstance(items, list) or not items:
                errors.append(f"nodes.{node}.gpus: a non-empty list is required")
                continue
            for i, g in enumerate(items):
                gpu = _keep(errors, _gpu, g, str(node), i, class_names, more_gpu_keys)
                if gpu is not None:
                    gpus.append(gpu)
        models: dict[str, ModelSpec] = {}
        table = data.get("models") or {}
        if not isinstance(table, Mapping):
            errors.append("models: a table of models is expected")
            table = {}
        for name, m in table.items():
            model = _keep(errors, _model, str(name), m, more_model_keys)
            if model is not None:
                models[name] = model
        preload = data.get("preload", [])
        if not isinstance(preload, list) or not all(isinstance(p, str) for p in preload):
            errors.append("preload: a list of model names is expected")
            preload = []
        twice = [p for i, p in enumerate(preload) if p in preload[:i]]
        if twice:
            errors.append(f"preload: {twice[0]!r} is named twice (each preloaded model is one replica)")
        errors += [f"preload: unknown model {p!r}" for p in dict.fromkeys(preload) if p not in table]
        asleep = data.get("max_asleep", 2)
        if isinstance(asleep, bool) or not isinstance(asleep, int):
            errors.append(f"max_asleep: a whole number is expected, got {asleep!r}")
        if errors:
            raise ConfigError("\n".join(dict.fromkeys(errors)))
        return cls(tuple(gpus), models, tuple(preload), asleep)


_T = TypeVar("_T")


def _keep(errors: list[str], make: Callable[..., _T], *args: Any) -> _T | None:
    """``make(*args)``, or ``None`` with its :class:`ConfigError` noted in ``errors``."""
    try:
        return make(*args)
    except ConfigError as exc:
        errors.append(str(exc))
        return None


def _gpu(g: object, node: str, i: int, class_names: tuple[str, ...], more_keys: tuple[str, ...]) -> GpuSpec:
    """The ``i``-th GPU of ``node``, from its table."""
    key = f"nodes.{node}.gpus[{i}]"
    if not isinstance(g, Mapping):
        raise ConfigError(f"{key}: expected a table")
    _known(g, f"{key}.", ("id", "vram_gb", "kv_reserve_gb", "reserved_for"), more_keys)
    reserved = g.get("reserved_for")
    ranks = None
    if reserved is not None:
        if not isinstance(reserved, list | tuple | set | frozenset) or not reserved:
            raise ConfigError(f"{key}.reserved_for: a non-empty list of classes is expected")
        try:
            ranks = frozenset(_rank(v, class_names) for v in reserved)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{key}.reserved_for: {exc}") from None
    try:
        return GpuSpec(
            str(g.get("id", f"{node}-gpu{i}")),
            node,
            _number(g, "", "vram_gb"),
            _number(g, "", "kv_reserve_gb", 0.0),
            ranks,
        )
    except KeyError as exc:
        raise ConfigError(f"{key}.{exc.args[0]}: required") from None
    except (TypeError, ValueError) as exc:  # (a ConfigError too: it names the GPU's key)
        raise ConfigError(f"{key}: {exc}") from None


def _model(name: str, m: object, more_keys: tuple[str, ...]) -> ModelSpec:
    """Model ``name``, from its table."""
    key = f"models.{name}"
    if not isinstance(m, Mapping):
        raise ConfigError(f"{key}: expected a table")
    base = m.get("adapter_of")
    if base is not None:
        if not isinstance(base, str):
            raise ConfigError(f"{key}.adapter_of: the name of its base model is expected")
        for k in ("vram_gb", "gpus", "slots", "wake_s", "max_adapters"):
            if k in m:
                raise ConfigError(
                    f"{key}.{k}: an adapter runs in its base's engine, in the room its base "
                    f"holds for adapters (set {'max_adapters' if k == 'vram_gb' else k} on {base!r})"
                )
    _known(
        m,
        f"{key}.",
        ("vram_gb", "gpus", "load_s", "slots", "wake_s", "adapter_of", "max_adapters"),
        more_keys,
    )
    at = f"{key}."
    return ModelSpec(
        name,
        _number(m, at, "vram_gb") if base is None else 0.0,
        int(_number(m, at, "gpus", 1, whole=True)),
        _number(m, at, "load_s", 30.0 if base is None else 1.0),
        int(_number(m, at, "slots", 4, whole=True)),
        None if m.get("wake_s") is None else _number(m, at, "wake_s"),
        base,
        int(_number(m, at, "max_adapters", 1, whole=True)),
    )


def _number(
    table: Mapping[str, Any], prefix: str, key: str, default: float | None = None, *, whole: bool = False
) -> float:
    """``table[key]`` (``default`` where it is not given and has one): a finite number, or a
    whole one; otherwise an error naming the key."""
    if key not in table and default is not None:
        return default
    if key not in table:
        raise KeyError(key) if not prefix else ConfigError(f"{prefix}{key}: required")
    value = table[key]
    kinds = int if whole else int | float
    if isinstance(value, bool) or not isinstance(value, kinds) or not math.isfinite(value):
        raise ConfigError(f"{prefix}{key}: expected a {'whole' if whole else 'finite'} number, got {value!r}")
    return float(value)


def _known(table: Mapping[str, Any], prefix: str, keys: tuple[str, ...], more: tuple[str, ...] = ()) -> None:
    """A key the fleet format does not have is an error (a typo never passes silently);
    ``more``: keys it may have that were taken out before (named in the message)."""
    for k in table:
        if k not in keys:
            raise ConfigError(f"{prefix}{k}: unknown key (expected one of: {', '.join((*keys, *more))})")


def _rank(value: object, names: tuple[str, ...]) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(names):
        return value
    if isinstance(value, str) and value.upper() in names:
        return names.index(value.upper())
    raise ValueError(f"unknown class {value!r}")
