"""A stand-in for Google's OAuth token service, for clients that authenticate to GCS with a service
account's JSON key.

Such a client signs a JWT with the key's private key and either trades it at the key's ``token_uri``
for an access token (Trino's GCS file system, Google's Java library) or sends it as its bearer token
itself (Google's C++ library, pyarrow's GCS client: a "self-signed JWT"). Google's service can't be
reached here, and the GCS emulator checks no token: :class:`GoogleTokenService` checks the JWT's
signature against the key it made and its issuer, and counts what it issued; :class:`GcsCredentialCheck`
stands in front of the emulator and refuses a request whose bearer token is neither of the two.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import secrets
import threading
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
CLIENT_EMAIL = "icesink-test@icesink.iam.gserviceaccount.com"


def _b64url(part: str) -> bytes:
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


@dataclass
class GoogleTokenService:
    """Serves ``POST /token`` on 127.0.0.1 for the service account whose key :meth:`write_key` writes."""

    key: rsa.RSAPrivateKey = field(default_factory=lambda: rsa.generate_private_key(65537, 2048))
    key_file: Path | None = None
    tokens_issued: int = 0
    refused: int = 0
    issued: set[str] = field(default_factory=set)
    _server: ThreadingHTTPServer | None = None

    def start(self) -> str:
        """Start serving; the token URI."""
        service = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                form = urllib.parse.parse_qs(self.rfile.read(length).decode())
                token = service._issue(form)
                body = json.dumps(
                    {"access_token": token, "expires_in": 3600, "token_type": "Bearer"}
                    if token
                    else {"error": "invalid_grant"}
                ).encode()
                self.send_response(200 if token else 400)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self._server.server_address[1]}/token"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def write_key(self, path: Path, token_uri: str, project: str) -> Path:
        """The service account's JSON key, readable by this user only, as Google hands one out."""
        pem = self.key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ).decode()
        key = {
            "type": "service_account",
            "project_id": project,
            "private_key_id": secrets.token_hex(8),
            "private_key": pem,
            "client_email": CLIENT_EMAIL,
            "client_id": "1",
            "token_uri": token_uri,
        }
        path.touch(mode=0o600)
        os.chmod(path, 0o600)
        path.write_text(json.dumps(key))
        self.key_file = path
        return path

    def signed_by_key(self, jwt: str) -> bool:
        """``jwt`` is signed with the key and issued by its account."""
        header, _, rest = jwt.partition(".")
        claims, _, signature = rest.partition(".")
        try:
            self.key.public_key().verify(
                _b64url(signature), f"{header}.{claims}".encode(), padding.PKCS1v15(), hashes.SHA256()
            )
            return bool(json.loads(_b64url(claims)).get("iss") == CLIENT_EMAIL)
        except (ValueError, InvalidSignature):
            return False

    def _issue(self, form: dict[str, list[str]]) -> str | None:
        """An access token for a JWT bearer grant signed with the key."""
        if form.get("grant_type") != [JWT_BEARER] or not self.signed_by_key(form.get("assertion", [""])[0]):
            self.refused += 1
            return None
        token = secrets.token_urlsafe(24)
        self.issued.add(token)
        self.tokens_issued += 1
        return token


@dataclass
class GcsCredentialCheck:
    """A reverse proxy in front of the GCS emulator (``upstream``) that passes a request only when its
    bearer token comes from ``service``'s key: a token the service issued for it (``exchanged``) or a JWT
    the client signed with it (``self_signed``); any other is answered 401 (``refused``)."""

    upstream: str
    service: GoogleTokenService
    exchanged: int = 0
    self_signed: int = 0
    refused: int = 0
    url: str = ""
    _server: ThreadingHTTPServer | None = None

    def start(self) -> str:
        """Start serving; its URL, to give the clients as the GCS endpoint."""
        check, target = self, urlsplit(self.upstream)

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self) -> None:
                body = self._body()
                if not check._authorized(self.headers.get("Authorization", "")):
                    self._reply(401, [], b'{"error": {"code": 401, "message": "not the key\'s credentials"}}')
                    return
                conn = http.client.HTTPConnection(target.hostname or "127.0.0.1", target.port, timeout=120)
                skip = {"host", "content-length", "transfer-encoding", "connection"}
                headers = {k: v for k, v in self.headers.items() if k.lower() not in skip}
                conn.request(self.command, self.path, body=body, headers=headers)
                answer = conn.getresponse()
                data = answer.read()
                kept = [  # a resumable upload's next requests come here too
                    (k, v.replace(check.upstream, check.url) if k.lower() == "location" else v)
                    for k, v in answer.getheaders()
                    if k.lower() not in skip
                ]
                conn.close()
                self._reply(answer.status, kept, data)

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

            def _reply(self, status: int, headers: list[tuple[str, str]], data: bytes) -> None:
                self.send_response(status)
                for key, value in headers:
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _forward

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self.url

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def _authorized(self, header: str) -> bool:
        token = header.removeprefix("Bearer ") if header.startswith("Bearer ") else ""
        if token in self.service.issued:
            self.exchanged += 1
        elif token and self.service.signed_by_key(token):
            self.self_signed += 1
        else:
            self.refused += 1
            return False
        return True
