"""A Protobuf writer schema from the registry, as a Kafka Connect schema and as a reader of payloads.

In the Confluent wire format a Protobuf payload starts with the message indexes (which message of the
schema's file, a path through nested messages: a zigzag varint count, then each index; a single 0 for
the first message), then the message. The registry holds the schema as confluent-kafka's serializer
registers it: a serialized ``FileDescriptorProto`` in base64 (Apicurio keeps it as given). A schema
held as ``.proto`` text (what Confluent's registry answers) is not read: the Python ``protobuf``
package has no ``.proto`` parser; such a record is a dead letter that says so.

Protobuf has no room for Kafka Connect's names, so a few message types carry the meaning Debezium
gives its logical types: ``google.protobuf.Timestamp`` is an instant (``timestamptz``),
``google.type.Date`` a date, ``confluent.type.Decimal`` a decimal with its own scale per value (as
Debezium's ``VariableScaleDecimal``: its column type is ``source.variable_scale_decimal``), and the
``google.protobuf.*Value`` wrappers an optional scalar. A field with presence (``optional``, a message)
is an optional column; a plain proto3 scalar is required (it can't be absent: it reads as its default).
"""

from __future__ import annotations

import base64
import binascii
from datetime import UTC, date, datetime
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError, Message

from service.data.registry import BadRecord, UnknownSchema
from service.model.columns import SchemaError

_INT32 = {FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_SINT32, FieldDescriptor.TYPE_SFIXED32}
_INT64 = {
    FieldDescriptor.TYPE_INT64,
    FieldDescriptor.TYPE_SINT64,
    FieldDescriptor.TYPE_SFIXED64,
    FieldDescriptor.TYPE_UINT32,
    FieldDescriptor.TYPE_FIXED32,
    FieldDescriptor.TYPE_UINT64,  # a value past 2**63 does not fit: a dead letter
    FieldDescriptor.TYPE_FIXED64,
}
_PRIMITIVES = {
    FieldDescriptor.TYPE_DOUBLE: "float64",
    FieldDescriptor.TYPE_FLOAT: "float",
    FieldDescriptor.TYPE_BOOL: "boolean",
    FieldDescriptor.TYPE_STRING: "string",
    FieldDescriptor.TYPE_BYTES: "bytes",
    FieldDescriptor.TYPE_ENUM: "string",  # the value's name
    **dict.fromkeys(_INT32, "int32"),
    **dict.fromkeys(_INT64, "int64"),
}
TIMESTAMP, DATE, DECIMAL = "google.protobuf.Timestamp", "google.type.Date", "confluent.type.Decimal"
_WRAPPERS = {
    f"google.protobuf.{name}Value": kind
    for name, kind in (
        ("Double", "float64"),
        ("Float", "float"),
        ("Int64", "int64"),
        ("UInt64", "int64"),
        ("Int32", "int32"),
        ("UInt32", "int64"),
        ("Bool", "boolean"),
        ("String", "string"),
        ("Bytes", "bytes"),
    )
}
_MAX_DEPTH = 16
_EPOCH = date(1970, 1, 1)


def _decimal_file() -> bytes:
    """``confluent/type/decimal.proto`` (Confluent's decimal message), as a serialized descriptor."""
    f = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(name="confluent/type/decimal.proto", package="confluent.type")
    proto.syntax = "proto3"
    decimal = proto.message_type.add(name="Decimal")
    decimal.field.add(name="value", number=1, type=f.TYPE_BYTES, label=f.LABEL_OPTIONAL)
    decimal.field.add(name="precision", number=2, type=f.TYPE_UINT32, label=f.LABEL_OPTIONAL)
    decimal.field.add(name="scale", number=3, type=f.TYPE_INT32, label=f.LABEL_OPTIONAL)
    return proto.SerializeToString()


def _well_known() -> dict[str, bytes]:
    """The files a registered schema may import: serialized descriptors of the well-known types."""
    from google.protobuf import timestamp_pb2, wrappers_pb2

    files = {m.DESCRIPTOR.name: m.DESCRIPTOR.serialized_pb for m in (timestamp_pb2, wrappers_pb2)}
    files["confluent/type/decimal.proto"] = _decimal_file()
    try:
        from google.type import date_pb2  # googleapis-common-protos, when installed
    except ImportError:
        return files
    return {**files, date_pb2.DESCRIPTOR.name: date_pb2.DESCRIPTOR.serialized_pb}


def message_indexes(payload: bytes) -> tuple[list[int], int]:
    """The message indexes at the start of a Confluent Protobuf payload, and where the message starts."""
    position = 0

    def varint() -> int:
        nonlocal position
        shift = result = 0
        while True:
            if position >= len(payload) or shift > 63:
                raise BadRecord("the message indexes of the payload are cut short")
            byte = payload[position]
            position += 1
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return (result >> 1) ^ -(result & 1)  # zigzag
            shift += 7

    count = varint()
    if count == 0:
        return [0], position
    if not 0 < count <= _MAX_DEPTH:
        raise BadRecord(f"the payload names {count} message indexes")
    indexes = [varint() for _ in range(count)]
    if min(indexes) < 0:
        raise BadRecord(f"negative message indexes {indexes}")
    return indexes, position


def _field_connect(field: FieldDescriptor, depth: int) -> dict[str, Any]:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return _message_connect(field.message_type, depth + 1)
    if field.type == FieldDescriptor.TYPE_GROUP:
        raise SchemaError(f"field {field.full_name}: groups are not read")
    return {"type": _PRIMITIVES[field.type]}


