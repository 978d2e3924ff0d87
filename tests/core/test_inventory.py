"""The GPU inventory as configuration: validation (errors name the key) and
``never`` (no GPU group of the fleet could ever hold a model): such requests
are refused at once on submit, naming the model and its VRAM need."""

from __future__ import annotations

import math
from typing import Any

import pytest

from laneway.core import ConfigError, State
from laneway.core.gpu_placement import GpuPlacement
from laneway.core.inventory import GpuSpec, Inventory, ModelSpec

from .gpu_helpers import GpuDriver, gpu, gpu_sched, greq, inventory, model


def fleet(**over: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "nodes": {"a": {"gpus": [{"id": "a0", "vram_gb": 80, "kv_reserve_gb": 8}]}},
        "models": {"m": {"vram_gb": 14}},
    }
    data.update(over)
    return data


# -- from_dict: a valid fleet ----------------------------------------------------
def test_from_dict_builds_gpus_models_and_preload() -> None:
    inv = Inventory.from_dict(
        {
            "nodes": {
                "a": {"gpus": [{"id": "a0", "vram_gb": 80, "kv_reserve_gb": 8}, {"vram_gb": 80}]},
                "b": {"gpus": [{"id": "b0", "vram_gb": 24, "reserved_for": ["P0", "p1"]}]},
            },
            "models": {
                "small": {"vram_gb": 14},
                "big": {"vram_gb": 140, "gpus": 2, "load_s": 60, "slots": 2},
            },
            "preload": ["small"],
        }
    )
    assert [g.id for g in inv.gpus] == ["a0", "a-gpu1", "b0"]  # a default id names node and index
    a0, a1, b0 = inv.gpus
    assert (a0.node, a0.vram_gb, a0.kv_reserve_gb, a0.usable_gb) == ("a", 80.0, 8.0, 72.0)
    assert a1.kv_reserve_gb == 0.0 and a1.reserved_for is None
    assert b0.reserved_for == frozenset({0, 1})
    assert b0.admits(0) and b0.admits(1) and not b0.admits(2)
    assert inv.nodes == {"a": [a0, a1], "b": [b0]}
    small, big = inv.models["small"], inv.models["big"]
    assert (small.gpus, small.load_s, small.slots) == (1, 30.0, 4)  # the defaults
    assert (big.gpus, big.load_s, big.slots, big.per_gpu_gb) == (2, 60.0, 2, 70.0)
    assert inv.preload == ("small",)


def test_reserved_for_takes_ranks_and_custom_class_names() -> None:
    data = {"nodes": {"n": {"gpus": [{"vram_gb": 24, "reserved_for": ["online", 2]}]}}}
    inv = Inventory.from_dict(data, class_names=("ONLINE", "NEARLINE", "BATCH"))
    assert inv.gpus[0].reserved_for == frozenset({0, 2})
    with pytest.raises(ConfigError, match=r"nodes\.n\.gpus\[0\]\.reserved_for: unknown class 'P0'"):
        Inventory.from_dict(
            {"nodes": {"n": {"gpus": [{"vram_gb": 24, "reserved_for": ["P0"]}]}}},
            class_names=("ONLINE", "BATCH"),
        )


