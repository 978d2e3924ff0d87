"""The store protocol: durable files, batches, per-line request state and stored responses.

Everything a batch needs to survive a crash lives behind :class:`Store`. The
embedded default is SQLite (:mod:`laneway.store.sqlite`); the protocol is
written so that a shared store (Redis) can stand behind it for several
gateway replicas:

- a line is *claimed* atomically by an ``owner`` (one runner process) with a
  lease; a line whose lease ran out can be claimed again by anyone, so a dead
  process never holds lines for ever;
- a line's result and its state change are written in one step, and only by
  the owner holding it (a stale owner's write is refused): every line ends
  exactly once, with one result per ``custom_id``;
- a batch changes status only along :data:`TRANSITIONS`.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from laneway.core.errors import LanewayError


class StoreError(LanewayError):
    """The store cannot be opened or was asked something it must refuse."""


class StoreUnavailable(StoreError):
    """The store cannot be reached now (Redis down, restarting or standing still): the same
    call may succeed later."""


class BatchStatus(enum.StrEnum):
    VALIDATING = "validating"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"
    EXPIRED = "expired"


S = BatchStatus
TRANSITIONS: dict[BatchStatus, frozenset[BatchStatus]] = {
    S.VALIDATING: frozenset({S.IN_PROGRESS, S.FAILED, S.CANCELLING}),
    S.IN_PROGRESS: frozenset({S.FINALIZING, S.CANCELLING, S.EXPIRED}),
    S.FINALIZING: frozenset({S.COMPLETED}),
    S.CANCELLING: frozenset({S.CANCELLED}),
    S.COMPLETED: frozenset(),
    S.FAILED: frozenset(),
    S.CANCELLED: frozenset(),
    S.EXPIRED: frozenset(),
}
ACTIVE = frozenset({S.VALIDATING, S.IN_PROGRESS, S.FINALIZING, S.CANCELLING})
TERMINAL = frozenset(s for s, nxt in TRANSITIONS.items() if not nxt)


def sources(target: BatchStatus) -> frozenset[BatchStatus]:
    """The statuses a batch may move to ``target`` from."""
    return frozenset(s for s, nxt in TRANSITIONS.items() if target in nxt)


class LineState(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class FileRecord:
    id: str
    tenant: str  # "" when the server has no tenants
    purpose: str
    filename: str
    bytes: int
    created_at: int


@dataclass(frozen=True, slots=True)
class BatchRecord:
    id: str
    tenant: str
    endpoint: str
    input_file_id: str
    completion_window: str
    priority: int  # class rank
    status: BatchStatus
    created_at: int
    expires_at: int
    in_progress_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    total: int = 0
    completed: int = 0
    failed: int = 0
    errors: tuple[dict[str, Any], ...] | None = None
    metadata: dict[str, str] | None = None
    input_tokens: int = 0  # over the lines answered so far
    output_tokens: int = 0


@dataclass(frozen=True, slots=True)
class NewLine:
    """A validated input line: its 1-based line number in the file, custom_id, body (JSON text)."""

    line_no: int
    custom_id: str
    body: str


@dataclass(frozen=True, slots=True)
class ClaimedLine:
    batch_id: str
    line_no: int
    custom_id: str
    body: str
    attempts: int  # including this one


@dataclass(frozen=True, slots=True)
class LineView:
    """A line as a test or an operator inspects it."""

    line_no: int
    custom_id: str
    state: LineState
    attempts: int
    result: str | None


@dataclass(frozen=True, slots=True)
class Outputs:
    """What finalizing a batch names its files: ids, names, the creation time."""

    output_file_id: str
    error_file_id: str
    created_at: int


Page = tuple[list[Any], bool]  # records, has_more


class Store(Protocol):
    """Durable state of files and batches. Every method is safe to call from the event loop."""

    # files
    async def put_file(self, record: FileRecord, content: bytes) -> None: ...
    async def get_file(self, file_id: str, tenant: str) -> FileRecord | None: ...
    async def file_content(self, file_id: str, tenant: str) -> bytes | None: ...
    async def list_files(
        self,
        tenant: str,
        *,
        limit: int,
        after: str | None = None,
        purpose: str | None = None,
        oldest_first: bool = False,
    ) -> tuple[list[FileRecord], bool]: ...
    async def delete_file(self, file_id: str, tenant: str) -> bool: ...

    # stored responses (the Responses API): a JSON record per tenant and id
    async def put_response(self, response_id: str, tenant: str, created_at: int, record: str) -> None: ...
    async def get_response(self, response_id: str, tenant: str) -> str | None: ...
    async def delete_response(self, response_id: str, tenant: str) -> bool: ...

    # batches
    async def create_batch(self, record: BatchRecord) -> None: ...
    async def get_batch(self, batch_id: str, tenant: str | None = None) -> BatchRecord | None:
        """``tenant=None``: any tenant's (the runner); else only that tenant's."""

    async def list_batches(
        self, tenant: str, *, limit: int, after: str | None = None
    ) -> tuple[list[BatchRecord], bool]: ...
    async def batches_in(self, statuses: frozenset[BatchStatus]) -> list[BatchRecord]: ...
    async def set_status(self, batch_id: str, status: BatchStatus, now: int) -> bool:
        """Move along :data:`TRANSITIONS`; ``False`` if the batch is not in a source status."""

    async def start_batch(self, batch_id: str, lines: Sequence[NewLine], now: int) -> bool:
        """validating → in_progress with its lines, in one step."""

    async def fail_batch(
        self,
        batch_id: str,
        errors: Sequence[dict[str, Any]],
        error_file: tuple[FileRecord, bytes] | None,
        now: int,
    ) -> bool:
        """validating → failed, with the validation errors (and an error file)."""

    # lines
    async def claim(
        self, batch_id: str, owner: str, limit: int, lease_s: float, now: float
    ) -> list[ClaimedLine]: ...
    async def lost(self, object_id: str) -> dict[str, Any] | None:
        """What is known of a batch or file the store lost (the shared store came back
        without its data): ``kind``, ``tenant``, ``lost`` (why); ``None`` if it was not."""
        ...

    async def renew(self, owner: str, lease_s: float, now: float, lines: Sequence[tuple[str, int]]) -> None:
        """Extend the lease of ``lines`` (batch, line number): those ``owner`` runs now."""
        ...

    async def finish(
        self, batch_id: str, line_no: int, owner: str, ok: bool, result: str, tokens: tuple[int, int] = (0, 0)
    ) -> bool:
        """Write the line's result and end it, adding its ``(input, output)`` tokens to
        the batch's; ``False`` (nothing written) unless ``owner`` holds it."""

    async def release(
        self, batch_id: str, line_no: int, owner: str, *, not_before: float, count_attempt: bool
    ) -> bool:
        """Put a running line back in the queue (to be claimed again after ``not_before``)."""

    async def release_owner(self, owner: str) -> int:
        """An orderly stop of ``owner``: its running lines go back to the queue, the run not counted."""

    async def pending(self, batch_id: str) -> int:
        """Lines not ended yet (queued or running)."""

    async def finalize(
        self,
        batch_id: str,
        status: BatchStatus,
        outputs: Outputs,
        leftover: Callable[[str], str] | None,
        now: int,
    ) -> BatchRecord | None:
        """End the batch in ``status``: lines not ended get ``leftover(custom_id)`` as their
        failed result (none may be left when ``leftover`` is None); the output and error files
        are written from the results in line order; all in one step."""

    async def lines(self, batch_id: str) -> list[LineView]: ...
    async def close(self) -> None: ...
