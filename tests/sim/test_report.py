"""Report figures on tiny traces whose waits can be worked out by hand."""

from __future__ import annotations

import io
import json
import statistics
from pathlib import Path

import pytest
from rich.console import Console

from contract import DESIGN_CLASS_KEYS, DESIGN_KEYS, PNG_MAGIC
from laneway.core import ClassTable, CostModel, SchedulerConfig
from laneway.core.inventory import Inventory
from laneway.sim.plots import definitions, summary_markdown, write_report
from laneway.sim.report import capacity, details, estimate_errors, merge_intervals, percentile, summarize
from laneway.sim.scenarios import gpu_mix
from laneway.sim.simulation import SimResult, simulate
from laneway.sim.tables import print_summaries, render_gpus, render_rejections, render_table, render_totals
from laneway.sim.workload import SimRequest, parse_trace


def run(lines: list[str], policy: str, slots: int = 1, config: SchedulerConfig | None = None) -> SimResult:
    requests = parse_trace(lines, ClassTable())
    return simulate(requests, slots=slots, policy=policy, config=config, scenario="hand", seed=7)


def test_a_whole_number_written_as_a_float_is_that_number() -> None:
    (req,) = parse_trace(['{"arrival_s": 0, "priority": 0, "output_tokens": 1e2}'], ClassTable())
    assert req.output_tokens == 100 and isinstance(req.output_tokens, int)


FIFO_TRACE = [
    '{"id": "a", "arrival_s": 0, "priority": "P3", "duration_s": 5}',
    '{"id": "b", "arrival_s": 1, "priority": "P0", "duration_s": 3}',
    '{"id": "c", "arrival_s": 2, "priority": "P0", "duration_s": 2}',
]


@pytest.mark.parametrize(
    ("values", "p", "expected"),
    [
        ([15, 20, 35, 40, 50], 5, 15),
        ([15, 20, 35, 40, 50], 30, 20),
        ([15, 20, 35, 40, 50], 40, 20),
        ([15, 20, 35, 40, 50], 50, 35),
        ([15, 20, 35, 40, 50], 100, 50),
        ([3, 1, 2], 0, 1),
        ([7.5], 99, 7.5),
        ([], 50, None),
    ],
)
def test_percentile_nearest_rank(values: list[float], p: float, expected: float | None) -> None:
    assert percentile(values, p) == expected


def test_percentile_rejects_out_of_range() -> None:
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_fifo_waits_by_hand() -> None:
    # one slot, served in arrival order: a 0–5, b 5–8, c 8–10
    s = summarize(run(FIFO_TRACE, "fifo"))
    p0, p3 = s["classes"]["P0"], s["classes"]["P3"]
    assert p3["count"] == p3["completed"] == 1
    assert p3["wait_max_s"] == 0.0
    assert p3["latency_p99_s"] == 5.0
    assert p3["makespan_s"] == 5.0
    assert (p0["count"], p0["completed"], p0["rejected"], p0["expired"]) == (2, 2, 0, 0)
    assert p0["wait_mean_s"] == pytest.approx(5.0)  # waits 4 and 6
    assert p0["wait_p50_s"] == pytest.approx(4.0)
    assert p0["wait_p95_s"] == p0["wait_p99_s"] == p0["wait_max_s"] == pytest.approx(6.0)
    assert p0["latency_p99_s"] == pytest.approx(8.0)  # c: 2 -> 10
    assert p0["makespan_s"] == pytest.approx(10.0)
    assert s["makespan_s"] == pytest.approx(10.0)
    assert s["utilization"] == pytest.approx(1.0)
    assert s["preemptions"] == 0
    assert (s["policy"], s["scenario"], s["slots"], s["seed"], s["requests"]) == ("fifo", "hand", 1, 7, 3)


def test_empty_classes_have_null_figures() -> None:
    s = summarize(run(FIFO_TRACE, "fifo"))
    for name in ("P1", "P2"):
        figures = s["classes"][name]
        assert (figures["count"], figures["completed"], figures["rejected"]) == (0, 0, 0)
        for key in ("wait_mean_s", "wait_p50_s", "wait_p99_s", "wait_max_s", "latency_p99_s", "makespan_s"):
            assert figures[key] is None


