"""A small fault-injecting HTTP proxy for the REST catalog.

Every request is forwarded to the upstream catalog. Faults are queued for *table commits*
(``POST .../namespaces/<ns>/tables/<table>``): the next commit is forwarded — so it lands in the
catalog — and then its answer is lost:

* ``"502"``: the client gets ``502 Bad Gateway`` instead of the catalog's answer;
* ``"drop"``: the connection is closed without any answer;
* ``"hang"``: nothing is answered for ``hang_s`` seconds, then the connection is closed (a timeout).

``down()`` makes every request fail with 503 (the catalog is unavailable) until ``up()``.

``answer_next(method, path, status)`` answers the next request whose method and path match with that
status and an Iceberg error body, *without* forwarding it (a 429 of a rate limiter, a 500 of a catalog
whose database connection was just reset): the request never reaches the catalog. Each such answer is
counted in ``answered``; every error the catalog itself answered is counted in ``upstream_errors``.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

COMMIT_PATH = re.compile(r"^/v1/(?:[^?]+/)?namespaces/[^/]+/tables/[^/?]+/?(?:\?.*)?$")
# Paths for answer_next: a table (load, commit, exists), a namespace's tables (create), namespaces.
TABLE_PATH = COMMIT_PATH
TABLES_PATH = re.compile(r"^/v1/(?:[^?]+/)?namespaces/[^/]+/tables/?(?:\?.*)?$")
NAMESPACES_PATH = re.compile(r"^/v1/(?:[^?]+/)?namespaces/?(?:\?.*)?$")
CONFIG_PATH = re.compile(r"^/v1/config/?(?:\?.*)?$")


@dataclass(frozen=True)
class Answer:
    """A canned answer for the next request matching ``method`` and ``path``."""

    method: str
    path: re.Pattern[str]
    status: int
    message: str
    headers: tuple[tuple[str, str], ...] = ()

    def body(self) -> bytes:
        kind = {400: "BadRequestException", 429: "TooManyRequestsException"}.get(self.status, "ServerError")
        return json.dumps({"error": {"message": self.message, "type": kind, "code": self.status}}).encode()


HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}


class FaultProxy:
    def __init__(self, upstream: str, hang_s: float = 20.0) -> None:
        parts = urlsplit(upstream)
        self.upstream_host = parts.hostname or "127.0.0.1"
        self.upstream_port = parts.port or 80
        self.hang_s = hang_s
        self.faults: deque[str] = deque()
        self.injected: list[tuple[str, str]] = []  # (fault, path) of every lost answer
        self.commits_forwarded = 0
        self.requests = 0
        self.answers: list[Answer] = []
        self.answered: list[tuple[int, str, str]] = []  # (status, method, path) of every canned answer
        self.upstream_errors: list[tuple[int, str, str, str]] = []  # (status, method, path, body)
        self._down = threading.Event()
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                proxy._handle(self)

            def do_POST(self) -> None:
                proxy._handle(self)

            def do_DELETE(self) -> None:
                proxy._handle(self)

            def do_HEAD(self) -> None:
                proxy._handle(self)

            def log_message(self, format: str, *args: object) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="fault-proxy", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def lose_next_commits(self, *faults: str) -> None:
        for fault in faults:
            if fault not in ("502", "drop", "hang"):
                raise ValueError(f"unknown fault {fault!r}")
        with self._lock:
            self.faults.extend(faults)

    def answer_next(
        self,
        method: str,
        path: re.Pattern[str],
        status: int,
        message: str = "answered by the fault proxy",
        headers: dict[str, str] | None = None,
    ) -> None:
        """Answer the next ``method`` request to a ``path`` with ``status``, without forwarding it."""
        with self._lock:
            self.answers.append(Answer(method, path, status, message, tuple((headers or {}).items())))

    def down(self) -> None:
        self._down.set()

    def up(self) -> None:
        self._down.clear()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    # -- forwarding ------------------------------------------------------------------------------------

    def _handle(self, req: BaseHTTPRequestHandler) -> None:
        with self._lock:
            self.requests += 1
        length = int(req.headers.get("Content-Length") or 0)
        body = req.rfile.read(length) if length else None
        if self._down.is_set():
            self._answer(req, 503, b'{"error": {"message": "catalog down (fault proxy)", "code": 503}}')
            return
        with self._lock:
            answer = next(
                (a for a in self.answers if a.method == req.command and a.path.match(req.path)), None
            )
            if answer is not None:
                self.answers.remove(answer)
                self.answered.append((answer.status, req.command, req.path))
        if answer is not None:
            self._answer(req, answer.status, answer.body(), answer.headers)
            return
        fault = None
        is_commit = req.command == "POST" and COMMIT_PATH.match(req.path) is not None
        if is_commit:
            with self._lock:
                self.commits_forwarded += 1
                fault = self.faults.popleft() if self.faults else None
        headers = {k: v for k, v in req.headers.items() if k.lower() not in HOP_BY_HOP}
        conn = http.client.HTTPConnection(self.upstream_host, self.upstream_port, timeout=120)
        try:
            conn.request(req.command, req.path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            status, reason, resp_headers = resp.status, resp.reason, resp.getheaders()
        except OSError as exc:
            self._answer(req, 502, f'{{"error": {{"message": "upstream: {exc}", "code": 502}}}}'.encode())
            return
        finally:
            conn.close()
        if status >= 400:
            with self._lock:
                self.upstream_errors.append((status, req.command, req.path, data.decode(errors="replace")))
        if fault is not None:
            with self._lock:
                self.injected.append((fault, req.path))
            if fault == "502":
                self._answer(req, 502, b'{"error": {"message": "bad gateway (fault proxy)", "code": 502}}')
                return
            if fault == "hang":
                time.sleep(self.hang_s)
            self._drop(req)
            return
        req.send_response_only(status, reason)
        for name, value in resp_headers:
            if name.lower() not in HOP_BY_HOP and name.lower() != "content-length":
                req.send_header(name, value)
        req.send_header("Content-Length", str(len(data)))
        req.end_headers()
        if req.command != "HEAD":
            req.wfile.write(data)

    @staticmethod
    def _answer(
        req: BaseHTTPRequestHandler, status: int, body: bytes, headers: tuple[tuple[str, str], ...] = ()
    ) -> None:
        req.send_response_only(status)
        for name, value in headers:
            req.send_header(name, value)
        req.send_header("Content-Type", "application/json")
        req.send_header("Content-Length", str(len(body)))
        req.end_headers()
        req.wfile.write(body)

    @staticmethod
    def _drop(req: BaseHTTPRequestHandler) -> None:
        req.close_connection = True
        with contextlib.suppress(OSError):
            req.connection.shutdown(socket.SHUT_RDWR)
