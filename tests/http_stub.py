"""Small HTTP servers for tests that stand in for a service or check the requests a client sends.

:class:`StubServer` answers every request on 127.0.0.1 with what a function returns for it; the
function sees the whole request (a chunked body already joined). :func:`forward` sends a request on to
the real server behind a checking stand-in and hands back its whole answer, so the stand-in can be put
between a client and any server (a catalog, a store emulator) without the client noticing.
"""

from __future__ import annotations

import http.client
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

# Headers that describe one hop, not the message: each connection sets its own.
_HOP = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    headers: dict[str, str]  # names in lower case
    body: bytes

    def header(self, name: str) -> str:
        return self.headers.get(name.lower(), "")


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes = b""
    headers: list[tuple[str, str]] = field(default_factory=list)

    @classmethod
    def json(cls, status: int, text: str) -> Reply:
        return cls(status, text.encode(), [("Content-Type", "application/json")])


class StubServer:
    """Serves ``respond(request)`` for every request until :meth:`stop`; :attr:`url` once started."""

    def __init__(self, respond: Callable[[Request], Reply]) -> None:
        self.respond = respond
        self.url = ""
        self._server: ThreadingHTTPServer | None = None

    def start(self) -> str:
        respond = self.respond

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self) -> None:
                headers = {k.lower(): v for k, v in self.headers.items()}
                reply = respond(Request(self.command, self.path, headers, self._body()))
                self.send_response(reply.status)
                for key, value in reply.headers:
                    self.send_header(key, value)
                if not any(k.lower() == "content-length" for k, _ in reply.headers):
                    self.send_header("Content-Length", str(len(reply.body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(reply.body)

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    chunks = []
                    while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                        chunks.append(self.rfile.read(size))
                        self.rfile.readline()
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return b"".join(chunks)
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _answer

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self.url

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


def forward(request: Request, upstream: str, proxy_url: str = "", drop: tuple[str, ...] = ()) -> Reply:
    """``request`` sent to ``upstream`` as it came (but the headers named in ``drop``, lower case), and
    the whole answer; a ``Location`` that points at ``upstream`` (a resumable upload's next address) is
    turned to ``proxy_url``, so the client's next requests come back through the proxy too."""
    target = urlsplit(upstream)
    conn = http.client.HTTPConnection(target.hostname or "127.0.0.1", target.port, timeout=120)
    try:
        headers = {k: v for k, v in request.headers.items() if k not in _HOP and k not in drop}
        path = target.path.rstrip("/") + request.path
        conn.request(request.method, path, body=request.body, headers=headers)
        answer = conn.getresponse()
        data = answer.read()
    finally:
        conn.close()
    hop = _HOP - {"content-length"} if request.method == "HEAD" else _HOP  # a HEAD's says the object's
    kept = [
        (k, v.replace(upstream, proxy_url) if proxy_url and k.lower() == "location" else v)
        for k, v in answer.getheaders()
        if k.lower() not in hop
    ]
    return Reply(answer.status, data, kept)
