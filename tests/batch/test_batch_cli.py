"""``laneway batch submit|status|results|cancel|list`` against a live server; mistakes are
one line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from batch_util import chat_line, client, jsonl
from laneway.cli import main
from live_server import LiveServer


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
        monkeypatch.setenv("LANEWAY_API_KEY", "right-key")
        code, _, err = run(capsys, ["batch", "list"])
        assert code == 0, err
