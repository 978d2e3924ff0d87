"""Driving an :class:`~laneway.engine.engine.Engine` from a thread of its own.

Commands (add, resume, preempt, cancel) go through a queue and run between
decode steps, so a preemption frees its slot within one step. Each command
returns a :class:`concurrent.futures.Future`. Event sinks are called on the
engine thread; callers marshal them to their own loop.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from laneway.engine.engine import Engine
from laneway.engine.sequences import Sink
from laneway.generation import Checkpoint, Job

T = TypeVar("T")
IDLE_POLL_S = 0.5
MAX_BROKEN_STEPS = 3  # steps in a row failing as a whole before the engine counts as down


class EngineRunner:
    def __init__(self, engine: Engine, name: str = "engine") -> None:
        self.engine = engine
        self._cmds: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name=f"laneway-{name}", daemon=True)
        self._closed = False
        self._closing = threading.Lock()  # (a command is queued only while the thread takes them)
        self.error: BaseException | None = None
        self._thread.start()

    def call(self, fn: Callable[[], T]) -> Future[T]:
        """Run ``fn`` on the engine thread between two steps."""
        fut: Future[T] = Future()
        with self._closing:
            if not self._closed:
                self._cmds.put((fn, fut))
                return fut
        why = f"the engine is down: {self.error}" if self.error is not None else "the engine is closed"
        fut.set_exception(RuntimeError(why))
        return fut

    def add(self, job: Job, sink: Sink, prompt_ids: list[int] | None = None) -> Future[None]:
        return self.call(lambda: self.engine.add(job, sink, prompt_ids))

    def resume(self, ckpt: Checkpoint, sink: Sink) -> Future[None]:
        return self.call(lambda: self.engine.resume(ckpt, sink))

    def preempt(self, job_id: str, mode: str) -> Future[Checkpoint | None]:
        return self.call(lambda: self.engine.preempt(job_id, mode))

    def cancel(self, job_id: str) -> Future[bool]:
        return self.call(lambda: self.engine.cancel(job_id))

    def close(self, timeout: float = 10.0) -> None:
        with self._closing:
            if self._closed:
                return
            self._closed = True
            self._cmds.put(None)
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.error is None

    def _run(self, item: tuple[Callable[[], Any], Future[Any]]) -> None:
        fn, fut = item
        if not fut.set_running_or_notify_cancel():
            return
        try:
            fut.set_result(fn())
        except BaseException as exc:  # handed to whoever waits on the future
            fut.set_exception(exc)

    def _drain(self, block: bool) -> bool:
        """Run the waiting commands (waiting a while for one if ``block``); ``False`` once closed."""
        try:
            item = self._cmds.get(timeout=IDLE_POLL_S) if block else self._cmds.get_nowait()
            while True:
                if item is None:
                    return False
                self._run(item)
                item = self._cmds.get_nowait()
        except queue.Empty:
            return True

    def _loop(self) -> None:
        engine = self.engine
        broken = 0  # steps in a row that failed as a whole
        while self._drain(block=not engine.has_work):
            if not engine.has_work:
                continue
            try:
                engine.step()
                broken = 0
            except Exception as exc:  # outside any one request: every job here fails, once
                broken += 1
                engine.fail_all(exc)
                if broken >= MAX_BROKEN_STEPS:  # the engine itself is broken: stop taking work
                    self.error = exc
                    self._refuse_all(exc)
                    return

    def _refuse_all(self, exc: BaseException) -> None:
        """Take no command from now on, and fail those queued (their callers wait on them)."""
        with self._closing:
            self._closed = True
        while True:
            try:
                item = self._cmds.get_nowait()
            except queue.Empty:
                return
            if item is not None and item[1].set_running_or_notify_cancel():
                item[1].set_exception(RuntimeError(f"the engine is down: {exc}"))