# -- from_dict: errors name the key ----------------------------------------------
NODE_ERRORS: list[tuple[dict[str, Any], str]] = [
    ({}, r"^nodes: "),
    ({"nodes": {}}, r"^nodes: "),
    ({"nodes": [{"gpus": []}]}, r"^nodes: "),
    ({"nodes": {"a": {}}}, r"^nodes\.a\.gpus: a non-empty list"),
    ({"nodes": {"a": {"gpus": []}}}, r"^nodes\.a\.gpus: a non-empty list"),
    ({"nodes": {"a": ["x"]}}, r"^nodes\.a\.gpus: a non-empty list"),
    ({"nodes": {"a": {"gpus": {"vram_gb": 80}}}}, r"^nodes\.a\.gpus: a non-empty list"),
    ({"nodes": {"a": {"gpus": [80]}}}, r"^nodes\.a\.gpus\[0\]: expected a table"),
    ({"nodes": {"a": {"gpus": [{"vram_gb": 80}, {"id": "x"}]}}}, r"^nodes\.a\.gpus\[1\]\.vram_gb: required"),
    ({"nodes": {"a": {"gpus": [{"vram_gb": "lots"}]}}}, r"^nodes\.a\.gpus\[0\]: "),
    ({"nodes": {"a": {"gpus": [{"vram_gb": None}]}}}, r"^nodes\.a\.gpus\[0\]: "),
    ({"nodes": {"a": {"gpus": [{"vram_gb": 0}]}}}, r"^nodes\.a\.gpus\[0\]: .*vram_gb: must be > 0"),
    ({"nodes": {"a": {"gpus": [{"vram_gb": -8}]}}}, r"^nodes\.a\.gpus\[0\]: .*vram_gb: must be > 0"),
    (
        {"nodes": {"a": {"gpus": [{"vram_gb": "nan"}]}}},
        r"^nodes\.a\.gpus\[0\]: vram_gb: expected a finite number",
    ),
    (
        {"nodes": {"a": {"gpus": [{"vram_gb": float("inf")}]}}},
        r"^nodes\.a\.gpus\[0\]: vram_gb: expected a finite",
    ),
    (
        {"nodes": {"a": {"gpus": [{"vram_gb": 24, "kv_reserve_gb": 24}]}}},
        r"^nodes\.a\.gpus\[0\]: .*kv_reserve_gb: must be >= 0 and below vram_gb",
    ),
    (
        {"nodes": {"a": {"gpus": [{"vram_gb": 24, "kv_reserve_gb": -1}]}}},
        r"^nodes\.a\.gpus\[0\]: .*kv_reserve_gb",
    ),
    (
        {"nodes": {"a": {"gpus": [{"vram_gb": 24, "kv_reserve_gb": "some"}]}}},
        r"^nodes\.a\.gpus\[0\]: ",
    ),
    (
        {"nodes": {"a": {"gpus": [{"id": "g", "vram_gb": 24}]}, "b": {"gpus": [{"id": "g", "vram_gb": 24}]}}},
        r"^gpus\.g: duplicate GPU id",
    ),
    (
        {"nodes": {"a": {"gpus": [{"vram_gb": 24, "reserved_for": ["P7"]}]}}},
        r"^nodes\.a\.gpus\[0\]\.reserved_for: unknown class 'P7'",
    ),
    (
        {"nodes": {"a": {"gpus": [{"vram_gb": 24, "reserved_for": [4]}]}}},
        r"^nodes\.a\.gpus\[0\]\.reserved_for: unknown class 4",
    ),
    (
        {"nodes": {"a": {"gpus": [{"vram_gb": 24, "reserved_for": [True]}]}}},
        r"^nodes\.a\.gpus\[0\]\.reserved_for: unknown class True",
    ),
    (
        {"nodes": {"a": {"gpus": [{"vram_gb": 24, "reserved_for": "P0"}]}}},
        r"^nodes\.a\.gpus\[0\]\.reserved_for: ",
    ),
    (
        {"nodes": {"a": {"gpus": [{"vram_gb": 24, "reserved_for": 0}]}}},
        r"^nodes\.a\.gpus\[0\]\.reserved_for: ",
    ),
    (
        {"nodes": {"a": {"gpus": [{"vram_gb": 24, "reserved_for": []}]}}},
        r"^nodes\.a\.gpus\[0\]\.reserved_for: ",
    ),
    ({"nodes": {"a": {"gpus": [{"vram_gb": 24, "vramm": 3}]}}}, r"^nodes\.a\.gpus\[0\]\.vramm: unknown key"),
    ({"nodes": {"a": {"gpus": [{"vram_gb": 24}], "rack": 1}}}, r"^nodes\.a\.rack: unknown key"),
    ({"nodes": {"a": {"gpus": [{"vram_gb": 24}]}}, "extra": {}}, r"^extra: unknown key"),
]


