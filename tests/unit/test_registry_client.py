"""The registry client against a tiny HTTP server on loopback (the real registry is in tests/sink): what
each answer means, retries, caching and credentials."""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from service.config import SchemaRegistryConfig
from service.data.registry import Registry, RegistryUnavailable, UnknownSchema

ANSWERS: dict[str, list[tuple[int, str]]] = {}
SEEN: list[tuple[str, str | None]] = []


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        SEEN.append((self.path, self.headers.get("Authorization")))
        answers = ANSWERS.get(self.path) or [(404, '{"error_code": 40403, "message": "Schema not found"}')]
        status, body = answers.pop(0) if len(answers) > 1 else answers[0]
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    ANSWERS.clear()
    SEEN.clear()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/apis/ccompat/v7/"
    finally:
        httpd.shutdown()


def _registry(url: str, **extra: Any) -> Registry:
    return Registry(SchemaRegistryConfig(url=url, retries=4, timeout_s=2, **extra))


AVRO = json.dumps({"schema": json.dumps({"type": "record", "name": "R", "fields": []})})


def test_a_schema_is_fetched_once_and_kept(server: str) -> None:
    ANSWERS["/apis/ccompat/v7/schemas/ids/11"] = [(200, AVRO)]
    registry = _registry(server)
    assert registry.schema(11).kind == "AVRO" and registry.schema(11).text.startswith("{")
    assert [p for p, _ in SEEN] == ["/apis/ccompat/v7/schemas/ids/11"]


def test_an_unknown_id_is_the_records_problem(server: str) -> None:
    with pytest.raises(UnknownSchema, match="schema id 12 is not in the registry"):
        _registry(server).schema(12)


def test_server_errors_and_answers_that_are_not_a_registrys_are_retried(server: str) -> None:
    ANSWERS["/apis/ccompat/v7/schemas/ids/13"] = [(503, "busy"), (200, "<html>proxy</html>"), (200, AVRO)]
    assert _registry(server).schema(13).kind == "AVRO"
    assert len(SEEN) == 3


def test_a_registry_that_keeps_failing_fails_the_batch_not_the_record(server: str) -> None:
    ANSWERS["/apis/ccompat/v7/schemas/ids/14"] = [(500, "down")]
    with pytest.raises(RegistryUnavailable, match="did not answer for schema id 14 after 4 attempts"):
        _registry(server).schema(14)
    assert len(SEEN) == 4


def test_credentials_go_in_headers(server: str) -> None:
    ANSWERS["/apis/ccompat/v7/schemas/ids/15"] = [(200, AVRO)]
    ANSWERS["/apis/ccompat/v7/schemas/ids/16"] = [(200, AVRO)]
    _registry(server, username="u", password="p").schema(15)
    _registry(server, bearer_token="t0k").schema(16)
    assert SEEN[0][1] == "Basic " + base64.b64encode(b"u:p").decode()
    assert SEEN[1][1] == "Bearer t0k"
