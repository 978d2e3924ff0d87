"""Refusing work: what no worker could run, entitlements and quotas, queue bounds,
shedding under overload, queue timeouts, and requests withdrawn by the runtime.

Every refusal moves the request to its end state, counts it by reason and carries the
estimated wait a retry would face (:class:`~laneway.core.decisions.Reject`).
"""

from __future__ import annotations

import math

from laneway.core.admission import Admission
from laneway.core.classes import ClassTable
from laneway.core.decisions import Decision, Reject
from laneway.core.errors import InvalidTransition
from laneway.core.estimator import Estimator
from laneway.core.expiry import Expiry
from laneway.core.lanes import Lanes
from laneway.core.live import Live
from laneway.core.placement import Placement
from laneway.core.request import Request, State, transition
from laneway.core.stats import Counters
from laneway.core.tables import Tables


class Refusals:
    __slots__ = (
        "admission",
        "classes",
        "counters",
        "estimator",
        "expiry",
        "lanes",
        "live",
        "pending",
        "placement",
        "tables",
    )

    def __init__(
        self,
        tables: Tables,
        classes: ClassTable,
        placement: Placement,
        admission: Admission,
        lanes: Lanes,
        expiry: Expiry,
        live: Live,
        estimator: Estimator,
        counters: Counters,
    ) -> None:
        self.tables = tables
        self.classes = classes
        self.placement = placement
        self.admission = admission
        self.lanes = lanes
        self.expiry = expiry
        self.live = live
        self.estimator = estimator
        self.counters = counters
        self.pending: list[Decision] = []  # refusals made between steps (sheds), out with the next

    def admit(self, req: Request, now: float) -> Reject | None:
        """Placement, the tenant's entitlements and quotas, queue bounds: refuse
        ``req``, or charge its tenant."""
        tenant = req.tenant
        if req.model is not None or self.tables.check_every:
            why = self.placement.never(req)
            if why is not None:
                return self.refuse(req, "unplaceable", why, now=now)
        if tenant is not None:
            refused = self.admission.check(tenant, req.cls, now)
            if refused is not None:
                return self.refuse(req, *refused, now=now)
        if self.tables.bounded:
            full = self._queue_full(req, now)
            if full is not None:
                return full
        if tenant is not None:
            self.admission.charge(tenant, req.cls, now)
        return None

    def _queue_full(self, req: Request, now: float) -> Reject | None:
        """Queue bounds: refuse ``req``, or shed less urgent work to make room."""
        cls = req.cls
        tables = self.tables
        limits = tables.wait_limits
        if limits is not None:
            timeout = (  # (none under a policy without queue timeouts: it would not time out)
                (req.timeout_s if req.timeout_s is not None else self.classes[cls].timeout_s)
                if tables.timeouts
                else None
            )
            limit = timeout if timeout is not None else limits[cls]
            if limit is not None:
                est = self.estimator.estimate_wait(req.priority, req.model, now, req.est_service_s)
                # (an infinite estimate: no worker is up; the runtime holds such requests)
                if limit < est < math.inf:
                    name = tables.names[cls]
                    if timeout is not None:  # it would only time out in the queue
                        why = (
                            f"the expected wait ({est:.0f} s) is past the {name} queue timeout ({limit:g} s)"
                        )
                        return self.refuse(req, "queue_timeout", why, now=now)
                    why = (
                        f"overloaded: the expected wait ({est:.0f} s) is past the {name} limit ({limit:g} s)"
                    )
                    return self.refuse(req, "overloaded", why, now=now)
        lanes = self.lanes
        bound = tables.max_queued[cls]
        if bound is not None and lanes.class_count[cls] >= bound:
            name = tables.names[cls]
            return self.refuse(req, "queue_full", f"the {name} queue is full ({bound})", now=now)
        total = tables.max_queued_total
        if total is not None and lanes.total >= total:
            victim = self._shed_candidate(cls)
            if victim is None:
                return self.refuse(req, "overloaded", "the server is overloaded", now=now)
            self._shed(victim, now)
        return None

    def refuse(self, req: Request, reason: str, message: str, retry_s: float = 0.0, *, now: float) -> Reject:
        """Refuse a new request at submission."""
        transition(req, State.REJECTED)
        self.counters.rejections[reason] += 1
        est = (
            0.0
            if reason in ("not_entitled", "unplaceable")
            else self.estimator.estimate_wait(req.priority, req.model, now)
        )
        if reason == "rate_limited":  # it may come back when its bucket refills: that is its wait
            return Reject(req.id, reason, message, retry_s, retry_s)
        if reason == "concurrency":  # nor sooner than its tenant's next request may start
            est = max(est, retry_s)
        return Reject(req.id, reason, message, est, max(retry_s, est))

    def withdraw(
        self, request_id: str, now: float, reason: str, message: str, retry_after_s: float
    ) -> Reject:
        """Refuse a queued request now (the runtime knows it cannot run: no worker for its
        model is healthy). Its wait estimate is ``retry_after_s``: it cannot start sooner."""
        req = self.live.get(request_id)
        if req.state is not State.QUEUED:
            raise InvalidTransition(f"request {request_id} is {req.state.value}, not queued")
        self.lanes.leave(req, now)
        transition(req, State.REJECTED)
        self.counters.rejections[reason] += 1
        self.live.end(req)
        return Reject(req.id, reason, message, retry_after_s, retry_after_s)

    def _shed_candidate(self, cls: int) -> Request | None:
        """The newest never-started request of the least urgent class below ``cls``
        (by effective class: a request others depend on is spared)."""
        for c in range(self.tables.k - 1, cls, -1):
            victim = self.expiry.newest(c, above=cls)
            if victim is not None:
                return victim
        return None

    def _shed(self, req: Request, now: float) -> None:
        self.lanes.leave(req, now)
        transition(req, State.REJECTED)
        self.counters.rejections["shed"] += 1
        est = self.estimator.estimate_wait(req.priority, req.model, now)
        self.pending.append(
            Reject(req.id, "shed", "dropped under overload for more urgent work", est, max(est, 1.0))
        )
        self.live.end(req)

    def expire(self, now: float, out: list[Decision]) -> None:
        """Queued requests past their queue timeout end."""
        for req in self.expiry.due(now):
            self.lanes.leave(req, now)
            transition(req, State.EXPIRED)
            self.counters.rejections["queue_timeout"] += 1
            self.live.end(req)
            est = self.estimator.estimate_wait(req.priority, req.model, now)
            name = self.tables.names[req.priority]
            out.append(Reject(req.id, "queue_timeout", f"queued past the {name} timeout", est, max(est, 1.0)))
