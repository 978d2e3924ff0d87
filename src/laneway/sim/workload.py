"""Simulated requests and the JSONL trace format (DESIGN §3).

One request per line: required ``arrival_s``, ``priority`` (0–3 or
"P0"–"P3") and ``duration_s`` (it may be left out when ``output_tokens``
gives the work instead); optional ``id``, ``model``, ``tenant``, ``vram_gb``,
``preemptible``, ``timeout_s``, ``prompt_tokens``, ``output_tokens``, and for runs on
upstreams with prefix caches (``--upstreams``) ``prefix`` and ``reply``: the prompt's
chain of block hashes (whole numbers, one a 32-token block, each naming every block
before it) and the reply's blocks that continue it.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Collection, Iterable, Iterator, Sequence
from pathlib import Path
from typing import NamedTuple, TextIO

from laneway.core import ClassTable
from laneway.core.errors import LanewayError

DAY_S = 24 * 3600.0  # a batch line's window: how long batch work may queue


class TraceError(LanewayError, ValueError):
    """A trace line is invalid; the message names the file and line."""


class SimRequest(NamedTuple):
    """One request of a workload (immutable; a named tuple: millions are made)."""

    id: str
    arrival_s: float
    priority: int
    duration_s: float | None
    model: str | None = None
    tenant: str | None = None
    vram_gb: float | None = None
    preemptible: bool = True
    timeout_s: float | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0
    # upstreams with prefix caches: the prompt's chain of block hashes, and the reply's
    # blocks that continue it (what the engine holds once it answered)
    prefix: tuple[int, ...] = ()
    reply: tuple[int, ...] = ()


# the largest value each field takes: past them a line is nonsense (a run of centuries), and
# the simulation's clock and its per-second work (MLFQ's quanta, the depth samples) with it
MAXIMA = {
    "arrival_s": 1e10,  # (Unix times are ~1.7e9)
    "duration_s": 1e6,  # (11.6 days)
    "timeout_s": 1e8,
    "vram_gb": 1e6,
    "prompt_tokens": 10**9,
    "output_tokens": 10**8,
}


def _number(obj: dict[str, object], key: str, *, minimum: float, strict: bool = False) -> float | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"field {key!r} must be a number, got {_shown(value)}")
    if value < minimum or (strict and value == minimum):
        relation = ">" if strict else ">="
        raise ValueError(f"field {key!r} must be {relation} {minimum:g}, got {_shown(value)}")
    if value > MAXIMA[key]:
        raise ValueError(f"field {key!r} must be <= {MAXIMA[key]:g}, got {_shown(value)}")
    return float(value)


def _integer(obj: dict[str, object], key: str) -> int:
    value = obj.get(key, 0)
    if value is None:
        return 0
    if isinstance(value, float) and value.is_integer():  # (1e2: JSON writes numbers either way)
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"field {key!r} must be a whole number >= 0, got {_shown(value)}")
    if value > MAXIMA[key]:
        raise ValueError(f"field {key!r} must be <= {MAXIMA[key]:g}, got {_shown(value)}")
    return value


def _shown(value: object) -> str:
    text = repr(value) if not isinstance(value, int) or abs(value) < 10**30 else f"{float(value):g}"
    return text if len(text) <= 60 else text[:57] + "..."


def _text(obj: dict[str, object], key: str) -> str | None:
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ValueError(f"field {key!r} must be a non-empty string, got {value!r}")
    return value


TRACE_FIELDS = frozenset(
    {
        "id",
        "arrival_s",
        "priority",
        "duration_s",
        "model",
        "tenant",
        "vram_gb",
        "preemptible",
        "timeout_s",
        "prompt_tokens",
        "output_tokens",
        "prefix",
        "reply",
    }
)


def _blocks(obj: dict[str, object], key: str) -> tuple[int, ...]:
    value = obj.get(key)
    if value is None:
        return ()
    if not isinstance(value, list) or not all(
        isinstance(b, int) and not isinstance(b, bool) and b >= 0 for b in value
    ):
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
        raise ValueError(f"field {key!r} must be a list of whole numbers >= 0 (block hashes), got {shown}")
    return tuple(value)


def parse_line(obj: object, classes: ClassTable, default_id: str) -> SimRequest:
    if not isinstance(obj, dict):
        raise ValueError("expected a JSON object")
    unknown = sorted(k for k in obj if k not in TRACE_FIELDS)
    if unknown:  # a typo never passes silently
        known = ", ".join(sorted(TRACE_FIELDS))
        raise ValueError(f"unknown field {unknown[0]!r} (a trace line has: {known})")
    for key in ("arrival_s", "priority"):
        if key not in obj:
            raise ValueError(f"missing field {key!r}")
    if "duration_s" not in obj:
        if "output_tokens" not in obj:
            raise ValueError("missing field 'duration_s' (or 'output_tokens' to derive it)")
        if not obj["output_tokens"]:
            raise ValueError(
                "field 'output_tokens' must be > 0 to derive the duration (or give 'duration_s')"
            )
    arrival = _number(obj, "arrival_s", minimum=0.0)
    if arrival is None:
        raise ValueError("field 'arrival_s' must be a number, got null")
    try:
        priority = classes.parse(obj["priority"])
    except ValueError as exc:
        raise ValueError(f"field 'priority': {exc}") from None
    duration = _number(obj, "duration_s", minimum=0.0, strict=True)
    output_tokens = _integer(obj, "output_tokens")
    if duration is None and not output_tokens:
        raise ValueError("field 'duration_s' is null and no 'output_tokens' gives the work")
    preemptible = obj.get("preemptible", True)
    if not isinstance(preemptible, bool):
        raise ValueError(f"field 'preemptible' must be true or false, got {preemptible!r}")
    raw_id = obj.get("id", default_id)
    if isinstance(raw_id, bool) or not isinstance(raw_id, str | int) or raw_id == "":
        raise ValueError(f"field 'id' must be a string or an integer, got {raw_id!r}")
    return SimRequest(
        id=str(raw_id),
        arrival_s=arrival,
        priority=priority,
        duration_s=duration,
        model=_text(obj, "model"),
        tenant=_text(obj, "tenant"),
        vram_gb=_number(obj, "vram_gb", minimum=0.0),
        preemptible=preemptible,
        timeout_s=_number(obj, "timeout_s", minimum=0.0, strict=True),
        prompt_tokens=_integer(obj, "prompt_tokens"),
        output_tokens=output_tokens,
        prefix=_blocks(obj, "prefix"),
        reply=_blocks(obj, "reply"),
    )


def _unique(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """A JSON object whose keys are each given once (twice, which one was meant is a guess)."""
    obj = dict(pairs)
    if len(obj) < len(pairs):
        seen: set[str] = set()
        twice = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise ValueError(f"field {twice!r} is given twice")
    return obj


def parse_trace(
    lines: Iterable[str],
    classes: ClassTable,
    source: str = "trace",
    models: Sequence[str] | None = None,
) -> list[SimRequest]:
    """Parse JSONL lines; raise :class:`TraceError` naming the first bad line.

    ``models``: the models of the GPU fleet the trace will run on; every line
    must then name a model (a fleet serves named models only)."""
    out: list[SimRequest] = []
    ids: dict[str, int] = {}
    for number, line in enumerate(lines, start=1):
        text = line.strip()
        if not text:
            continue
        if number == 1:
            text = text.removeprefix("\ufeff")  # (a byte-order mark, as some editors write one)
        try:
            obj = json.loads(text, object_pairs_hook=_unique)
        except json.JSONDecodeError as exc:
            raise TraceError(f"{source}:{number}: not valid JSON ({exc.msg})") from None
        except RecursionError:
            raise TraceError(f"{source}:{number}: nested too deep to be a trace line") from None
        except ValueError as exc:  # (a key twice, or Python's limit on an integer's digits)
            raise TraceError(f"{source}:{number}: {exc}") from None
        try:
            req = parse_line(obj, classes, default_id=f"r{number}")
        except ValueError as exc:
            raise TraceError(f"{source}:{number}: {exc}") from None
        if models is not None and req.model is None:
            served = ", ".join(models) or "none"
            raise TraceError(
                f"{source}:{number}: a run on a GPU fleet needs a model on every line "
                f"(the fleet serves: {served})"
            )
        if req.id in ids:
            if isinstance(obj, dict) and "id" not in obj:
                what = f"it names no id, and its default id {req.id!r} is taken by line {ids[req.id]}"
            else:
                what = f"duplicate id {req.id!r} (first on line {ids[req.id]})"
            raise TraceError(f"{source}:{number}: {what}")
        ids[req.id] = number
        out.append(req)
    if not out:
        raise TraceError(f"{source}: no requests in the trace")
    out.sort(key=lambda r: r.arrival_s)  # stable: file order breaks ties
    return out


MAX_LINE_CHARS = 2**20  # (a trace line is ~100 characters; /dev/zero given for a trace is one line)


def _bounded_lines(fh: TextIO, source: str) -> Iterator[str]:
    """``fh``'s lines, each read to at most :data:`MAX_LINE_CHARS`."""
    for number in itertools.count(1):
        line = fh.readline(MAX_LINE_CHARS + 1)
        if not line:
            return
        if len(line) > MAX_LINE_CHARS and not line.endswith("\n"):
            raise TraceError(
                f"{source}:{number}: a line over {MAX_LINE_CHARS:,} characters: not a trace line"
            )
        yield line


