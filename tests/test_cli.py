"""``laneway simulate`` end to end: output formats, the report, and clean errors."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from contract import DESIGN_KEYS, PNG_MAGIC
from laneway import __version__
from laneway.cli import main
from laneway.core import POLICIES

GOOD_LINE = '{"arrival_s": 0, "priority": "P3", "duration_s": 5}'


def write_trace(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


def error_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("laneway: error: ")
    return lines[0]


def test_scenario_json_is_one_design_object(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--scenario", "chat-vs-batch", "--json"]) == 0
    objs = json_lines(capsys.readouterr().out)
    assert len(objs) == 1
    s = objs[0]
    assert s.keys() >= DESIGN_KEYS
    assert (s["policy"], s["scenario"], s["slots"], s["seed"]) == ("laneway", "chat-vs-batch", 4, 0)
    assert s["classes"]["P0"]["count"] > 0


def test_hold_s_keeps_urgent_slots_and_preempts_less(capsys: pytest.CaptureFixture[str]) -> None:
    """``--hold-s``: the server's holds in the simulator. On support-desk (P0 chat beside
    batch floods) fewer batch requests are preempted, and every request still ends."""
    runs = []
    for hold in ("0", "0.25"):
        assert main(["simulate", "--scenario", "support-desk", "--json", "--hold-s", hold]) == 0
        (s,) = json_lines(capsys.readouterr().out)
        assert all(c["completed"] == c["count"] for c in s["classes"].values())
        runs.append(s)
    assert runs[1]["preemptions"] < runs[0]["preemptions"]


def test_max_wait_s_refuses_what_would_wait_past_its_timeout(capsys: pytest.CaptureFixture[str]) -> None:
    """``--max-wait-s``: the server's early refusal in the simulator. On mixed, batch
    requests expected to wait past it are refused as overloaded on arrival; without it
    none is, and every request still ends exactly once."""
    runs = []
    for extra in ([], ["--max-wait-s", "120"]):
        assert main(["simulate", "--scenario", "mixed", "--requests", "3000", "--json", *extra]) == 0
        (s,) = json_lines(capsys.readouterr().out)
        for c in s["classes"].values():
            assert c["completed"] + c["rejected"] == c["count"]
        runs.append(s)
    refused = [{k: c["rejected"] - c["expired"] for k, c in s["classes"].items()} for s in runs]
    assert not any(refused[0].values())
    assert refused[1]["P3"] > 0 and refused[1]["P0"] == 0


def test_policy_list_and_all(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--scenario", "chat-vs-batch", "--policy", "fifo, laneway,fifo", "--json"]) == 0
    assert [s["policy"] for s in json_lines(capsys.readouterr().out)] == ["fifo", "laneway"]
    assert main(["simulate", "--scenario", "chat-vs-batch", "--policy", "all", "--json", "--slots", "6"]) == 0
    got = capsys.readouterr()
    objs = json_lines(got.out)
    # naive, round-robin and least-loaded are placement baselines: "all" leaves them out
    # on plain slots, and says so
    baselines = ("naive", "round-robin", "least-loaded")
    assert [s["policy"] for s in objs] == [p for p in POLICIES if p not in baselines]
    assert "naive, round-robin, least-loaded left out" in got.err
    assert {s["slots"] for s in objs} == {6}


def test_default_output_is_a_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--scenario", "chat-vs-batch", "--policy", "priority,laneway"]) == 0
    out = capsys.readouterr().out
    for word in ("chat-vs-batch", "priority", "laneway", "P0", "P2", "utilization", "preemptions"):
        assert word in out


def table_cells(text: str) -> dict[tuple[str, str], list[str]]:
    """(policy, class) -> the cells of a row of the printed class table (the first table)."""
    rows: dict[tuple[str, str], list[str]] = {}
    policy = ""
    for line in text.splitlines():
        if line.startswith("└"):
            break  # the end of the class table
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if len(cells) > 2 and cells[1].startswith("P"):
            policy = cells[0] or policy
            rows[(policy, cells[1])] = cells[2:]
    return rows


def test_readme_headline_figures_are_in_the_default_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Why: one run, side by side", 1)[1].split("\n## ", 1)[0]
    assert "laneway simulate --scenario chat-vs-batch --policy fifo,laneway" in section
    quoted = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("| ") and cells[0] in ("fifo", "laneway"):
            quoted[cells[0]] = (cells[1].split()[0], cells[2].split()[0])
    assert set(quoted) == {"fifo", "laneway"}
    argv = ["simulate", "--scenario", "chat-vs-batch", "--policy", "fifo,laneway"]
    assert main([*argv, "--report", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "last done s" in out
    rows = table_cells(out)
    columns = [
        "count",
        "done",
        "rejected",
        "wait mean s",
        "p50",
        "p99",
        "max",
        "latency p99 s",
        "last done s",
    ]
    md = (tmp_path / "summary.md").read_text(encoding="utf-8")
    for policy, (p0_wait_p99, p2_last_done) in quoted.items():
        p0, p2 = (dict(zip(columns, rows[(policy, c)], strict=True)) for c in ("P0", "P2"))
        assert (p0["p99"], p2["last done s"]) == (p0_wait_p99, p2_last_done)
        assert f"| {policy} | P2 | 200 | 200 | 0 | 0 |" in md
        md_row = next(x for x in md.splitlines() if x.startswith(f"| {policy} | P2 |"))
        assert md_row.endswith(f"| {p2_last_done} |")  # summary.md has the column too


def test_trace_replay(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = write_trace(
        tmp_path,
        GOOD_LINE,
        '{"arrival_s": 1, "priority": 0, "duration_s": 3}',
        '{"arrival_s": 2, "priority": "P0", "duration_s": 2}',
    )
    assert main(["simulate", "--trace", str(trace), "--policy", "fifo", "--slots", "1", "--json"]) == 0
    (s,) = json_lines(capsys.readouterr().out)
    assert (s["scenario"], s["slots"], s["seed"], s["requests"]) == ("trace", 1, None, 3)
    assert s["classes"]["P0"]["wait_max_s"] == pytest.approx(6.0)
    assert main(["simulate", "--trace", str(trace), "--json"]) == 0
    (s,) = json_lines(capsys.readouterr().out)
    assert s["slots"] == 8
    assert s["classes"]["P0"]["wait_max_s"] == 0.0


def test_a_trace_of_epoch_times_runs_as_quickly_as_any(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Arrivals at Unix times ~3 years apart: the queue depth is sampled across the
    quiet stretches once, not every 5 s of them (it took minutes and gigabytes)."""
    trace = write_trace(
        tmp_path,
        '{"arrival_s": 1.7e9, "priority": 1, "duration_s": 1}',
        '{"arrival_s": 1.7e9, "priority": 3, "duration_s": 1e6}',
        '{"arrival_s": 1.8e9, "priority": 0, "duration_s": 2}',
    )
    started = time.monotonic()
    out_dir = tmp_path / "rep"
    assert main(["simulate", "--trace", str(trace), "--json", "--report", str(out_dir)]) == 0
    assert time.monotonic() - started < 60  # (generous: it takes well under a second)
    (s,) = json_lines(capsys.readouterr().out)
    assert [s["classes"][c]["completed"] for c in ("P0", "P1", "P3")] == [1, 1, 1]
    assert (out_dir / "queue_depth.png").stat().st_size > 0


