"""Tenants see only their own files and batches (404 for others'); batch classes follow entitlements."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from batch_util import chat_line, client, jsonl, submit, wait
from laneway.config import hash_key, parse_config
from live_server import LiveServer, live_server

ALICE, BOB, OPS = "alice-key", "bob-key", "ops-key"


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    cfg = parse_config(
        {
            "server": {"data_dir": str(tmp_path_factory.mktemp("tenants"))},
            "workers": [{"name": "s", "type": "simulated", "model": "sim", "slots": 2, "tokens_per_s": 2000}],
            "tenants": {
                "alice": {"key_sha256": [hash_key(ALICE)], "allowed": ["P0", "P1", "P2", "P3"]},
                "bob": {"key_sha256": [hash_key(BOB)], "allowed": ["P3"]},
                "ops": {"key_sha256": [hash_key(OPS)], "allowed": []},  # (/metrics and the dashboard)
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


def test_a_key_for_metrics_alone_stores_no_file(keyed: LiveServer) -> None:
    with client(keyed.base_url, OPS) as ops, pytest.raises(openai.PermissionDeniedError) as info:
        ops.files.create(file=("o.jsonl", jsonl([chat_line("o")])), purpose="batch")
    assert "may run no class" in str(info.value)
    assert httpx.get(keyed.url + "/metrics", headers={"Authorization": f"Bearer {OPS}"}).status_code == 200
    # (a media type is the same in any case)
    r = httpx.post(
        keyed.base_url + "/files",
        headers={"Authorization": f"Bearer {ALICE}", "content-type": "Multipart/Form-Data; boundary=b"},
        content=b'--b\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        b'--b\r\nContent-Disposition: form-data; name="file"; filename="u.jsonl"\r\n\r\n'
        + jsonl([chat_line("u")])
        + b"\r\n--b--\r\n",
    )
    assert r.status_code == 200 and r.json()["filename"] == "u.jsonl", r.text


def test_a_purpose_given_twice_is_refused_unless_the_same(keyed: LiveServer) -> None:
    def upload(*purposes: str) -> httpx.Response:
        parts = b"".join(
            b'--b\r\nContent-Disposition: form-data; name="purpose"\r\n\r\n' + p.encode() + b"\r\n"
            for p in purposes
        )
        return httpx.post(
            keyed.base_url + "/files",
            headers={"Authorization": f"Bearer {ALICE}", "content-type": "multipart/form-data; boundary=b"},
            content=parts
            + b'--b\r\nContent-Disposition: form-data; name="file"; filename="u.jsonl"\r\n\r\n'
            + jsonl([chat_line("u")])
            + b"\r\n--b--\r\n",
        )

    r = upload("batch", "fine-tune")  # (the first was taken)
    assert r.status_code == 400 and r.json()["error"]["param"] == "purpose", r.text
    assert "'batch', 'fine-tune'" in r.json()["error"]["message"]
    assert upload("batch", "batch").status_code == 200
