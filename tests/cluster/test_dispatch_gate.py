"""The decisions a replica holds while it makes a dispatch's worker: handed on in order,
each dispatch only once its worker is made — also when the gate is cleared meanwhile."""

from __future__ import annotations

import asyncio

from laneway.cluster.dispatch_gate import DispatchGate
from laneway.core import Decision, Dispatch


class Workers:
    """The workers made here, made after a moment (``w1``: once ``slow`` is set); what was
    handed on, and whether its worker was made by then."""

    def __init__(self, *made: str) -> None:
        self.made = set(made)
        self.handed: list[tuple[str, bool]] = []
        self.slow = asyncio.Event()

    async def make(self, worker: str) -> None:
        if worker == "w1":
            await self.slow.wait()
        else:
            await asyncio.sleep(0.01)
        self.made.add(worker)

    def hand_on(self, d: Decision) -> None:
        assert type(d) is Dispatch
        self.handed.append((d.request_id, d.worker_id in self.made))

    def gate(self) -> DispatchGate:
        return DispatchGate(lambda w: w in self.made, self.make, self.hand_on, "r1")

    async def handed_on(self, n: int) -> list[tuple[str, bool]]:
        for _ in range(100):
            if len(self.handed) >= n:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)  # (and nothing more)
        return self.handed


def test_held_decisions_go_on_in_order_each_dispatch_once_its_worker_is_made() -> None:
    async def main() -> None:
        workers = Workers("w0")
        workers.slow.set()
        gate = workers.gate()
        assert not gate.holds(Dispatch("a", "w0"))  # (its worker is here: nothing to wait for)
        for d in (Dispatch("b", "w1"), Dispatch("c", "w0"), Dispatch("d", "w2")):
            assert gate.holds(d)  # (c: behind b, in order)
        assert await workers.handed_on(3) == [("b", True), ("c", True), ("d", True)]
        await gate.close()

    asyncio.run(main())


def test_a_gate_cleared_while_it_makes_a_worker_makes_the_worker_of_what_is_held_after() -> None:
    """Cleared (the replica goes on under a new name) while a worker is made, the gate then
    holds a new dispatch: that one must wait for its own worker, not be handed on in place
    of the dropped one."""

    async def main() -> None:
        workers = Workers()
        gate = workers.gate()
        assert gate.holds(Dispatch("dropped", "w1"))
        await asyncio.sleep(0.01)  # (w1 is being made)
        gate.clear()
        assert gate.holds(Dispatch("after", "w2"))
        workers.slow.set()
        assert await workers.handed_on(1) == [("after", True)]
        await gate.close()

    asyncio.run(main())
