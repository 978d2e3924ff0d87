"""A replica's background tasks stop even when a cancel is swallowed."""

from __future__ import annotations

import asyncio

from laneway.cluster import tasks


def test_a_task_that_swallows_a_cancel_is_cancelled_again_until_it_ends() -> None:
    """As Python 3.11's ``asyncio.wait_for`` does when the call it awaits completes as the
    cancel comes: the loop goes on. One cancel and an await hung a replica's close."""

    async def stubborn(log: list[str]) -> None:
        while True:
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                if not log:  # (the first cancel swallowed)
                    log.append("swallowed")
                    continue
                log.append("ended")
                raise

    async def main() -> tuple[bool, list[str], bool]:
        log: list[str] = []
        t = asyncio.create_task(stubborn(log))
        await asyncio.sleep(0)
        ended = await asyncio.wait_for(tasks.stop(t), 5)
        return ended, log, t.cancelled()

    assert asyncio.run(main()) == (True, ["swallowed", "ended"], True)


def test_a_failed_task_and_none_and_itself() -> None:
    async def fails() -> None:
        raise ValueError("broken")

    async def itself(box: list[asyncio.Task[bool]]) -> bool:
        return await tasks.stop(box[0])

    async def main() -> tuple[bool, bool, bool, bool]:
        t = asyncio.create_task(fails())
        await asyncio.sleep(0)
        box: list[asyncio.Task[bool]] = []
        me = asyncio.create_task(itself(box))
        box.append(me)
        try:
            await me
            own = False
        except asyncio.CancelledError:
            own = True  # (cancelled at its next await, not waited for)
        return await tasks.stop(t), await tasks.stop(None), own, me.cancelled()

    assert asyncio.run(main()) == (True, True, True, True)
