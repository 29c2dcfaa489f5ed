"""The Avro decoder without a registry server: writer schemas → Connect schemas → columns, the wire
format, and the bad records it dead-letters (tests/sink/test_avro.py runs it against the real registry)."""

from __future__ import annotations

import base64
import io
import json
import struct
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from fastavro import parse_schema, schemaless_writer
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from service.data import registry_decode
from service.data.avro_schema import connect_schema, decoding_schema
from service.data.protobuf_schema import ProtobufSchema, message_indexes
from service.data.registry import BadRecord, NotFramed, RegisteredSchema, UnknownSchema, frame, framed
from service.model.columns import Encoding, SchemaError, columns_from_envelope_schema
from tests.sink.avro_stream import BALANCE, envelope, key_schema, unscaled


class FakeRegistry:
    """Schemas by id, as a registry would answer (an unknown id: UnknownSchema)."""

    def __init__(self, schemas: dict[int, Any]) -> None:
        self.schemas = schemas
        self.asked: list[int] = []

    def schema(self, schema_id: int) -> RegisteredSchema:
        self.asked.append(schema_id)
        if schema_id not in self.schemas:
            raise UnknownSchema(f"schema id {schema_id} is not in the registry")
        schema = self.schemas[schema_id]
        if isinstance(schema, str):  # a serialized Protobuf descriptor
            return RegisteredSchema("PROTOBUF", schema)
        return RegisteredSchema("AVRO", json.dumps(schema))


def _write(schema: dict[str, Any], value: dict[str, Any], schema_id: int) -> bytes:
    out = io.BytesIO()
    schemaless_writer(out, parse_schema(schema), value)
    return framed(schema_id, out.getvalue())


def test_debezium_avro_schema_maps_to_the_columns_of_its_json_twin() -> None:
    columns = columns_from_envelope_schema(connect_schema(envelope("shop.accounts", 2)))
    assert [(c.name, str(c.type), c.required, c.encoding) for c in columns] == [
        ("id", "long", True, Encoding.INTEGER),
        ("name", "string", False, Encoding.STRING),
        ("balance", "decimal(10, 2)", False, Encoding.DECIMAL_BASE64),
        ("tier", "int", False, Encoding.INTEGER),
    ]


@pytest.mark.parametrize(
    ("avro", "expected"),
    [
        ({"type": "int", "logicalType": "date"}, ("date", Encoding.DATE_DAYS)),
        ({"type": "long", "logicalType": "timestamp-millis"}, ("timestamp", Encoding.TIMESTAMP_MILLIS)),
        ({"type": "long", "logicalType": "timestamp-micros"}, ("timestamp", Encoding.TIMESTAMP_MICROS)),
        ({"type": "long", "logicalType": "local-timestamp-micros"}, ("timestamp", Encoding.TIMESTAMP_MICROS)),
        ({"type": "long", "logicalType": "time-micros"}, ("time", Encoding.TIME_MICROS)),
        ({"type": "int", "logicalType": "time-millis"}, ("time", Encoding.TIME_MILLIS)),
        ({"type": "string", "logicalType": "uuid"}, ("uuid", Encoding.UUID_TEXT)),
        (
            {"type": "bytes", "logicalType": "decimal", "precision": 7, "scale": 3},
            ("decimal(7, 3)", Encoding.DECIMAL_BASE64),
        ),
        ({"type": "fixed", "name": "F", "size": 4}, ("binary", Encoding.BYTES_BASE64)),
        ({"type": "enum", "name": "E", "symbols": ["A", "B"]}, ("string", Encoding.STRING)),
        ({"type": "array", "items": "long"}, ("list<long>", Encoding.INTEGER)),
        (
            {"type": "string", "connect.name": "io.debezium.time.ZonedTimestamp"},
            ("timestamptz", Encoding.TIMESTAMP_ISO),
        ),
        ({"type": "double"}, ("double", Encoding.FLOATING)),
        ({"type": "float"}, ("float", Encoding.FLOATING)),
    ],
)
def test_plain_avro_logical_types_map_like_their_connect_names(
    avro: dict[str, Any], expected: tuple[str, Encoding]
) -> None:
    row = {"type": "record", "name": "Value", "fields": [{"name": "c", "type": ["null", avro]}]}
    schema = {"type": "record", "name": "Envelope", "fields": [{"name": "after", "type": ["null", row]}]}
    (column,) = columns_from_envelope_schema(connect_schema(schema))
    assert (str(column.type), column.encoding) == expected


