"""The Confluent wire format and the schema registry its schema ids point into.

A record in the Confluent wire format is the magic byte 0, a 4-byte big-endian schema id, then the
payload (Avro binary; for Protobuf, the message indexes first). Confluent's registry, Apicurio's
Confluent-compatible API (``/apis/ccompat/v7``) and Karapace answer ``GET /schemas/ids/{id}`` with
``{"schema": "<text>", "schemaType": "AVRO" | "PROTOBUF" | ...}``.

A schema id never changes meaning, so each one is fetched once per process (the driver and every
Python worker have their own cache). A registry that does not answer is retried
(``source.schema_registry.retries``) and then fails the batch, which is retried as a whole: a record
is never skipped because the registry was down. An id the registry does not know (404) is the
record's problem: a dead letter.
"""

from __future__ import annotations

import json
import logging
import struct
import threading
from dataclasses import dataclass
from typing import Any, Protocol

import requests

from service.config import SchemaRegistryConfig
from service.retrying import Backoff, log_failure, retry_call

logger = logging.getLogger(__name__)

MAGIC = 0
HEADER_BYTES = 5


class NotFramed(ValueError):
    """A record that does not start with the magic byte and a schema id."""


class UnknownSchema(LookupError):
    """The registry has no schema of this id."""


class RegistryUnavailable(RuntimeError):
    """The registry did not answer, or answered with a server error, after every attempt."""


def frame(payload: bytes) -> tuple[int, bytes]:
    """``(schema id, payload)`` of a record in the Confluent wire format."""
    if len(payload) < HEADER_BYTES or payload[0] != MAGIC:
        first = f"0x{payload[0]:02x}" if payload else "nothing"
        raise NotFramed(
            f"not in the Confluent wire format: {len(payload)} bytes starting with {first} "
            "(expected the magic byte 0x00 and a 4-byte schema id)"
        )
    return struct.unpack(">I", payload[1:HEADER_BYTES])[0], payload[HEADER_BYTES:]


def register(url: str, subject: str, schema: dict[str, Any], timeout_s: float = 30.0) -> int:
    """Register an Avro ``schema`` under ``subject`` (``POST /subjects/{subject}/versions``); its id. For
    producers of Avro (the sample source, the benchmark); the sink only reads schemas."""
    response = requests.post(
        f"{url.rstrip('/')}/subjects/{subject}/versions",
        json={"schema": json.dumps(schema)},
        headers={"Content-Type": "application/vnd.schemaregistry.v1+json"},
        timeout=timeout_s,
    )
    response.raise_for_status()
    return int(response.json()["id"])


def framed(schema_id: int, payload: bytes) -> bytes:
    """``payload`` in the Confluent wire format (tests and the benchmark produce with it)."""
    return bytes([MAGIC]) + struct.pack(">I", schema_id) + payload


class BadRecord(ValueError):
    """A record's own fault (its payload does not match its schema): a dead letter with this reason."""


@dataclass(frozen=True)
class RegisteredSchema:
    """A schema as the registry holds it: its type (``AVRO``, ``PROTOBUF``, ...) and its text."""

    kind: str
    text: str


class WriterSchema(Protocol):
    """A writer schema ready to read payloads: each one read into the JSON converter's values (but
    bytes, which stay bytes) and the Kafka Connect schema it stands for (the JSON converter's
    ``schema`` section); raises :class:`BadRecord`."""

    def read(self, payload: bytes) -> tuple[dict[str, Any], dict[str, Any]]: ...


class _Retryable(Exception):
    """A registry answer worth another attempt (no answer, a timeout, a 5xx, a 429)."""


@dataclass(frozen=True)
class Registry:
    """A client of one registry; picklable (it travels to the Python workers), its cache per process."""

    config: SchemaRegistryConfig

    def schema(self, schema_id: int) -> RegisteredSchema:
        """The writer schema of ``schema_id``; raises :class:`UnknownSchema` (a 404) or
        :class:`RegistryUnavailable` (every attempt failed)."""
        key = (self.config.url, schema_id)
        with _LOCK:
            cached = _CACHE.get(key)
        if cached is None:
            cached = self._fetch(schema_id)
            with _LOCK:
                _CACHE[key] = cached
        return cached

    def _fetch(self, schema_id: int) -> RegisteredSchema:
        cfg = self.config
        url = f"{cfg.url.rstrip('/')}/schemas/ids/{schema_id}"

        def attempt() -> RegisteredSchema:
            try:
                response = requests.get(
                    url,
                    headers=self._headers(),
                    auth=self._auth(),
                    timeout=cfg.timeout_s,
                    verify=cfg.ca_file or True,
                )
            except (requests.ConnectionError, requests.Timeout) as exc:
                raise _Retryable(f"{url}: {type(exc).__name__}") from exc
            if response.status_code == 404:
                raise UnknownSchema(f"schema id {schema_id} is not in the registry ({url}: 404)")
            if response.status_code == 429 or response.status_code >= 500:
                raise _Retryable(f"{url}: HTTP {response.status_code}")
            if response.status_code != 200:
                raise RegistryUnavailable(f"{url}: HTTP {response.status_code}: {response.text[:200]}")
            try:
                body = response.json()
                return RegisteredSchema(str(body.get("schemaType") or "AVRO"), str(body["schema"]))
            except (
                ValueError,
                KeyError,
                TypeError,
                AttributeError,
            ):  # not a registry's answer (a proxy's page?)
                raise _Retryable(f"{url}: HTTP 200 without a schema: {response.text[:100]!r}") from None

        try:
            return retry_call(
                attempt,
                Backoff(cfg.retries, initial_s=0.5, max_s=10.0),
                retry_on=lambda exc: isinstance(exc, _Retryable),
                on_failure=log_failure(
                    logger, f"asking the schema registry for schema id {schema_id}", cfg.retries
                ),
            )
        except _Retryable as exc:
            raise RegistryUnavailable(
                f"the schema registry did not answer for schema id {schema_id} after {cfg.retries} attempts: {exc}"
            ) from exc

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/vnd.schemaregistry.v1+json, application/json"}
        if self.config.bearer_token is not None:
            headers["Authorization"] = f"Bearer {self.config.bearer_token.get_secret_value()}"
        return headers

    def _auth(self) -> tuple[str, str] | None:
        cfg = self.config
        if cfg.username is None or cfg.password is None:
            return None
        return cfg.username, cfg.password.get_secret_value()


_LOCK = threading.Lock()
_CACHE: dict[tuple[str, int], RegisteredSchema] = {}
