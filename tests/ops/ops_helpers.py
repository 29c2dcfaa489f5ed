"""Helpers of the operations tests: free ports, a Prometheus scraper, an OTLP/HTTP metrics receiver."""

from __future__ import annotations

import gzip
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A loopback port nothing listens on, never one this process handed out before.

    The kernel may give a just-closed ephemeral port to the next bind, so two calls in a row (or a
    call and a server bound to port 0 afterwards) could otherwise meet on one port: bind servers that
    pick their own port before asking for free ones.
    """
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def http_status(url: str, timeout: float = 3.0) -> int | None:
    """The HTTP status of a GET, or None when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (OSError, urllib.error.URLError):
        return None


def wait_for(what: str, check: Callable[[], Any], timeout: float, interval: float = 0.5) -> Any:
    """Poll ``check`` until it returns something truthy; fail naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


# -- Prometheus --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def parse_prometheus(text: str) -> list[Sample]:
    from prometheus_client.parser import text_string_to_metric_families

    return [
        Sample(s.name, dict(s.labels), float(s.value))
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


@dataclass
class Scraper:
    """Scrapes a Prometheus endpoint in the background and keeps every successful scrape."""

    url: str
    interval: float = 0.5
    history: list[tuple[float, list[Sample]]] = field(default_factory=list)
    errors: int = 0

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="scraper", daemon=True)

    def start(self) -> Scraper:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)

    def scrape(self) -> list[Sample] | None:
        try:
            with urllib.request.urlopen(self.url, timeout=5) as resp:
                samples = parse_prometheus(resp.read().decode())
        except (OSError, urllib.error.URLError):
            self.errors += 1
            return None
        with self._lock:
            self.history.append((time.time(), samples))
        return samples

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.scrape()
            self._stop.wait(self.interval)

    def latest(self) -> list[Sample]:
        with self._lock:
            return list(self.history[-1][1]) if self.history else []

    def all_samples(self) -> list[Sample]:
        with self._lock:
            return [s for _, samples in self.history for s in samples]


def value(samples: list[Sample], name: str, **labels: str) -> float | None:
    """The sum of the samples named ``name`` whose labels include ``labels`` (None: no such sample)."""
    found = [
        s.value for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    return sum(found) if found else None


# -- OTLP/HTTP receiver ------------------------------------------------------------------------------


@dataclass
class OtlpMetric:
    name: str
    unit: str
    kind: str
    points: list[tuple[dict[str, str], float]]  # (attributes, value or histogram count)


class OtlpReceiver:
    """A minimal OTLP/HTTP (protobuf) metrics endpoint that keeps every export it receives."""

    def __init__(self) -> None:
        self.exports: list[list[OtlpMetric]] = []
        self.resources: list[dict[str, str]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                receiver._receive(self.path, body)
                from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
                    ExportMetricsServiceResponse,
                )

                data = ExportMetricsServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self._server.server_address[1])
        self.paths: list[str] = []
        threading.Thread(target=self._server.serve_forever, name="otlp", daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _receive(self, path: str, body: bytes) -> None:
        from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

        request = ExportMetricsServiceRequest()
        request.ParseFromString(body)
        metrics: list[OtlpMetric] = []
        for rm in request.resource_metrics:
            self.resources.append({kv.key: kv.value.string_value for kv in rm.resource.attributes})
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    kind = m.WhichOneof("data") or ""
                    points: list[tuple[dict[str, str], float]] = []
                    data = getattr(m, kind) if kind else None
                    for p in getattr(data, "data_points", []):
                        attrs = {kv.key: kv.value.string_value for kv in p.attributes}
                        if kind == "histogram":
                            points.append((attrs, float(p.count)))
                        else:
                            points.append(
                                (attrs, float(p.as_int) if p.WhichOneof("value") == "as_int" else p.as_double)
                            )
                    metrics.append(OtlpMetric(m.name, m.unit, kind, points))
        self.paths.append(path)
        self.exports.append(metrics)

    def last(self, name: str) -> OtlpMetric | None:
        for export in reversed(self.exports):
            for m in export:
                if m.name == name:
                    return m
        return None

    def close(self) -> None:
        self._server.shutdown()
