"""Tenants see only their own files and batches (404 for others'); batch classes follow entitlements."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from batch_util import chat_line, client, jsonl, submit, wait
from laneway.config import hash_key, parse_config
from live_server import LiveServer, live_server

ALICE, BOB = "alice-key", "bob-key"


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    cfg = parse_config(
        {
            "server": {"data_dir": str(tmp_path_factory.mktemp("tenants"))},
            "workers": [{"name": "s", "type": "simulated", "model": "sim", "slots": 2, "tokens_per_s": 2000}],
            "tenants": {
                "alice": {"key_sha256": [hash_key(ALICE)], "allowed": ["P0", "P1", "P2", "P3"]},
                "bob": {"key_sha256": [hash_key(BOB)], "allowed": ["P3"]},
            },
            "batches": {"poll_s": 0.1},
        }
    )
    with live_server(cfg) as server:
        yield server


def test_files_and_batches_are_private(keyed: LiveServer) -> None:
    alice, bob = client(keyed.base_url, ALICE), client(keyed.base_url, BOB)
    f = alice.files.create(file=("a.jsonl", jsonl([chat_line("a")])), purpose="batch")
    b = alice.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    for call in (
        lambda: bob.files.retrieve(f.id),
        lambda: bob.files.content(f.id),
        lambda: bob.files.delete(f.id),
        lambda: bob.batches.retrieve(b.id),
        lambda: bob.batches.cancel(b.id),
        lambda: bob.batches.create(
            input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
        ),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    assert [x.id for x in bob.batches.list()] == [] and [x.id for x in bob.files.list()] == []
    done = wait(alice, b.id)
    assert done.status == "completed"
    with pytest.raises(openai.NotFoundError):
        bob.files.content(done.output_file_id)
    assert alice.files.content(done.output_file_id).text.count("\n") == 1
    r = httpx.get(keyed.base_url + "/batches")
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"


def test_batch_class_within_entitlements(keyed: LiveServer) -> None:
    alice, bob = client(keyed.base_url, ALICE), client(keyed.base_url, BOB)
    with pytest.raises(openai.PermissionDeniedError, match="may not use class P2"):
        submit(bob, [chat_line("x")], metadata={"priority": "P2"})
    b = submit(bob, [chat_line("x")])  # the default P2 is not bob's: his least urgent allowed class
    assert b.model_extra["laneway"]["priority"] == "P3"
    assert wait(bob, b.id).status == "completed"
    assert submit(alice, [chat_line("y")]).model_extra["laneway"]["priority"] == "P2"
    assert (
        submit(alice, [chat_line("y")], metadata={"priority": "1"}).model_extra["laneway"]["priority"] == "P1"
    )