def _repeated(field: FieldDescriptor) -> bool:
    repeated = getattr(field, "is_repeated", None)  # protobuf 6+; `label` before (gone in 7)
    if repeated is None:
        return bool(field.label == FieldDescriptor.LABEL_REPEATED)
    return bool(repeated)


def _message_connect(message: Descriptor, depth: int = 0) -> dict[str, Any]:
    name = message.full_name
    if name == TIMESTAMP:
        return {"type": "string", "name": "io.debezium.time.ZonedTimestamp"}
    if name == DATE:
        return {"type": "int32", "name": "io.debezium.time.Date"}
    if name == DECIMAL:
        scale = {"field": "scale", "type": "int32", "optional": False}
        value = {"field": "value", "type": "bytes", "optional": False}
        return {"type": "struct", "name": "io.debezium.data.VariableScaleDecimal", "fields": [scale, value]}
    if name in _WRAPPERS:
        return {"type": _WRAPPERS[name]}
    if depth > _MAX_DEPTH:
        raise SchemaError(f"message {name} nests deeper than {_MAX_DEPTH} (a recursive message?)")
    fields = []
    for field in message.fields:
        schema = _field_connect(field, depth)
        if _repeated(field):
            fields.append(
                {
                    "field": field.name,
                    "type": "array",
                    "items": {**schema, "optional": False},
                    "optional": True,
                }
            )
        else:
            fields.append({**schema, "field": field.name, "optional": bool(field.has_presence)})
    return {"type": "struct", "name": name, "fields": fields}


def _value(field: FieldDescriptor, value: Any) -> Any:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return _message_value(value)
    if field.type == FieldDescriptor.TYPE_ENUM:
        known = field.enum_type.values_by_number.get(value)
        if known is None:
            raise BadRecord(f"field {field.name}: {value} is not a value of enum {field.enum_type.full_name}")
        return known.name
    return value


def _message_value(message: Message) -> Any:
    """A message as the JSON converter's values of its Connect schema (bytes stay bytes)."""
    name = message.DESCRIPTOR.full_name
    if name == TIMESTAMP:
        seconds, nanos = message.seconds, message.nanos
        if nanos % 1000:
            raise BadRecord(
                f"a timestamp with nanoseconds ({seconds}s {nanos}ns): the table keeps microseconds"
            )
        try:
            instant = datetime.fromtimestamp(seconds, UTC).replace(microsecond=nanos // 1000)
        except (ValueError, OverflowError):
            raise BadRecord(f"a timestamp out of range ({seconds}s)") from None
        return instant.isoformat().replace("+00:00", "Z")
    if name == DATE:
        try:
            day = date(message.year, message.month, message.day)
        except ValueError as exc:
            raise BadRecord(f"not a date: {exc}") from None
        return (day - _EPOCH).days
    if name == DECIMAL:
        return {"scale": message.scale, "value": message.value}
    if name in _WRAPPERS:
        return message.value
    out: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        if _repeated(field):
            out[field.name] = [_value(field, v) for v in value]
        elif field.has_presence and not message.HasField(field.name):
            out[field.name] = None
        else:
            out[field.name] = _value(field, value)
    return out


class ProtobufSchema:
    """A Protobuf writer schema from the registry (:class:`service.data.registry.WriterSchema`)."""

    def __init__(self, schema_id: int, text: str) -> None:
        self.schema_id = schema_id
        proto = descriptor_pb2.FileDescriptorProto()
        try:
            proto.ParseFromString(base64.b64decode(text, validate=True))
        except (binascii.Error, ValueError, DecodeError):
            raise UnknownSchema(
                f"schema id {schema_id} is Protobuf as .proto text, which is not read (only a serialized "
                "FileDescriptorProto, as confluent-kafka's serializer registers it)"
            ) from None
        pool = descriptor_pool.DescriptorPool()
        known = _well_known()
        for dependency in proto.dependency:
            if dependency not in known:
                raise UnknownSchema(
                    f"schema id {schema_id} imports {dependency}: schema references are not read "
                    f"(only {', '.join(sorted(known))})"
                )
            pool.AddSerializedFile(known[dependency])
        try:
            self._file = pool.AddSerializedFile(proto.SerializeToString())
        except TypeError as exc:
            raise UnknownSchema(f"schema id {schema_id} is not a valid Protobuf schema: {exc}") from None
        self._messages: dict[tuple[int, ...], tuple[type[Message], dict[str, Any]]] = {}

    def _message(self, indexes: list[int]) -> tuple[type[Message], dict[str, Any]]:
        key = tuple(indexes)
        if key not in self._messages:
            types = self._file.message_types_by_name
            try:
                descriptor = list(types.values())[indexes[0]]
                for i in indexes[1:]:
                    descriptor = descriptor.nested_types[i]
            except IndexError:
                raise BadRecord(f"schema id {self.schema_id} has no message at indexes {indexes}") from None
            try:
                connect = _message_connect(descriptor)
            except SchemaError as exc:
                raise UnknownSchema(f"schema id {self.schema_id} can't be mapped to columns: {exc}") from None
            self._messages[key] = (message_factory.GetMessageClass(descriptor), connect)
        return self._messages[key]

    def read(self, payload: bytes) -> tuple[dict[str, Any], dict[str, Any]]:
        indexes, start = message_indexes(payload)
        cls, connect = self._message(indexes)
        message = cls()
        try:
            message.ParseFromString(payload[start:])
        except DecodeError as exc:
            raise BadRecord(f"the payload does not match schema id {self.schema_id}: {exc}") from None
        return _message_value(message), connect