def test_a_union_of_two_types_is_refused_naming_the_field() -> None:
    schema = {
        "type": "record",
        "name": "Envelope",
        "fields": [
            {
                "name": "after",
                "type": {
                    "type": "record",
                    "name": "V",
                    "fields": [{"name": "c", "type": ["null", "int", "string"]}],
                },
            }
        ],
    }
    with pytest.raises(SchemaError, match=r"value\.after\.c: a union"):
        connect_schema(schema)


def test_decoding_schema_keeps_the_binary_encoding_without_logical_types() -> None:
    plain = decoding_schema({"type": "record", "name": "R", "fields": [{"name": "b", "type": BALANCE}]})
    assert "logicalType" not in plain["fields"][0]["type"]
    assert plain["fields"][0]["type"]["type"] == "bytes"


def test_frame_refuses_records_without_the_magic_byte() -> None:
    assert frame(framed(7, b"xy")) == (7, b"xy")
    with pytest.raises(NotFramed, match="starting with 0x7b"):
        frame(b'{"op":"c"}')
    with pytest.raises(NotFramed, match="2 bytes starting with 0x00"):
        frame(b"\x00\x01")


def _decode(
    values: list[bytes | None], keys: list[bytes | None], registry: FakeRegistry
) -> registry_decode.AvroDecoded:
    columns = columns_from_envelope_schema(connect_schema(registry.schemas[2]))
    kafka = pa.table(
        {"topic": ["t"] * len(values), "partition": [0] * len(values), "offset": list(range(len(values)))}
    )
    return registry_decode.decode(values, keys, kafka, columns, ["id"], registry_decode.Schemas(registry))  # type: ignore[arg-type]


def test_each_bad_record_is_found_and_the_rest_decoded_in_order() -> None:
    registry = FakeRegistry({1: key_schema("a"), 2: envelope("a", 1)})

    def event(key: int, balance: Decimal) -> bytes:
        after = {"id": key, "name": f"n{key}", "balance": unscaled(balance)}
        return _write(
            envelope("a", 1),
            {"before": None, "after": after, "source": {"ts_ms": 1, "lsn": key}, "op": "c"},
            2,
        )

    keys = [_write(key_schema("a"), {"id": k}, 1) for k in range(6)]
    values: list[bytes | None] = [
        event(0, Decimal("1.25")),
        event(1, Decimal("99999999999")),  # 13 digits: out of range for decimal(10,2)
        event(2, Decimal("2.50")),
        b"\x00" + struct.pack(">I", 3) + b"\x02",  # schema id 3: unknown
        event(4, Decimal("4.00"))[:-2],  # cut short
        None,  # a tombstone: a delete of key 5
    ]
    result = _decode(values, keys, registry)  # type: ignore[arg-type]
    assert result.decoded.rows.column("id").to_pylist() == [0, 2, 5]
    assert result.decoded.rows.column("balance").to_pylist() == [Decimal("1.25"), Decimal("2.50"), None]
    assert result.decoded.by_op == {"c": 2, "d": 1}
    dead = dict(
        zip(result.dead.column("offset").to_pylist(), result.dead.column("error").to_pylist(), strict=True)
    )
    assert sorted(dead) == [1, 3, 4], dead
    assert "a decimal out of range" in dead[1]
    assert "schema id 3 is not in the registry" in dead[3]
    assert "does not match schema id 2" in dead[4]
    assert registry.asked.count(2) == 1, "a schema is fetched once per task"


def test_a_batch_of_only_bad_records_decodes_to_no_rows_in_the_columns_types() -> None:
    registry = FakeRegistry({1: key_schema("a"), 2: envelope("a", 1)})
    result = _decode([b"garbage"], [None], registry)  # type: ignore[arg-type]
    assert result.decoded.rows.num_rows == 0 and "id" in result.decoded.rows.column_names
    assert result.dead.column("error").to_pylist() == [
        "not in the Confluent wire format: 7 bytes starting with 0x67 (expected the magic byte 0x00 and a 4-byte schema id)"
    ]


# -- Protobuf ------------------------------------------------------------------------------------------


