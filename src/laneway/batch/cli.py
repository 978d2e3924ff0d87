"""``laneway batch``: the Batch API from the command line (a client of a running server).

``laneway batch submit FILE.jsonl [--endpoint E] [--priority P] [--window 24h] [--wait]``
uploads the file, creates the batch and prints its id (with ``--wait``, a
progress bar of done/failed/total with an ETA until it ends);
``laneway batch status ID`` prints where it stands; ``laneway batch results
ID -o OUT.jsonl [--errors ERR.jsonl]`` saves its output (and error) file.
Every command takes ``--base-url`` (``$LANEWAY_BASE_URL``, default
``http://127.0.0.1:8000/v1``) and ``--api-key`` (``$LANEWAY_API_KEY``, else
``$OPENAI_API_KEY``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"
ENDED = ("completed", "failed", "expired", "cancelled")


class BatchCliError(Exception):
    """Reported as one line, exit status 2."""


def add_arguments(p: argparse.ArgumentParser, parser_class: type[argparse.ArgumentParser]) -> None:
    sub = p.add_subparsers(dest="batch_command", metavar="COMMAND", parser_class=parser_class)
    sub.required = True
    submit = sub.add_parser("submit", help="upload a JSONL file and start a batch")
    submit.add_argument("file", type=Path, metavar="FILE.jsonl")
    submit.add_argument("--endpoint", help="default: the url of the file's first line")
    submit.add_argument(
        "--priority", metavar="P", help="the batch's class (e.g. P3; default: the server's, P2)"
    )
    submit.add_argument("--window", default="24h", metavar="DURATION", help="completion window (default 24h)")
    submit.add_argument("--wait", action="store_true", help="show progress until the batch ends")
    submit.add_argument("--poll", type=float, default=1.0, metavar="S", help=argparse.SUPPRESS)
    status = sub.add_parser("status", help="show a batch's status and counts")
    status.add_argument("id", metavar="ID")
    status.add_argument("--json", action="store_true", help="print the batch object as JSON")
    res = sub.add_parser("results", help="save a batch's output (and error) file")
    res.add_argument("id", metavar="ID")
    res.add_argument("-o", "--output", type=Path, required=True, metavar="OUT.jsonl")
    res.add_argument("--errors", type=Path, metavar="ERR.jsonl", help="also save the error file here")
    for cmd in (submit, status, res):
        cmd.add_argument(
            "--base-url", metavar="URL", help=f"server API (default $LANEWAY_BASE_URL or {DEFAULT_BASE_URL})"
        )
        cmd.add_argument(
            "--api-key", metavar="KEY", help="API key (default $LANEWAY_API_KEY or $OPENAI_API_KEY)"
        )
    p.set_defaults(run=cmd_batch)


def _client(args: argparse.Namespace) -> Any:
    import openai

    base = args.base_url or os.environ.get("LANEWAY_BASE_URL") or DEFAULT_BASE_URL
    key = args.api_key or os.environ.get("LANEWAY_API_KEY") or os.environ.get("OPENAI_API_KEY") or "none"
    return openai.OpenAI(base_url=base, api_key=key, max_retries=2, timeout=60)


def cmd_batch(args: argparse.Namespace) -> int:
    import openai

    commands = {"submit": _submit, "status": _status, "results": _results}
    client = _client(args)
    try:
        return commands[args.batch_command](client, args)
    except openai.APIStatusError as exc:
        raise BatchCliError(f"the server answered {exc.status_code}: {_message(exc)}") from None
    except openai.APIConnectionError:
        raise BatchCliError(f"cannot reach the server at {client.base_url}") from None
    finally:
        client.close()


def _message(exc: Any) -> str:
    body = exc.body
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
    return str(exc.message)


def _endpoint(path: Path) -> str:
    with path.open("rb") as f:
        for raw in f:
            if raw.strip():
                try:
                    url = json.loads(raw).get("url")
                except (ValueError, AttributeError):
                    url = None
                if isinstance(url, str):
                    return url
                break
    raise BatchCliError(f"{path}: cannot tell the endpoint from the first line; pass --endpoint")


def _submit(client: Any, args: argparse.Namespace) -> int:
    path: Path = args.file
    if not path.is_file():
        raise BatchCliError(f"{path}: no such file")
    endpoint = args.endpoint or _endpoint(path)
    with path.open("rb") as f:
        uploaded = client.files.create(file=(path.name, f), purpose="batch")
    metadata = {"priority": args.priority} if args.priority else None
    batch = client.batches.create(
        input_file_id=uploaded.id,
        endpoint=endpoint,
        completion_window=args.window,
        metadata=metadata,
    )
    print(batch.id, flush=True)
    if not args.wait:
        return 0
    batch = _wait(client, batch, max(0.05, args.poll))
    _print_status(batch, Console(stderr=True))
    return 0 if batch.status == "completed" else 1


def _wait(client: Any, batch: Any, poll_s: float) -> Any:
    console = Console(stderr=True)
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[done]} done, {task.fields[failed]} failed / {task.fields[lines]}"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task(batch.status, total=None, done=0, failed=0, lines="?")
        while True:
            counts = batch.request_counts
            total = counts.total if counts is not None and counts.total else None
            done = counts.completed if counts is not None else 0
            failed = counts.failed if counts is not None else 0
            progress.update(
                task,
                description=batch.status,
                total=total,
                completed=done + failed,
                done=done,
                failed=failed,
                lines=total or "?",
            )
            if batch.status in ENDED:
                return batch
            time.sleep(poll_s)
            batch = client.batches.retrieve(batch.id)


def _print_status(batch: Any, console: Console) -> None:
    c = batch.request_counts
    counts = f"{c.completed} done, {c.failed} failed of {c.total}" if c is not None else "no counts yet"
    files = []
    if batch.output_file_id:
        files.append(f"output {batch.output_file_id}")
    if batch.error_file_id:
        files.append(f"errors {batch.error_file_id}")
    extra = (batch.model_extra or {}).get("laneway") or {}
    cls = f" [{extra['priority']}]" if extra.get("priority") else ""
    console.print(f"{batch.id}{cls}: {batch.status}; {counts}" + (f"; {', '.join(files)}" if files else ""))
    if batch.errors is not None and batch.errors.data:
        for e in batch.errors.data[:20]:
            console.print(f"  {e.code}: {e.message}")
        if len(batch.errors.data) > 20:
            console.print(f"  … {len(batch.errors.data) - 20} more (see the error file)")


def _status(client: Any, args: argparse.Namespace) -> int:
    batch = client.batches.retrieve(args.id)
    if args.json:
        print(batch.model_dump_json())
    else:
        _print_status(batch, Console(width=200) if not sys.stdout.isatty() else Console())
    return 0


def _results(client: Any, args: argparse.Namespace) -> int:
    batch = client.batches.retrieve(args.id)
    if batch.status not in ENDED:
        raise BatchCliError(f"batch {batch.id} is {batch.status}: results come once it has ended")
    written = 0
    if batch.output_file_id:
        data = client.files.content(batch.output_file_id).content
        args.output.write_bytes(data)
        written = data.count(b"\n")
    else:
        args.output.write_bytes(b"")
    errors = 0
    if batch.error_file_id:
        data = client.files.content(batch.error_file_id).content
        errors = data.count(b"\n")
        if args.errors is not None:
            args.errors.write_bytes(data)
    note = f"; {errors} failed" + (f" (in {args.errors})" if args.errors and errors else "") if errors else ""
    print(f"{written} results written to {args.output}{note}", file=sys.stderr)
    return 0
