"""Token-fair tenants and token-per-minute quotas through the HTTP API."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from laneway.config import hash_key, parse_config
from live_server import LiveServer, live_server

BIG, SMALL, METERED = "big-key", "small-key", "metered-key"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    cfg = parse_config(
        {
            "server": {"data_dir": str(tmp_path_factory.mktemp("fair"))},
            "workers": [
                {"name": "sim0", "type": "simulated", "model": "sim", "slots": 1, "tokens_per_s": 200}
            ],
            "tenants": {
                "big": {"key_sha256": [hash_key(BIG)]},
                "small": {"key_sha256": [hash_key(SMALL)], "weight": 2},
                "metered": {
                    "key_sha256": [hash_key(METERED)],
                    "quotas": {"P2": {"tokens_per_min": 120, "tokens_burst": 60}},
                    "allowed": ["P2", "P3"],
                },
            },
        }
    )
    with live_server(cfg) as s:
        yield s


def post(s: LiveServer, key: str, tokens: int, text: str = "hi") -> httpx.Response:
    body = {"model": "sim", "prompt": text, "max_tokens": tokens, "priority": "P2"}
    return httpx.post(
        s.base_url + "/completions", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=60
    )


def test_a_small_tenant_is_not_stuck_behind_a_big_ones_backlog(server: LiveServer) -> None:
    ended: dict[str, float] = {}

    def big(i: int) -> None:
        assert post(server, BIG, 40).status_code == 200
        ended[f"big{i}"] = time.monotonic()

    threads = [threading.Thread(target=big, args=(i,)) for i in range(12)]  # 12 x 0.2 s on one slot
    for t in threads:
        t.start()
    deadline = time.monotonic() + 10
    while server.runtime.sched.queued < 8 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert post(server, SMALL, 40).status_code == 200
    ended["small"] = time.monotonic()
    for t in threads:
        t.join(60)
    after = sum(1 for k, v in ended.items() if k.startswith("big") and v > ended["small"])
    assert after >= 6, ended  # it went ahead of most of the queued backlog (FIFO: of none)


def test_a_token_per_minute_quota_is_a_429_with_when_it_refills(server: LiveServer) -> None:
    got = [post(server, METERED, 30, "x" * 100) for _ in range(4)]  # prompt ~26 tokens + 30 out
    statuses = [r.status_code for r in got]
    assert statuses[0] == 200 and 429 in statuses, statuses
    refused = got[statuses.index(429)]
    err = refused.json()["error"]
    assert err["code"] == "rate_limited" and "tokens/min" in err["message"]
    assert int(refused.headers["retry-after"]) >= 1
    assert err["estimated_wait_s"] > 0

    def estimate(key: str, priority: str = "P2") -> httpx.Response:
        auth = {"Authorization": f"Bearer {key}"}
        return httpx.get(server.base_url + "/queue/estimate", params={"priority": priority}, headers=auth)

    mine = estimate(METERED).json()  # the bucket is still in debt: the estimate says so
    assert mine["quota"]["reason"] == "rate_limited" and "tokens/min" in mine["quota"]["message"]
    assert mine["estimated_wait_s"] >= mine["quota"]["retry_after_s"] > 0
    assert mine["basis_detail"].startswith("its tenant's quota lets it in after ")
    assert estimate(BIG).json()["quota"] is None  # another tenant's quota is not its own
    assert estimate(METERED, "P3").json()["quota"] is None  # nor another class's
    denied = estimate(METERED, "P0")
    assert denied.status_code == 403 and denied.json()["error"]["param"] == "priority"


def test_a_stream_the_client_leaves_is_charged_the_tokens_it_got(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Progress reaches the scheduler at 16, 48, ... tokens; a client that leaves in
    between is charged what it streamed, not only what was last reported."""
    cfg = parse_config(
        {
            "server": {"data_dir": str(tmp_path_factory.mktemp("leaver"))},
            "workers": [{"name": "s", "type": "simulated", "model": "sim", "slots": 1, "tokens_per_s": 20}],
            "tenants": {
                "leaver": {
                    "key_sha256": [hash_key(METERED)],
                    "quotas": {"P2": {"tokens_per_min": 6, "tokens_burst": 1000}},
                }
            },
        }
    )
    body = {"model": "sim", "prompt": "hi", "max_tokens": 200, "priority": "P2", "stream": True}
    with live_server(cfg) as s, httpx.Client(timeout=30) as c:
        got = 0
        headers = {"Authorization": f"Bearer {METERED}"}
        with c.stream("POST", s.base_url + "/completions", json=body, headers=headers) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                got += line.startswith("data: {")
                if got == 30:
                    break  # (30 tokens at 20 a second: well short of the report at 48)
        deadline = time.monotonic() + 10
        while s.runtime.tickets and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not s.runtime.tickets
        [budget] = s.runtime.sched.admission._budgets.values()
        spent = budget.burst - budget.tokens  # (it refills 0.1 a second)
        assert spent >= 30, spent
