"""The shared store: files, batches and lines in Redis, for several gateway replicas.

:class:`RedisDB` has the operations of :class:`~laneway.store.sqlite.SQLiteDB`,
synchronous, with the same meaning; :class:`~laneway.store.redis_store.RedisStore`
runs it on a thread of its own, as the SQLite store is run. Every change that
must be whole is one Lua script (Redis runs each atomically) or, where Python
must compute part of it (a batch's output files), a ``WATCH``/``MULTI``
transaction that is tried again when anything it read changed.

Unlike the embedded store, opening it releases nothing: lines ``running``
belong to replicas that may well be alive; a dead replica's lines are claimed
again by anyone once their lease runs out.

Keys (all under ``prefix``): ``seq`` (creation order), ``f:ID`` / ``fc:ID`` (a
file and its content), ``files:TENANT`` and ``batches:TENANT`` (zsets by
creation order), ``b:ID`` (a batch), ``bs:STATUS`` (batches by status), and
per batch ``ld:`` (custom_id and body of each line), ``lst:`` (state),
``latt:`` (attempts), ``lown:`` (owner), ``lres:`` (result), ``lq:`` (queued
lines by when they may run), ``lr:`` (running lines by lease end); ``own:OWNER``
holds the lines an owner runs; ``r:["TENANT","ID"]`` a stored response.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import redis

from laneway.bus import BusUnavailable, connect_sync
from laneway.store.base import (
    BatchRecord,
    BatchStatus,
    ClaimedLine,
    FileRecord,
    LineState,
    LineView,
    NewLine,
    Outputs,
    StoreError,
    sources,
)
from laneway.store.redis_lua import (
    LUA_CLAIM,
    LUA_CREATE_BATCH,
    LUA_DELETE_FILE,
    LUA_FAIL_BATCH,
    LUA_FINISH,
    LUA_PUT_FILE,
    LUA_RELEASE,
    LUA_RELEASE_OWNER,
    LUA_RENEW,
    LUA_SET_STATUS,
    LUA_START_BATCH,
)

# a line whose owner still says it lives is claimed again this long after its lease ran out
# (a replica standing still is taken for dead by then: laneway.cluster.liveness)
CLAIM_GRACE_S = 4.0
# ... and one neither alive nor taken for dead (yet) this long after
CLAIM_LONG_GRACE_S = 30.0
SOCKET_TIMEOUT_S = 10.0  # a Redis standing still fails a call after this (it is tried again)
LINE_WRITE_CHUNK = 1000  # lines per round trip when a batch starts
STAGE_TTL_MS = 600_000  # lines written for a start that never happened expire
FINALIZE_TRIES = 20  # a finalize races finishing lines at most this often before giving up
_BATCH_INTS = (
    "priority",
    "created_at",
    "expires_at",
    "in_progress_at",
    "finalizing_at",
    "completed_at",
    "failed_at",
    "expired_at",
    "cancelling_at",
    "cancelled_at",
    "total",
    "completed",
    "failed",
    "input_tokens",
    "output_tokens",
)
_BATCH_FIELDS = BatchRecord.__slots__
_STATE = {"q": LineState.QUEUED, "r": LineState.RUNNING, "d": LineState.DONE, "f": LineState.FAILED}


def _no(line_no: int) -> str:
    return f"{line_no:010d}"


def _s(v: bytes | str | None) -> str | None:
    return v.decode() if isinstance(v, bytes) else v


class RedisDB:
    """The store's operations on one Redis connection (use from one thread at a time)."""

    def __init__(self, url: str, prefix: str = "laneway:") -> None:
        self.p = prefix
        self.recovered = 0  # (nothing is released on open: other replicas may be running lines)
        # how long past its lease a line of an owner alive, and of one neither alive nor taken
        # for dead, waits before it is claimed again (:data:`LUA_CLAIM`; 0, 0: at once, as
        # owners that are not replicas of a cluster, whose liveness is not in Redis)
        self.claim_grace = (0.0, 0.0)
        try:
            # (its replies are bytes, which the client's types leave as bytes | str | ...: read as such)
            self.r: Any = connect_sync(url, timeout_s=SOCKET_TIMEOUT_S)
            self.r.ping()
        except (redis.RedisError, ValueError, BusUnavailable) as exc:
            raise StoreError(f"cannot use the Redis store at {url}: {exc}") from None
        self._scripts = {
            name: self.r.register_script(code)
            for name, code in (
                ("put_file", LUA_PUT_FILE),
                ("delete_file", LUA_DELETE_FILE),
                ("create_batch", LUA_CREATE_BATCH),
                ("set_status", LUA_SET_STATUS),
                ("start_batch", LUA_START_BATCH),
                ("fail_batch", LUA_FAIL_BATCH),
                ("claim", LUA_CLAIM),
                ("renew", LUA_RENEW),
                ("finish", LUA_FINISH),
                ("release", LUA_RELEASE),
                ("release_owner", LUA_RELEASE_OWNER),
            )
        }

    def _run(self, name: str, *args: Any) -> Any:
        return self._scripts[name](args=[self.p, *args])

    def close(self) -> None:
        self.r.close()

    # ------------------------------------------------------------------ responses
    def _response_key(self, response_id: str, tenant: str) -> str:
        return self.p + "r:" + json.dumps([tenant, response_id])  # (no tenant can forge another's key)

    def put_response(self, response_id: str, tenant: str, created_at: int, record: str) -> None:
        self.r.set(self._response_key(response_id, tenant), record)

    def get_response(self, response_id: str, tenant: str) -> str | None:
        return _s(self.r.get(self._response_key(response_id, tenant)))

    def delete_response(self, response_id: str, tenant: str) -> bool:
        return bool(self.r.delete(self._response_key(response_id, tenant)))

    # ------------------------------------------------------------------ files
    def put_file(self, r: FileRecord, content: bytes) -> None:
        self._run("put_file", r.id, r.tenant, r.purpose, r.filename, r.bytes, r.created_at, content)

    def _file(self, file_id: str, tenant: str) -> FileRecord | None:
        h = self.r.hgetall(self.p + "f:" + file_id)
        if not h or _s(h[b"tenant"]) != tenant:
            return None
        return FileRecord(
            file_id,
            tenant,
            h[b"purpose"].decode(),
            h[b"filename"].decode(),
            int(h[b"bytes"]),
            int(h[b"created_at"]),
        )

    def get_file(self, file_id: str, tenant: str) -> FileRecord | None:
        return self._file(file_id, tenant)

    def file_content(self, file_id: str, tenant: str) -> bytes | None:
        if self._file(file_id, tenant) is None:
            return None
        data = self.r.get(self.p + "fc:" + file_id)
        return bytes(data) if data is not None else None

    def _page(
        self,
        index: str,
        after: str | None,
        keep: Callable[[str], Any],
        limit: int,
        oldest_first: bool = False,
    ) -> tuple[list[Any], bool]:
        """Newest first (or oldest), after ``after`` (an id in ``index``), ``limit`` of what
        ``keep`` keeps."""
        top: str = "-inf" if oldest_first else "+inf"
        if after is not None:
            score = self.r.zscore(index, after)
            if score is None:
                return [], False
            top = f"({int(score)}"
        out: list[Any] = []
        offset = 0
        while True:
            n = max(64, limit + 1)
            if oldest_first:
                ids = self.r.zrangebyscore(index, top, "+inf", start=offset, num=n)
            else:
                ids = self.r.zrevrangebyscore(index, top, "-inf", start=offset, num=n)
            if not ids:
                return out, False
            for i in ids:
                got = keep(i.decode())
                if got is not None:
                    if len(out) == limit:
                        return out, True
                    out.append(got)
            offset += len(ids)

    def list_files(
        self,
        tenant: str,
        *,
        limit: int,
        after: str | None = None,
        purpose: str | None = None,
        oldest_first: bool = False,
    ) -> tuple[list[FileRecord], bool]:
        def keep(file_id: str) -> FileRecord | None:
            f = self._file(file_id, tenant)
            return f if f is not None and (purpose is None or f.purpose == purpose) else None

        return self._page(self.p + "files:" + tenant, after, keep, limit, oldest_first)

    def delete_file(self, file_id: str, tenant: str) -> bool:
        return bool(self._run("delete_file", file_id, tenant))

    # ------------------------------------------------------------------ batches
    def create_batch(self, r: BatchRecord) -> None:
        fields: list[object] = []
        for name in _BATCH_FIELDS:
            value = getattr(r, name)
            if name in ("id", "errors") or value is None:
                continue
            if name == "metadata":
                value = json.dumps(value)
            elif name == "status":
                value = value.value
            fields += [name, value]
        try:
            self._run("create_batch", r.id, r.tenant, r.status.value, *fields)
        except redis.ResponseError as exc:
            raise StoreError(f"batch {r.id}: {exc}") from None

    def _batch_from(self, h: dict[bytes, bytes], batch_id: str) -> BatchRecord:
        kw: dict[str, Any] = {}
        for k, v in h.items():
            name = k.decode()
            if name == "seq":
                continue
            if name in _BATCH_INTS:
                kw[name] = int(v)
            elif name == "status":
                kw[name] = BatchStatus(v.decode())
            elif name == "errors":
                kw[name] = tuple(json.loads(v))
            elif name == "metadata":
                kw[name] = json.loads(v)
            else:
                kw[name] = v.decode()
        return BatchRecord(id=batch_id, **kw)

    def get_batch(self, batch_id: str, tenant: str | None = None) -> BatchRecord | None:
        h = self.r.hgetall(self.p + "b:" + batch_id)
        if not h or (tenant is not None and _s(h[b"tenant"]) != tenant):
            return None
        return self._batch_from(h, batch_id)

    def list_batches(
        self, tenant: str, *, limit: int, after: str | None = None
    ) -> tuple[list[BatchRecord], bool]:
        return self._page(self.p + "batches:" + tenant, after, lambda i: self.get_batch(i, tenant), limit)

    def batches_in(self, statuses: frozenset[BatchStatus]) -> list[BatchRecord]:
        found: list[tuple[float, str]] = []
        for s in statuses:
            found += [
                (score, i.decode())
                for i, score in self.r.zrange(self.p + "bs:" + s.value, 0, -1, withscores=True)
            ]
        out = [self.get_batch(i) for _, i in sorted(found)]
        return [b for b in out if b is not None]

    def set_status(self, batch_id: str, status: BatchStatus, now: int) -> bool:
        src = sorted(s.value for s in sources(status))
        return bool(self._run("set_status", batch_id, status.value, f"{status.value}_at", now, *src))

    def start_batch(self, batch_id: str, lines: Sequence[NewLine], now: int) -> bool:
        if len({n.custom_id for n in lines}) != len(lines):
            raise StoreError(f"batch {batch_id}: a custom_id is on two lines")
        if self.r.hget(self.p + "b:" + batch_id, "status") not in (b"validating", b"cancelling"):
            return False  # (cancelling: the script writes its lines only if it never started)
        stage = f"{self.p}stage:{uuid.uuid4().hex}:"
        try:
            for i in range(0, len(lines), LINE_WRITE_CHUNK):
                pipe = self.r.pipeline(transaction=False)
                part = lines[i : i + LINE_WRITE_CHUNK]
                pipe.hset(
                    stage + "ld:", mapping={_no(n.line_no): json.dumps([n.custom_id, n.body]) for n in part}
                )
                pipe.hset(stage + "lst:", mapping={_no(n.line_no): "q" for n in part})
                pipe.hset(stage + "latt:", mapping={_no(n.line_no): 0 for n in part})
                pipe.zadd(stage + "lq:", {_no(n.line_no): 0 for n in part})
                for k in ("ld:", "lst:", "latt:", "lq:"):
                    pipe.pexpire(stage + k, STAGE_TTL_MS)  # (what a crash here leaves goes by itself)
                pipe.execute()
            return bool(self._run("start_batch", batch_id, now, len(lines), stage))
        finally:
            self.r.delete(*(stage + k for k in ("ld:", "lst:", "latt:", "lq:")))

    def _line_keys(self, batch_id: str) -> list[str]:
        return [self.p + k + batch_id for k in ("ld:", "lst:", "latt:", "lown:", "lres:", "lq:", "lr:")]

    def fail_batch(
        self,
        batch_id: str,
        errors: Sequence[dict[str, Any]],
        error_file: tuple[FileRecord, bytes] | None,
        now: int,
    ) -> bool:
        extra: list[object] = [""]
        if error_file is not None:
            r, content = error_file
            extra = [r.id, r.tenant, r.purpose, r.filename, r.bytes, r.created_at, content]
        return bool(self._run("fail_batch", batch_id, now, json.dumps(list(errors)), *extra))

    # ------------------------------------------------------------------ lines
    def claim(self, batch_id: str, owner: str, limit: int, lease_s: float, now: float) -> list[ClaimedLine]:
        if limit <= 0:
            return []
        got = self._run("claim", batch_id, owner, limit, repr(now + lease_s), repr(now), *self.claim_grace)
        out = []
        for i in range(0, len(got), 3):
            cid, body = json.loads(got[i + 1])
            out.append(ClaimedLine(batch_id, int(got[i]), cid, body, int(got[i + 2])))
        return out

    def lost(self, object_id: str) -> dict[str, Any] | None:
        """A batch or file recorded lost by a replica of the cluster (laneway.cluster.node)."""
        raw = self.r.hget(self.p + "lostids", object_id)
        if raw is None:
            return None
        try:
            info = json.loads(raw)
        except ValueError:
            return None
        return info if isinstance(info, dict) else None

    def renew(self, owner: str, lease_s: float, now: float, lines: Sequence[tuple[str, int]]) -> None:
        args: list[object] = [owner, repr(now + lease_s)]
        for batch_id, line_no in lines:
            args += [batch_id, _no(line_no)]
        self._run("renew", *args)

    def finish(
        self, batch_id: str, line_no: int, owner: str, ok: bool, result: str, tokens: tuple[int, int] = (0, 0)
    ) -> bool:
        state = "d" if ok else "f"
        return bool(self._run("finish", batch_id, _no(line_no), owner, state, result, *tokens))

    def release(
        self, batch_id: str, line_no: int, owner: str, *, not_before: float, count_attempt: bool
    ) -> bool:
        undo = 0 if count_attempt else 1
        return bool(self._run("release", batch_id, _no(line_no), owner, repr(not_before), undo))

    def release_owner(self, owner: str) -> int:
        return int(self._run("release_owner", owner))

    def pending(self, batch_id: str) -> int:
        return int(self.r.zcard(self.p + "lq:" + batch_id)) + int(self.r.zcard(self.p + "lr:" + batch_id))

    def finalize(
        self,
        batch_id: str,
        status: BatchStatus,
        outputs: Outputs,
        leftover: Callable[[str], str] | None,
        now: int,
    ) -> BatchRecord | None:
        src = {s.value for s in sources(status)}
        key = self.p + "b:" + batch_id
        lst, lres, ld = (self.p + k + batch_id for k in ("lst:", "lres:", "ld:"))
        for _ in range(FINALIZE_TRIES):
            with self.r.pipeline(transaction=True) as pipe:
                try:
                    pipe.watch(key, lst)
                    rec = self.get_batch(batch_id)
                    if rec is None or rec.status.value not in src:
                        return None
                    states = {int(k): v.decode() for k, v in pipe.hgetall(lst).items()}
                    results = {int(k): v.decode() for k, v in pipe.hgetall(lres).items()}
                    left = sorted(n for n, s in states.items() if s in ("q", "r"))
                    if left and leftover is None:
                        raise StoreError(f"batch {batch_id} still has {len(left)} lines to run")
                    filled: dict[int, str] = {}
                    for n in left:
                        cid, _ = json.loads(pipe.hget(ld, _no(n)))
                        filled[n] = leftover(cid)  # type: ignore[misc]
                    done = [results[n] for n in sorted(states) if states[n] == "d"]
                    failed = [
                        filled.get(n) or results[n] for n in sorted(states) if states[n] in ("f", "q", "r")
                    ]
                    pipe.multi()
                    for n, text in filled.items():
                        pipe.hset(lres, _no(n), text)
                        pipe.hset(lst, _no(n), "f")
                    if filled:
                        pipe.hincrby(key, "failed", len(filled))
                        pipe.delete(
                            self.p + "lq:" + batch_id, self.p + "lr:" + batch_id, self.p + "lown:" + batch_id
                        )
                    out_id = self._output(
                        pipe, rec, outputs.output_file_id, "output", done, outputs.created_at
                    )
                    err_id = self._output(
                        pipe, rec, outputs.error_file_id, "error", failed, outputs.created_at
                    )
                    fields: dict[str, Any] = {"status": status.value, f"{status.value}_at": now}
                    if out_id is not None:
                        fields["output_file_id"] = out_id
                    if err_id is not None:
                        fields["error_file_id"] = err_id
                    pipe.hset(key, mapping=fields)
                    seq = self.r.hget(key, "seq")
                    pipe.zrem(self.p + "bs:" + rec.status.value, batch_id)
                    pipe.zadd(self.p + "bs:" + status.value, {batch_id: int(seq or 0)})
                    pipe.execute()
                except redis.WatchError:
                    continue  # a line ended or the status moved meanwhile: read again
            return self.get_batch(batch_id)
        raise StoreError(f"batch {batch_id}: could not finalize (it kept changing)")

    def _output(
        self, pipe: Any, rec: BatchRecord, file_id: str, kind: str, lines: list[str], now: int
    ) -> str | None:
        if not lines:
            return None
        content = ("\n".join(lines) + "\n").encode("utf-8")
        seq = self.r.incr(self.p + "seq")
        pipe.hset(
            self.p + "f:" + file_id,
            mapping={
                "tenant": rec.tenant,
                "purpose": "batch_output",
                "filename": f"{rec.id}_{kind}.jsonl",
                "bytes": len(content),
                "created_at": now,
                "seq": seq,
            },
        )
        pipe.set(self.p + "fc:" + file_id, content)
        pipe.zadd(self.p + "files:" + rec.tenant, {file_id: seq})
        return file_id

    def lines(self, batch_id: str) -> list[LineView]:
        states = self.r.hgetall(self.p + "lst:" + batch_id)
        data = self.r.hgetall(self.p + "ld:" + batch_id)
        attempts = self.r.hgetall(self.p + "latt:" + batch_id)
        results = self.r.hgetall(self.p + "lres:" + batch_id)
        out = []
        for k in sorted(states, key=int):
            cid, _ = json.loads(data[k])
            res = results.get(k)
            out.append(LineView(int(k), cid, _STATE[states[k].decode()], int(attempts.get(k, 0)), _s(res)))
        return out
