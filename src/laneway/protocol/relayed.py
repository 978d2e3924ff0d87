"""Requests laneway passes through to an upstream as sent: Anthropic's Messages API
(``/v1/messages``) and any other ``POST /v1/…`` endpoint of an upstream's server whose
body names a model (rerank, score, classify, tokens counted …).

laneway reads only the model (to place it), ``stream``, and what sizes it
(``max_tokens``, ``max_completion_tokens``); its own fields (``priority``,
``preemptible``, ``laneway``) pick the class and are not sent. ``service_tier`` is
the upstream's there (Anthropic's ``auto`` or ``standard_only``): sent as given,
not read.
Such a request cannot resume part-way: preempted, a whole answer runs again from
the start; a streamed one is not preempted once started.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from laneway.errors import InvalidRequest
from laneway.generation import RELAY, Job, ResumeRule, SamplingParams
from laneway.protocol.fields import OWNED
from laneway.protocol.values import MAX_TOKENS_LIMIT, flag


def relay_job(
    rid: str, model: str, endpoint: str, body: Mapping[str, Any], headers: Iterable[tuple[str, str]] = ()
) -> Job:
    """The job that sends ``body`` to ``endpoint`` (under the upstream's base URL), with the
    client's headers of :data:`PASSED_HEADERS` among ``headers``."""
    stream = flag(body, "stream", False)
    limit = None
    for name in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        value = body.get(name)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value < MAX_TOKENS_LIMIT:
                raise InvalidRequest(
                    f"{name} must be a whole number from 1 to {MAX_TOKENS_LIMIT - 1}, got {value!r}",
                    param=name,
                )
            limit = value
            break
    forwarded = {k: v for k, v in body.items() if k not in OWNED or k == "service_tier"}
    rule = ResumeRule.NONE if stream else ResumeRule.RESTART
    return Job(
        rid,
        model,
        SamplingParams(max_tokens=limit),
        kind=RELAY,
        body=forwarded,
        stream=stream,
        resume=rule,
        endpoint=endpoint,
        headers=passed_headers(headers),
    )


# the client's headers a pass-through carries on (Anthropic's API reads its version and
# betas from them: anthropic-version, anthropic-beta), at most this many, this long
PASSED_HEADERS = ("anthropic-",)
MAX_PASSED = 8
MAX_HEADER_CHARS = 1024


def passed_headers(headers: Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """The headers among ``headers`` that a pass-through carries on: named with a prefix of
    :data:`PASSED_HEADERS`, of plain printable characters (none that could end a header)."""
    out = []
    for name, value in headers:
        low = name.lower()
        if (
            low.startswith(PASSED_HEADERS)
            and len(name) + len(value) <= MAX_HEADER_CHARS
            and low.isascii()
            and all(c.isalnum() or c in "-_" for c in low)
            and value.isascii()
            and value.isprintable()
        ):
            out.append((low, value))
    return tuple(out[:MAX_PASSED])
