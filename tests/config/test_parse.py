"""The TOML configuration: defaults, every section, errors that name the key."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from laneway.config import hash_key, load_config, parse_config
from laneway.core import ConfigError

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "laneway.toml"


def test_defaults() -> None:
    cfg = parse_config({})
    assert (cfg.host, cfg.port, str(cfg.data_dir)) == ("127.0.0.1", 8000, ".laneway")
    [w] = cfg.workers
    assert (w.type, w.model, w.slots) == ("local", "builtin:smollm2", 4)
    assert cfg.alert_wait_s == (10.0, 60.0, 300.0, None)
    assert not cfg.auth and cfg.models == ("builtin:smollm2",)
    assert cfg.shutdown_grace_s == 30.0
    assert parse_config({"server": {"shutdown_grace_s": "none"}}).shutdown_grace_s is None
    assert parse_config({"server": {"shutdown_grace_s": 0}}).shutdown_grace_s == 0
    assert cfg.max_header_bytes == 65536
    assert parse_config({"server": {"max_header_bytes": 8192}}).max_header_bytes == 8192


def test_cluster_settings() -> None:
    up = [{"type": "upstream", "model": "m", "url": "http://127.0.0.1:8001/v1"}]
    cluster = {"redis_url": "redis://127.0.0.1:6379/0", "replica": "r1"}
    got = parse_config({"cluster": cluster, "workers": up}).cluster
    assert got is not None and (got.replica, got.key_prefix, got.leader_priority) == ("r1", "laneway:", 1)
    got = parse_config({"cluster": {**cluster, "leader_priority": 3}, "workers": up}).cluster
    assert got is not None and got.leader_priority == 3
    assert parse_config({}).cluster is None
    with pytest.raises(ConfigError, match="cluster"):  # the default worker is in-process
        parse_config({"cluster": cluster})


def test_example_files_load() -> None:
    cfg = load_config(EXAMPLE)
    assert cfg.auth
    assert {w.type for w in cfg.workers} == {"local", "simulated"}
    chat, batch = cfg.tenant_for_key("chat-demo-key"), cfg.tenant_for_key("batch-demo-key")
    assert chat is not None and chat.name == "chat-frontend"
    assert batch is not None and batch.name == "batch-pipeline"
    cluster = load_config(EXAMPLE.with_name("cluster.toml"))
    assert cluster.cluster is not None and cluster.cluster.replica == "r1"
    assert {w.type for w in cluster.workers} == {"upstream"}
    [upstream] = load_config(EXAMPLE.with_name("vllm.toml")).workers
    assert (upstream.type, upstream.served_name, upstream.api_key_env) == ("upstream", "llama-3.1-8b", None)
    cpu = load_config(EXAMPLE.with_name("vllm-cpu.toml"))
    [vllm] = cpu.workers
    assert (vllm.url, vllm.model, vllm.served_name, vllm.slots) == (
        "http://127.0.0.1:8001/v1",
        "smollm2",
        "smollm2",
        4,
    )
    assert cpu.unavailable_hold_s == 60


def test_tenants_store_hashes_and_find_keys() -> None:
    cfg = parse_config(
        {
            "tenants": {
                "acme": {
                    "key_sha256": [hash_key("secret")],
                    "default_priority": "P2",
                    "allowed": ["P1", "P2"],
                    "max_concurrent": 3,
                    "quotas": {"P1": {"rate_per_s": 2, "burst": 4}},
                }
            }
        }
    )
    tenant = cfg.tenant_for_key("secret")
    assert tenant is not None and tenant.name == "acme"
    assert cfg.tenant_for_key("other") is None
    pol = cfg.scheduler.tenants["acme"]
    assert pol.default_class == 2 and pol.allowed == frozenset({1, 2}) and pol.quotas[1].burst == 4


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"server": {"port": "x"}}, "server.port"),
        ({"server": {"prot": 1}}, "server.prot"),
        ({"server": {"policy": "nope"}}, "server.policy"),
        ({"server": {"policy": "naive"}}, "server.policy"),
        ({"server": {"policy": "round-robin"}}, "server.policy"),
        ({"scheduler": {"placement": "random"}}, "scheduler.placement"),
        ({"scheduler": {"max_queued_total": 0}}, "scheduler.max_queued_total"),
        ({"scheduler": {"hold_s": 1e300}}, "scheduler.hold_s"),
        ({"scheduler": {"max_wait_s": 1e9}}, "scheduler.max_wait_s"),
        ({"server": {"shutdown_grace_s": -1}}, "server.shutdown_grace_s"),
        ({"workers": [{"type": "gpu"}]}, "workers[0].type"),
        ({"workers": [{"slots": 0}]}, "workers[0].slots"),
        ({"workers": [{"type": "upstream", "model": "m"}]}, "workers[0].url"),
        ({"workers": [{"type": "upstream", "model": "m", "url": "localhost:8001"}]}, "workers[0].url"),
        (
            {"workers": [{"type": "upstream", "model": "m", "url": "http://127.0.0.1:8001/v1 "}]},
            "workers[0].url",
        ),
        ({"workers": [{"type": "upstream", "model": "m", "url": "ftp://h/v1"}]}, "workers[0].url"),
        ({"workers": [{"type": "upstream", "model": "m", "url": "http://h:99999/v1"}]}, "workers[0].url"),
        ({"workers": [{"kind": "upstream", "model": "m", "url": "http://h/v1"}]}, "workers[0].kind"),
        ({"workers": [{"type": "upstream", "model": "m", "url": "http:///v1"}]}, "workers[0].url"),
        ({"workers": [{"type": "upstream", "model": "m", "url": "http://u:p@h/v1"}]}, "workers[0].url"),
        (
            {"workers": [{"type": "upstream", "model": "m", "url": "http://h", "token_ids": "x"}]},
            "workers[0].token_ids",
        ),
        (
            {"workers": [{"type": "upstream", "model": "m", "url": "http://h", "stall_timeout_s": 0}]},
            "workers[0].stall_timeout_s",
        ),
        ({"workers": [{"url": "http://127.0.0.1:8001/v1", "model": "m"}]}, "workers[0].url"),  # no type
        (
            {"workers": [{"type": "upstream", "model": "m", "url": "http://h", "device": "cpu"}]},
            "workers[0].device",
        ),
        ({"workers": [{"type": "simulated", "timeout_s": 5}]}, "workers[0].timeout_s"),
        ({"workers": [{"type": "local", "isolate": "yes"}]}, "workers[0].isolate"),
        ({"workers": [{"type": "local", "x_top_k": 5}]}, "workers[0].x_top_k"),
        ({"workers": [{"type": "upstream", "model": "m", "url": "http://h", "x_": 5}]}, "workers[0].x_"),
        # (a field laneway sets in each request: x_n broke every request's count, x_stream was dropped)
        ({"workers": [{"type": "upstream", "model": "m", "url": "http://h", "x_n": 2}]}, "workers[0].x_n"),
        (
            {"workers": [{"type": "upstream", "model": "m", "url": "http://h", "x_stream": False}]},
            "workers[0].x_stream",
        ),
        (
            {"workers": [{"type": "upstream", "model": "m", "url": "http://h", "x_priority": 1}]},
            "workers[0].x_priority",
        ),
        ({"workers": [{"type": "simulated", "slots": 10**11}]}, "workers[0].slots"),
        ({"server": {"probe_interval_s": 0}}, "server.probe_interval_s"),
        ({"server": {"max_header_bytes": 100}}, "server.max_header_bytes"),
        ({"server": {"unavailable_hold_s": -1}}, "server.unavailable_hold_s"),
        ({"server": {"unavailable_hold_s": "none"}}, "server.unavailable_hold_s"),
        ({"workers": [{"name": "a"}, {"name": "a"}]}, "workers[1].name"),
        ({"workers": []}, "workers"),  # (empty: an error; left out: the built-in default)
        ({"classes": {"P9": {}}}, "classes.P9"),
        ({"classes": {"P0": {"timeout_s": -1}}}, "classes.P0.timeout_s"),
        ({"classes": {"P3": {"service_s": 0}}}, "classes.P3.service_s"),
        ({"tenants": {"t": {"key_sha256": ["abc"]}}}, "tenants.t.key_sha256"),
        ({"tenants": {"t": {"allowed": ["P7"]}}}, "tenants.t.allowed"),
        ({"tenants": {"t": {"quotas": {"P0": {"burst": 2}}}}}, "tenants.t.quotas.P0.rate_per_s"),
        ({"alerts": {"queue_wait_s": {"P0": "soon"}}}, "alerts.queue_wait_s.P0"),
        ({"scheduler": {"max_preemptions": -1}}, "scheduler.max_preemptions"),
        ({"models": {"other": {"aliases": ["x"]}}}, "models.other"),
        # an alias that would hide a served model, or be two models' names
        (
            {
                "workers": [
                    {"type": "simulated", "model": "a"},
                    {"type": "simulated", "model": "b", "name": "w1"},
                ],
                "models": {"a": {"aliases": ["b"]}},
            },
            "models.a.aliases",
        ),
        (
            {
                "workers": [
                    {"type": "simulated", "model": "a"},
                    {"type": "simulated", "model": "b", "name": "w1"},
                ],
                "models": {"a": {"aliases": ["x"]}, "b": {"aliases": ["x"]}},
            },
            "models.b.aliases",
        ),
        # one key of two tenants (the second's limits would never apply)
        (
            {"tenants": {"a": {"key_sha256": ["a" * 64]}, "b": {"key_sha256": ["A" * 64]}}},
            "tenants.b.key_sha256",
        ),
        # a tenant allowed no class, or not the one its requests that name none get
        ({"tenants": {"t": {"allowed": ["P0"]}}}, "tenants.t.allowed"),
        (
            {"server": {"default_priority": "P2"}, "tenants": {"t": {"allowed": ["P0", "P1"]}}},
            "tenants.t.allowed",
        ),
        ({"service_tiers": {"flex": "P9"}}, "service_tiers.flex"),
        ({"cluster": {"redis_url": "http://h"}}, "cluster.redis_url"),
        ({"cluster": {"redis_url": "redis://h", "leader_priority": -1}}, "cluster.leader_priority"),
        ({"cluster": {"redis_url": "redis://h", "leader_prio": 2}}, "cluster.leader_prio"),
        ({"cluster": {"replica": "r1"}}, "cluster.redis_url"),  # (a [cluster] key without its Redis)
        ({"tenants": {"t": {"quotas": {"P0": {"rps": 1}}}}}, "tenants.t.quotas.P0.rps"),
        ({"service_tiers": {"priority": 7}}, "service_tiers.priority"),
        # URLs Python's parser refuses (a bracket not closed, a port that is no number): a line
        ({"workers": [{"type": "upstream", "model": "m", "url": "http://[::1"}]}, "workers[0].url"),
        ({"cluster": {"redis_url": "redis://[::1"}}, "cluster.redis_url"),
        ({"cluster": {"redis_url": "redis://h:abc/0"}}, "cluster.redis_url"),
        ({"server": {"otlp_traces_endpoint": "http://[::1"}}, "server.otlp_traces_endpoint"),
        ({"server": {"otlp_traces_endpoint": "http://h:99999/v1/traces"}}, "server.otlp_traces_endpoint"),
        ({"server": {"otlp_traces_endpoint": "http://127.0.0.1:4318"}}, "server.otlp_traces_endpoint"),
        # names shown in logs and metrics take no control characters
        ({"workers": [{"type": "simulated", "name": "a\x00b"}]}, "workers[0].name"),
        ({"workers": [{"type": "simulated", "model": "m\n"}]}, "workers[0].model"),
        ({"tenants": {"t\x07": {}}}, "tenants"),
        # "none" where no limit means nothing: refused in a line, not a traceback later
        *(
            (data, key)
            for key, data in (
                ("server.probe_interval_s", {"server": {"probe_interval_s": "none"}}),
                ("server.keep_alive_s", {"server": {"keep_alive_s": "none"}}),
                ("scheduler.drain_cap_s", {"scheduler": {"drain_cap_s": "none"}}),
                ("scheduler.default_service_s", {"scheduler": {"default_service_s": "none"}}),
                ("scheduler.fair_prompt_weight", {"scheduler": {"fair_prompt_weight": "none"}}),
                ("scheduler.costs.step_s", {"scheduler": {"costs": {"step_s": "none"}}}),
                ("scheduler.costs.decode_tokens_s", {"scheduler": {"costs": {"decode_tokens_s": "none"}}}),
                ("classes.P1.weight", {"classes": {"P1": {"weight": "none"}}}),
                ("batches.lease_s", {"batches": {"lease_s": "none"}}),
                ("batches.poll_s", {"batches": {"poll_s": "none"}}),
                (
                    "tenants.t.quotas.P0.burst",
                    {"tenants": {"t": {"quotas": {"P0": {"rate_per_s": 1, "burst": "none"}}}}},
                ),
                (
                    "tenants.t.quotas.P0.rate_per_s",
                    {"tenants": {"t": {"quotas": {"P0": {"rate_per_s": "none"}}}}},
                ),
                (
                    "tenants.t.quotas.P0.tokens_per_min",
                    {"tenants": {"t": {"quotas": {"P0": {"tokens_per_min": "none"}}}}},
                ),
                ("tenants.t.weight", {"tenants": {"t": {"weight": "none"}}}),
                (
                    "workers[0].timeout_s",
                    {"workers": [{"type": "upstream", "model": "m", "url": "http://h", "timeout_s": "none"}]},
                ),
            )
        ),
    ],
)
def test_errors_name_the_key(data: dict, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    assert str(info.value).startswith(key + ":"), str(info.value)


def test_a_tenant_not_allowed_the_default_class_gets_its_most_urgent_allowed_one_below() -> None:
    cfg = parse_config({"tenants": {"t": {"allowed": ["P3", "P2"]}, "u": {"allowed": ["P1", "P3"]}}})
    policies = {t.name: t.policy for t in cfg.tenants}
    assert cfg.default_priority == 1
    assert policies["t"].default_class == 2  # (P1 not allowed: P2, not P3)
    assert policies["u"].default_class is None  # (P1 allowed: the server's default)


def test_two_workers_of_one_engine_and_model_are_warned_of(caplog: pytest.LogCaptureFixture) -> None:
    from laneway.serve import startup_facts

    up = {"type": "upstream", "model": "m", "url": "http://127.0.0.1:8001/v1"}
    cfg = parse_config(
        {
            "workers": [
                {**up, "name": "a"},
                {**up, "name": "b", "url": "http://127.0.0.1:8001/v1/"},  # (the same engine)
                {**up, "name": "c", "model": "m-lora"},  # (another model of it: its own worker)
            ]
        }
    )
    with caplog.at_level(logging.WARNING, logger="laneway"):
        startup_facts(cfg, {})
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and warned[0].startswith("workers a and b send m to the same engine"), warned


def test_a_workers_start_up_line_says_isolate_and_forward_priority(caplog: pytest.LogCaptureFixture) -> None:
    from laneway.backends.upstream import UpstreamWorker
    from laneway.serve import startup_facts

    up = {"type": "upstream", "model": "m", "url": "http://127.0.0.1:8001/v1"}
    cfg = parse_config(
        {
            "workers": [
                {**up, "name": "a", "isolate": True, "forward_priority": True},
                {**up, "name": "b", "model": "n"},
            ]
        }
    )
    workers = {w.name: UpstreamWorker(w.name, w.url, w.model, slots=w.slots) for w in cfg.workers}
    with caplog.at_level(logging.INFO, logger="laneway"):
        startup_facts(cfg, workers)  # type: ignore[arg-type]
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("worker ")]
    assert said == [
        "worker a: upstream http://127.0.0.1:8001/v1 serving m, 4 slots; isolate (urgent work runs alone); "
        "forward_priority (each request's class as vLLM's priority)",
        "worker b: upstream http://127.0.0.1:8001/v1 serving n, 4 slots",
    ], said


def test_a_class_prior_of_service() -> None:
    cfg = parse_config({"classes": {"P3": {"service_s": 600}}})
    assert [c.service_s for c in cfg.scheduler.classes.classes] == [None, None, None, 600.0]


def test_upstream_settings() -> None:
    cfg = parse_config(
        {
            "server": {"probe_interval_s": 0.5, "unavailable_hold_s": 0},
            "workers": [
                {"type": "upstream", "model": "m", "url": "https://gpu.example/v1", "token_ids": "none"},
                {
                    "type": "upstream",
                    "model": "m",
                    "url": "http://[::1]:8001/v1",
                    "stall_timeout_s": "none",
                    "isolate": True,
                },
            ],
        }
    )
    assert (cfg.probe_interval_s, cfg.unavailable_hold_s) == (0.5, 0.0)
    a, b = cfg.workers
    assert (a.token_ids, a.stall_timeout_s, a.isolate) == ("none", 30.0, False)
    assert (b.token_ids, b.stall_timeout_s, b.isolate) == ("vllm", None, True)


def test_file_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[server\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)
    wrong = tmp_path / "wrong.toml"
    wrong.write_text("[server]\nport = -5\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"wrong.toml: server.port: must be >= 0"):
        load_config(wrong)
    wrong.write_text("[server]\nport = 70000\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"wrong.toml: server.port: must be <= 65535, got 70000"):
        load_config(wrong)
    # an endless file is not read to its end (it filled the memory until the kernel killed laneway)
    with pytest.raises(ConfigError, match=r"^/dev/zero: over 16 MiB: not a configuration file$"):
        load_config(Path("/dev/zero"))


def test_none_where_it_means_no_limit_and_a_class_given_as_a_number() -> None:
    cfg = parse_config(
        {
            "server": {"shutdown_grace_s": "none"},
            "scheduler": {"aging_interval_s": "none", "max_wait_s": "none", "hold_s": "none"},
            "classes": {"P2": {"timeout_s": "none"}},
            "alerts": {"queue_wait_s": {"P0": "none"}},
            "service_tiers": {"priority": 0, "flex": "p3"},
            "workers": [{"type": "upstream", "model": "m", "url": "http://h", "stall_timeout_s": "none"}],
        }
    )
    assert cfg.shutdown_grace_s is None and cfg.scheduler.aging_interval_s is None
    assert cfg.scheduler.max_wait_s is None and cfg.scheduler.hold_s == 0.0
    assert cfg.scheduler.classes.classes[2].timeout_s is None and cfg.alert_wait_s[0] is None
    assert cfg.service_tiers["priority"] == "P0" and cfg.service_tiers["flex"] == "P3"
    assert cfg.workers[0].stall_timeout_s is None
    assert parse_config({"cluster": {}}).cluster is None  # (an empty table: no cluster)