def test_p0_behind_p3_waits_for_the_checkpoint_save() -> None:
    lines = [
        '{"id": "bulk", "arrival_s": 0, "priority": "P3", "duration_s": 100,'
        ' "prompt_tokens": 1000, "output_tokens": 3000}',
        '{"id": "chat", "arrival_s": 10, "priority": "P0", "duration_s": 1, "prompt_tokens": 200}',
    ]
    result = run(lines, "laneway")
    s = summarize(result)
    costs = CostModel()
    held = costs.tokens_held(1000, costs.generated_in(10.0))
    save, restore = costs.save_s(held), costs.restore_s(held)
    p0, p3 = s["classes"]["P0"], s["classes"]["P3"]
    assert p0["wait_max_s"] == pytest.approx(save)
    assert p0["latency_p99_s"] == pytest.approx(save + 1.0)
    assert p3["wait_max_s"] == pytest.approx(1.0)  # requeued while the chat request runs
    assert p3["makespan_s"] == pytest.approx(101.0 + save + restore)
    assert (s["preemptions"], p3["preemptions"], p0["preemptions"]) == (1, 1, 0)
    assert s["utilization"] == pytest.approx(1.0)


def test_rejected_and_expired() -> None:
    lines = [
        '{"id": "long", "arrival_s": 0, "priority": "P2", "duration_s": 100}',
        '{"id": "chat", "arrival_s": 1, "priority": "P0", "duration_s": 1, "timeout_s": 5}',
        '{"id": "late", "arrival_s": 2, "priority": "P3", "duration_s": 1}',
    ]
    result = run(lines, "priority", config=SchedulerConfig(max_queued_total=1))
    s = summarize(result)
    p0, p2, p3 = (s["classes"][n] for n in ("P0", "P2", "P3"))
    assert (p0["count"], p0["completed"], p0["rejected"], p0["expired"]) == (1, 0, 1, 1)
    assert (p3["count"], p3["completed"], p3["rejected"], p3["expired"]) == (1, 0, 1, 0)
    assert (p2["completed"], p2["rejected"]) == (1, 0)
    assert p0["wait_mean_s"] is None and p0["latency_p99_s"] is None
    assert s["expired"] == 1
    assert s["makespan_s"] == pytest.approx(100.0)


def test_estimate_error_median() -> None:
    result = run(FIFO_TRACE, "fifo")
    s = summarize(result)
    by_id = {o.spec.id: o for o in result.outcomes}
    assert by_id["a"].estimate_s == 0.0  # a free slot: no wait predicted, none happened
    expected = [abs(by_id[r].estimate_s - w) / max(w, 1.0) for r, w in (("a", 0.0), ("b", 4.0), ("c", 6.0))]
    assert estimate_errors(result.outcomes) == pytest.approx(expected)
    assert s["estimate_error_median"] == pytest.approx(statistics.median(expected))


def test_json_object_has_every_design_key() -> None:
    s = summarize(run(FIFO_TRACE, "laneway"))
    assert s.keys() >= DESIGN_KEYS
    assert {"slots", "seed", "requests", "drains", "expired"} <= s.keys()
    assert list(s["classes"]) == ["P0", "P1", "P2", "P3"]
    for figures in s["classes"].values():
        assert DESIGN_CLASS_KEYS | {"expired", "makespan_s", "preemptions"} <= figures.keys()
    assert s["model_loads"] == 0
    assert json.loads(json.dumps(s, allow_nan=False)) == s


EXPIRING_TRACE = [
    '{"id": "long", "arrival_s": 0, "priority": "P3", "duration_s": 100, "preemptible": false}',
    '{"id": "x", "arrival_s": 1, "priority": "P0", "duration_s": 1, "timeout_s": 5}',
    '{"id": "y", "arrival_s": 2, "priority": "P1", "duration_s": 1, "timeout_s": 5}',
    '{"id": "z", "arrival_s": 3, "priority": "P1", "duration_s": 1, "timeout_s": 5}',
]


def test_details_capacity_and_rejection_reasons() -> None:
    result = run(EXPIRING_TRACE, "laneway")
    s = summarize(result)
    assert [s["classes"][c]["rejected"] for c in ("P0", "P1", "P3")] == [1, 2, 0]
    assert details(result) == {
        "capacity": "1 slot",
        "rejections": {"P0": {"queue_timeout": 1}, "P1": {"queue_timeout": 2}},
    }
    assert "capacity" not in s and "rejections" not in s  # the --json object stays as it was
    assert capacity(run(FIFO_TRACE, "fifo", slots=4)) == "4 slots"
    requests = [SimRequest("a", 0.0, 2, 5.0, model="m"), SimRequest("b", 1.0, 0, 5.0, model="other")]
    gpu = gpu_run(2, ONE_SLOT, requests)
    assert details(gpu) == {"capacity": "2 GPUs in 1 node, 1 model", "rejections": {"P0": {"unplaceable": 1}}}


