"""The class table and the rest of the configuration: validation names the key."""

from __future__ import annotations

import pytest

from laneway.core import (
    ClassTable,
    ConfigError,
    CostModel,
    LanewayError,
    PolicySpec,
    PriorityClass,
    Quota,
    Scheduler,
    SchedulerConfig,
    TenantPolicy,
    WorkerSpec,
)
from laneway.core.policies import policy


def test_default_table_matches_design() -> None:
    t = ClassTable()
    assert t.names == ("P0", "P1", "P2", "P3")
    assert len(t) == 4
    assert [t[i].timeout_s for i in range(4)] == [30.0, 60.0, 300.0, None]
    assert t[0].may_preempt == {2, 3}
    assert t[1].may_preempt == {3}
    assert t[2].may_preempt == frozenset()
    assert t[3].may_preempt == frozenset()
    assert [t[i].preemptible for i in range(4)] == [False, False, True, True]
    assert [t[i].rank for i in range(4)] == [0, 1, 2, 3]


def test_custom_table() -> None:
    t = ClassTable((PriorityClass("online", 0, 5.0, frozenset({1})), PriorityClass("bulk", 1, None)))
    assert t.names == ("online", "bulk")
    assert t.parse("BULK") == 1
    assert t.parse(0) == 0


@pytest.mark.parametrize(
    ("classes", "key"),
    [
        ((), "classes"),
        ((PriorityClass("A", 1, None),), r"classes\[0\]\.rank"),
        ((PriorityClass("A", 0, None), PriorityClass("A", 1, None)), r"classes\[1\]\.name"),
        ((PriorityClass("A", 0, 0.0),), r"classes\.A\.timeout_s"),
        ((PriorityClass("A", 0, -5.0),), r"classes\.A\.timeout_s"),
        ((PriorityClass("A", 0, None, weight=0.0),), r"classes\.A\.weight"),
        ((PriorityClass("A", 0, None, frozenset({0})),), r"classes\.A\.may_preempt"),
        (
            (PriorityClass("A", 0, None), PriorityClass("B", 1, None, frozenset({0}))),
            r"classes\.B\.may_preempt",
        ),
        ((PriorityClass("A", 0, None, frozenset({5})),), r"classes\.A\.may_preempt"),
        ((PriorityClass("A", 0, None, max_queued=0),), r"classes\.A\.max_queued"),
        ((PriorityClass("A", 0, None, max_queued=-1),), r"classes\.A\.max_queued"),
    ],
)
def test_class_table_validation_names_the_key(classes: tuple[PriorityClass, ...], key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        ClassTable(classes)


def test_config_error_is_a_value_error_and_a_laneway_error() -> None:
    with pytest.raises(ValueError):
        ClassTable(())
    with pytest.raises(LanewayError):
        ClassTable(())


@pytest.mark.parametrize(
    ("value", "rank"),
    [
        (0, 0),
        (1, 1),
        (2, 2),
        (3, 3),
        ("P0", 0),
        ("P1", 1),
        ("P2", 2),
        ("P3", 3),
        ("p2", 2),
        (" P1 ", 1),
        ("3", 3),
        ("0", 0),
        (1.0, 1),  # a whole number written as a float by some JSON encoders
    ],
)
def test_parse(value: object, rank: int) -> None:
    assert ClassTable().parse(value) == rank


@pytest.mark.parametrize(
    "value",
    [
        4,
        -1,
        99,
        "P4",
        "4",
        "-1",
        "high",
        "",
        "\u0663",
        "\uff13",
        True,
        False,
        None,
        4.0,
        2.5,
        float("nan"),
        b"P1",
        [1],
    ],
)
def test_parse_rejects(value: object) -> None:
    with pytest.raises(ValueError, match="priority"):
        ClassTable().parse(value)


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"aging_interval_s": 0.0}, "aging_interval_s"),
        ({"aging_interval_s": -1.0}, "aging_interval_s"),
        ({"aging_ceiling": 4}, "aging_ceiling"),
        ({"aging_ceiling": -1}, "aging_ceiling"),
        ({"drain_cap_s": -0.1}, "drain_cap_s"),
        ({"max_preemptions": -1}, "max_preemptions"),
        ({"max_queued_total": 0}, "max_queued_total"),
        ({"mlfq_slice_s": 0.0}, "mlfq_slice_s"),
        ({"mlfq_levels": 0}, "mlfq_levels"),
        ({"default_service_s": 0.0}, "default_service_s"),
        ({"tenants": {"acme": TenantPolicy(allowed=frozenset({7}))}}, r"tenants\.acme"),
        ({"tenants": {"acme": TenantPolicy(default_class=4)}}, r"tenants\.acme"),
        ({"tenants": {"acme": TenantPolicy(quotas={9: Quota(1.0)})}}, r"tenants\.acme"),
    ],
)
def test_scheduler_config_validation(kwargs: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        SchedulerConfig(**kwargs)  # type: ignore[arg-type]


def test_scheduler_config_defaults_are_valid() -> None:
    cfg = SchedulerConfig()
    assert cfg.aging_interval_s == 60.0
    assert 0 <= cfg.aging_ceiling < len(cfg.classes)
    assert cfg.drain_cap_s == 30.0
    SchedulerConfig(aging_interval_s=None, max_queued_total=1, aging_ceiling=0)


def test_aging_ceiling_follows_the_class_table() -> None:
    two = ClassTable((PriorityClass("hi", 0, None), PriorityClass("lo", 1, None)))
    SchedulerConfig(classes=two, aging_ceiling=1)
    with pytest.raises(ConfigError, match="aging_ceiling"):
        SchedulerConfig(classes=two, aging_ceiling=2)


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"host_link_bytes_s": 0.0}, "costs.host_link_bytes_s"),
        ({"prefill_tokens_s": -1.0}, "costs.prefill_tokens_s"),
        ({"decode_tokens_s": 0.0}, "costs.decode_tokens_s"),
        ({"kv_bytes_per_token": -1}, "costs"),
        ({"step_s": -0.1}, "costs"),
    ],
)
def test_cost_model_validation(kwargs: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        CostModel(**kwargs)  # type: ignore[arg-type]


def test_worker_and_quota_validation() -> None:
    with pytest.raises(ConfigError, match=r"workers\.gpu7\.slots"):
        WorkerSpec("gpu7", 0)
    with pytest.raises(ConfigError, match="quota"):
        Quota(0.0)
    with pytest.raises(ConfigError, match="quota"):
        Quota(1.0, burst=0.5)


def test_scheduler_construction_errors() -> None:
    with pytest.raises(LanewayError, match="worker"):
        Scheduler([])
    with pytest.raises(LanewayError, match="unique"):
        Scheduler([WorkerSpec("w"), WorkerSpec("w")])
    with pytest.raises(ValueError, match="unknown policy"):
        Scheduler([WorkerSpec("w")], policy_name="lottery")
    with pytest.raises(ValueError, match="preemption"):
        PolicySpec("x", preemption="sometimes")
    with pytest.raises(ValueError, match="needs class lanes"):
        PolicySpec("x", classes=False, feedback=True)
    assert policy(PolicySpec("custom")).name == "custom"


def test_submit_with_unknown_class_rank() -> None:
    from .helpers import req, sched

    s = sched(1)
    with pytest.raises(LanewayError, match="class rank"):
        s.submit(req("a", 4), 0.0)
    with pytest.raises(LanewayError, match="class rank"):
        s.submit(req("b", -1), 0.0)
