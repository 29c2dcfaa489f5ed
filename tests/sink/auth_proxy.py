"""A reverse proxy in front of the REST catalog that enforces one authentication method.

Iceberg's RESTCatalogServer has no authentication of its own; this proxy lets the tests prove that
icesink's catalog configuration really authenticates (and that wrong credentials are refused) for:
a static bearer token, OAuth2 client credentials (token endpoint ``/v1/oauth/tokens``), HTTP basic,
and AWS SigV4 (the header's form and access key; the signature itself is not recomputed).
"""

from __future__ import annotations

import base64
import secrets
import threading
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import requests

TOKEN_PATH = "/v1/oauth/tokens"


@dataclass
class AuthProxy:
    upstream: str
    mode: str  # bearer | oauth2 | basic | sigv4
    token: str = ""
    client_id: str = ""
    client_secret: str = ""
    username: str = ""
    password: str = ""
    access_key: str = ""
    issued: set[str] = field(default_factory=set)
    authorized: int = 0
    refused: int = 0
    tokens_issued: int = 0

    def authorized_header(self, header: str | None) -> bool:
        if header is None:
            return False
        if self.mode == "bearer":
            return header == f"Bearer {self.token}"
        if self.mode == "oauth2":
            return header.startswith("Bearer ") and header[7:] in self.issued
        if self.mode == "basic":
            expected = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
            return header == f"Basic {expected}"
        if self.mode == "sigv4":
            return (
                header.startswith(f"AWS4-HMAC-SHA256 Credential={self.access_key}/")
                and "Signature=" in header
            )
        raise ValueError(self.mode)

    def issue_token(self, form: dict[str, list[str]], header: str | None) -> str | None:
        client_id, client_secret = form.get("client_id", [""])[0], form.get("client_secret", [""])[0]
        if header and header.startswith("Basic "):
            client_id, _, client_secret = base64.b64decode(header[6:]).decode().partition(":")
        if form.get("grant_type") != ["client_credentials"]:
            return None
        if (client_id, client_secret) != (self.client_id, self.client_secret):
            return None
        token = secrets.token_hex(16)
        self.issued.add(token)
        self.tokens_issued += 1
        return token

    def serve(self) -> tuple[str, ThreadingHTTPServer]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                if self.path.startswith(TOKEN_PATH) and proxy.mode == "oauth2":
                    token = proxy.issue_token(
                        urllib.parse.parse_qs(body.decode()), self.headers.get("Authorization")
                    )
                    if token is None:
                        return self._reply(401, b'{"error": "invalid_client"}')
                    payload = (
                        f'{{"access_token": "{token}", "token_type": "bearer", "expires_in": 3600, '
                        f'"issued_token_type": "urn:ietf:params:oauth:token-type:access_token"}}'
                    )
                    return self._reply(200, payload.encode())
                if not proxy.authorized_header(self.headers.get("Authorization")):
                    proxy.refused += 1
                    return self._reply(
                        401,
                        b'{"error": {"message": "not authorized", "type": "NotAuthorizedException", "code": 401}}',
                    )
                proxy.authorized += 1
                skip = {"host", "authorization", "content-length", "connection"}
                headers = {k: v for k, v in self.headers.items() if k.lower() not in skip}
                answer = requests.request(
                    self.command, proxy.upstream + self.path, data=body, headers=headers, timeout=60
                )
                self._reply(answer.status_code, answer.content, answer.headers.get("Content-Type"))

            def _reply(self, code: int, body: bytes, content_type: str | None = "application/json") -> None:
                self.send_response(code)
                self.send_header("Content-Type", content_type or "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_DELETE = do_HEAD = _forward

            def log_message(self, format: str, *args: object) -> None:
                return

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{server.server_address[1]}", server
