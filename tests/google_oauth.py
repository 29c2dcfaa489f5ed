"""Stand-ins for Google's credential services, for clients that authenticate to GCS without a token
in their configuration.

With a service account's JSON key, a client signs a JWT with the key's private key and either trades
it at the key's ``token_uri`` for an access token (Trino's GCS file system, Google's Java library) or
sends it as its bearer token itself (Google's C++ library, pyarrow's GCS client: a "self-signed JWT").
On Compute Engine and on GKE with workload identity there is no key: both libraries ask the metadata
server (``GCE_METADATA_HOST`` for the Java library, ``GCE_METADATA_ROOT`` for the C++ one, both
``host:port``) for the account's token.

Google's services can't be reached here, and the GCS emulator checks no token:
:class:`GoogleTokenService` serves the token endpoint (it checks the JWT's signature against the key it
made, and its issuer) and the metadata server's few paths the clients read, and remembers how it issued
each token; :class:`GcsCredentialCheck` stands in front of the emulator and refuses a request whose
bearer token is none of these.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import urllib.parse
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from tests.http_stub import Reply, Request, StubServer, forward

JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
CLIENT_EMAIL = "icesink-test@icesink.iam.gserviceaccount.com"
PROJECT = "icesink"
METADATA = "/computeMetadata/v1"
FLAVOR = ("Metadata-Flavor", "Google")


def _b64url(part: str) -> bytes:
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


@dataclass
class GoogleTokenService:
    """Serves, on 127.0.0.1, ``POST /token`` for the service account whose key :meth:`write_key` writes,
    and the metadata server's token for the same account (:attr:`metadata_host`)."""

    key: rsa.RSAPrivateKey = field(default_factory=lambda: rsa.generate_private_key(65537, 2048))
    key_file: Path | None = None
    issued: dict[str, str] = field(default_factory=dict)  # token -> "key" (a JWT grant) or "metadata"
    refused: int = 0
    _server: StubServer | None = None

    def start(self) -> str:
        """Start serving; the token URI."""
        self._server = StubServer(self._answer)
        return f"{self._server.start()}/token"

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()

    @property
    def metadata_host(self) -> str:
        """``host:port`` of the metadata server, for ``GCE_METADATA_HOST`` and ``GCE_METADATA_ROOT``."""
        assert self._server is not None, "not started"
        return self._server.url.removeprefix("http://")

    def tokens_issued(self, how: str) -> int:
        """How many tokens were issued ``how``: "key" or "metadata"."""
        return sum(1 for kind in list(self.issued.values()) if kind == how)  # served while counted

    def write_key(self, path: Path, token_uri: str, project: str = PROJECT) -> Path:
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

    def _answer(self, request: Request) -> Reply:
        path = urllib.parse.urlsplit(request.path).path
        if request.method == "POST" and path == "/token":
            form = urllib.parse.parse_qs(request.body.decode())
            assertion = form.get("assertion", [""])[0]
            if form.get("grant_type") != [JWT_BEARER] or not self.signed_by_key(assertion):
                self.refused += 1
                return Reply.json(400, '{"error": "invalid_grant"}')
            return self._token("key")
        if request.method == "GET" and (path == "/" or path.startswith(METADATA)):
            return self._metadata(path, request)
        return Reply(404)

    def _metadata(self, path: str, request: Request) -> Reply:
        """The paths of the metadata server Google's libraries read for the default service account.
        Like the real one it answers only requests with ``Metadata-Flavor: Google``, and says so in every
        answer (the Java library's ping at ``/`` looks for that header)."""
        if path != "/" and request.header("Metadata-Flavor") != "Google":
            return Reply(403, b"Missing Metadata-Flavor header", [FLAVOR])
        accounts = f"{METADATA}/instance/service-accounts/"
        if path.startswith(accounts):  # by its alias, "default", or its email (Google's C++ library)
            alias, _, rest = path.removeprefix(accounts).partition("/")
            if alias not in ("default", CLIENT_EMAIL):
                return Reply(404, b"", [FLAVOR])
            if rest == "token":
                return self._token("metadata", [FLAVOR])
            if rest == "email":
                return Reply(200, CLIENT_EMAIL.encode(), [FLAVOR, ("Content-Type", "application/text")])
            if rest == "":  # ?recursive=true: the account's description
                described = {
                    "aliases": ["default"],
                    "email": CLIENT_EMAIL,
                    "scopes": ["https://www.googleapis.com/auth/cloud-platform"],
                }
                return Reply(
                    200, json.dumps(described).encode(), [FLAVOR, ("Content-Type", "application/json")]
                )
        text = {
            "/": "",
            f"{METADATA}/project/project-id": PROJECT,
            f"{METADATA}/universe/universe-domain": "googleapis.com",
        }.get(path)
        if text is not None:
            return Reply(200, text.encode(), [FLAVOR, ("Content-Type", "application/text")])
        return Reply(404, b"", [FLAVOR])

    def _token(self, how: str, headers: list[tuple[str, str]] | None = None) -> Reply:
        token = secrets.token_urlsafe(24)
        self.issued[token] = how
        body = json.dumps({"access_token": token, "expires_in": 3600, "token_type": "Bearer"})
        return Reply(200, body.encode(), [*(headers or []), ("Content-Type", "application/json")])


@dataclass
class GcsCredentialCheck:
    """A reverse proxy in front of the GCS emulator (``upstream``) that passes a request only when its
    bearer token comes from ``service``'s account: a JWT the client signed with the key
    (``seen["self-signed"]``), or a token the service issued for a JWT grant (``seen["key"]``) or through
    the metadata server (``seen["metadata"]``); any other is answered 401 (``refused``)."""

    upstream: str
    service: GoogleTokenService
    seen: Counter[str] = field(default_factory=Counter)
    refused: int = 0
    url: str = ""
    _server: StubServer | None = None

    def start(self) -> str:
        """Start serving; its URL, to give the clients as the GCS endpoint."""
        self._server = StubServer(self._answer)
        self.url = self._server.start()
        return self.url

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()

    def _answer(self, request: Request) -> Reply:
        if not self._authorized(request.header("Authorization")):
            return Reply.json(401, '{"error": {"code": 401, "message": "not the account\'s credentials"}}')
        return forward(request, self.upstream, self.url)

    def _authorized(self, header: str) -> bool:
        token = header.removeprefix("Bearer ") if header.startswith("Bearer ") else ""
        if token in self.service.issued:
            self.seen[self.service.issued[token]] += 1
        elif token and self.service.signed_by_key(token):
            self.seen["self-signed"] += 1
        else:
            self.refused += 1
            return False
        return True
