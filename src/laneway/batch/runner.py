"""The batch runner: feeds stored batch lines into the same scheduler as live traffic.

One driver task per active batch. It validates a new batch's input file,
then claims lines from the store a few at a time (at most ``max_in_flight``
per batch are submitted to the runtime at once, so a batch of 10^5 lines
never floods the core queue but keeps enough queued to keep every slot
busy), submits each at the batch's class (so P0/P1 work preempts it) with the
rest of the completion window as its queue timeout, and writes each result
once. When no line is left it finalizes: output and error files, status.

Nothing here assumes it is the only runner: lines are claimed atomically with
a lease (renewed while this process lives), results are written only by the
claim's owner, and status changes follow the store's transition table. On
start the runner picks up every active batch in the store; lines that were
running when a previous process died are claimed and run again.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from laneway.batch import results
from laneway.batch.validate import ENDPOINTS, Validated, parse_line, validate_input
from laneway.errors import Deferred, GenerationFailed, RequestError
from laneway.generation import RESPONSES, ResumeRule
from laneway.logs import Repeated
from laneway.protocol.responses import Shape, extension
from laneway.protocol.responses_answer import Answer
from laneway.runtime.runtime import Runtime
from laneway.runtime.ticket import Ticket
from laneway.store.base import (
    ACTIVE,
    BatchRecord,
    BatchStatus,
    ClaimedLine,
    FileRecord,
    Outputs,
    Store,
    StoreUnavailable,
)

log = logging.getLogger("laneway.batches")
T = TypeVar("T")

DRIVER_RETRY_MAX_S = 300.0  # the longest wait before a failed driver runs again
MAX_LISTED_ERRORS = 1000  # validation errors listed in the batch object (the error file has all)
MAX_RETRY_AFTER_S = 30.0
RETRY_FAILED_S = 1.0  # back-off before running a line again after a worker failure
STORE_RETRY_S = 2.0  # the longest wait before the store is tried again while it cannot be reached


def new_file_id() -> str:
    return "file-" + uuid.uuid4().hex[:24]


@dataclass(eq=False)
class _Driver:
    batch_id: str
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    recheck: bool = False  # re-read the batch's status (a cancel came in)
    stopping: bool = False  # cancelling or expiring: line outcomes are no longer written
    running: dict[int, asyncio.Task[None]] = field(default_factory=dict)  # line -> its task
    tickets: dict[int, Ticket] = field(default_factory=dict)
    task: asyncio.Task[None] | None = None


class BatchRunner:
    def __init__(
        self,
        runtime: Runtime,
        store: Store,
        *,
        owner: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.rt = runtime
        self.store = store
        self.cfg = runtime.config.batches
        self.clock = clock
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        slots = sum(w.capacity().slots for w in runtime.workers.values())
        self.max_in_flight = self.cfg.max_in_flight or max(8, 2 * slots)
        self._drivers: dict[str, _Driver] = {}
        self._failures: dict[str, int] = {}  # batch -> driver failures in a row
        self._retry_at: dict[str, float] = {}  # batch -> when its failed driver may run again
        self._housekeeper: asyncio.Task[None] | None = None
        self.closed = False
        # why no line may start now (the cluster's store lost its data): lines in flight end
        # and their results are written where they can be; none is claimed, none finalized
        self.paused: Callable[[], str | None] = lambda: None
        self.draining = False  # (a shutdown's grace: no line starts, those in flight go on)
        # (in a cluster: the replica's journal of what it made, so that a loss names its files too)
        self.made: Callable[[str, str, str], None] = lambda kind, object_id, tenant: None
        self._quiet = asyncio.Event()  # set while no line is in flight
        self._quiet.set()

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Resume every active batch in the store, then keep looking for new ones."""
        for batch in await self.store.batches_in(ACTIVE):
            self.track(batch.id)
        self._housekeeper = asyncio.get_running_loop().create_task(self._housekeeping())

    def drain(self) -> None:
        """A shutdown's grace: no line starts from now on; those in flight go on."""
        self.draining = True

    async def idle(self) -> None:
        """Until no line is in flight (their results written), or the runner is closed."""
        await self._quiet.wait()

    async def close(self) -> None:
        """Stop feeding lines; what was running goes back to the queue for the next start."""
        self.closed = True
        self._quiet.set()
        tasks: list[asyncio.Task[None]] = []
        if self._housekeeper is not None:
            tasks.append(self._housekeeper)
        for d in list(self._drivers.values()):
            d.stopping = True
            for ticket in list(d.tickets.values()):
                self.rt.cancel(ticket)
            tasks.extend(d.running.values())
            if d.task is not None:
                tasks.append(d.task)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.store.release_owner(self.owner)

    def refresh_metrics(self) -> None:
        """The batch gauges, read at scrape time."""
        metrics = self.rt.metrics
        metrics.batches_active.set(len(self._drivers))
        metrics.batch_running.set(sum(len(d.running) for d in self._drivers.values()))

    def track(self, batch_id: str) -> None:
        """Drive ``batch_id`` (if no driver does yet, and it is not waiting to be tried again)."""
        if self.closed or batch_id in self._drivers or self._retry_at.get(batch_id, 0.0) > self.clock():
            return
        d = _Driver(batch_id)
        self._drivers[batch_id] = d
        d.task = asyncio.get_running_loop().create_task(self._drive(d))
        d.task.add_done_callback(functools.partial(self._driver_done, d))

    def poke(self, batch_id: str) -> None:
        """The batch's status changed (a cancel): its driver looks now rather than at its next poll."""
        d = self._drivers.get(batch_id)
        if d is not None:
            d.recheck = True
            d.wake.set()

    def _driver_done(self, d: _Driver, task: asyncio.Task[None]) -> None:
        if self._drivers.get(d.batch_id) is d:
            del self._drivers[d.batch_id]
        if not task.cancelled() and task.exception() is not None:
            # housekeeping tries it again, each time after twice as long (a store that is
            # briefly unwritable), logging the traceback once
            failures = self._failures.get(d.batch_id, 0) + 1
            self._failures[d.batch_id] = failures
            delay = min(DRIVER_RETRY_MAX_S, self.cfg.poll_s * 2**failures)
            self._retry_at[d.batch_id] = self.clock() + delay
            if failures == 1:
                log.error("batch %s: driver failed", d.batch_id, exc_info=task.exception())
            else:
                log.error(
                    "batch %s: driver failed again (%d times): %r; next try in %.0f s",
                    d.batch_id,
                    failures,
                    task.exception(),
                    delay,
                )
        else:
            self._failures.pop(d.batch_id, None)
            self._retry_at.pop(d.batch_id, None)

    def running_lines(self) -> list[tuple[str, int]]:
        """The lines this runner runs now (batch, line number): only their leases are renewed."""
        return [(d.batch_id, n) for d in self._drivers.values() for n in d.running]

    async def _housekeeping(self) -> None:
        renewed = self.clock()
        self._store_down = Repeated(log)  # (a warning every 10 s while it is away, not each poll)
        while not self.closed:
            await asyncio.sleep(self.cfg.poll_s)
            try:
                now = self.clock()
                if now - renewed >= self.cfg.lease_s / 3:
                    await self.store.renew(self.owner, self.cfg.lease_s, now, self.running_lines())
                    renewed = now
                for batch in await self.store.batches_in(ACTIVE):
                    self.track(batch.id)
                self._store_down.ok("batch housekeeping: the shared store answers again")
            except StoreUnavailable as exc:
                self._store_down.warn("batch housekeeping: %s", exc)
            except Exception:
                log.exception("batch housekeeping failed")

    # ------------------------------------------------------------------ one batch
    async def _drive(self, d: _Driver) -> None:
        b = await self.store.get_batch(d.batch_id)
        if b is None:
            return
        if b.status is BatchStatus.VALIDATING:
            b = await self._validate(b)
        checked = self.clock()
        while b.status is BatchStatus.IN_PROGRESS and not self.closed:
            now = self.clock()
            try:
                if now >= b.expires_at:
                    await self._stop_lines(d)
                    b = await self._finalize(
                        b, BatchStatus.EXPIRED, "batch_expired", "the completion window ended"
                    )
                    return
                paused = self.draining or self.paused() is not None
                free = 0 if paused else self.max_in_flight - len(d.running)
                claimed = (
                    await self.store.claim(b.id, self.owner, free, self.cfg.lease_s, now) if free > 0 else []
                )
                for line in claimed:
                    self._start_line(d, b, line)
                if not paused and not d.running and not claimed and await self.store.pending(b.id) == 0:
                    await self.store.set_status(b.id, BatchStatus.FINALIZING, int(self.clock()))
                    b = await self._reread(b)
                    break
            except StoreUnavailable as exc:
                # away for a while: the lines in flight go on (their leases renewed, their
                # results written once it is back); this driver looks again shortly
                log.warning("batch %s: %s", b.id, exc)
                await asyncio.sleep(STORE_RETRY_S)
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(d.wake.wait(), max(0.0, min(self.cfg.poll_s, b.expires_at - now)))
            d.wake.clear()
            if d.recheck or self.clock() - checked >= self.cfg.poll_s:
                d.recheck = False
                checked = self.clock()
                with contextlib.suppress(StoreUnavailable):
                    b = await self._reread(b)
        if b.status is BatchStatus.FINALIZING:
            await self._finalize(b, BatchStatus.COMPLETED, None, "")
        elif b.status is BatchStatus.CANCELLING:
            await self._stop_lines(d)
            await self._finalize(b, BatchStatus.CANCELLED, "batch_cancelled", "the batch was cancelled")

    async def _reread(self, b: BatchRecord) -> BatchRecord:
        return await self.store.get_batch(b.id) or b

    async def _validate(self, b: BatchRecord) -> BatchRecord:
        content = await self.store.file_content(b.input_file_id, b.tenant)
        now = int(self.clock())
        if content is None:
            errors = [
                {
                    "code": "file_not_found",
                    "line": None,
                    "message": "the input file was deleted",
                    "param": None,
                }
            ]
            await self.store.fail_batch(b.id, errors, None, now)
            return await self._reread(b)
        try:
            checked = await asyncio.to_thread(
                validate_input, content, b.endpoint, self.rt.config, self.rt.support
            )
        except Exception as exc:  # a file that breaks the checker fails its batch, not the runner
            log.exception("batch %s: validation failed", b.id)
            checked = Validated()
            checked.bad(None, "validation_error", f"the input file could not be validated: {exc!r}")
        if checked.errors:
            lines = [
                results.unanswered(checked.custom_ids.get(e["line"]), e["code"], e["message"], e["line"])
                for e in checked.errors
            ]
            data = ("\n".join(lines) + "\n").encode("utf-8")
            record = FileRecord(
                new_file_id(), b.tenant, "batch_output", f"{b.id}_error.jsonl", len(data), now
            )
            if await self.store.fail_batch(b.id, checked.errors[:MAX_LISTED_ERRORS], (record, data), now):
                self.made("file", record.id, b.tenant)
            log.info("batch %s failed validation: %d errors", b.id, len(checked.errors))
        else:
            await self.store.start_batch(b.id, checked.lines, now)
        return await self._reread(b)

    async def _finalize(
        self, b: BatchRecord, status: BatchStatus, code: str | None, message: str
    ) -> BatchRecord:
        leftover = None if code is None else (lambda cid: results.unanswered(cid, code, message))
        now = int(self.clock())
        outputs = Outputs(new_file_id(), new_file_id(), now)
        done = await self.store.finalize(b.id, status, outputs, leftover, now)
        if done is None:  # another runner got there first, or the status moved
            return await self._reread(b)
        for file_id in (done.output_file_id, done.error_file_id):
            if file_id is not None:
                self.made("file", file_id, b.tenant)
        log.info(
            "batch %s %s: %d completed, %d failed of %d",
            b.id,
            status,
            done.completed,
            done.failed,
            done.total,
        )
        return done

    async def _stop_lines(self, d: _Driver) -> None:
        d.stopping = True
        for ticket in list(d.tickets.values()):
            self.rt.cancel(ticket)
        await asyncio.gather(*d.running.values(), return_exceptions=True)

    # ------------------------------------------------------------------ one line
    def _start_line(self, d: _Driver, b: BatchRecord, line: ClaimedLine) -> None:
        task = asyncio.get_running_loop().create_task(self._line(d, b, line))
        d.running[line.line_no] = task
        self._quiet.clear()

        def ended(_: asyncio.Task[None]) -> None:
            d.running.pop(line.line_no, None)
            d.tickets.pop(line.line_no, None)
            d.wake.set()
            if not any(other.running for other in self._drivers.values()):
                self._quiet.set()

        task.add_done_callback(ended)

    async def _line(self, d: _Driver, b: BatchRecord, line: ClaimedLine) -> None:
        try:
            await self._run_line(d, b, line)
        except asyncio.CancelledError:
            raise
        except Exception:  # the store refused: try to hand the line back so it runs again
            log.exception("batch %s line %d: could not record its outcome", b.id, line.line_no)
            with contextlib.suppress(Exception):
                await self._retry(line, RETRY_FAILED_S, count_attempt=True)

    async def _stored(self, what: str, line: ClaimedLine, op: Callable[[], Awaitable[T]]) -> T:
        """``op`` (a write of ``line``'s outcome), tried again while the store cannot be
        reached: the outcome is kept here and the line's lease renewed meanwhile (it is in
        flight), so it is written once the store is back, not lost and not run again."""
        delay = 0.1
        while True:
            try:
                return await op()
            except StoreUnavailable as exc:
                if delay == 0.1:
                    log.warning("batch %s line %d: cannot %s yet: %s", line.batch_id, line.line_no, what, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, STORE_RETRY_S)

    async def _run_line(self, d: _Driver, b: BatchRecord, line: ClaimedLine) -> None:
        cid = line.custom_id
        if line.attempts > self.cfg.max_attempts:
            message = f"the request was started {line.attempts - 1} times without finishing"
            await self._write(line, False, results.unanswered(cid, "too_many_attempts", message))
            return
        kind = ENDPOINTS[b.endpoint]
        rid = ""
        try:
            asked = json.loads(line.body)
            parsed, responses = parse_line(asked, kind, self.rt.config, self.rt.support)
            rid = parsed.job.id if responses is None else responses.id
            ticket = self.rt.submit(
                parsed.job,
                b.priority,
                tenant=b.tenant or None,
                preemptible=parsed.job.resume is not ResumeRule.NONE,  # a line's own flag is not honoured
                deltas=False,
                timeout_s=max(1.0, b.expires_at - self.clock()),
            )
        except Deferred as exc:  # quota or overload: later
            await self._retry(line, exc.retry_after_s, count_attempt=False)
            return
        except RequestError as exc:  # e.g. the model is no longer served
            await self._write(line, False, results.refused(cid, rid, exc))
            return
        d.tickets[line.line_no] = ticket
        try:
            done = await ticket.result()
        except RequestError as exc:
            if d.stopping:
                return
            if isinstance(exc, Deferred):
                await self._retry(line, exc.retry_after_s, count_attempt=False)
            elif isinstance(exc, GenerationFailed) and line.attempts < self.cfg.max_attempts:
                await self._retry(line, RETRY_FAILED_S, count_attempt=True)
            else:
                await self._write(line, False, results.refused(cid, rid, exc))
            return
        tier = asked.get("service_tier") if isinstance(asked, dict) else None
        named = asked["model"]  # (the line's own name for it: an alias stays an alias)
        now = int(self.clock())
        if responses is not None:  # (an upstream's own where its Responses API answered)
            body = Answer(responses, named, now, tier).finished(
                done, extension(ticket), forwarded=parsed.job.kind == RESPONSES, now=now, store=False
            )
        else:
            body = Shape(kind, rid, named, now, tier).final(done, extension(ticket))
        tokens = (done.usage.prompt_tokens, done.usage.completion_tokens)
        await self._write(line, True, results.answered(cid, rid, 200, body), tokens)

    async def _write(
        self, line: ClaimedLine, ok: bool, result: str, tokens: tuple[int, int] = (0, 0)
    ) -> None:
        written = await self._stored(
            "write its result",
            line,
            lambda: self.store.finish(line.batch_id, line.line_no, self.owner, ok, result, tokens),
        )
        if not written:
            log.warning("batch %s line %d: no longer ours; result dropped", line.batch_id, line.line_no)
            return
        self.rt.metrics.lines_ended["completed" if ok else "failed"].inc()

    async def _retry(self, line: ClaimedLine, after_s: float, *, count_attempt: bool) -> None:
        not_before = self.clock() + min(max(after_s, 0.0), MAX_RETRY_AFTER_S)
        released = await self._stored(
            "hand it back",
            line,
            lambda: self.store.release(
                line.batch_id, line.line_no, self.owner, not_before=not_before, count_attempt=count_attempt
            ),
        )
        if released:
            self.rt.metrics.lines_ended["retried"].inc()
