"""Debezium types land faithfully; records that can't be decoded go to the dead-letter topic, counted exactly."""

from __future__ import annotations

import base64
import json
import uuid
from datetime import UTC, date, datetime
from decimal import Context, Decimal
from typing import Any

from readers import duckdb_rows, pyiceberg_rows, spark_rows, trino_rows
from tests.sink.conftest import Sink
from tests.sink.expect import topic_records

FIELDS = [
    {"field": "id", "type": "int64", "optional": False},
    {"field": "i16", "type": "int16", "optional": True},
    {"field": "i32", "type": "int32", "optional": True},
    {"field": "f32", "type": "float", "optional": True},
    {"field": "f64", "type": "double", "optional": True},
    {"field": "flag", "type": "boolean", "optional": True},
    {"field": "s", "type": "string", "optional": True},
    {"field": "raw", "type": "bytes", "optional": True},
    {
        "field": "amount",
        "type": "bytes",
        "optional": True,
        "name": "org.apache.kafka.connect.data.Decimal",
        "parameters": {"scale": "3", "connect.decimal.precision": "12"},
    },
    {"field": "d", "type": "int32", "optional": True, "name": "io.debezium.time.Date"},
    {"field": "ts_ms", "type": "int64", "optional": True, "name": "io.debezium.time.Timestamp"},
    {"field": "ts_us", "type": "int64", "optional": True, "name": "io.debezium.time.MicroTimestamp"},
    {"field": "ts_ns", "type": "int64", "optional": True, "name": "io.debezium.time.NanoTimestamp"},
    {"field": "tz", "type": "string", "optional": True, "name": "io.debezium.time.ZonedTimestamp"},
    {"field": "u", "type": "string", "optional": True, "name": "io.debezium.data.Uuid"},
    {"field": "j", "type": "string", "optional": True, "name": "io.debezium.data.Json"},
]
SCHEMA = {
    "type": "struct",
    "fields": [
        {"type": "struct", "optional": True, "field": "before", "fields": FIELDS},
        {"type": "struct", "optional": True, "field": "after", "fields": FIELDS},
        {"type": "string", "optional": False, "field": "op"},
    ],
}
KEY_SCHEMA = {"type": "struct", "fields": [FIELDS[0]]}


def _unscaled(value: Decimal, scale: int) -> str:
    n = int(value.scaleb(scale, Context(prec=100)))  # the default context rounds to 28 digits
    return base64.b64encode(n.to_bytes(max(1, (n.bit_length() + 8) // 8), "big", signed=True)).decode()


def _event(op: str, after: dict[str, Any] | None, before: dict[str, Any] | None = None) -> str:
    return json.dumps({"schema": SCHEMA, "payload": {"op": op, "after": after, "before": before}})


def _key(i: int | None) -> str | None:
    return None if i is None else json.dumps({"schema": KEY_SCHEMA, "payload": {"id": i}})


U1 = uuid.UUID("6f9619ff-8b86-d011-b42d-00c04fc964ff")
WIRE = {
    "id": 1,
    "i16": -7,
    "i32": 2_000_000_000,
    "f32": 1.5,
    "f64": -2.25,
    "flag": True,
    "s": "héllo",
    "raw": base64.b64encode(b"\x00\x01\xff").decode(),
    "amount": _unscaled(Decimal("-123456789.123"), 3),
    "d": 19_000,
    "ts_ms": 1_700_000_000_123,
    "ts_us": 1_700_000_000_123_456,
    "ts_ns": 1_700_000_000_123_456_789,
    "tz": "2024-02-29T23:59:58.5+02:00",
    "u": str(U1).upper(),
    "j": '{"a": [1, 2]}',
}
EXPECTED = {
    "id": 1,
    "i16": -7,
    "i32": 2_000_000_000,
    "f32": 1.5,
    "f64": -2.25,
    "flag": True,
    "s": "héllo",
    "raw": b"\x00\x01\xff",
    "amount": Decimal("-123456789.123"),
    "d": date(2022, 1, 8),
    "ts_ms": datetime(2023, 11, 14, 22, 13, 20, 123000),
    "ts_us": datetime(2023, 11, 14, 22, 13, 20, 123456),
    "ts_ns": datetime(2023, 11, 14, 22, 13, 20, 123456),
    "tz": datetime(2024, 2, 29, 21, 59, 58, 500000, tzinfo=UTC),
    "u": U1,
    "j": '{"a": [1, 2]}',
}


def _normalise(row: dict[str, Any]) -> dict[str, Any]:
    out = dict(row)
    if isinstance(out["u"], str):
        out["u"] = uuid.UUID(out["u"])
    if isinstance(out["u"], bytes):  # pyiceberg: the 16 bytes
        out["u"] = uuid.UUID(bytes=out["u"])
    if isinstance(out["raw"], bytearray | memoryview):
        out["raw"] = bytes(out["raw"])
    tz = out["tz"]
    if isinstance(tz, datetime):
        out["tz"] = tz.replace(tzinfo=UTC) if tz.tzinfo is None else tz.astimezone(UTC)
    return out


def test_types_and_dead_letters(make_sink: Any, spark: Any, stack: Any) -> None:
    sink: Sink = make_sink(
        partitions=1, source={"max_record_bytes": 4096}, table={"delete_format": "position"}
    )
    good2 = {**WIRE, "id": 2, "s": None, "raw": None, "amount": None, "tz": None, "u": None}
    records: list[tuple[str | None, str | None]] = [
        (_key(1), _event("c", WIRE)),
        (_key(2), _event("r", good2)),
        (_key(3), "{this is not json"),  # malformed
        (None, _event("c", {**WIRE, "id": None})),  # no key at all
        (_key(4), _event("x", {**WIRE, "id": 4})),  # unknown op
        (_key(5), _event("c", {**WIRE, "id": 5, "i16": 2**40})),  # out of range for int
        (_key(6), _event("c", {**WIRE, "id": 6, "s": "x" * 5000})),  # over max_record_bytes
        (_key(7), _event("c", {**WIRE, "id": 7})),
        (_key(7), _event("d", None, {"id": 7})),  # created then deleted
        (_key(7), None),  # tombstone: deletes key 7 again, not a dead letter
    ]
    sink.send(records)
    sink.run_until_caught_up()

    expected = [EXPECTED, {**EXPECTED, **{k: None for k in ("s", "raw", "amount", "tz", "u")}, "id": 2}]
    readers = {
        "spark": spark_rows(spark, sink.table),
        "duckdb": duckdb_rows(sink.table),
        "trino": trino_rows(sink.table),
        "pyiceberg": pyiceberg_rows(sink.table),  # position deletes: pyiceberg reads them
    }
    for reader, rows in readers.items():
        got = sorted((_normalise(r) for r in rows), key=lambda r: r["id"])
        assert got == expected, f"{reader} read {got}"

    letters = topic_records(stack.kafka_bootstrap, f"{sink.name}.dlq", 5)
    reasons = {}
    for m in letters:
        headers = {k: v.decode() for k, v in m.headers() or []}
        assert headers["icesink.source.topic"] == sink.topic
        assert headers["icesink.source.partition"] == "0"
        reasons[int(headers["icesink.source.offset"])] = headers["icesink.error"]
    assert sorted(reasons) == [2, 3, 4, 5, 6], reasons
    assert "malformed" in reasons[2]
    assert "key column id is missing" in reasons[3]
    assert "unknown op 'x'" in reasons[4]
    assert "column i16" in reasons[5] and "int" in reasons[5]
    assert "max_record_bytes" in reasons[6]
    assert len(letters) == 5
