"""``laneway batch``: the Batch API from the command line (a client of a running server).

``laneway batch submit FILE.jsonl [--endpoint E] [--priority P] [--window 24h] [--wait]``
uploads the file, creates the batch and prints its id (with ``--wait``, a
progress bar of done/failed/total with an ETA until it ends);
``laneway batch status ID`` prints where it stands; ``laneway batch results
ID -o OUT.jsonl [--errors ERR.jsonl]`` saves its output (and error) file;
``laneway batch files`` lists the uploaded files, ``laneway batch delete
FILE_ID`` deletes one. A file of more request lines than a batch takes is
refused before it is uploaded; ``--wait`` waits through a server restart.
Every command takes ``--base-url`` (``$LANEWAY_BASE_URL``, default
``http://127.0.0.1:8000/v1``) and ``--api-key`` (``$LANEWAY_API_KEY``, else
``$OPENAI_API_KEY``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from laneway.arguments import path, positive_int, up_to
from laneway.batch.input_file import BatchCliError, endpoint_of, request_lines
from laneway.batch.window import window_seconds
from laneway.config.urls import is_http
from laneway.core import ClassTable

DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"
ENDED = ("completed", "failed", "expired", "cancelled")
MAX_LINES = 50_000  # what a batch takes (OpenAI's limit; laneway's [batches] max_lines by default)
UNREACHABLE_S = 300.0  # --wait waits this long for a server that went away (a restart) before giving up


def _priority(text: str) -> str:
    """``--priority``: a class the server knows (P0–P3 or 0–3), checked before anything is sent."""
    classes = ClassTable()
    try:
        return classes[classes.parse(text)].name
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _window(text: str) -> str:
    """``--window``: a duration the server accepts (``24h``, ``90m``, ``2d``), checked before upload."""
    try:
        window_seconds(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("completion_window ")) from None
    return text


def _id(example: str) -> Callable[[str], str]:
    """An object's id (such as ``example``): not empty (the server's ids are never)."""

    def parse(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError(f"an id such as {example}, got an empty string")
        return text

    return parse


_BATCH_ID = _id("batch_...")


def _lines_console() -> Console:
    """Console for status and error lines on stderr: a line is never wrapped, whatever the width."""
    return Console(stderr=True, soft_wrap=True)


def add_arguments(p: argparse.ArgumentParser, parser_class: type[argparse.ArgumentParser]) -> None:
    sub = p.add_subparsers(dest="batch_command", metavar="COMMAND", parser_class=parser_class)
    sub.required = True
    submit = sub.add_parser("submit", help="upload a JSONL file and start a batch")
    submit.add_argument("file", type=path, metavar="FILE.jsonl")
    submit.add_argument("--endpoint", help="default: the url of the file's first line")
    submit.add_argument(
        "--priority",
        type=_priority,
        metavar="P",
        help="the batch's class (e.g. P3; default: the server's, P2)",
    )
    submit.add_argument(
        "--window",
        type=_window,
        default="24h",
        metavar="DURATION",
        help="completion window (default 24h)",
    )
    submit.add_argument("--wait", action="store_true", help="show progress until the batch ends")
    submit.add_argument(
        "--max-lines",
        type=positive_int,
        default=MAX_LINES,
        metavar="N",
        help=f"refuse a file of more request lines before uploading it (default {MAX_LINES:,}, "
        "the server's default [batches] max_lines)",
    )
    submit.add_argument("--poll", type=float, default=1.0, metavar="S", help=argparse.SUPPRESS)
    status = sub.add_parser("status", help="show a batch's status and counts")
    status.add_argument("id", type=_BATCH_ID, metavar="ID")
    status.add_argument("--json", action="store_true", help="print the batch object as JSON")
    res = sub.add_parser("results", help="save a batch's output (and error) file")
    res.add_argument("id", type=_BATCH_ID, metavar="ID")
    res.add_argument("-o", "--output", type=path, required=True, metavar="OUT.jsonl")
    res.add_argument("--errors", type=path, metavar="ERR.jsonl", help="also save the error file here")
    cancel = sub.add_parser("cancel", help="cancel a batch (its finished lines keep their results)")
    cancel.add_argument("id", type=_BATCH_ID, metavar="ID")
    listing = sub.add_parser("list", help="list the batches, newest first")
    listing.add_argument("--limit", type=up_to(100), default=20, metavar="N", help="at most N (default 20)")
    listing.add_argument("--json", action="store_true", help="one batch object per line, as JSON")
    files = sub.add_parser("files", help="list the uploaded files (inputs and results), newest first")
    files.add_argument("--limit", type=up_to(100), default=20, metavar="N", help="at most N (default 20)")
    files.add_argument("--json", action="store_true", help="one file object per line, as JSON")
    delete = sub.add_parser("delete", help="delete an uploaded file")
    delete.add_argument("id", type=_id("file-..."), metavar="FILE_ID")
    for cmd in (submit, status, res, cancel, listing, files, delete):
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
    if not is_http(base):
        given = "--base-url" if args.base_url else "LANEWAY_BASE_URL"
        raise BatchCliError(
            f"{given}: expected an http:// or https:// URL such as {DEFAULT_BASE_URL}, got {base!r}"
        )
    key = args.api_key or os.environ.get("LANEWAY_API_KEY") or os.environ.get("OPENAI_API_KEY") or "none"
    if not (key.isascii() and key.isprintable()):  # (it goes in a header: HTTP takes no other)
        given = (
            "--api-key"
            if args.api_key
            else "LANEWAY_API_KEY"
            if os.environ.get("LANEWAY_API_KEY")
            else "OPENAI_API_KEY"
        )
        raise BatchCliError(f"{given}: an API key is printable ASCII (it is sent in a header)")
    return openai.OpenAI(base_url=base, api_key=key, max_retries=2, timeout=60)


def cmd_batch(args: argparse.Namespace) -> int:
    import openai

    commands = {
        "submit": _submit,
        "status": _status,
        "results": _results,
        "cancel": _cancel,
        "list": _list,
        "files": _files,
        "delete": _delete,
    }
    client = _client(args)
    try:
        return commands[args.batch_command](client, args)
    except openai.APIStatusError as exc:
        if exc.status_code == 401 and client.api_key == "none":  # (none was given)
            raise BatchCliError(
                "the server wants an API key: give --api-key KEY, or set LANEWAY_API_KEY"
            ) from None
        if exc.status_code == 401:
            where = "--api-key" if args.api_key else "LANEWAY_API_KEY / OPENAI_API_KEY"
            raise BatchCliError(f"the server refused the API key ({where}): {_message(exc)}") from None
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


def _submit(client: Any, args: argparse.Namespace) -> int:
    path: Path = args.file
    request_lines(path, args.max_lines)
    endpoint = args.endpoint or endpoint_of(path)
    with path.open("rb") as f:
        uploaded = client.files.create(file=(path.name, f), purpose="batch")
    metadata = {"priority": args.priority} if args.priority else None
    try:
        batch = client.batches.create(
            input_file_id=uploaded.id,
            endpoint=endpoint,
            completion_window=args.window,
            metadata=metadata,
        )
    except BaseException:  # no batch uses the file: do not leave it behind
        _delete_quietly(client, uploaded.id)
        raise
    print(batch.id, flush=True)
    if not args.wait:
        return 0
    batch = _wait(client, batch, max(0.05, args.poll))
    _print_status(batch, _lines_console())
    return 0 if batch.status == "completed" else 1


def _delete_quietly(client: Any, file_id: str) -> None:
    import openai

    with contextlib.suppress(openai.OpenAIError):  # the error that made the batch fail is the one to report
        client.files.delete(file_id)


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
            batch = _retrieve_through_restarts(client, batch, poll_s, progress, task)


def _retrieve_through_restarts(client: Any, batch: Any, poll_s: float, progress: Progress, task: Any) -> Any:
    """The batch as the server has it now, waiting while the server cannot be reached or
    answers 503 (it restarts; the batch goes on after) for at most :data:`UNREACHABLE_S`."""
    import openai

    gone_since = None
    while True:
        try:
            return client.batches.retrieve(batch.id)
        except (openai.APIConnectionError, openai.InternalServerError) as exc:
            if isinstance(exc, openai.InternalServerError) and exc.status_code != 503:
                raise
            now = time.monotonic()
            gone_since = gone_since or now
            if now - gone_since > UNREACHABLE_S:
                raise
            progress.update(task, description=f"{batch.status} (server unreachable, waiting)")
            time.sleep(min(5.0, max(poll_s, 0.5)))


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
    line = f"{batch.id}{cls}: {batch.status}; {counts}" + (f"; {', '.join(files)}" if files else "")
    console.print(line, markup=False)
    if batch.errors is not None and batch.errors.data:
        for e in batch.errors.data[:20]:
            console.print(f"  {e.code}: {e.message}", markup=False)
        if len(batch.errors.data) > 20:
            console.print(f"  … {len(batch.errors.data) - 20} more (see the error file)", markup=False)


def _status(client: Any, args: argparse.Namespace) -> int:
    batch = client.batches.retrieve(args.id)
    if args.json:
        print(batch.model_dump_json())
    else:
        _print_status(batch, Console(soft_wrap=True))
    return 0


def _results(client: Any, args: argparse.Namespace) -> int:
    if args.errors is not None and args.errors.resolve() == args.output.resolve():
        raise BatchCliError(f"-o and --errors both name {args.output}: the errors would replace the results")
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
    data = b""
    if batch.error_file_id:
        data = client.files.content(batch.error_file_id).content
        errors = data.count(b"\n")
    message = f"{_count(written, 'result')} written to {args.output}"
    if args.errors is not None:
        args.errors.write_bytes(data)  # empty when nothing failed: the file says so too
        message += f"; {_count(errors, 'error')} written to {args.errors}"
    elif errors:
        message += f"; {errors} failed (save them with --errors FILE)"
    print(message, file=sys.stderr)
    return 0


def _cancel(client: Any, args: argparse.Namespace) -> int:
    batch = client.batches.cancel(args.id)
    _print_status(batch, Console(soft_wrap=True))
    return 0


def _listing(items: list[Any], as_json: bool, none: str, show: Callable[[Any, Console], None]) -> int:
    """A list command's output: one JSON object a line, or ``show(item, console)`` each."""
    if as_json:
        for item in items:
            print(item.model_dump_json())
        return 0
    console = Console(soft_wrap=True)
    if not items:
        console.print(none, markup=False)
    for item in items:
        show(item, console)
    return 0


def _list(client: Any, args: argparse.Namespace) -> int:
    page = client.batches.list(limit=args.limit)
    return _listing(list(page.data)[: args.limit], args.json, "no batches", _print_status)


def _print_file(f: Any, console: Console) -> None:
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(f.created_at))
    console.print(f"{f.id}  {f.purpose:<12}  {f.bytes:>12,} bytes  {when}  {f.filename}", markup=False)


def _files(client: Any, args: argparse.Namespace) -> int:
    page = client.files.list(limit=args.limit)
    return _listing(list(page.data)[: args.limit], args.json, "no files", _print_file)


def _delete(client: Any, args: argparse.Namespace) -> int:
    client.files.delete(args.id)
    print(f"{args.id} deleted", file=sys.stderr)
    return 0


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")
