"""Token-fair tenants inside a class: start-time fair queueing on a virtual token counter.

Inside one class, requests are ordered by a *tag*, in seconds like an arrival
time. Each (class, tenant) has a virtual counter ``F``: where the tenant's
charged work has brought it, each request's expected cost (prompt tokens x
``prompt_weight`` + output tokens x ``output_weight``) counted as the time the
class's slots take to serve that many weighted tokens, over the tenant's
weight; each class has a virtual time ``V``: the tag of the request it
dispatched last. A request gets the tag ``max(arrival, V, F)`` and moves its
tenant's counter on by its cost; the class dispatches the lowest tag first.
A tenant sending within the class's capacity keeps tags near its arrival
times (FIFO, as without tenants); one sending more runs ahead of the present
and waits behind the others' work. So:

- tenants share the class by weight, counted in tokens, not requests: one that
  sends ten times as much waits behind its own work, not others' (VTC, as in
  "Fairness in Serving Large Language Models", Sheng et al., OSDI 2024);
- a tenant alone uses every slot (work-conserving: a tag is only an order);
- a tenant that comes back after a pause starts at ``V``, the present: it banks
  no credit for the time it sent nothing;
- one tenant's requests keep their order; a preempted request keeps its tag and
  goes back to the head of its tenant's work.

The expected cost is corrected as the tokens come (:meth:`FairShares.charge`):
a request that ends early gives back what it was charged beyond its tokens,
one that runs past its size pays for the rest, and the tenant's later requests
are tagged accordingly. A request without a tenant is tagged with its arrival
time: it is FIFO among its like, and ranks as a tenant that sends within its
share.
"""

from __future__ import annotations

from collections.abc import Mapping

from laneway.core.request import Request


class FairShares:
    def __init__(
        self,
        n_classes: int,
        weights: Mapping[str, float],
        *,
        prompt_weight: float = 1.0,
        output_weight: float = 2.0,
        tokens_per_s: float = 1000.0,
    ) -> None:
        self.weights = dict(weights)
        self.prompt_weight = prompt_weight
        self.output_weight = output_weight
        self.tokens_per_s = tokens_per_s  # weighted tokens a second the slots serve, in all
        self.v = [0.0] * n_classes  # per class: the tag dispatched last
        self.counter: dict[tuple[int, str | None], float] = {}  # F, per (class, tenant)
        # weighted tokens received, per (class, tenant): what the fairness bound is about
        self.received: dict[tuple[int, str | None], float] = {}

    def weight(self, tenant: str | None) -> float:
        return self.weights.get(tenant, 1.0) if tenant is not None else 1.0

    def _seconds(self, tenant: str | None, cost: float) -> float:
        return cost / (self.weight(tenant) * self.tokens_per_s)

    def cost(self, prompt_tokens: int, output_tokens: float) -> float:
        return self.prompt_weight * prompt_tokens + self.output_weight * output_tokens

    def tag(self, req: Request, output_tokens: float) -> float:
        """Tag a newly admitted request (charged its expected cost)."""
        cls = req.cls
        key = (cls, req.tenant)
        start = req.arrival_s
        v = self.v[cls]
        if v > start:
            start = v
        f = self.counter.get(key, start)
        if f > start:
            start = f
        req.fair_charged = charged = self.cost(req.prompt_tokens, output_tokens)
        self.counter[key] = start + self._seconds(req.tenant, charged)
        return start

    def dispatched(self, req: Request) -> None:
        cls = req.cls
        if req.tag > self.v[cls]:
            self.v[cls] = req.tag

    def charge(self, req: Request, output_tokens: int) -> None:
        """``req`` has made ``output_tokens`` so far (or in all, at its end): its tenant's
        counter follows what it really costs; it is charged at least what it was."""
        cost = self.cost(req.prompt_tokens, output_tokens)
        extra = cost - req.fair_charged
        if extra > 0:
            key = (req.cls, req.tenant)
            self.counter[key] = self.counter.get(key, 0.0) + self._seconds(req.tenant, extra)
            req.fair_charged = cost

    def ended(self, req: Request, output_tokens: int | None) -> None:
        """``req`` ended having made ``output_tokens`` (``None``: as expected): what it was
        charged beyond its tokens goes back, what it made beyond its charge (since the
        last progress report) is charged, and what it received is counted."""
        key = (req.cls, req.tenant)
        if output_tokens is not None:
            self.charge(req, output_tokens)
            cost = self.cost(req.prompt_tokens, output_tokens)
            back = req.fair_charged - cost
            if back > 0:
                self.counter[key] = self.counter.get(key, 0.0) - self._seconds(req.tenant, back)
            req.fair_charged = cost
        self.received[key] = self.received.get(key, 0.0) + req.fair_charged
