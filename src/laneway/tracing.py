"""OpenTelemetry traces of requests (optional: ``pip install 'laneway[otel]'``; off unless an
OTLP endpoint is configured, ``[server] otlp_traces_endpoint``).

Each request is one span (``laneway.request``, of the client's trace where its
``traceparent`` header names one), from its arrival to its end, with its class,
tenant, model, time queued and outcome; an event for each preemption. Each run
of it on a worker is a child span (``laneway.run``: the worker, whether it
resumes a preempted run, how it ended); an upstream worker sends that span's
``traceparent`` with its call, so that an engine started with
``--otlp-traces-endpoint`` (vLLM) continues the same trace. Spans are sent over
OTLP/HTTP (protobuf) in batches, off the event loop.

:data:`OFF` is what a server without tracing holds: every call returns at once,
and nothing of OpenTelemetry is imported.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from laneway.core.errors import ConfigError

log = logging.getLogger("laneway.tracing")
SERVICE_NAME = "laneway"


EXPORT_TIMEOUT_S = 5.0  # one export of spans to the collector, at most


class Ticket(Protocol):
    """What is traced of a request (the runtime's ticket)."""

    @property
    def id(self) -> str: ...

    job: Any
    class_name: str
    tenant: str | None
    worker: str | None
    run: int
    queue_s: float
    preemptions: int
    tokens: int
    span: Any


class Tracing:
    """Spans of requests and their runs (a no-op when ``endpoint`` is None)."""

    def __init__(self, endpoint: str | None = None, service: str = SERVICE_NAME) -> None:
        self.on = endpoint is not None
        self._runs: dict[str, Any] = {}  # job id -> the span of its current run
        if endpoint is None:
            return
        try:
            from opentelemetry import trace
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
            from opentelemetry.trace import SpanKind, Status, StatusCode
            from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
        except ImportError:
            raise ConfigError(
                "server.otlp_traces_endpoint: traces need OpenTelemetry: pip install 'laneway[otel]'"
            ) from None
        self._provider = TracerProvider(resource=Resource.create({"service.name": service}))
        # (bounded: a collector that is down or never answers costs a stopping server at most
        # EXPORT_TIMEOUT_S to flush, not the SDK's 30 s, past which an orchestrator kills it)
        exporter = OTLPSpanExporter(endpoint=endpoint, timeout=EXPORT_TIMEOUT_S)
        processor = BatchSpanProcessor(exporter, export_timeout_millis=EXPORT_TIMEOUT_S * 1000)
        self._provider.add_span_processor(processor)
        self._tracer = self._provider.get_tracer("laneway")
        self._propagator = TraceContextTextMapPropagator()
        self._kind = SpanKind
        self._in_span = trace.set_span_in_context
        self._status = (Status, StatusCode)
        log.info("traces go to %s (OTLP/HTTP)", endpoint)

    # ------------------------------------------------------------ the request
    def arrived(self, ticket: Ticket, traceparent: str | None, tracestate: str | None = None) -> None:
        if not self.on:
            return
        carrier = {"traceparent": traceparent} if traceparent else {}
        if traceparent and tracestate:
            carrier["tracestate"] = tracestate
        parent = self._propagator.extract(carrier)
        job = ticket.job
        ticket.span = self._tracer.start_span(
            "laneway.request",
            context=parent,
            kind=self._kind.SERVER,
            attributes={
                "laneway.request_id": job.id,
                "laneway.kind": job.kind,
                "laneway.model": job.model,
                "laneway.priority": ticket.class_name,
                "laneway.tenant": ticket.tenant or "",
            },
        )

    def run_started(self, ticket: Ticket, worker: str, resumed: bool) -> None:
        if not self.on or ticket.span is None:
            return
        self._end_run(ticket.id, "superseded")
        self._runs[ticket.id] = self._tracer.start_span(
            "laneway.run",
            context=self._in_span(ticket.span),
            kind=self._kind.CLIENT,
            attributes={"laneway.worker": worker, "laneway.resumed": resumed, "laneway.run": ticket.run},
        )

    def preempted(self, ticket: Ticket, mode: str, tokens_done: int, checkpoint_bytes: int) -> None:
        if not self.on or ticket.span is None:
            return
        self._end_run(ticket.id, "preempted")
        ticket.span.add_event(
            "preempted",
            {
                "laneway.worker": ticket.worker or "",
                "laneway.resume": mode,
                "laneway.tokens_done": tokens_done,
                "laneway.checkpoint_bytes": checkpoint_bytes,
            },
        )

    def ended(self, ticket: Ticket, outcome: str, tokens: tuple[int, int] | None, error: str | None) -> None:
        if not self.on or ticket.span is None:
            return
        self._end_run(ticket.id, outcome)
        span, ticket.span = ticket.span, None
        span.set_attributes(
            {
                "laneway.outcome": outcome,
                "laneway.queue_s": ticket.queue_s,
                "laneway.preemptions": ticket.preemptions,
                "laneway.worker": ticket.worker or "",
            }
        )
        if tokens is not None:
            span.set_attributes({"laneway.prompt_tokens": tokens[0], "laneway.completion_tokens": tokens[1]})
        elif ticket.tokens:  # (ended with no usage, a cancel: what it streamed)
            span.set_attribute("laneway.completion_tokens", ticket.tokens)
        if error is not None:
            status, code = self._status
            span.set_status(status(code.ERROR, error))
        span.end()

    def _end_run(self, job_id: str, how: str) -> None:
        span = self._runs.pop(job_id, None)
        if span is not None:
            span.set_attribute("laneway.run_end", how)
            span.end()

    # ------------------------------------------------------------ to the engine
    def carried_by(self, worker: object) -> None:
        """An upstream worker (one with a ``trace`` hook): its calls carry their run's
        ``traceparent`` from now on."""
        if self.on and hasattr(worker, "trace"):
            worker.trace = self.traceparent

    def traceparent(self, job_id: str) -> str | None:
        """The W3C ``traceparent`` an upstream call of ``job_id``'s current run carries."""
        span = self._runs.get(job_id)
        if span is None:
            return None
        ctx = span.get_span_context()
        return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"

    def close(self) -> None:
        """Send what is left (a server stopping)."""
        if self.on:
            for job_id in list(self._runs):
                self._end_run(job_id, "shutdown")
            self._provider.shutdown()


OFF = Tracing()
