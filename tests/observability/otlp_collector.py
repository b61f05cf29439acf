"""A real OTLP/HTTP trace endpoint on loopback, for tests: it answers `POST /v1/traces` the way an OpenTelemetry
Collector does (protobuf `ExportTraceServiceRequest` in, `ExportTraceServiceResponse` out, gzip accepted) and keeps
every span it decoded, with the resource attributes of the process that sent it."""
from __future__ import annotations

import gzip
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (ExportTraceServiceRequest,
                                                                      ExportTraceServiceResponse)

PROTOBUF = "application/x-protobuf"


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as it arrived: ids as lower-case hex, the W3C form."""

    name: str
    trace_id: str
    span_id: str
    parent_span_id: str  # "" for a root span
    kind: int  # opentelemetry.proto.trace.v1.Span.SpanKind
    start_ns: int
    resource: dict  # the sending process's resource attributes (service.name, ...)
    attributes: dict


def _value(any_value):
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


def _attributes(key_values) -> dict:
    return {kv.key: _value(kv.value) for kv in key_values}


class OtlpCollector:
    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.requests: list[dict] = []  # path, content type, encoding, spans in it
        self.lock = threading.Lock()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_POST(self):  # noqa: N802
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    raw = gzip.decompress(raw)
                content_type = self.headers.get("Content-Type", "")
                if self.path != "/v1/traces" or content_type != PROTOBUF:
                    with collector.lock:
                        collector.requests.append({"path": self.path, "content_type": content_type, "spans": 0})
                    self.send_response(404 if self.path != "/v1/traces" else 415)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                request = ExportTraceServiceRequest.FromString(raw)
                received = []
                for resource_spans in request.resource_spans:
                    resource = _attributes(resource_spans.resource.attributes)
                    for scope_spans in resource_spans.scope_spans:
                        for span in scope_spans.spans:
                            received.append(ReceivedSpan(
                                name=span.name, trace_id=span.trace_id.hex(), span_id=span.span_id.hex(),
                                parent_span_id=span.parent_span_id.hex(), kind=span.kind,
                                start_ns=span.start_time_unix_nano, resource=resource,
                                attributes=_attributes(span.attributes)))
                with collector.lock:
                    collector.spans += received
                    collector.requests.append({"path": self.path, "content_type": content_type,
                                               "spans": len(received)})
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", PROTOBUF)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        """The base endpoint, as OTEL_EXPORTER_OTLP_ENDPOINT takes it (the exporter appends /v1/traces)."""
        return f"http://127.0.0.1:{self.server.server_port}"

    def start(self) -> "OtlpCollector":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        with self.lock:
            return [s for s in self.spans if s.trace_id == trace_id]

    def wait_for(self, trace_id: str, names: set[str], timeout: float) -> dict[str, ReceivedSpan]:
        """The spans of `trace_id` by name, once every one of `names` arrived; fails after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            by_name = {s.name: s for s in self.trace(trace_id)}
            if names <= set(by_name):
                return by_name
            if time.monotonic() > deadline:
                raise AssertionError(f"spans {sorted(names - set(by_name))} of trace {trace_id} never arrived; "
                                     f"got {sorted(by_name)}")
            time.sleep(0.1)