def _proto_schema(*dependencies: str) -> descriptor_pb2.FileDescriptorProto:
    f = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(name="t.proto", package="t", syntax="proto3")
    proto.dependency.extend(dependencies)
    row = proto.message_type.add(name="Row")
    row.field.add(name="id", number=1, type=f.TYPE_INT64)
    row.field.add(name="note", number=2, type=f.TYPE_STRING, proto3_optional=True, oneof_index=0)
    row.oneof_decl.add(name="_note")
    row.field.add(name="at", number=3, type=f.TYPE_MESSAGE, type_name=".google.protobuf.Timestamp")
    row.field.add(name="amount", number=4, type=f.TYPE_MESSAGE, type_name=".confluent.type.Decimal")
    row.field.add(name="tags", number=5, type=f.TYPE_INT32, label=f.LABEL_REPEATED)
    row.field.add(name="flag", number=6, type=f.TYPE_MESSAGE, type_name=".google.protobuf.BoolValue")
    mood = row.enum_type.add(name="Mood")
    mood.value.add(name="SAD", number=0)
    mood.value.add(name="OK", number=1)
    row.field.add(name="mood", number=7, type=f.TYPE_ENUM, type_name=".t.Row.Mood")
    envelope = proto.message_type.add(name="Envelope")
    envelope.field.add(name="before", number=1, type=f.TYPE_MESSAGE, type_name=".t.Row")
    envelope.field.add(name="after", number=2, type=f.TYPE_MESSAGE, type_name=".t.Row")
    envelope.field.add(name="op", number=3, type=f.TYPE_STRING)
    return proto


DEPENDENCIES = (
    "google/protobuf/timestamp.proto",
    "confluent/type/decimal.proto",
    "google/protobuf/wrappers.proto",
)


def _proto_text(proto: descriptor_pb2.FileDescriptorProto) -> str:
    return base64.b64encode(proto.SerializeToString()).decode()


def test_protobuf_messages_map_to_columns_by_their_meaning() -> None:
    schema = ProtobufSchema(9, _proto_text(_proto_schema(*DEPENDENCIES)))
    payload = b"\x02\x02"  # message indexes [1]: Envelope, then an empty message
    _, connect = schema.read(payload)
    columns = columns_from_envelope_schema(connect)
    assert [(c.name, str(c.type), c.required, c.encoding) for c in columns] == [
        ("id", "long", True, Encoding.INTEGER),
        ("note", "string", False, Encoding.STRING),
        ("at", "timestamptz", False, Encoding.TIMESTAMP_ISO),
        ("amount", "string", False, Encoding.VARIABLE_SCALE_DECIMAL),
        ("tags", "list<int>", False, Encoding.INTEGER),
        ("flag", "boolean", False, Encoding.BOOLEAN),
        ("mood", "string", True, Encoding.STRING),
    ]


def test_protobuf_message_indexes_and_values() -> None:
    assert message_indexes(b"\x00rest") == ([0], 1)
    assert message_indexes(b"\x04\x02\x06") == ([1, 3], 3)
    with pytest.raises(BadRecord, match="cut short"):
        message_indexes(b"\x04\x82")
    proto = _proto_schema(*DEPENDENCIES)
    pool = descriptor_pool.DescriptorPool()
    for text in _well_known_files():
        pool.AddSerializedFile(text)
    pool.Add(proto)
    envelope = message_factory.GetMessageClass(pool.FindMessageTypeByName("t.Envelope"))(op="c")
    envelope.after.id, envelope.after.mood = 7, 1
    envelope.after.at.FromDatetime(datetime(2026, 3, 1, 8, 0, 0, 1, tzinfo=UTC))
    envelope.after.amount.value, envelope.after.amount.scale = b"\x04\xd2", 2
    envelope.after.tags.extend([1, 2])
    envelope.after.flag.value = True
    value, _ = ProtobufSchema(9, _proto_text(proto)).read(b"\x02\x02" + envelope.SerializeToString())
    assert value["after"] == {
        "id": 7,
        "note": None,
        "at": "2026-03-01T08:00:00.000001Z",
        "amount": {"scale": 2, "value": b"\x04\xd2"},
        "tags": [1, 2],
        "flag": True,
        "mood": "OK",
    }
    assert value["before"] is None and value["op"] == "c"


def _well_known_files() -> list[bytes]:
    from google.protobuf import timestamp_pb2, wrappers_pb2

    from service.data.protobuf_schema import _decimal_file

    return [timestamp_pb2.DESCRIPTOR.serialized_pb, wrappers_pb2.DESCRIPTOR.serialized_pb, _decimal_file()]


def test_protobuf_schemas_the_decoder_cannot_read_are_named() -> None:
    with pytest.raises(UnknownSchema, match=r"\.proto text, which is not read"):
        ProtobufSchema(3, 'syntax = "proto3"; message M { int64 id = 1; }')
    with pytest.raises(UnknownSchema, match=r"imports other/thing\.proto: schema references are not read"):
        ProtobufSchema(4, _proto_text(_proto_schema("other/thing.proto")))
    schema = ProtobufSchema(5, _proto_text(_proto_schema(*DEPENDENCIES)))
    with pytest.raises(BadRecord, match="has no message at indexes"):
        schema.read(b"\x02\x0a")
    with pytest.raises(BadRecord, match="does not match schema id 5"):
        schema.read(b"\x02\x02\x0a\xff\xff")
