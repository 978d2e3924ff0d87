"""Refusing work: queue bounds, shedding under overload, queue timeouts.

A mixin of :class:`~laneway.core.scheduler.Scheduler`: every refusal moves the
request to its end state, counts it by reason and carries the estimated wait a
retry would face.
"""

from __future__ import annotations

import math

from laneway.core.decisions import Decision, Reject
from laneway.core.errors import InvalidTransition
from laneway.core.request import Request, State, transition


class Refusing:
    __slots__ = ()  # the scheduler's attributes are slots (see Scheduler)

    def _admit(self, req: Request, now: float) -> Reject | None:
        """Placement, the tenant's entitlements and quotas, queue bounds: refuse
        ``req``, or charge its tenant."""
        tenant = req.tenant
        if req.model is not None or self._check_every:
            why = self.placement.never(req)
            if why is not None:
                return self._refuse(req, "unplaceable", why, now=now)
        if tenant is not None:
            refused = self.admission.check(tenant, req.cls, now)
            if refused is not None:
                return self._refuse(req, *refused, now=now)
        if self._bounded:
            full = self._queue_full(req, now)
            if full is not None:
                return full
        if tenant is not None:
            self.admission.charge(tenant, req.cls, now)
        return None

    def _queue_full(self, req: Request, now: float) -> Reject | None:
        """Queue bounds: refuse ``req``, or shed less urgent work to make room."""
        cls = req.cls
        limits = self._wait_limits
        if limits is not None:
            timeout = req.timeout_s if req.timeout_s is not None else self.classes[cls].timeout_s
            limit = timeout if timeout is not None else limits[cls]
            if limit is not None:
                est = self.estimate_wait(req.priority, req.model, now, req.est_service_s)
                # (an infinite estimate: no worker is up; the runtime holds such requests)
                if limit < est < math.inf:
                    name = self.classes[cls].name
                    if timeout is not None:  # it would only time out in the queue
                        why = (
                            f"the expected wait ({est:.0f} s) is past the {name} queue timeout ({limit:g} s)"
                        )
                        return self._refuse(req, "queue_timeout", why, now=now)
                    why = (
                        f"overloaded: the expected wait ({est:.0f} s) is past the {name} limit ({limit:g} s)"
                    )
                    return self._refuse(req, "overloaded", why, now=now)
        bound = self._max_queued[cls]
        if bound is not None and self.lanes.class_count[cls] >= bound:
            name = self.classes[cls].name
            return self._refuse(req, "queue_full", f"the {name} queue is full ({bound})", now=now)
        total = self._max_queued_total
        if total is not None and self.lanes.total >= total:
            victim = self._shed_candidate(cls)
            if victim is None:
                return self._refuse(req, "overloaded", "the server is overloaded", now=now)
            self._shed(victim, now)
        return None

    def _refuse(self, req: Request, reason: str, message: str, retry_s: float = 0.0, *, now: float) -> Reject:
        transition(req, State.REJECTED)
        self.counters.rejections[reason] += 1
        est = (
            0.0
            if reason in ("not_entitled", "unplaceable")
            else self.estimate_wait(req.priority, req.model, now)
        )
        if reason == "rate_limited":  # it may come back when its bucket refills: that is its wait
            return Reject(req.id, reason, message, retry_s, retry_s)
        return Reject(req.id, reason, message, est, max(retry_s, est))

    def quota_refusal(self, tenant: str | None, cls: int, now: float) -> tuple[str, str, float] | None:
        """Whether a new class-``cls`` request of ``tenant`` would be refused by its
        entitlements or quotas now: ``(reason, message, retry_after_s)``, or ``None``.
        It charges nothing."""
        return None if tenant is None else self.admission.check(tenant, cls, now)

    def withdraw(
        self, request_id: str, now: float, reason: str, message: str, retry_after_s: float
    ) -> Reject:
        """Refuse a queued request now (the runtime knows it cannot run: no worker for its
        model is healthy). Its wait estimate is ``retry_after_s``: it cannot start sooner."""
        req = self.get(request_id)
        if req.state is not State.QUEUED:
            raise InvalidTransition(f"request {request_id} is {req.state.value}, not queued")
        self._dequeue(req, now)
        transition(req, State.REJECTED)
        self.counters.rejections[reason] += 1
        self._end(req)
        return Reject(req.id, reason, message, retry_after_s, retry_after_s)

    def _shed_candidate(self, cls: int) -> Request | None:
        """The newest never-started request of the least urgent class below ``cls``
        (by effective class: a request others depend on is spared)."""
        for c in range(len(self.classes) - 1, cls, -1):
            victim = self.expiry.newest(c, above=cls)
            if victim is not None:
                return victim
        return None

    def _shed(self, req: Request, now: float) -> None:
        self._dequeue(req, now)
        transition(req, State.REJECTED)
        self.counters.rejections["shed"] += 1
        est = self.estimate_wait(req.priority, req.model, now)
        self._pending.append(
            Reject(req.id, "shed", "dropped under overload for more urgent work", est, max(est, 1.0))
        )
        self._end(req)

    def _expire(self, req: Request, now: float, out: list[Decision]) -> None:
        self._dequeue(req, now)
        transition(req, State.EXPIRED)
        self.counters.rejections["queue_timeout"] += 1
        self._end(req)
        est = self.estimate_wait(req.priority, req.model, now)
        name = self.classes[req.priority].name
        out.append(Reject(req.id, "queue_timeout", f"queued past the {name} timeout", est, max(est, 1.0)))
