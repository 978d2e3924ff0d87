"""What ``laneway serve`` logs, and how: ``--log-level`` and ``--log-format text|json``.

Every logger (laneway's and uvicorn's) writes to stderr through one handler:

- ``text``: ``2026-12-01 18:00:00,123 INFO laneway.runtime: message``;
- ``json``: one object per line, ``{"ts", "level", "logger", "message", ...}``
  with the record's structured fields beside them.

At INFO the start-up facts are logged (workers, tenants, classes, the costs
measured on the in-process engines). With ``--access-log``, every request that
ends is logged by ``laneway.requests`` with its fields: ``request_id``,
``tenant``, ``priority``, ``worker``, ``queue_ms``, ``preemptions``,
``status`` (completed, failed, cancelled, rejected), ``prompt_tokens`` and
``completion_tokens`` (and uvicorn's access line for each HTTP request).
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from typing import Any

FORMATS = ("text", "json")
LEVELS = ("debug", "info", "warning", "error")
REQUESTS = logging.getLogger("laneway.requests")
SAY = logging.getLogger("laneway")
_json = False  # (setup: the start-up and shutdown lines are records too)
# what a LogRecord has of its own: everything else on it came in ``extra``
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "color_message",  # (uvicorn's message again, with terminal colours)
}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, ensure_ascii=False)


_KEY_IN_QUERY = re.compile(r"([?&]key=)[^&\s]*")


class _NoKeys(logging.Filter):
    """An access line's URL with its ``key=`` (the dashboard's, in a browser's address) hidden:
    a log is read by more people than a key may be."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and any(isinstance(a, str) and "key=" in a for a in args):
            record.args = tuple(_KEY_IN_QUERY.sub(r"\1…", a) if isinstance(a, str) else a for a in args)
        return True


class _NoUpgradeNoise(logging.Filter):
    """uvicorn's warnings for an ``Upgrade`` header (WebSocket, h2c): laneway serves no
    upgrade, and answers such a request as any other — any client could fill the log with
    two lines a request."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.msg if isinstance(record.msg, str) else ""
        return not message.startswith(("Unsupported upgrade request", "No supported WebSocket library"))


def setup(level: str = "info", fmt: str = "text", *, requests: bool = False) -> None:
    """Configure the root logger (and uvicorn's, which then propagate to it)."""
    if level not in LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LEVELS)}, got {level!r}")
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        lg = logging.getLogger(name)
        lg.handlers.clear()
        lg.propagate = True
        lg.setLevel(level.upper())
    access = logging.getLogger("uvicorn.access")
    access.disabled = not requests
    if not any(isinstance(f, _NoKeys) for f in access.filters):
        access.addFilter(_NoKeys())
    errors = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _NoUpgradeNoise) for f in errors.filters):
        errors.addFilter(_NoUpgradeNoise())
    logging.getLogger("httpx").setLevel(logging.WARNING)  # (a line per request it sends: a fleet's probes)
    REQUESTS.setLevel(logging.INFO if requests else logging.WARNING)
    global _json
    _json = fmt == "json"


def say(message: str, **fields: Any) -> None:
    """A line for the operator (start-up, shutdown): ``laneway: message`` on stderr, or,
    with ``--log-format json``, a record of logger ``laneway`` like every other line."""
    if _json:
        SAY.warning(message, extra=fields) if fields.get("warning") else SAY.info(message, extra=fields)
    else:
        print(f"laneway: {message}", file=sys.stderr, flush=True)


def request_ended(
    request_id: str,
    tenant: str | None,
    priority: str,
    worker: str | None,
    queue_s: float,
    preemptions: int,
    status: str,
    prompt_tokens: int | None,
    completion_tokens: int | None,
) -> None:
    """One line per request that ended (when ``--access-log`` asked for them)."""
    if not REQUESTS.isEnabledFor(logging.INFO):
        return
    fields = {
        "request_id": request_id,
        "tenant": tenant,
        "priority": priority,
        "worker": worker,
        "queue_ms": round(queue_s * 1000.0, 3),
        "preemptions": preemptions,
        "status": status,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
    }
    REQUESTS.info(
        "%s %s %s on %s: queued %.1f ms, %d preemptions, %s+%s tokens",
        request_id,
        status,
        priority,
        worker or "-",
        queue_s * 1000.0,
        preemptions,
        prompt_tokens if prompt_tokens is not None else "-",
        completion_tokens if completion_tokens is not None else "-",
        extra=fields,
    )


class Repeated:
    """A warning that may come several times a second while something stays down (Redis,
    from a loop that retries every 200 ms): logged the first time, then at most once every
    ``every_s`` with how many times it came meanwhile; :meth:`ok` logs once that it is over."""

    def __init__(self, logger: logging.Logger, every_s: float = 10.0) -> None:
        self.log = logger
        self.every_s = every_s
        self._since = 0  # warnings not logged since the last one that was
        self._last = -float("inf")
        self._down = False

    def warn(self, message: str, *args: object) -> None:
        now = time.monotonic()
        if now - self._last < self.every_s:
            self._since += 1
            return
        if self._since:
            message += f" (and {self._since} times more in the last {now - self._last:.0f} s)"
        self.log.warning(message, *args)
        self._last, self._since, self._down = now, 0, True

    def ok(self, message: str, *args: object) -> None:
        """It works again: said once, if it was warned of."""
        if self._down:
            self.log.warning(message, *args)
            self._last, self._since, self._down = -float("inf"), 0, False