def test_a_trace_written_with_a_byte_order_mark_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "bom.jsonl"
    trace.write_bytes("\ufeff".encode() + GOOD_LINE.encode() + b"\n")
    assert main(["simulate", "--trace", str(trace), "--json"]) == 0
    (s,) = json_lines(capsys.readouterr().out)
    assert s["requests"] == 1


def test_the_fewest_mixed_requests_asked_draw_some() -> None:
    from laneway.sim.scenarios import mixed

    assert all(mixed(seed, 10).requests for seed in range(20))


def test_mixed_requests(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--scenario", "mixed", "--requests", "300", "--seed", "3", "--json"]) == 0
    (s,) = json_lines(capsys.readouterr().out)
    assert s["seed"] == 3
    assert 0 < s["requests"] < 3000  # scaled down from the full scenario


def test_report_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_dir = tmp_path / "rep"
    argv = ["simulate", "--scenario", "chat-vs-batch", "--policy", "fifo,laneway", "--json"]
    assert main([*argv, "--report", str(out_dir)]) == 0
    captured = capsys.readouterr()
    assert len(json_lines(captured.out)) == 2  # stdout stays pure JSON
    assert "summary.md" in captured.err
    md = (out_dir / "summary.md").read_text(encoding="utf-8")
    assert "chat-vs-batch" in md and "| laneway | P0 |" in md
    for name in ("wait_cdf.png", "queue_depth.png"):
        data = (out_dir / name).read_bytes()
        assert len(data) > 1000 and data.startswith(PNG_MAGIC)


def test_gpu_mix_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_dir = tmp_path / "gpu"
    argv = ["simulate", "--scenario", "gpu-mix", "--policy", "naive,laneway", "--json"]
    assert main([*argv, "--report", str(out_dir)]) == 0
    captured = capsys.readouterr()
    objs = json_lines(captured.out)
    assert [s["policy"] for s in objs] == ["naive", "laneway"]
    for s in objs:
        assert s.keys() >= DESIGN_KEYS | {"gpu_utilization", "model_evictions"}
        assert s["model_loads"] > 0
        assert 0 < s["utilization"] <= 1
        assert list(s["gpu_utilization"]) == ["a0", "a1", "a2", "a3", "b0", "b1", "b2", "b3"]
    assert "gpu_timeline.png" in captured.err
    data = (out_dir / "gpu_timeline.png").read_bytes()
    assert len(data) > 1000 and data.startswith(PNG_MAGIC)
    assert "gpu_timeline.png" in (out_dir / "summary.md").read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("bad", "words"),
    [
        ('{"arrival_s": 1, "priority": 0}', "duration_s"),
        ('{"arrival_s": -1, "priority": 0, "duration_s": 1}', "arrival_s"),
        ('{"arrival_s": 1, "priority": "P9", "duration_s": 1}', "P9"),
        ('{"arrival_s": 1, "priority": 0, "output_tokens": 0}', "'output_tokens' must be > 0"),
        ('{"arrival_s": 1, "priority": "\u0663", "duration_s": 1}', "unknown priority"),
        ('{"arrival_s": 1, "priority": 0, "duration_s": 1', "not valid JSON"),
        # values past any real run (they looped until memory ran out)
        ('{"arrival_s": 1e17, "priority": 2, "duration_s": 1}', "'arrival_s' must be <= 1e+10"),
        ('{"arrival_s": 1, "priority": 2, "duration_s": 1e17}', "'duration_s' must be <= 1e+06"),
        ('{"arrival_s": 1, "priority": 2, "output_tokens": ' + "1" * 27 + "}", "'output_tokens' must be <="),
        ('{"arrival_s": 1, "priority": 2, "output_tokens": 1e9}', "'output_tokens' must be <= 1e+08"),
        ('{"arrival_s": 1, "priority": 2, "output_tokens": 1.5}', "'output_tokens' must be a whole number"),
        ("[" * 10_000 + "]" * 10_000, "nested too deep"),  # (a RecursionError traceback)
        ('{"arrival_s": 1, "priority": 0, "duration_s": 1, "duration_s": 9}', "'duration_s' is given twice"),
    ],
    ids=[
        "missing-field",
        "negative-arrival",
        "unknown-class",
        "no-output-tokens",
        "non-ascii-digit",
        "bad-json",
        "arrival-past-any-clock",
        "duration-of-centuries",
        "output-tokens-of-27-digits",
        "output-tokens-of-1e9",
        "output-tokens-not-whole",
        "nested",
        "key-twice",
    ],
)
def test_bad_trace_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], bad: str, words: str) -> None:
    trace = write_trace(tmp_path, GOOD_LINE, bad)
    line = error_line(capsys, ["simulate", "--trace", str(trace)])
    assert f"{trace}:2:" in line
    assert words in line


