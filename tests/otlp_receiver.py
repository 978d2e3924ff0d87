"""A small OTLP/HTTP trace receiver on 127.0.0.1 for the tests: ``POST /v1/traces``
(protobuf ``ExportTraceServiceRequest``, as OpenTelemetry's exporters send it), each span
kept, readable as :class:`Span` (ids in hex, attributes as Python values)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


@dataclass
class Span:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    error: bool = False
    trace_state: str = ""


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind in ("string_value", "bool_value", "int_value", "double_value") else None


def _attrs(items: Any) -> dict[str, Any]:
    return {a.key: _value(a.value) for a in items}


class Receiver:
    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.posts = 0
        lock = self.lock = threading.Lock()
        spans = self.spans
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                ok = self.path == "/v1/traces"
                if ok:
                    got = ExportTraceServiceRequest.FromString(body)
                    with lock:
                        outer.posts += 1
                        for rs in got.resource_spans:
                            service = _attrs(rs.resource.attributes).get("service.name", "")
                            for ss in rs.scope_spans:
                                for s in ss.spans:
                                    spans.append(
                                        Span(
                                            service,
                                            s.name,
                                            s.trace_id.hex(),
                                            s.span_id.hex(),
                                            s.parent_span_id.hex(),
                                            _attrs(s.attributes),
                                            [(e.name, _attrs(e.attributes)) for e in s.events],
                                            s.status.code == 2,
                                            s.trace_state,
                                        )
                                    )
                answer = ExportTraceServiceResponse().SerializeToString() if ok else b""
                self.send_response(200 if ok else 404)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def of_trace(self, trace_id: str) -> list[Span]:
        with self.lock:
            return [s for s in self.spans if s.trace_id == trace_id]

    def wait_for(self, trace_id: str, names: set[str], timeout_s: float = 30.0) -> list[Span]:
        """The spans of ``trace_id`` once spans of every name in ``names`` came (bounded wait)."""
        deadline = time.monotonic() + timeout_s
        while True:
            spans = self.of_trace(trace_id)
            if names <= {s.name for s in spans} or time.monotonic() > deadline:
                return spans
            time.sleep(0.1)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(10)


@contextlib.contextmanager
def otlp_receiver() -> Iterator[Receiver]:
    r = Receiver()
    try:
        yield r
    finally:
        r.close()
