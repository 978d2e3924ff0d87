"""``laneway batch submit|status|results`` against a live server; mistakes are one line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from batch_util import chat_line, jsonl
from laneway.cli import main
from live_server import LiveServer


def run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_submit_wait_status_results(
    batch_server: LiveServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    src = tmp_path / "in.jsonl"
    src.write_bytes(jsonl([chat_line(f"k{i}") for i in range(12)]))
    monkeypatch.setenv("LANEWAY_BASE_URL", batch_server.base_url)
    code, out, err = run(
        capsys, ["batch", "submit", str(src), "--priority", "P3", "--wait", "--poll", "0.05"]
    )
    assert code == 0, err
    batch_id = out.strip()
    assert batch_id.startswith("batch_")
    assert f"{batch_id} [P3]: completed; 12 done, 0 failed of 12" in err
    code, out, _ = run(capsys, ["batch", "status", batch_id, "--base-url", batch_server.base_url])
    assert code == 0 and "completed; 12 done, 0 failed of 12" in out
    code, out, _ = run(capsys, ["batch", "status", batch_id, "--json"])
    assert code == 0 and json.loads(out)["request_counts"] == {"completed": 12, "failed": 0, "total": 12}
    dest = tmp_path / "out.jsonl"
    code, _, err = run(capsys, ["batch", "results", batch_id, "-o", str(dest)])
    assert code == 0 and f"12 results written to {dest}" in err
    assert sorted(json.loads(x)["custom_id"] for x in dest.read_text().splitlines()) == sorted(
        f"k{i}" for i in range(12)
    )


def test_failed_batch_exits_1_and_mistakes_are_one_line(
    batch_server: LiveServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LANEWAY_BASE_URL", batch_server.base_url)
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(jsonl([chat_line("a", model="nope")]))
    code, _, err = run(capsys, ["batch", "submit", str(bad), "--wait", "--poll", "0.05"])
    assert code == 1 and "failed" in err and "model_not_found" in err

    def one_line(argv: list[str]) -> str:
        code, _, err = run(capsys, argv)
        lines = err.splitlines()
        assert code == 2 and len(lines) == 1 and lines[0].startswith("laneway: error: "), err
        return lines[0]

    assert "no such file" in one_line(["batch", "submit", str(tmp_path / "missing.jsonl")])
    assert "404" in one_line(["batch", "status", "batch_nope"])
    assert "cannot reach the server" in one_line(
        ["batch", "status", "x", "--base-url", "http://127.0.0.1:9/v1"]
    )
    assert "invalid choice" in one_line(["batch", "frobnicate"])
    assert "--output" in one_line(["batch", "results", "x"])
    blank = tmp_path / "blank.jsonl"
    blank.write_text("not json\n")
    assert "--endpoint" in one_line(["batch", "submit", str(blank)])
