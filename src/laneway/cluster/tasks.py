"""Stopping a replica's background tasks: cancelled until they have ended.

On Python 3.11 ``asyncio.wait_for`` swallows a cancellation that arrives as the call it
awaits completes (fixed in 3.12): the task goes on with its loop as if nothing had been
asked, and one ``cancel()`` then ``await`` waits for ever (a Redis client's blocking
read, e.g. a stream read that blocks for a second at a time, is such a call). Found: a
replica's close hung in a test when a decision read answered as it was cancelled.
"""

from __future__ import annotations

import asyncio
from typing import Any

RETRY_S = 0.5  # how long one cancel is given before the next
TRIES = 20  # cancels at most (10 s in all); past them, the task is left


async def stop(task: asyncio.Task[Any] | None) -> bool:
    """Cancel ``task`` and wait until it has ended, cancelling it again while it goes on;
    whether it ended. Its exception, if it failed, is taken (not logged as never retrieved).
    Called from ``task`` itself, it is cancelled (at its next await) and not waited for."""
    if task is None:
        return True
    if task is asyncio.current_task():  # (stopping itself: it ends at its next await)
        task.cancel()
        return False
    for _ in range(TRIES):
        if task.done():
            break
        task.cancel()
        await asyncio.wait({task}, timeout=RETRY_S)
    if not task.done():
        return False
    if not task.cancelled():
        task.exception()
    return True