def test_rejections_table_and_summary_md(tmp_path: Path) -> None:
    results = [run(EXPIRING_TRACE, "laneway"), run(FIFO_TRACE, "fifo")]
    shown = [{**summarize(r), **details(r)} for r in results]
    out = io.StringIO()
    print_summaries(shown, Console(file=out, width=160))
    text = out.getvalue()
    assert text.splitlines()[0].rstrip() == "scenario hand: 4 requests, 1 slot, seed 7"
    assert "Rejections by reason" in text and "queue_timeout" in text
    table = render_rejections(shown)
    assert table is not None and [c.header for c in table.columns] == ["policy", "class", "queue_timeout"]
    assert render_rejections(shown[1:]) is None  # fifo rejected nothing
    assert render_rejections([summarize(r) for r in results]) is None  # no details: no table
    write_report(results, [summarize(r) for r in results], tmp_path)
    md = (tmp_path / "summary.md").read_text(encoding="utf-8")
    section = md.split("## Rejections by reason\n\n", 1)[1].split("\n\n", 1)[0]
    assert section.splitlines() == [
        "| policy | class | queue_timeout |",
        "| --- | --- | ---: |",
        "| laneway | P0 | 1 |",
        "| laneway | P1 | 2 |",
    ]


def test_render_table_shows_policies_and_classes() -> None:
    summaries = [summarize(run(FIFO_TRACE, p)) for p in ("fifo", "laneway")]
    out = io.StringIO()
    console = Console(file=out, width=140)
    console.print(render_table(summaries))
    text = out.getvalue()
    for word in ("fifo", "laneway", "P0", "P3", "6.00", "8.00"):
        assert word in text
    out.truncate(0)
    print_summaries(summaries, console)
    assert "utilization" in out.getvalue() and "100.0%" in out.getvalue()


def test_write_report(tmp_path: Path) -> None:
    results = [run(FIFO_TRACE, p) for p in ("fifo", "laneway")]
    summaries = [summarize(r) for r in results]
    paths = write_report(results, summaries, tmp_path / "out", "three requests")
    assert [p.name for p in paths] == ["summary.md", "wait_cdf.png", "queue_depth.png"]  # (no tenants)
    for p in paths[1:]:
        assert p.read_bytes().startswith(PNG_MAGIC)
    md = paths[0].read_text(encoding="utf-8")
    assert md == summary_markdown(summaries, "three requests")
    # ... latency p99 8.00, last done 10.0 (c ends at 10)
    assert "| fifo | P0 | 2 | 2 | 0 | 0 | 5.00 | 4.00 | 6.00 | 6.00 | 6.00 | 8.00 | 10.0 |" in md
    assert "| fifo | P3 | 1 | 1 | 0 | 0 | 0.00 | 0.00 | 0.00 | 0.00 | 0.00 | 5.00 | 5.00 |" in md
    assert "- slots: 1" in md and "- seed: 7" in md and "three requests" in md
    assert "Rejections by reason" not in md  # nothing was rejected
    assert len(definitions()) == 9
    assert all(item.split(":")[0] in md for item in definitions())


def test_a_report_of_two_tenants_shows_them_apart(tmp_path: Path) -> None:
    """``big`` floods one slot at t=0; ``small``'s one request comes at t=1. Token-fair, it runs
    next (waits 1 s: until the running one ends); first come first served, after all of big's."""
    trace = [
        *(
            f'{{"id": "b{i}", "arrival_s": 0, "priority": "P2", "duration_s": 2, "tenant": "big"}}'
            for i in range(5)
        ),
        '{"id": "s", "arrival_s": 1, "priority": "P2", "duration_s": 2, "tenant": "small"}',
    ]
    fair = run(trace, "laneway")
    fifo = run(trace, "laneway", config=SchedulerConfig(fair_tenants=False))
    waits = {r.scheduler.cfg.fair_tenants: {o.spec.id: o.wait_s for o in r.outcomes} for r in (fair, fifo)}
    assert waits[True]["s"] == 1.0 and waits[False]["s"] == 9.0
    results = [fair, fifo]
    summaries = [summarize(r) for r in results]
    paths = write_report(results, summaries, tmp_path / "out")
    assert [p.name for p in paths] == ["summary.md", "wait_cdf.png", "queue_depth.png", "tenant_waits.png"]
    assert paths[3].read_bytes().startswith(PNG_MAGIC) and paths[3].stat().st_size > 10_000
    md = paths[0].read_text(encoding="utf-8")
    assert "![wait-time CDF per tenant](tenant_waits.png)" in md
    # (the terminal's "Per tenant" table, in summary.md too: it was left out)
    assert "## Per tenant" in md and "| laneway | small | 1 | 1 |" in md
    waited = md.split("## Wait estimates")[1].split("\n\n")[1]
    assert "| in interval | not known |" in waited.splitlines()[0]


