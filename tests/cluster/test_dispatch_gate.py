"""The decisions a replica holds while it makes a dispatch's worker: handed on in order,
each dispatch only once its worker is made — also when the gate is cleared meanwhile."""

from __future__ import annotations

import asyncio

from laneway.cluster.dispatch_gate import DispatchGate
from laneway.core import Decision, Dispatch


def test_held_decisions_go_on_in_order_each_dispatch_once_its_worker_is_made() -> None:
    async def main() -> None:
        made: set[str] = {"w0"}
        handed: list[tuple[str, bool]] = []  # (request, whether its worker was made when handed on)

        async def make(worker: str) -> None:
            await asyncio.sleep(0.01)
            made.add(worker)

        def hand_on(d: Decision) -> None:
            assert type(d) is Dispatch
            handed.append((d.request_id, d.worker_id in made))

        gate = DispatchGate(lambda w: w in made, make, hand_on, "r1")
        assert not gate.holds(Dispatch("a", "w0"))  # (its worker is here: nothing to wait for)
        for d in (Dispatch("b", "w1"), Dispatch("c", "w0"), Dispatch("d", "w2")):
            assert gate.holds(d)  # (c: behind b, in order)
        for _ in range(100):
            if len(handed) == 3:
                break
            await asyncio.sleep(0.01)
        assert handed == [("b", True), ("c", True), ("d", True)]
        await gate.close()

    asyncio.run(main())


def test_a_gate_cleared_while_it_makes_a_worker_makes_the_worker_of_what_is_held_after() -> None:
    """Cleared (the replica goes on under a new name) while a worker is made, the gate then
    holds a new dispatch: that one must wait for its own worker, not be handed on in place
    of the dropped one."""

    async def main() -> None:
        made: set[str] = set()
        handed: list[tuple[str, bool]] = []
        slow = asyncio.Event()

        async def make(worker: str) -> None:
            if worker == "w1":
                await slow.wait()
            else:
                await asyncio.sleep(0.01)
            made.add(worker)

        def hand_on(d: Decision) -> None:
            assert type(d) is Dispatch
            handed.append((d.request_id, d.worker_id in made))

        gate = DispatchGate(lambda w: w in made, make, hand_on, "r1")
        assert gate.holds(Dispatch("dropped", "w1"))
        await asyncio.sleep(0.01)  # (w1 is being made)
        gate.clear()
        assert gate.holds(Dispatch("after", "w2"))
        slow.set()
        for _ in range(100):
            if handed:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        assert handed == [("after", True)]
        await gate.close()

    asyncio.run(main())
