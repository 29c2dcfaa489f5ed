"""A reverse proxy in front of the REST catalog that enforces one authentication method.

Iceberg's RESTCatalogServer has no authentication of its own; this proxy lets the tests prove that
icesink's catalog configuration really authenticates (and that wrong credentials are refused) for:
a static bearer token, OAuth2 client credentials (token endpoint ``/v1/oauth/tokens``), HTTP basic,
and AWS SigV4 (the header's form and access key; the signature itself is not recomputed).
"""

from __future__ import annotations

import base64
import secrets
import urllib.parse
from dataclasses import dataclass, field

from tests.http_stub import Reply, Request, StubServer, forward

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

    def serve(self) -> tuple[str, StubServer]:
        """Start the proxy; its URL and server (``stop()`` it)."""
        server = StubServer(self._answer)
        return server.start(), server

    def _answer(self, request: Request) -> Reply:
        if request.path.startswith(TOKEN_PATH) and self.mode == "oauth2":
            token = self.issue_token(
                urllib.parse.parse_qs(request.body.decode()), request.header("Authorization") or None
            )
            if token is None:
                return Reply.json(401, '{"error": "invalid_client"}')
            return Reply.json(
                200,
                f'{{"access_token": "{token}", "token_type": "bearer", "expires_in": 3600, '
                f'"issued_token_type": "urn:ietf:params:oauth:token-type:access_token"}}',
            )
        if not self.authorized_header(request.header("Authorization") or None):
            self.refused += 1
            return Reply.json(
                401, '{"error": {"message": "not authorized", "type": "NotAuthorizedException", "code": 401}}'
            )
        self.authorized += 1
        return forward(request, self.upstream, drop=("authorization",))  # the catalog checks none
