"""The ``laneway`` command line.

``laneway serve [--config FILE] [--host H] [--port P] [--model SPEC] [--slots N]
[--data-dir DIR] [--insecure]`` (see :mod:`laneway.serve`)

``laneway batch submit|status|results ...`` (see :mod:`laneway.batch.cli`)

``laneway simulate (--scenario NAME | --trace FILE.jsonl) [--policy NAME[,NAME...]|all]
[--slots N] [--upstreams N [--kv-tokens N]] [--isolate] [--seed N] [--requests N] [--hold-s S]
[--no-fair-tenants] [--no-prefill-guard] [--json] [--report DIR]``

Errors the user can fix (bad trace line, unknown scenario or policy, missing
file, bad numbers) print one line, ``laneway: error: ...``, and exit with 2.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn

from rich.console import Console

from laneway import __version__
from laneway.arguments import path, seconds_up_to, up_to, whole
from laneway.batch.cli import BatchCliError
from laneway.batch.cli import add_arguments as add_batch_arguments
from laneway.config.parse import read_toml
from laneway.config.workers import MAX_SLOTS
from laneway.core import POLICIES, ClassTable, ConfigError, LanewayError, SchedulerConfig, WorkerSpec
from laneway.core.config import MAX_HOLD_S, MAX_WAIT_S
from laneway.core.gpu_placement import GpuPlacement
from laneway.core.inventory import Inventory
from laneway.core.policies import compared
from laneway.serve import ServeError, Stopped, cmd_serve
from laneway.serve import add_arguments as add_serve_arguments
from laneway.sim.agents import AGENT_KV_TOKENS
from laneway.sim.report import details, summarize
from laneway.sim.scenarios import SCENARIOS, Scenario, scenario
from laneway.sim.simulation import SimResult, simulate
from laneway.sim.tables import print_summaries
from laneway.sim.workload import load_trace, unserved

TRACE_SLOTS = 8  # slots for trace replay unless --slots says otherwise
# the largest runs `simulate` takes (each well within a few GB of memory; slots as a server's worker)
MAX_UPSTREAMS = 10_000
MAX_REQUESTS = 1_000_000
USAGE_ERROR = 2


class UsageError(Exception):
    """A command-line mistake: reported as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="laneway", description="Priority scheduling for LLM inference.")
    parser.add_argument("--version", action="version", version=f"laneway {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True
    sim = commands.add_parser(
        "simulate",
        help="replay a built-in scenario or a JSONL trace under one or more policies",
        description="Replay a workload on simulated slots and report per-class waits.",
    )
    source = sim.add_mutually_exclusive_group(required=True)
    source.add_argument("--scenario", metavar="NAME", help=f"built-in workload: {', '.join(SCENARIOS)}")
    source.add_argument("--trace", metavar="FILE", type=path, help="JSONL trace, one request per line")
    sim.add_argument(
        "--policy",
        default="laneway",
        metavar="NAME",
        help=f"policy, comma-separated list, or 'all' ({', '.join(POLICIES)}); default: laneway",
    )
    sim.add_argument(
        "--slots",
        type=up_to(MAX_SLOTS),
        metavar="N",
        help=f"slots (default: the scenario's own; {TRACE_SLOTS} for a trace; with --upstreams, of each: 8)",
    )
    sim.add_argument(
        "--upstreams",
        type=up_to(MAX_UPSTREAMS),
        metavar="N",
        help="a trace runs on N upstreams whose engines keep a prefix cache (its lines' prefix, reply)",
    )
    sim.add_argument(
        "--kv-tokens",
        type=up_to(10**10),
        metavar="N",
        help=f"with --upstreams: each engine's KV space in tokens (default {AGENT_KV_TOKENS:,})",
    )
    sim.add_argument("--seed", type=whole, metavar="N", help="scenario seed (default 0)")
    sim.add_argument(
        "--requests",
        type=up_to(MAX_REQUESTS, 10, " (arrivals drawn at rates for about N: fewer may draw none)"),
        metavar="N",
        help="mixed scenario only: about N requests",
    )
    sim.add_argument(
        "--fleet",
        metavar="FILE",
        type=path,
        help="TOML file of GPU nodes and models: a trace runs on that fleet instead of --slots",
    )
    for flag, said in (  # (switches)
        ("--isolate", "the upstreams run urgent work alone (isolate): the agents scenario, --upstreams"),
        ("--no-fair-tenants", "FIFO by arrival inside a class (default: tenants share a class by tokens)"),
        ("--no-prefill-guard", "an urgent long prefill may run beside others ([scheduler] prefill_guard)"),
    ):
        sim.add_argument(flag, action="store_true", help=said)
    sim.add_argument(
        "--hold-s",
        type=seconds_up_to(MAX_HOLD_S),
        default=0.0,
        metavar="S",
        help="keep a P0/P1 request's slot S seconds for its class's next request, from the work "
        "it would preempt (default 0; laneway serve's default is 0.25)",
    )
    sim.add_argument(
        "--max-wait-s",
        type=seconds_up_to(MAX_WAIT_S, positive=True),
        metavar="S",
        help="refuse at once (overloaded) an arrival expected to wait past its class's queue timeout, "
        "else past S seconds (default: none; laneway serve's default is 120)",
    )
    sim.add_argument("--json", action="store_true", help="print one JSON object per policy, one per line")
    sim.add_argument("--report", type=path, metavar="DIR", help="write summary.md and PNG charts to DIR")
    sim.set_defaults(run=cmd_simulate)
    serve = commands.add_parser(
        "serve",
        help="run the OpenAI-compatible gateway",
        description="Serve the OpenAI API with priority lanes in front of the configured workers.",
    )
    add_serve_arguments(serve)
    serve.set_defaults(run=cmd_serve)
    batch = commands.add_parser(
        "batch",
        help="submit batches to a running server and follow them (the Batch API)",
        description="Client commands for the OpenAI Batch API of a running laneway server.",
    )
    add_batch_arguments(batch, _Parser)
    cluster = commands.add_parser(
        "cluster",
        help="ask a cluster's Redis who leads, or go on after Redis lost laneway's data",
        description="Operator commands for replicas that share state in Redis ([cluster]).",
    )
    from laneway.cluster.cli import add_arguments as add_cluster_arguments

    add_cluster_arguments(cluster, _Parser)
    return parser


def parse_policies(text: str, gpus: bool = False, caches: bool = False) -> list[str]:
    """``all`` is every policy; ``naive`` (a GPU-placement baseline) only on GPU runs,
    ``round-robin`` and ``least-loaded`` (spread baselines) only on upstreams with caches."""
    names = [p.strip() for p in text.split(",")]
    if not any(names):
        raise UsageError("argument --policy: no policy given")
    if not all(names):
        raise UsageError(f"argument --policy: an empty name in {text!r} (names are separated by one comma)")
    if names == ["all"]:
        return [p for p in POLICIES if compared(p, gpus=gpus, caches=caches)]
    out: list[str] = []
    for name in names:
        if name not in POLICIES:
            raise UsageError(f"unknown policy {name!r}: choose from {', '.join(POLICIES)} or 'all'")
        if not compared(name, gpus=gpus, caches=caches):  # (its row would be laneway's, named so)
            raise UsageError(f"argument --policy: {name} would run as laneway itself here: {_same_why(name)}")
        if name not in out:
            out.append(name)
    return out


def _same_why(name: str) -> str:
    """Why baseline ``name`` is laneway on a run that lacks what it compares."""
    if name == "naive":
        return "naive places on GPUs and this run has no GPU fleet"
    return f"{name} spreads over upstreams with prefix caches and this run has none"


def load_fleet(path: Path) -> Inventory:
    """A GPU fleet from TOML: ``[nodes.NAME]`` with ``gpus = [{id, vram_gb,
    kv_reserve_gb, reserved_for}, ...]``, ``[models.NAME]`` with ``vram_gb,
    gpus, load_s, slots``, and ``preload = [...]``; errors name the key."""
    data = read_toml(path)  # (its errors name the file)
    try:
        inventory = Inventory.from_dict(data)
        # as laneway serve refuses them: a model no GPU group can hold for any class
        errors = [
            f"models.{name}: {inventory.never(name, 0)}"
            for name in inventory.models
            if all(inventory.never(name, c) for c in range(len(ClassTable().names)))
        ]
        if errors:
            raise ConfigError("\n".join(errors))
        GpuPlacement(inventory)  # (its preloads placed: each must fit next to those before it)
    except ConfigError as exc:  # (a line per mistake)
        raise UsageError("\n".join(f"{path}: {line}" for line in str(exc).splitlines())) from None
    return inventory


def load_workload(args: argparse.Namespace) -> Scenario:
    """The workload of --scenario or --trace (a trace runs on --slots slots), its upstreams
    isolated with --isolate."""
    sc = _workload(args)
    if args.isolate:
        if sc.workers is None:
            raise UsageError(
                "argument --isolate: only on upstreams (the agents scenario, or a trace with --upstreams)"
            )
        sc = replace(
            sc,
            workers=tuple(replace(w, isolate=True) for w in sc.workers),
            description=f"{sc.description or sc.name}, each running urgent work alone (isolate)",
        )
    return sc


def _workload(args: argparse.Namespace) -> Scenario:
    """The scenario or trace the arguments name, on the capacity they give."""
    if args.kv_tokens is not None and args.upstreams is None:
        raise UsageError("argument --kv-tokens: only with --upstreams")
    if args.trace is not None:
        if args.requests is not None:
            raise UsageError("argument --requests: only for --scenario mixed")
        if args.seed is not None:
            raise UsageError("argument --seed: only with --scenario (a trace is replayed as it is written)")
        if args.upstreams is not None:
            if args.fleet is not None:
                raise UsageError("argument --upstreams: not with --fleet (the fleet sets the capacity)")
            slots, kv = args.slots or 8, args.kv_tokens or AGENT_KV_TOKENS
            workers = tuple(WorkerSpec(f"u{i}", slots, kv_tokens=kv) for i in range(args.upstreams))
            requests = load_trace(args.trace, ClassTable())
            where = f"{args.upstreams} upstreams of {slots} slots with prefix caches of {kv:,} tokens"
            return Scenario(
                "trace",
                requests,
                slots * args.upstreams,
                f"trace {args.trace} on {where}",
                workers=workers,
                caches=True,
            )
        if args.fleet is not None:
            if args.slots is not None:
                raise UsageError("argument --slots: not with --fleet (the fleet sets the capacity)")
            fleet = load_fleet(args.fleet)
            requests = load_trace(args.trace, ClassTable(), models=tuple(fleet.models))
            note = unserved(requests, fleet.models)
            if note is not None:
                print(f"laneway: {args.trace}: {note}", file=sys.stderr)
            return Scenario("trace", requests, len(fleet.gpus), f"trace {args.trace} on {args.fleet}", fleet)
        requests = load_trace(args.trace, ClassTable())
        return Scenario("trace", requests, args.slots or TRACE_SLOTS, f"trace {args.trace}")
    if args.fleet is not None:
        raise UsageError("argument --fleet: only with --trace (scenarios bring their own capacity)")
    if args.upstreams is not None:
        raise UsageError("argument --upstreams: only with --trace (scenarios bring their own capacity)")
    if args.scenario not in SCENARIOS:
        raise UsageError(f"unknown scenario {args.scenario!r}: choose from {', '.join(SCENARIOS)}")
    params: dict[str, int] = {}
    if args.requests is not None:
        if args.scenario != "mixed":
            raise UsageError("argument --requests: only for --scenario mixed")
        params["requests"] = args.requests
    seed = 0 if args.seed is None else args.seed
    sc = scenario(args.scenario, seed, **params)
    if args.slots is not None:
        if sc.inventory is not None:
            raise UsageError(f"argument --slots: scenario {sc.name} runs on its own GPU fleet")
        if sc.workers is not None:
            raise UsageError(f"argument --slots: scenario {sc.name} runs on its own upstreams")
        sc = replace(sc, slots=args.slots)
    return sc


def run_policies(
    policies: Sequence[str], sc: Scenario, seed: int | None, config: SchedulerConfig | None = None
) -> list[SimResult]:
    err = Console(stderr=True)
    show = sys.stderr.isatty()
    results = []
    for i, policy in enumerate(policies, start=1):
        label = f"simulating {sc.name} ({len(sc.requests)} requests) under {policy} [{i}/{len(policies)}]"

        def run(policy: str = policy) -> SimResult:
            return simulate(
                sc.requests,
                slots=sc.slots,
                policy=policy,
                scenario=sc.name,
                seed=seed,
                inventory=sc.inventory,
                config=config,
                workers=sc.workers,
                caches=sc.caches,
            )

        if show:
            with err.status(label):
                results.append(run())
        else:
            results.append(run())
    return results


def cmd_simulate(args: argparse.Namespace) -> int:
    sc = load_workload(args)
    policies = parse_policies(args.policy, gpus=sc.inventory is not None, caches=sc.caches)
    if args.policy.strip() == "all":
        left = [p for p in POLICIES if p not in policies]
        if left:
            why = "; ".join(_same_why(p) for p in left)
            print(
                f"laneway: {', '.join(left)} left out, as each would run as laneway itself here ({why})",
                file=sys.stderr,
            )
    if args.isolate and "fifo" in policies:  # (as laneway serve says at start)
        print("laneway: isolate does nothing under policy fifo (one queue, no classes)", file=sys.stderr)
    description = sc.description
    if args.report is not None:
        try:  # fail before simulating, not after
            args.report.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(
                f"--report {args.report}: cannot make the folder: {exc.strerror or exc}"
            ) from None
    seed = None if args.trace is not None else (0 if args.seed is None else args.seed)
    config = SchedulerConfig(
        fair_tenants=not args.no_fair_tenants,
        hold_s=args.hold_s,
        max_wait_s=args.max_wait_s,
        prefill_guard=not args.no_prefill_guard,
    )
    results = run_policies(policies, sc, seed, config)
    summaries = [summarize(r) for r in results]
    if args.json:
        for s in summaries:
            print(json.dumps(s, allow_nan=False))
    else:
        console = Console()
        if not console.is_terminal:
            console = Console(width=120)
        print_summaries([{**s, **details(r)} for s, r in zip(summaries, results, strict=True)], console)
    if args.report is not None:
        from laneway.sim.plots import write_report  # matplotlib is slow to import: only when asked

        paths = write_report(results, summaries, args.report, description)
        note = "report: " + ", ".join(str(p) for p in paths)
        print(note, file=sys.stderr if args.json else sys.stdout)
    return 0


def _fail(message: str) -> int:
    for line in message.splitlines() or [""]:  # (a line per mistake: a fleet's configuration)
        print(f"laneway: error: {line}", file=sys.stderr)
    return USAGE_ERROR


def unknown_option(parser: argparse.ArgumentParser, argv: list[str]) -> str | None:
    """The first ``--option`` in ``argv`` that the (sub)command it follows does not have, as
    an error naming it (and the closest it has); ``None``: none. (argparse would first say
    that a required option is missing, when the unknown one is a misspelling of it.)"""
    p = parser
    for token in argv:
        if token == "--":
            return None
        subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
        if subs and token in subs[0].choices:
            p = subs[0].choices[token]
            continue
        if not token.startswith("--") or token == "--":
            continue
        name = token.split("=", 1)[0]
        known = [o for a in p._actions for o in a.option_strings if o.startswith("--")]
        if name in known or (p.allow_abbrev and any(o.startswith(name) for o in known)):
            continue
        close = difflib.get_close_matches(name, known, n=1)
        return f"unknown option {name}" + (f" (did you mean {close[0]}?)" if close else "")
    return None


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    if not argv:  # bare `laneway`: what it can do
        parser.print_help()
        return USAGE_ERROR
    bad = unknown_option(parser, argv)
    if bad is not None:
        return _fail(bad)
    try:
        args = parser.parse_args(argv)
        run: Any = args.run
        code = int(run(args))
        sys.stdout.flush()  # (a reader gone shows here, not as Python's note at exit)
        return code
    except (UsageError, ServeError, BatchCliError) as exc:
        return _fail(str(exc))
    except SystemExit as exc:  # --help and --version
        return exc.code if isinstance(exc.code, int) else 0
    except LanewayError as exc:
        return _fail(str(exc))
    except BrokenPipeError:  # (`laneway simulate --json | head`): the reader has what it wanted
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # (nothing more to flush at exit)
        return 141  # 128 + SIGPIPE, as a tool the signal ends
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        return _fail(f"{where}{exc.strerror or exc}")
    except KeyboardInterrupt:
        print("laneway: interrupted", file=sys.stderr)
        return 130
    except Stopped:
        print("laneway: stopped (SIGTERM)", file=sys.stderr)
        return 0


if __name__ == "__main__":
    sys.exit(main())
