"""The sales stream in Protobuf, produced from Python with confluent-kafka's ProtobufSerializer against
the stack's schema registry (it registers each file as a serialized descriptor).

Messages are built at run time from a FileDescriptorProto (no generated code): ``Envelope`` with
``before``/``after`` rows, a ``Source`` (ts_ms, lsn) and ``op``, and a ``Key`` of its own file. A row
is ``id``, ``customer`` (optional), ``amount`` (``confluent.type.Decimal``) and ``sold_at``
(``google.protobuf.Timestamp``).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.confluent.type import decimal_pb2
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2

F = descriptor_pb2.FieldDescriptorProto


def _files(package: str) -> tuple[descriptor_pb2.FileDescriptorProto, descriptor_pb2.FileDescriptorProto]:
    value = descriptor_pb2.FileDescriptorProto(
        name=f"{package}/envelope.proto", package=package, syntax="proto3"
    )
    value.dependency.extend(["google/protobuf/timestamp.proto", "confluent/type/decimal.proto"])
    row = value.message_type.add(name="Row")
    row.field.add(name="id", number=1, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    row.field.add(
        name="customer",
        number=2,
        type=F.TYPE_STRING,
        label=F.LABEL_OPTIONAL,
        proto3_optional=True,
        oneof_index=0,
    )
    row.oneof_decl.add(name="_customer")
    row.field.add(name="amount", number=3, type=F.TYPE_MESSAGE, type_name=".confluent.type.Decimal")
    row.field.add(name="sold_at", number=4, type=F.TYPE_MESSAGE, type_name=".google.protobuf.Timestamp")
    source = value.message_type.add(name="Source")
    source.field.add(name="ts_ms", number=1, type=F.TYPE_INT64)
    source.field.add(name="lsn", number=2, type=F.TYPE_INT64)
    envelope = value.message_type.add(name="Envelope")
    envelope.field.add(name="before", number=1, type=F.TYPE_MESSAGE, type_name=f".{package}.Row")
    envelope.field.add(name="after", number=2, type=F.TYPE_MESSAGE, type_name=f".{package}.Row")
    envelope.field.add(name="source", number=3, type=F.TYPE_MESSAGE, type_name=f".{package}.Source")
    envelope.field.add(name="op", number=4, type=F.TYPE_STRING)
    key = descriptor_pb2.FileDescriptorProto(name=f"{package}/key.proto", package=package, syntax="proto3")
    key.message_type.add(name="Key").field.add(name="id", number=1, type=F.TYPE_INT64)
    return value, key


@dataclass
class ProtobufSales:
    """Records of one topic and the rows the source holds after them."""

    registry: str
    topic: str
    lsn: int = 100
    rows: dict[int, dict[str, Any]] = field(default_factory=dict)
    appended: list[dict[str, Any]] = field(default_factory=list)  # every row image written, in order

    def __post_init__(self) -> None:
        package = self.topic.replace("-", "_").replace(".", "_")
        pool = descriptor_pool.DescriptorPool()
        for module in (timestamp_pb2, decimal_pb2):
            pool.AddSerializedFile(module.DESCRIPTOR.serialized_pb)
        value, key = _files(package)
        pool.Add(value)
        pool.Add(key)
        self.Envelope = message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.Envelope"))
        self.Key = message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.Key"))
        # A timeout so that a registry that stops answering fails the test with its reason, and the topic
        # name strategy (Debezium's and the sink's subjects) rather than the client's default lookup of
        # subject associations, an API the registry need not have.
        client = SchemaRegistryClient({"url": self.registry, "timeout": 30})
        config = {"use.deprecated.format": False, "subject.name.strategy.type": "TOPIC"}
        self._value = ProtobufSerializer(self.Envelope, client, config)
        self._key = ProtobufSerializer(self.Key, client, config)

    def _fill(self, image: Any, row: dict[str, Any]) -> None:
        image.id = row["id"]
        if row["customer"] is not None:
            image.customer = row["customer"]
        if row["amount"] is not None:
            unscaled = int(row["amount"].scaleb(2))
            image.amount.value = unscaled.to_bytes((unscaled.bit_length() + 8) // 8, "big", signed=True)
            image.amount.precision, image.amount.scale = 12, 2
        if row["sold_at"] is not None:
            image.sold_at.FromDatetime(row["sold_at"])

    def _event(self, op: str, before: dict[str, Any] | None, after: dict[str, Any] | None) -> bytes:
        self.lsn += 1
        message = self.Envelope(op=op)
        message.source.ts_ms, message.source.lsn = 1_700_000_000_000 + self.lsn, self.lsn
        if before is not None:
            self._fill(message.before, before)
        if after is not None:
            self._fill(message.after, after)
        return bytes(self._value(message, SerializationContext(self.topic, MessageField.VALUE)))

    def key_of(self, key: int) -> bytes:
        return bytes(self._key(self.Key(id=key), SerializationContext(self.topic, MessageField.KEY)))

    def upsert(
        self, key: int, customer: str | None, amount: Decimal | None, sold_at: datetime | None
    ) -> list[tuple[bytes, bytes | None]]:
        before = copy.deepcopy(self.rows.get(key))
        row = {"id": key, "customer": customer, "amount": amount, "sold_at": sold_at}
        self.rows[key] = row
        self.appended.append(dict(row))
        return [(self.key_of(key), self._event("u" if before else "c", before, row))]

    def delete(self, key: int) -> list[tuple[bytes, bytes | None]]:
        before = self.rows.pop(key)
        return [(self.key_of(key), self._event("d", before, None)), (self.key_of(key), None)]

    def stream(self) -> list[tuple[bytes, bytes | None]]:
        """The sales stream's shape: inserts, updates (one key twice), deletes, NULLs, the widest amount."""
        at = datetime(2026, 3, 1, 8, 0, 0, 1, tzinfo=UTC)
        records = []
        for k in range(1, 31):
            records += self.upsert(k, f"customer-{k}", Decimal(k * 12345 - 2000) / 100, at.replace(minute=k))
        for k in range(1, 11):
            records += self.upsert(k, f"CUSTOMER-{k}", Decimal(k) + Decimal("0.99"), at)
        records += self.upsert(
            3, "three", Decimal("-9999999999.99"), datetime(1999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)
        )
        for k in range(20, 26):
            records += self.delete(k)
        records += self.upsert(31, None, None, None)
        return records

    def expected(self) -> list[dict[str, Any]]:
        return [dict(row) for row in self.rows.values()]
