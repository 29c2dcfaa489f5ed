"""A stand-in for Google's OAuth token service, for clients that authenticate to GCS with a service
account's JSON key.

Such a client (Trino's GCS file system, Google's Java and C++ libraries) signs a JWT with the key's
private key and trades it at the key's ``token_uri`` for an access token. Google's service can't be
reached here, and the GCS emulator checks no token; this one checks the JWT's signature against the
key it made and its issuer, and counts what it issued, so a test can prove the key was used.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import threading
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

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

    def _issue(self, form: dict[str, list[str]]) -> str | None:
        """An access token for a JWT bearer grant signed with the key and issued by its account."""
        assertion = form.get("assertion", [""])[0]
        header, _, rest = assertion.partition(".")
        claims, _, signature = rest.partition(".")
        try:
            if form.get("grant_type") != [JWT_BEARER] or not signature:
                raise ValueError("not a JWT bearer grant")
            self.key.public_key().verify(
                _b64url(signature), f"{header}.{claims}".encode(), padding.PKCS1v15(), hashes.SHA256()
            )
            if json.loads(_b64url(claims)).get("iss") != CLIENT_EMAIL:
                raise ValueError("another account")
        except (ValueError, InvalidSignature):
            self.refused += 1
            return None
        self.tokens_issued += 1
        return secrets.token_urlsafe(24)
