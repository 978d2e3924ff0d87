"""What a live fleet's models failed lately, and what that costs their requests.

- a model whose launch (or adapter load) failed is *failing*: its queued requests are
  answered 503 ``model_unavailable`` naming the reason, new ones too for a back-off (5 s,
  doubling to 5 minutes while launches keep failing); a cluster's leader tells the other
  replicas the same (:meth:`Faults.elsewhere`);
- requests that fail on a model's engines by their fault while their probes pass are
  counted per model: :data:`BROKEN_RUNS` in a row, none ending well between, and its
  engines are broken, not busy (:meth:`Faults.run_failed` names them; the fleet stops
  them and backs their model off).

:class:`Faults` keeps the figures and says what follows; :class:`~laneway.runtime.fleet.Fleet`
acts (stops engines, tells the core, starts preloads again).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from laneway.errors import Unavailable
from laneway.runtime.ticket import Phase

if TYPE_CHECKING:
    from laneway.runtime.runtime import Runtime

log = logging.getLogger("laneway.fleet")

BACKOFF_S = 5.0
BACKOFF_MAX_S = 300.0
BROKEN_RUNS = 3  # requests in a row failing on a model's engines by their fault (probes passing)


@dataclass
class Failing:
    reason: str
    until: float  # loop time: new requests for the model are refused until then
    backoff_s: float
    stopped: bool = False  # its engines started, then were stopped as broken


class Faults:
    def __init__(self, runtime: Runtime, known: Callable[[str], bool]) -> None:
        self.rt = runtime
        self.known = known  # (whether a name is one of the fleet's models)
        self.failing: dict[str, Failing] = {}  # model -> its last launch failure, while backing off
        # model -> requests that failed on its engines since one ended well there, the replicas
        # at fault, and the last such request
        self._runs: dict[str, tuple[int, set[str], str]] = {}

    # ------------------------------------------------------------ launches
    def back_off(self, model: str, what: str, reason: str, *, stopped: bool = False) -> float:
        """``model`` failed to load (``what``, ``reason``; ``stopped``: its engines were
        stopped as broken): its new requests are refused for a back-off (doubling while it
        keeps failing), its queued ones now; the back-off."""
        now = self.rt.now()
        last = self.failing.get(model)
        backoff = BACKOFF_S if last is None else min(last.backoff_s * 2, BACKOFF_MAX_S)
        self.failing[model] = Failing(reason, now + backoff, backoff, stopped)
        log.error("%s (retried after %g s): %s", what, backoff, reason)
        self.withdraw(model)
        return backoff

    def started(self, model: str) -> None:
        """``model`` (or an adapter) was started: it is failing no more."""
        self.failing.pop(model, None)

    def withdraw(self, model: str) -> None:
        """Refuse the queued requests of ``model`` now (it cannot be started for a while)."""
        rt = self.rt
        err = self.unavailable(model)
        for ticket in list(rt.tickets.values()):
            if ticket.job.model == model and ticket.phase is Phase.QUEUED:
                rt.withdraw(ticket, err)

    def elsewhere(self, failing: dict[str, tuple[str, float]]) -> None:
        """What a cluster's leader says cannot be started now (model -> reason, seconds
        left): refused here too, its queued requests at once."""
        now = self.rt.now()
        for model, (reason, left) in failing.items():
            if not self.known(model) or left <= 0:
                continue
            mine = self.failing.get(model)
            if mine is not None and mine.until >= now + left - 1:
                continue  # (known: refused here already)
            self.failing[model] = Failing(str(reason), now + left, float(left))
            self.withdraw(model)

    def refusal(self, model: str) -> Unavailable | None:
        """Why a new request for ``model`` is refused now (its launches fail), or ``None``."""
        f = self.failing.get(model)
        if f is None or f.until <= self.rt.now():
            return None
        return self.unavailable(model)

    def unavailable(self, model: str) -> Unavailable:
        f = self.failing[model]
        back = max(math.ceil(f.until - self.rt.now()), 1)
        lines = f.reason.splitlines()  # (a line, and where a log's end follows, the end's last line)
        said = lines[0] if len(lines) < 2 else f"{lines[0]} … {lines[-1].strip()} (whole: /readyz)"
        what = "is unavailable" if f.stopped else "could not be started"
        return Unavailable(
            f"model {model!r} {what}: {said}",
            code="model_unavailable",
            retry_after_s=back,  # (its next start, at the soonest; what it would wait: not known)
            estimated_wait_s=None,
        )

    # ------------------------------------------------------------ runs
    def run_failed(self, model: str, rid: str, request_id: str) -> set[str] | None:
        """Request ``request_id`` failed a run on replica ``rid`` of ``model`` by its
        engine's fault: the replicas at fault once that makes :data:`BROKEN_RUNS` requests
        in a row (its own retries count once; counting starts again), else ``None``."""
        n, at_fault, last = self._runs.get(model, (0, set(), ""))
        at_fault.add(rid)
        if request_id != last:
            n += 1
        if n < BROKEN_RUNS:
            self._runs[model] = (n, at_fault, request_id)
            return None
        self._runs.pop(model, None)
        return at_fault

    def ran(self, model: str) -> None:
        """A request of ``model`` ended well on one of its engines: they are not broken."""
        if self._runs:
            self._runs.pop(model, None)
