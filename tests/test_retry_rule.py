"""One rule for what a 429 or 503 tells a client to do (``retry_figures``), whichever path
refused it: the scheduler, the server's byte bound, a model with no healthy worker, the
store, a cluster that lost its data, the connection cap."""

from __future__ import annotations

import json
import math

import pytest

from laneway.connections import REFUSED
from laneway.core import Reject
from laneway.errors import RETRY_MAX_S, RETRY_MIN_S, RETRY_UNKNOWN_S, Unavailable, retry_figures
from laneway.runtime.rejections import error_for, shutting_down, taken_for_dead


@pytest.mark.parametrize(
    ("wait", "retry", "expect"),
    [
        (12.3456, None, (12.346, 12.346)),  # the wait, to the millisecond, is when to come back
        (0.2, None, (RETRY_MIN_S, 0.2)),  # never sooner than a second
        (5e6, None, (RETRY_MAX_S, 5e6)),  # never later than an hour
        (math.inf, None, (RETRY_UNKNOWN_S, None)),  # a wait not known is null, not an hour
        (None, None, (RETRY_UNKNOWN_S, None)),
        (2.0, 0.5, (RETRY_MIN_S, 2.0)),  # its own retry time (a quota's refill) comes first
        (math.inf, 5.0, (5.0, None)),
        (3.0, 0.0, (3.0, 3.0)),  # (no retry time of its own)
    ],
)
def test_the_rule(wait: float | None, retry: float | None, expect: tuple[float, float | None]) -> None:
    assert retry_figures(wait, retry) == expect


def test_every_refusal_path_follows_it() -> None:
    for err in (
        error_for(Reject("r", "queue_timeout", "m", math.inf, math.inf)),  # no worker is up
        error_for(Reject("r", "overloaded", "m", 42.0, 42.0)),
        error_for(Reject("r", "rate_limited", "m", 0.25, 0.25)),
        error_for(Reject("r", "queue_timeout", "m", math.inf, 5.0)),  # the leader did not answer
        shutting_down(),
        taken_for_dead(),
        Unavailable("m", code="store_unavailable", retry_after_s=2),
    ):
        retry, wait = err.retry_after_s, err.estimated_wait_s
        assert RETRY_MIN_S <= retry <= RETRY_MAX_S, err
        assert type(retry) is float, err  # (a whole number of seconds given was 5, not 5.0, in JSON)
        assert wait is None or (math.isfinite(wait) and wait >= 0), err
    assert error_for(Reject("r", "queue_timeout", "m", math.inf, math.inf)).estimated_wait_s is None
    assert error_for(Reject("r", "overloaded", "m", 42.0, 42.0)).retry_after_s == 42.0


def test_the_connection_cap_answers_by_the_same_rule() -> None:
    head, _, body = REFUSED.partition(b"\r\n\r\n")
    error = json.loads(body)["error"]
    retry, wait = retry_figures(None, 1.0)
    assert (error["retry_after_s"], error["estimated_wait_s"]) == (retry, wait)
    assert f"retry-after: {math.ceil(retry)}".encode() in head
