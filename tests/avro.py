"""Avro in the Confluent wire format for tests, independently of the sink's decoder: register a schema,
frame a record, read a framed record back (fastavro and the registry's Confluent-compatible API)."""

from __future__ import annotations

import io
import json
import struct
import urllib.request
from functools import cache
from typing import Any

from fastavro import parse_schema, schemaless_reader, schemaless_writer


def _call(url: str, body: dict[str, Any] | None = None) -> Any:
    request = urllib.request.Request(
        url,
        data=None if body is None else json.dumps(body).encode(),
        method="GET" if body is None else "POST",
        headers={"Content-Type": "application/vnd.schemaregistry.v1+json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def register(registry_url: str, subject: str, schema: dict[str, Any]) -> int:
    """Register ``schema`` under ``subject``; its id (what a framed record carries)."""
    return int(_call(f"{registry_url}/subjects/{subject}/versions", {"schema": json.dumps(schema)})["id"])


@cache
def _schema(registry_url: str, schema_id: int) -> Any:
    return parse_schema(json.loads(_call(f"{registry_url}/schemas/ids/{schema_id}")["schema"]))


def framed(schema_id: int, schema: dict[str, Any], value: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    schemaless_writer(out, parse_schema(schema), value)
    return b"\x00" + struct.pack(">I", schema_id) + out.getvalue()


def read(registry_url: str, data: bytes) -> Any:
    """A framed record's value, read with its writer schema from the registry."""
    assert data[0] == 0, f"not framed: {data[:8]!r}"
    schema_id = struct.unpack(">I", data[1:5])[0]
    return schemaless_reader(io.BytesIO(data[5:]), _schema(registry_url, schema_id), None)
