"""`laneway simulate --trace FILE --fleet FLEET.toml`: traces on a GPU fleet."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from laneway.cli import main

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_trace_on_the_example_fleet(capsys: pytest.CaptureFixture[str]) -> None:
    trace, fleet = EXAMPLES / "gpu-trace.jsonl", EXAMPLES / "fleet.toml"
    assert (
        main(["simulate", "--trace", str(trace), "--fleet", str(fleet), "--policy", "laneway", "--json"]) == 0
    )
    out = json.loads(capsys.readouterr().out)
    # chat-7b is preloaded; mid-13b and big-70b are loaded once each; the 405B model fits nowhere
    assert out["model_loads"] == 2
    assert out["classes"]["P0"]["completed"] == 2
    assert out["classes"]["P2"]["completed"] == 2
    assert out["classes"]["P2"]["rejected"] == 1


def test_fleet_table_names_the_fleet_and_why_requests_were_rejected(
    capsys: pytest.CaptureFixture[str],
) -> None:
    trace, fleet = EXAMPLES / "gpu-trace.jsonl", EXAMPLES / "fleet.toml"
    assert main(["simulate", "--trace", str(trace), "--fleet", str(fleet), "--policy", "naive,laneway"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[0].rstrip() == "scenario trace: 5 requests, 8 GPUs in 2 nodes, 3 models"
    # (a model the fleet does not serve is said, not left to pass as a rejection: a typo shows)
    assert err == (
        f"laneway: {trace}: the fleet serves no model 'huge-405b' (1 request): refused as unplaceable\n"
    )
    assert "slots" not in out
    # the 405B model fits nowhere (both policies); naive lets a P0 chat request time out
    table = out.split("Rejections by reason", 1)[1]
    lines = [line.replace("┃", "│") for line in table.splitlines()]
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in lines if "│" in line]
    assert rows == [
        ["policy", "class", "queue_timeout", "unplaceable"],
        ["naive", "P0", "1", "0"],
        ["", "P2", "0", "1"],
        ["laneway", "P2", "0", "1"],
    ]


def test_a_trace_without_models_on_a_fleet_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text(
        '{"arrival_s": 0, "priority": "P0", "duration_s": 2, "model": "chat-7b"}\n'
        "\n"
        '{"arrival_s": 1, "priority": "P2", "duration_s": 5}\n',
        encoding="utf-8",
    )
    assert main(["simulate", "--trace", str(trace), "--fleet", str(EXAMPLES / "fleet.toml")]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"laneway: error: {trace}:3: a run on a GPU fleet needs a model on every line "
        "(the fleet serves: chat-7b, mid-13b, big-70b)\n"
    )
    # on plain slots the same trace runs
    assert main(["simulate", "--trace", str(trace), "--json"]) == 0
    capsys.readouterr()


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("nodes = 3", "nodes"),
        ('[nodes.a]\ngpus = [{ id = "g", vram_gb = -1 }]', "vram_gb"),
        ('[nodes.a]\ngpus = [{ id = "g", vram_gb = 24 }]\n[models.m]\nload_s = 3', "models.m.vram_gb"),
        ('preload = ["nope"]\n[nodes.a]\ngpus = [{ id = "g", vram_gb = 24 }]', "preload"),
        ("[nodes.a\n", "not valid TOML"),
        (
            '[nodes.a]\ngpus = [{ id = "g", vram_gb = 24 }]\n[models.m]\nvram_gb = 8\nslots = 0',
            ": models.m.slots:",
        ),
        (  # (as laneway serve refuses it)
            '[nodes.a]\ngpus = [{ id = "g", vram_gb = 24 }]\n[models.m]\nvram_gb = 40',
            ": models.m: model 'm' needs 40 GB of VRAM on one GPU (40 GB each); no GPU group",
        ),
        (
            'preload = ["a", "b"]\n[nodes.a]\ngpus = [{ id = "g", vram_gb = 24 }]\n'
            "[models.a]\nvram_gb = 14\n[models.b]\nvram_gb = 14",
            ": preload: model 'b' does not fit next to a (preloaded before it)",
        ),
    ],
)
def test_bad_fleet_is_one_clear_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, needle: str
) -> None:
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(text, encoding="utf-8")
    trace = EXAMPLES / "gpu-trace.jsonl"
    assert main(["simulate", "--trace", str(trace), "--fleet", str(fleet)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("laneway: error: ") and needle in err and "\n" not in err
    assert err.count(str(fleet)) == 1  # the file is named once


def test_fleet_only_with_a_trace(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--scenario", "chat-vs-batch", "--fleet", str(EXAMPLES / "fleet.toml")]) == 2
    assert "--fleet" in capsys.readouterr().err


def test_wakes_are_counted_apart_from_loads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two models with a sleep mode taking turns on one GPU: after each one's first load, it
    sleeps when evicted and wakes where it was — counted as wakes, not loads, and every
    placement but the last is evicted."""
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(
        '[nodes.n]\ngpus = [{ id = "g0", vram_gb = 24 }]\n'
        + "".join(f"[models.{m}]\nvram_gb = 14\nload_s = 30\nwake_s = 3\n" for m in "ab"),
        encoding="utf-8",
    )
    trace = tmp_path / "trace.jsonl"
    lines = (
        f'{{"arrival_s": {200 * i}, "priority": "P2", "duration_s": 5, "model": "{"ab"[i % 2]}"}}'
        for i in range(10)
    )
    trace.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert main(["simulate", "--trace", str(trace), "--fleet", str(fleet), "--json"]) == 0
    (s,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert (s["model_loads"], s["model_wakes"], s["model_evictions"]) == (2, 8, 9)
    assert s["classes"]["P2"]["completed"] == 10