def load_trace(
    path: str | Path, classes: ClassTable, models: Sequence[str] | None = None
) -> list[SimRequest]:
    p = Path(path)
    try:
        with p.open(encoding="utf-8") as fh:
            return parse_trace(_bounded_lines(fh, str(p)), classes, source=str(p), models=models)
    except OSError as exc:
        raise TraceError(f"{p}: cannot read trace ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise TraceError(f"{p}: not UTF-8 text") from None


def to_jsonl(requests: Iterable[SimRequest], classes: ClassTable) -> str:
    """Write requests in the trace format (the inverse of :func:`parse_trace`)."""
    lines = []
    for r in requests:
        obj: dict[str, object] = {
            "id": r.id,
            "arrival_s": round(r.arrival_s, 6),
            "priority": classes[r.priority].name,
        }
        if r.duration_s is not None:
            obj["duration_s"] = round(r.duration_s, 6)
        for key in ("model", "tenant", "vram_gb", "timeout_s"):
            value = getattr(r, key)
            if value is not None:
                obj[key] = value
        if not r.preemptible:
            obj["preemptible"] = False
        for key in ("prompt_tokens", "output_tokens"):
            if getattr(r, key):
                obj[key] = getattr(r, key)
        for key in ("prefix", "reply"):
            if getattr(r, key):
                obj[key] = list(getattr(r, key))
        lines.append(json.dumps(obj))
    return "\n".join(lines) + "\n"


def unserved(requests: Sequence[SimRequest], models: Collection[str]) -> str | None:
    """Which models of a trace a fleet serving ``models`` does not serve, said in a line
    (``None``: none): their requests are refused as the server refuses them
    (``unplaceable``), and a name mistyped would otherwise pass as a rejection."""
    unknown: dict[str, int] = {}
    for r in requests:
        if r.model is not None and r.model not in models:
            unknown[r.model] = unknown.get(r.model, 0) + 1
    if not unknown:
        return None
    named = ", ".join(f"{m!r} ({n} request{'s' if n > 1 else ''})" for m, n in sorted(unknown.items()))
    return f"the fleet serves no model {named}: refused as unplaceable"