def test_a_tenants_service_counts_requests_sized_by_their_tokens() -> None:
    """A tenant's "service s" is the slot time its requests held: one sized by its tokens
    (no ``duration_s``) counts too (it was 0)."""
    trace = [
        '{"id": "d", "arrival_s": 0, "priority": "P2", "duration_s": 2, "tenant": "t"}',
        '{"id": "k", "arrival_s": 0, "priority": "P2", "output_tokens": 100, "tenant": "u"}',
    ]
    result = run(trace, "laneway", slots=2)
    tenants = summarize(result)["tenants"]
    assert tenants["t"]["service_s"] == pytest.approx(2.0)
    k = next(o for o in result.outcomes if o.spec.id == "k")
    service = tenants["u"]["service_s"]
    assert service == pytest.approx(k.latency_s - k.wait_s) and service > 0.5


# --------------------------------------------------------------------------- GPU runs


def gpu_run(
    gpus: int, models: dict[str, dict], requests: list[SimRequest], policy: str = "laneway"
) -> SimResult:
    inv = Inventory.from_dict(
        {
            "nodes": {"n": {"gpus": [{"id": f"g{i}", "vram_gb": 40} for i in range(gpus)]}},
            "models": models,
        }
    )
    return simulate(requests, slots=gpus, policy=policy, scenario="hand", seed=7, inventory=inv)


ONE_SLOT = {"m": {"vram_gb": 30, "load_s": 10, "slots": 1}}


def test_merge_intervals() -> None:
    assert merge_intervals([(5, 6), (0, 2), (1, 3), (3, 4), (10, 11), (10, 10.5)]) == [
        (0, 4),
        (5, 6),
        (10, 11),
    ]
    assert merge_intervals([]) == []


@pytest.mark.parametrize("policy", ["laneway", "naive"])
def test_gpu_utilization_counts_loads(policy: str) -> None:
    # a: load on g0 0–10, runs 10–30; b arrives at 5 while the only replica is
    # loading for a: a second load on g1 5–15, runs 15–20. Makespan 30:
    # g0 busy 30/30, g1 busy 15/30 (10 s loading + 5 s running)
    requests = [SimRequest("a", 0.0, 2, 20.0, model="m"), SimRequest("b", 5.0, 2, 5.0, model="m")]
    s = summarize(gpu_run(2, ONE_SLOT, requests, policy))
    assert s["makespan_s"] == pytest.approx(30.0)
    assert s["gpu_utilization"] == pytest.approx({"g0": 1.0, "g1": 0.5})
    assert s["utilization"] == pytest.approx(0.75)
    assert (s["model_loads"], s["model_evictions"]) == (2, 0)


def test_gpu_utilization_counts_concurrent_runs_once() -> None:
    # a 2-slot replica loads on g0 0–10, then runs a (10–30) and b (10–15) at
    # once: g0 is busy 30 of 30 s (not 10 + 20 + 5), g1 never is
    models = {"m": {"vram_gb": 30, "load_s": 10, "slots": 2}}
    requests = [SimRequest("a", 0.0, 2, 20.0, model="m"), SimRequest("b", 5.0, 2, 5.0, model="m")]
    s = summarize(gpu_run(2, models, requests))
    assert s["gpu_utilization"] == pytest.approx({"g0": 1.0, "g1": 0.0})
    assert s["utilization"] == pytest.approx(0.5)
    assert s["model_loads"] == 1


def test_gpu_eviction_and_idle_gap() -> None:
    # one 40 GB GPU, two 30 GB models: m1 loads 0–10 and runs a 10–15; b for m2
    # arrives at 20, m1 is evicted, m2 loads 20–30 and runs b 30–35; the GPU is
    # idle 15–20: busy 30 of 35 s
    models = {"m1": ONE_SLOT["m"], "m2": ONE_SLOT["m"]}
    requests = [SimRequest("a", 0.0, 2, 5.0, model="m1"), SimRequest("b", 20.0, 2, 5.0, model="m2")]
    result = gpu_run(1, models, requests)
    s = summarize(result)
    assert s["makespan_s"] == pytest.approx(35.0)
    assert s["utilization"] == pytest.approx(30 / 35)
    assert (s["model_loads"], s["model_evictions"]) == (2, 1)
    assert [e[0] for e in result.timeline].count("evict") == 1


