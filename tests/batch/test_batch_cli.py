"""``laneway batch submit|status|results|cancel|list|files|delete`` against a live server; mistakes are
one line, exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from batch_util import chat_line, client, jsonl
from laneway.cli import main
from laneway.testing import free_port, serve_process
from live_server import LiveServer

BASE = "http://127.0.0.1:8000/v1"


def run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def one_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """Run a command that must fail with exit 2 and one ``laneway: error:`` line."""
    code, out, err = run(capsys, argv)
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert err.startswith("laneway: error: "), err
    return err.rstrip("\n")


@pytest.fixture
def cli(batch_server: LiveServer, monkeypatch: pytest.MonkeyPatch) -> LiveServer:
    """The batch commands talk to ``batch_server`` (``LANEWAY_BASE_URL``)."""
    monkeypatch.setenv("LANEWAY_BASE_URL", batch_server.base_url)
    return batch_server


def test_submit_wait_status_results(
    cli: LiveServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "in.jsonl"
    src.write_bytes(jsonl([chat_line(f"k{i}") for i in range(12)]))
    code, out, err = run(
        capsys, ["batch", "submit", str(src), "--priority", "P3", "--wait", "--poll", "0.05"]
    )
    assert code == 0, err
    batch_id = out.strip()
    assert batch_id.startswith("batch_")
    assert f"{batch_id} [P3]: completed; 12 done, 0 failed of 12" in err
    code, out, _ = run(capsys, ["batch", "status", batch_id, "--base-url", cli.base_url])
    assert code == 0 and "completed; 12 done, 0 failed of 12" in out
    code, out, _ = run(capsys, ["batch", "status", batch_id, "--json"])
    assert code == 0 and json.loads(out)["request_counts"] == {"completed": 12, "failed": 0, "total": 12}
    dest = tmp_path / "out.jsonl"
    code, _, err = run(capsys, ["batch", "results", batch_id, "-o", str(dest)])
    assert code == 0 and err == f"12 results written to {dest}\n"
    errors = tmp_path / "err.jsonl"
    code, _, err = run(capsys, ["batch", "results", batch_id, "-o", str(dest), "--errors", str(errors)])
    assert code == 0 and err == f"12 results written to {dest}; 0 errors written to {errors}\n"
    assert errors.read_bytes() == b""  # written, empty: nothing failed
    # one file for both would keep only the errors: refused, the results left as they were
    line = one_line(capsys, ["batch", "results", batch_id, "-o", str(dest), "--errors", str(dest)])
    assert line == f"laneway: error: -o and --errors both name {dest}: the errors would replace the results"
    assert sorted(json.loads(x)["custom_id"] for x in dest.read_text().splitlines()) == sorted(
        f"k{i}" for i in range(12)
    )


def test_failed_batch_exits_1_and_mistakes_are_one_line(
    cli: LiveServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(jsonl([chat_line("a", model="nope")]))
    code, _, err = run(capsys, ["batch", "submit", str(bad), "--wait", "--poll", "0.05"])
    assert code == 1 and "failed" in err and "model_not_found" in err

    assert "no such file" in one_line(capsys, ["batch", "submit", str(tmp_path / "missing.jsonl")])
    assert "a directory, not a JSONL file" in one_line(capsys, ["batch", "submit", str(tmp_path)])
    assert one_line(capsys, ["batch", "submit", "/dev/null"]).endswith(" /dev/null: not a regular file")
    assert "argument --max-lines: must be at least 1, got 0" in one_line(
        capsys, ["batch", "submit", str(bad), "--max-lines", "0"]
    )
    out = str(tmp_path / "o")
    for command in (["status", ""], ["cancel", " "], ["results", "", "-o", out]):
        assert "an id such as batch_..., got an empty string" in one_line(capsys, ["batch", *command])
    assert "an id such as file-..., got an empty string" in one_line(capsys, ["batch", "delete", ""])
    assert "-o/--output: expected a path" in one_line(capsys, ["batch", "results", "batch_x", "-o", ""])
    for url in ("http://127.0.0.1:abc/v1", "http://[::1"):
        line = one_line(capsys, ["batch", "list", "--base-url", url])
        assert line.endswith(f"--base-url: expected an http:// or https:// URL such as {BASE}, got {url!r}")
    assert "404" in one_line(capsys, ["batch", "status", "batch_nope"])
    assert "cannot reach the server" in one_line(
        capsys, ["batch", "status", "x", "--base-url", "http://127.0.0.1:9/v1"]
    )
    assert "invalid choice" in one_line(capsys, ["batch", "frobnicate"])
    assert "--output" in one_line(capsys, ["batch", "results", "x"])
    assert "argument --priority: unknown priority 'P9'" in one_line(
        capsys, ["batch", "submit", str(bad), "--priority", "P9"]
    )


def test_submit_says_what_is_wrong_with_the_first_line(
    cli: LiveServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cases = {
        "": "empty.jsonl: the file is empty (no request lines)",
        "\n  \n": "blank.jsonl: the file is empty (no request lines)",
        '{"custom_id": "a", "url": "/v1/chat': "truncated.jsonl: line 1 is not valid JSON: Unterminated",
        '\n{"custom_id": "a",}\n': "trailing.jsonl: line 2 is not valid JSON: ",
        "[1, 2]\n": "array.jsonl: line 1 is not a JSON object",
        '{"custom_id": "a", "body": {}}\n': "nourl.jsonl: line 1 has no url; pass --endpoint",
    }
    names = ["empty", "blank", "truncated", "trailing", "array", "nourl"]
    before = _file_ids(cli)
    for name, (text, expected) in zip(names, cases.items(), strict=True):
        path = tmp_path / f"{name}.jsonl"
        path.write_text(text)
        code, out, err = run(capsys, ["batch", "submit", str(path)])
        assert code == 2 and out == "" and err.count("\n") == 1, err
        assert err.startswith(f"laneway: error: {path.parent}/{expected}"), err
    assert _file_ids(cli) == before
    # a file an editor began with a byte-order mark is taken, as the server takes it
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + jsonl([chat_line("b0"), chat_line("b1")]))
    code, out, err = run(capsys, ["batch", "submit", str(bom), "--wait", "--poll", "0.05"])
    assert code == 0 and "completed; 2 done, 0 failed of 2" in err, err


def _file_ids(server: LiveServer) -> set[str]:
    return {f.id for f in client(server.base_url).files.list()}


def test_bad_options_are_refused_before_upload_and_a_failed_create_leaves_no_file(
    cli: LiveServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "in.jsonl"
    src.write_bytes(jsonl([chat_line("a")]))
    before = _file_ids(cli)

    err = one_line(capsys, ["batch", "submit", str(src), "--priority", "P9"])
    assert "argument --priority: unknown priority 'P9': expected 0–3 or one of P0, P1, P2, P3" in err
    err = one_line(capsys, ["batch", "submit", str(src), "--window", "5x"])
    assert "argument --window: must be a duration like '24h' (s, m, h or d), got '5x'" in err
    assert "between 1s and 30d" in one_line(capsys, ["batch", "submit", str(src), "--window", "90d"])
    assert _file_ids(cli) == before  # nothing was uploaded
    # the server refuses the batch after the upload: the uploaded file is deleted again
    err = one_line(capsys, ["batch", "submit", str(src), "--endpoint", "/v1/moderations"])
    assert "the server answered 400: endpoint must be one of" in err
    assert _file_ids(cli) == before
    code, out, _ = run(capsys, ["batch", "submit", str(src), "--priority", "3", "--window", "90m"])
    assert code == 0
    b = client(cli.base_url).batches.retrieve(out.strip())
    assert b.metadata == {"priority": "P3"} and b.completion_window == "90m"


def test_status_lines_are_never_wrapped(
    cli: LiveServer, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "40")
    src = tmp_path / "long.jsonl"
    src.write_bytes(jsonl([chat_line("a"), chat_line("b", model="no-such-model-" + "y" * 60)]))
    code, out, err = run(capsys, ["batch", "submit", str(src), "--wait", "--poll", "0.05"])
    assert code == 1
    batch_id = out.strip()
    expected = f"  model_not_found: line 2: the model 'no-such-model-{'y' * 60}'"
    assert any(line.startswith(expected) for line in err.splitlines()), err
    code, out, _ = run(capsys, ["batch", "status", batch_id])
    lines = out.splitlines()
    assert code == 0 and len(lines) == 2 and lines[0].startswith(f"{batch_id} [P2]: failed; ")
    assert lines[1].startswith(expected) and len(lines[1]) > 80


def test_list_and_cancel(cli: LiveServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "in.jsonl"
    src.write_bytes(jsonl([chat_line(f"c{i}", max_tokens=200) for i in range(40)]))
    code, out, err = run(capsys, ["batch", "submit", str(src), "--priority", "P3"])
    assert code == 0, err
    batch_id = out.strip()
    code, out, _ = run(capsys, ["batch", "list", "--limit", "5"])
    assert code == 0 and out.splitlines()[0].startswith(f"{batch_id} [P3]: ")  # newest first
    code, out, _ = run(capsys, ["batch", "list", "--json"])
    assert code == 0 and batch_id in [json.loads(x)["id"] for x in out.splitlines()]
    code, out, err = run(capsys, ["batch", "cancel", batch_id])
    assert code == 0, err
    assert out.startswith(f"{batch_id} [P3]: cancel"), out  # cancelling, or cancelled already
    code, out, _ = run(capsys, ["batch", "status", batch_id, "--json"])
    assert json.loads(out)["status"] in ("cancelling", "cancelled")
    assert "404" in one_line(capsys, ["batch", "cancel", "batch_nope"])
    assert "--limit" in one_line(capsys, ["batch", "list", "--limit", "0"])


def test_a_missing_or_refused_api_key_names_where_a_key_is_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from laneway.config import hash_key, parse_config
    from live_server import live_server

    cfg = parse_config(
        {
            "server": {"data_dir": str(tmp_path / "data")},
            "workers": [{"name": "sim0", "type": "simulated", "model": "sim", "slots": 1}],
            "tenants": {"team": {"key_sha256": [hash_key("right-key")]}},
        }
    )
    for name in ("LANEWAY_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    with live_server(cfg) as server:
        monkeypatch.setenv("LANEWAY_BASE_URL", server.base_url)
        line = one_line(capsys, ["batch", "list"])
        assert (
            line == "laneway: error: the server wants an API key: give --api-key KEY, or set LANEWAY_API_KEY"
        )
        line = one_line(capsys, ["batch", "list", "--api-key", "wrong-key"])
        assert line.startswith("laneway: error: the server refused the API key (--api-key): "), line
        # a key that cannot go in a header is named, not a traceback or "cannot reach"
        line = one_line(capsys, ["batch", "list", "--api-key", "clé"])
        assert line == "laneway: error: --api-key: an API key is printable ASCII (it is sent in a header)"
        assert "--api-key: an API key" in one_line(capsys, ["batch", "list", "--api-key", "a\nb"])
        monkeypatch.setenv("LANEWAY_API_KEY", "ключ")
        assert "LANEWAY_API_KEY: an API key" in one_line(capsys, ["batch", "list"])
        monkeypatch.setenv("LANEWAY_API_KEY", "right-key")
        code, _, err = run(capsys, ["batch", "list"])
        assert code == 0, err


def test_too_many_lines_are_refused_before_upload_and_as_they_arrive(
    cli: LiveServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = _file_ids(cli)
    src = tmp_path / "long.jsonl"
    src.write_bytes(jsonl([chat_line(f"l{i}") for i in range(6)]) + b"\n\n")  # (blank lines do not count)
    err = one_line(capsys, ["batch", "submit", str(src), "--max-lines", "5"])
    assert f"{src} has 6 request lines; a batch takes at most 5" in err and "--max-lines" in err
    assert _file_ids(cli) == before  # nothing was uploaded
    # another client: the server (max_lines 500) refuses the upload as it arrives, before storing it
    many = jsonl([chat_line(f"m{i}") for i in range(700)])
    r = httpx.post(cli.base_url + "/files", files={"file": ("many.jsonl", many)}, data={"purpose": "batch"})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (
        error["code"] == "too_many_requests"
        and error["param"] == "file"
        and "at most 500" in error["message"]
    )
    assert _file_ids(cli) == before
    ok = jsonl([chat_line(f"k{i}") for i in range(500)]) + b"\n" * 100  # at the limit, blank lines aside
    r = httpx.post(cli.base_url + "/files", files={"file": ("ok.jsonl", ok)}, data={"purpose": "batch"})
    assert r.status_code == 200, r.text


def test_files_are_listed_and_deleted(
    cli: LiveServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    uploaded = client(cli.base_url).files.create(
        file=("mine.jsonl", jsonl([chat_line("f")])), purpose="batch"
    )
    code, out, _ = run(capsys, ["batch", "files", "--limit", "100"])
    assert code == 0 and any(
        line.startswith(uploaded.id) and "mine.jsonl" in line for line in out.splitlines()
    )
    code, out, _ = run(capsys, ["batch", "files", "--json", "--limit", "100"])
    assert uploaded.id in {json.loads(x)["id"] for x in out.splitlines()}
    code, _, err = run(capsys, ["batch", "delete", uploaded.id])
    assert code == 0 and err == f"{uploaded.id} deleted\n" and uploaded.id not in _file_ids(cli)
    assert "404" in one_line(capsys, ["batch", "delete", uploaded.id])


def test_wait_goes_on_through_a_server_restart(tmp_path: Path) -> None:
    port = free_port()
    cfg = tmp_path / "laneway.toml"
    cfg.write_text(
        f'[server]\ndata_dir = "{tmp_path / "data"}"\n[batches]\npoll_s = 0.1\n'
        '[[workers]]\nname = "s"\ntype = "simulated"\nmodel = "sim"\nslots = 1\ntokens_per_s = 100\n'
    )
    src = tmp_path / "in.jsonl"
    src.write_bytes(jsonl([chat_line(f"r{i}", max_tokens=40) for i in range(12)]))  # ~5 s of work
    base = f"http://127.0.0.1:{port}/v1"
    args = ("--config", str(cfg), "--port", str(port))
    with serve_process(*args, log=tmp_path / "a.log") as first:
        waiting = subprocess.Popen(
            [sys.executable, "-m", "laneway.cli", "batch", "submit", str(src), "--wait", "--poll", "0.2"],
            env={**os.environ, "LANEWAY_BASE_URL": base},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            c = client(base)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                page = c.batches.list().data
                if page and page[0].request_counts and page[0].request_counts.completed >= 2:
                    break
                time.sleep(0.1)
            else:
                raise AssertionError("the batch never got going")
            first.stop()  # (Ctrl-C: its lines wait for the next start)
            time.sleep(2)  # the waiting client finds no server meanwhile
            with serve_process(*args, log=tmp_path / "b.log"):
                out, err = waiting.communicate(timeout=120)
        finally:
            if waiting.poll() is None:
                waiting.kill()
                waiting.communicate()
    assert waiting.returncode == 0, err
    assert out.decode().startswith("batch_")
    text = err.decode()
    assert "completed; 12 done, 0 failed of 12" in text, text