@pytest.mark.parametrize(("data", "pattern"), NODE_ERRORS)
def test_bad_nodes_and_gpus_raise_config_error_naming_the_key(data: dict[str, Any], pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        Inventory.from_dict(data)


MODEL_ERRORS: list[tuple[Any, str]] = [
    (["m"], r"^models: "),
    ({"m": 14}, r"^models\.m: expected a table"),
    ({"m": {}}, r"^models\.m\.vram_gb: required"),
    ({"m": {"vram_gb": "huge"}}, r"^models\.m\.vram_gb: expected a finite number, got 'huge'"),
    ({"m": {"vram_gb": 0}}, r"^models\.m\.vram_gb: must be > 0"),
    ({"m": {"vram_gb": "nan"}}, r"^models\.m\.vram_gb: expected a finite number"),
    ({"m": {"vram_gb": float("nan")}}, r"^models\.m\.vram_gb: expected a finite number"),
    ({"m": {"vram_gb": 14, "gpus": 0}}, r"^models\.m\.gpus: must be >= 1"),
    ({"m": {"vram_gb": 14, "gpus": "two"}}, r"^models\.m\.gpus: expected a whole number"),
    ({"m": {"vram_gb": 14, "load_s": -1}}, r"^models\.m\.load_s: must be >= 0"),
    ({"m": {"vram_gb": 14, "load_s": "nan"}}, r"^models\.m\.load_s: expected a finite number"),
    ({"m": {"vram_gb": 14, "slots": 0}}, r"^models\.m\.slots: must be >= 1"),
    (
        {"ok": {"vram_gb": 14}, "bad": {"vram_gb": 14, "slots": None}},
        r"^models\.bad\.slots: expected a whole",
    ),
    ({"m": {"vram_gb": 14, "colour": 1}}, r"^models\.m\.colour: unknown key \(expected one of: vram_gb, "),
]


@pytest.mark.parametrize(("models", "pattern"), MODEL_ERRORS)
def test_bad_models_raise_config_error_naming_the_key(models: Any, pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        Inventory.from_dict(fleet(models=models))


@pytest.mark.parametrize(
    ("preload", "pattern"),
    [
        ("m", r"^preload: a list of model names"),
        ([1], r"^preload: a list of model names"),
        ({"m": True}, r"^preload: a list of model names"),
        (["m", "ghost"], r"^preload: unknown model 'ghost'"),
        (["m", "m"], r"^preload: 'm' is named twice"),
    ],
)
def test_bad_preload_raises_config_error(preload: Any, pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        Inventory.from_dict(fleet(preload=preload))


def test_preload_that_does_not_fit_is_a_config_error_of_the_placement() -> None:
    inv = Inventory.from_dict(
        {
            "nodes": {"a": {"gpus": [{"id": "a0", "vram_gb": 40, "kv_reserve_gb": 4}]}},
            "models": {"x": {"vram_gb": 20}, "y": {"vram_gb": 20}},
            "preload": ["x", "y"],
        }
    )
    with pytest.raises(ConfigError, match=r"^preload: model 'y' does not fit"):
        GpuPlacement(inv)
    # each alone fits: 20 <= 36 usable
    assert len(GpuPlacement(Inventory(inv.gpus, inv.models, ("y",))).replicas) == 1


def test_direct_construction_is_validated_too() -> None:
    with pytest.raises(ConfigError, match=r"^gpus: at least one GPU"):
        Inventory((), {})
    with pytest.raises(ConfigError, match=r"^gpus\.g0: duplicate GPU id"):
        Inventory((gpu("g0", 24), gpu("g0", 80, node="other")), {})
    with pytest.raises(ConfigError, match=r"^models\.a: name mismatch \('b'\)"):
        Inventory((gpu("g0", 24),), {"a": model("b", 10)})
    with pytest.raises(ConfigError, match=r"^preload: unknown model 'c'"):
        Inventory((gpu("g0", 24),), {"a": model("a", 10)}, ("c",))
    with pytest.raises(ConfigError, match=r"^gpus\.g0\.reserved_for"):
        GpuSpec("g0", "n", 24.0, 0.0, frozenset())
    with pytest.raises(ConfigError, match=r"^gpus\.g0\.kv_reserve_gb"):
        GpuSpec("g0", "n", 24.0, 30.0)
    with pytest.raises(ConfigError, match=r"^models\.m\.slots"):
        ModelSpec("m", 14.0, slots=0)


# -- never: could any GPU group ever hold the model? -------------------------------
def never_fleet() -> Inventory:
    """Node a: 2 x 80 GB (8 GB KV reserve each: 72 usable); node b: 1 x 24 GB (20
    usable) and 1 x 48 GB reserved for P0/P1 (44 usable)."""
    return inventory(
        [
            gpu("a0", 80, "a", kv=8),
            gpu("a1", 80, "a", kv=8),
            gpu("b0", 24, "b", kv=4),
            gpu("b1", 48, "b", kv=4, reserved={0, 1}),
        ],
        [
            model("fits-small", 20),  # b0 exactly (20 usable)
            model("fits-72", 72),  # a0/a1 exactly after the reserve
            model("over-kv", 73),  # 80 GB GPUs, but not after the 8 GB KV reserve
            model("too-big", 100),
            model("two-a", 140, gpus=2),  # 70 each on node a
            model("three", 60, gpus=3),  # 20 each: fits 4 GPUs, but 2 per node
            model("two-over", 150, gpus=2),  # 75 each: > 72
            model("online-only", 40),  # only b1 (reserved for P0/P1) and node a
            model("b-pair", 40, gpus=2),  # 20 each: a0+a1, or b0+b1 for P0/P1
        ],
    )


@pytest.mark.parametrize(
    ("name", "cls", "placeable"),
    [
        ("fits-small", 2, True),
        ("fits-72", 3, True),
        ("over-kv", 0, False),
        ("too-big", 0, False),
        ("two-a", 2, True),
        ("three", 0, False),
        ("two-over", 0, False),
        ("online-only", 2, True),  # node a holds it for anyone
        ("b-pair", 3, True),
    ],
)
def test_never_says_whether_any_gpu_group_could_hold_the_model(name: str, cls: int, placeable: bool) -> None:
    inv = never_fleet()
    why = inv.never(name, cls)
    if placeable:
        assert why is None
    else:
        spec = inv.models[name]
        assert why is not None
        assert repr(name) in why and f"{spec.vram_gb:g} GB" in why, why


def test_never_a_model_that_fits_only_gpus_reserved_for_other_classes() -> None:
    inv = inventory(
        [gpu("big", 80, "a", reserved={0, 1}), gpu("small", 24, "a")],
        [model("m", 40), model("pair", 40, gpus=2)],
    )
    for cls in (0, 1):
        assert inv.never("m", cls) is None
    for cls in (2, 3):
        why = inv.never("m", cls)
        assert why is not None and "'m'" in why and "40 GB" in why
    # a 2-GPU model needs both GPUs: only classes the reserved one admits
    assert inv.never("pair", 0) is None
    assert inv.never("pair", 2) is not None


def test_never_names_unknown_and_missing_models() -> None:
    inv = never_fleet()
    why = inv.never("ghost", 0)
    assert why is not None and "unknown model 'ghost'" in why and "fits-small" in why
    assert inv.never(None, 0) is not None


@pytest.mark.parametrize("policy", ["laneway", "naive"])
@pytest.mark.parametrize(
    ("name", "cls", "need"),
    [
        ("over-kv", 0, "73 GB"),
        ("too-big", 2, "100 GB"),
        ("three", 1, "60 GB"),
        ("two-over", 0, "150 GB"),
        ("ghost", 0, "ghost"),
    ],
)
def test_unplaceable_request_is_rejected_at_once_on_submit(
    policy: str, name: str, cls: int, need: str
) -> None:
    d = GpuDriver(gpu_sched(never_fleet(), policy))
    r = greq("r", cls, 0.0, name, timeout_s=math.inf)
    rej = d.submit(r)
    assert rej is not None
    assert rej.reason == "unplaceable"
    assert repr(name) in rej.message and need in rej.message, rej.message
    assert r.state is State.REJECTED
    assert d.ended == {"r": "rejected"}
    assert d.sched.live == 0 and d.sched.queued == 0
    # nothing is loaded for it, then or later
    d.advance(3600.0)
    assert d.loads == []
    assert d.sched.counters.rejections["unplaceable"] == 1


@pytest.mark.parametrize("policy", ["laneway", "naive"])
def test_reserved_only_model_is_unplaceable_for_p2_but_runs_for_p0(policy: str) -> None:
    inv = inventory([gpu("big", 80, "a", reserved={0, 1}), gpu("small", 24, "a")], [model("m", 40, load_s=5)])
    d = GpuDriver(gpu_sched(inv, policy))
    rej = d.submit(greq("batch", 2, 0.0, "m"))
    assert rej is not None and rej.reason == "unplaceable"
    assert "'m'" in rej.message and "40 GB" in rej.message
    assert d.submit(greq("chat", 0, 0.0, "m")) is None
    d.advance(0.0)
    assert [ld.gpu_ids for _, ld in d.loads] == [("big",)]
    d.advance(5.0)
    assert d.gpus_of("chat") == ("big",)


def test_request_naming_no_model_is_unplaceable_on_a_gpu_fleet() -> None:
    d = GpuDriver(gpu_sched(never_fleet()))
    rej = d.submit(greq("r", 0, 0.0, None))
    assert rej is not None and rej.reason == "unplaceable"
    assert d.sched.live == 0


def test_a_model_that_fits_only_on_gpus_kept_for_other_classes_is_told_so() -> None:
    inv = Inventory.from_dict(
        {
            "nodes": {
                "n": {
                    "gpus": [
                        {"id": "g0", "vram_gb": 8},
                        {"id": "g1", "vram_gb": 24, "reserved_for": ["P0", "P1"]},
                    ]
                }
            },
            "models": {"r": {"vram_gb": 20}},
        }
    )
    assert inv.never("r", 0) is None and inv.never("r", 1) is None
    why = inv.never("r", 2)
    assert why is not None and "(g1) are reserved for other classes" in why, why
    assert "no GPU group" not in why  # (one can: not for this class)