def test_gpu_json_keys() -> None:
    requests = [SimRequest("a", 0.0, 2, 20.0, model="m"), SimRequest("b", 5.0, 2, 5.0, model="m")]
    s = summarize(gpu_run(2, ONE_SLOT, requests))
    assert s.keys() >= DESIGN_KEYS | {"gpu_utilization", "model_evictions"}
    assert list(s["gpu_utilization"]) == ["g0", "g1"]  # configuration order
    assert json.loads(json.dumps(s, allow_nan=False)) == s
    slot_run = summarize(run(FIFO_TRACE, "laneway"))
    assert not slot_run.keys() & {"gpu_utilization", "model_evictions"}


def test_totals_show_loads_and_gpus() -> None:
    requests = [SimRequest("a", 0.0, 2, 20.0, model="m"), SimRequest("b", 5.0, 2, 5.0, model="m")]
    out = io.StringIO()
    console = Console(file=out, width=160)
    print_summaries([summarize(run(FIFO_TRACE, "fifo"))], console)
    text = out.getvalue()
    assert "loads" in text and "evictions" not in text and "GPU utilization" not in text
    out.truncate(0)
    out.seek(0)
    summaries = [summarize(gpu_run(2, ONE_SLOT, requests, p)) for p in ("naive", "laneway")]
    console.print(render_totals(summaries))
    table = render_gpus(summaries)
    assert table is not None
    console.print(table)
    text = out.getvalue()
    for word in ("loads", "evictions", "75.0%", "GPU utilization", "g0", "g1", "100.0%", "50.0%"):
        assert word in text


def test_write_report_gpu_timeline(tmp_path: Path) -> None:
    sc = gpu_mix(0, hours=0.1)
    results = [
        simulate(sc.requests, slots=sc.slots, policy=p, scenario=sc.name, inventory=sc.inventory)
        for p in ("naive", "laneway")
    ]
    summaries = [summarize(r) for r in results]
    paths = write_report(results, summaries, tmp_path, sc.description)
    assert [p.name for p in paths] == ["summary.md", "wait_cdf.png", "queue_depth.png", "gpu_timeline.png"]
    assert paths[-1].read_bytes().startswith(PNG_MAGIC)
    md = paths[0].read_text(encoding="utf-8")
    assert "![GPU timeline](gpu_timeline.png)" in md and "## GPU utilization" in md
    assert "model evictions" in md
    assert "- fleet: 8 GPUs in 2 nodes, 3 models\n- GPUs: a0, a1, a2, a3, b0, b1, b2, b3\n" in md
    assert "- slots:" not in md


def test_tables_are_whole_at_80_columns() -> None:
    """On an 80-column terminal a table too wide is split by columns: no figure is cut."""
    import io

    from rich.console import Console

    from laneway.sim.report import details, summarize
    from laneway.sim.scenarios import scenario
    from laneway.sim.simulation import simulate
    from laneway.sim.tables import print_summaries

    sc = scenario("support-desk")
    runs = [simulate(sc.requests, slots=sc.slots, policy=p) for p in ("fifo", "laneway")]
    summaries = [{**summarize(r), **details(r)} for r in runs]
    out = io.StringIO()
    print_summaries(summaries, Console(width=80, file=out))
    text = out.getvalue()
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "…" not in text
    for s in summaries:  # every class's last completion is there, whole
        for figures in s["classes"].values():
            assert f"{figures['makespan_s']:,.0f}" in text
    wide = io.StringIO()
    print_summaries(summaries, Console(width=160, file=wide))
    assert wide.getvalue().count("┏") < text.count("┏")  # split only where it had to


def test_identical_curves_are_named_so() -> None:
    from laneway.sim.plots import twins

    waits = {"fifo": [[1.0, 2.0]], "priority": [[0.5]], "graceful": [[0.5]], "x": [[0.5]], "y": [[3.0]]}
    assert twins(waits) == {"graceful": "priority", "x": "priority"}
    assert twins({"a": [[1.0]], "b": [[2.0]]}) == {}
