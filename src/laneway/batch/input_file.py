"""``laneway batch submit``'s checks of a JSONL file before it is uploaded: a regular
file, its endpoint (the first request line's ``url``), at most as many request lines as a
batch takes. What is wrong is one line (:class:`BatchCliError`), before anything is sent."""

from __future__ import annotations

from pathlib import Path

from laneway.protocol import json_input
from laneway.protocol.json_input import BadJSON


class BatchCliError(Exception):
    """Reported as one line, exit status 2."""


def request_lines(path: Path, max_lines: int) -> int:
    """How many request lines (not blank) the file ``path`` holds: a regular file of at
    most ``max_lines`` of them."""
    if not path.is_file():
        if path.is_dir():
            what = "a directory, not a JSONL file"
        else:
            what = "not a regular file" if path.exists() else "no such file"
        raise BatchCliError(f"{path}: {what}")
    with path.open("rb") as f:
        lines = sum(1 for raw in f if raw.strip())
    if lines > max_lines:
        raise BatchCliError(
            f"{path} has {lines:,} request lines; a batch takes at most {max_lines:,} "
            "(split the file; --max-lines N for a server that takes more)"
        )
    return lines


def endpoint_of(path: Path) -> str:
    """The ``url`` of the file's first request line; what is wrong with it otherwise."""
    with path.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            if number == 1:  # (a byte-order mark, as the server takes the file with one)
                raw = raw.removeprefix(b"\xef\xbb\xbf")
            if not raw.strip():
                continue
            where = f"{path}: line {number}"
            try:
                obj = json_input.loads(raw, where)
            except BadJSON as exc:
                raise BatchCliError(exc.message if exc.param is None else f"{where}: {exc.message}") from None
            if not isinstance(obj, dict):
                raise BatchCliError(f"{where} is not a JSON object")
            url = obj.get("url")
            if url is None:
                raise BatchCliError(f"{where} has no url; pass --endpoint")
            if not isinstance(url, str) or not url:
                raise BatchCliError(f"{where}: url must be a non-empty string, got {url!r}")
            return url
    raise BatchCliError(f"{path}: the file is empty (no request lines)")