def test_a_duplicate_id_names_its_cause(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A line with no id gets ``r{line}``: where a line before named that id, the error says
    so, not that the line repeats an id it never gave."""
    named = GOOD_LINE.replace("{", '{"id": "r2", ', 1)
    trace = write_trace(tmp_path, named, GOOD_LINE)
    line = error_line(capsys, ["simulate", "--trace", str(trace)])
    assert line == f"laneway: error: {trace}:2: it names no id, and its default id 'r2' is taken by line 1"
    trace = write_trace(tmp_path, named, named)
    line = error_line(capsys, ["simulate", "--trace", str(trace)])
    assert line == f"laneway: error: {trace}:2: duplicate id 'r2' (first on line 1)"


def test_an_endless_line_is_not_read_to_its_end(capsys: pytest.CaptureFixture[str]) -> None:
    # (/dev/zero is one line without end: it was read until the memory ran out)
    line = error_line(capsys, ["simulate", "--trace", "/dev/zero"])
    assert line == "laneway: error: /dev/zero:1: a line over 1,048,576 characters: not a trace line"


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["simulate", "--scenario", "nope"], "unknown scenario 'nope'"),
        (["simulate", "--scenario", "mixed", "--policy", "fifo,bogus"], "unknown policy 'bogus'"),
        (
            ["simulate", "--scenario", "mixed", "--policy", "fifo,,laneway"],
            "an empty name in 'fifo,,laneway'",
        ),
        (["simulate", "--scenario", "mixed", "--policy", " , "], "no policy given"),
        (
            ["simulate", "--scenario", "mixed", "--report", ""],
            "--report: expected a path, got an empty string",
        ),
        (["serve", "--data-dir", " "], "--data-dir: expected a path, got an empty string"),
        (["simulate", "--trace", "examples/gpu-trace.jsonl", "--seed", "3"], "--seed: only with --scenario"),
        (
            ["simulate", "--scenario", "mixed", "--policy", "naive,laneway"],
            "naive would run as laneway itself here: naive places on GPUs and this run has no GPU fleet",
        ),
        (
            ["simulate", "--scenario", "gpu-mix", "--policy", "round-robin"],
            "round-robin would run as laneway itself here: round-robin spreads over upstreams with prefix",
        ),
        (["simulate", "--scenario", "mixed", "--slots", "0"], "--slots"),
        (["simulate", "--scenario", "mixed", "--slots", "two"], "--slots"),
        (["simulate", "--scenario", "mixed", "--slots", "9" * 20], "--slots: must be at most 100,000"),
        (["simulate", "--scenario", "mixed", "--requests", "99999999999999"], "--requests: must be at most"),
        # (fewer drew no request at all, and the run said so as a success)
        (["simulate", "--scenario", "mixed", "--requests", "2"], "--requests: must be at least 10"),
        (["simulate", "--trace", "t.jsonl", "--upstreams", "100000000"], "--upstreams: must be at most"),
        (["simulate", "--scenario", "mixed", "--seed", "1.5"], "--seed"),
        (["simulate", "--scenario", "mixed", "--hold-s", "-1"], "--hold-s"),
        (["simulate", "--scenario", "mixed", "--hold-s", "soon"], "--hold-s"),
        (["simulate", "--scenario", "chat-vs-batch", "--requests", "10"], "--requests"),
        (["simulate", "--trace", "/no/such/trace.jsonl"], "/no/such/trace.jsonl"),
        (["simulate"], "--scenario"),
        (["simulate", "--scenario", "mixed", "--trace", "x.jsonl"], "not allowed"),
        (["frobnicate"], "frobnicate"),
        # a misspelt option is named (not "--scenario is required"), with the closest one
        (["simulate", "--scenaro", "mixed"], "unknown option --scenaro (did you mean --scenario?)"),
        (["batch", "submit", "x.jsonl", "--wiat"], "unknown option --wiat (did you mean --wait?)"),
        (["serve", "--prot", "1"], "unknown option --prot (did you mean --port?)"),
        (["simulate", "--zzz", "--scenario", "mixed"], "unknown option --zzz"),
    ],
)
def test_usage_errors(capsys: pytest.CaptureFixture[str], argv: list[str], words: str) -> None:
    assert words in error_line(capsys, argv)


def test_report_path_that_is_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    trace = write_trace(tmp_path, GOOD_LINE)
    line = error_line(capsys, ["simulate", "--trace", str(trace), "--report", str(blocker / "sub")])
    assert str(blocker) in line and "--report" in line and "cannot make the folder" in line


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"laneway {__version__}"


def test_console_script(tmp_path: Path) -> None:
    script = Path(sys.executable).parent / "laneway"
    assert script.exists(), "the laneway console script is not installed next to this interpreter"
    trace = write_trace(tmp_path, GOOD_LINE, '{"arrival_s": 1, "priority": "P0", "duration_s": 1}')
    done = subprocess.run(
        [str(script), "simulate", "--trace", str(trace), "--policy", "fifo", "--slots", "1", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    s = json.loads(done.stdout)
    assert s["classes"]["P0"]["wait_max_s"] == pytest.approx(4.0)
    bad = subprocess.run(
        [str(script), "simulate", "--scenario", "nope"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 2
    assert bad.stderr.startswith("laneway: error: ") and "Traceback" not in bad.stderr


def test_a_reader_that_stops_early_is_no_error(tmp_path: Path) -> None:
    """``laneway simulate --json | head``: a reader that has what it wanted is no error."""
    script = Path(sys.executable).parent / "laneway"
    argv = [str(script), "simulate", "--scenario", "chat-vs-batch", "--policy", "all", "--json"]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()  # (gone before the first line: every write fails)
        err = proc.stderr.read()
        code = proc.wait(timeout=120)
    assert b"least-loaded left out" in err  # (it ran, and said what it says)
    assert b"error" not in err and b"Traceback" not in err and code in (0, 141), (code, err)


def test_bare_laneway_prints_its_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    out = capsys.readouterr().out
    assert out.startswith("usage: laneway") and "simulate" in out and "serve" in out and "batch" in out
