"""``/healthz`` (the process is alive) and ``/readyz`` (recovered and consuming) for probes."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Health:
    def __init__(self) -> None:
        self._ready = threading.Event()
        self._detail: dict[str, object] = {"state": "starting"}
        self._server: ThreadingHTTPServer | None = None

    def set_ready(self, **detail: object) -> None:
        self._detail = {"state": "consuming", **detail}
        self._ready.set()

    def set_not_ready(self, state: str) -> None:
        self._ready.clear()
        self._detail = {"state": state}

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    def serve(self, host: str, port: int) -> int:
        health = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/healthz":
                    self._answer(200, {"status": "ok"})
                elif self.path == "/readyz":
                    self._answer(200 if health.ready else 503, health._detail)
                else:
                    self._answer(404, {"error": "not found"})

            def _answer(self, code: int, body: dict[str, object]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:  # probes would flood the log
                return

        self._server = ThreadingHTTPServer((host, port), Handler)
        threading.Thread(target=self._server.serve_forever, name="health", daemon=True).start()
        return int(self._server.server_address[1])

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
