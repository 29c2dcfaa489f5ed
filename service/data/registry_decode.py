"""Debezium Avro and Protobuf (the Confluent wire format) → the same typed Arrow changes as the JSON
decoders.

Each record is read with its own writer schema, fetched by the schema id it carries
(:mod:`service.data.registry`; :mod:`service.data.avro_schema`, :mod:`service.data.protobuf_schema`),
into the values Kafka Connect's JSON converter would write for it (a date as days, a timestamp as an
integer or ISO text; bytes are turned into base64 here, for the columns that need it). The rows are
then laid out as the JSON envelopes would parse and go through the JSON path's own checks and
conversions (:func:`service.data.arrow_decode.decode_envelopes`): a column can't decode one way from
JSON and another from Avro or Protobuf.

There is no second decoder to hand a bad record to (Spark's reads JSON only), so this one finds the bad
records itself and returns them as dead letters with the reason: a record without the magic byte, a
schema id the registry does not know, a payload that does not match its schema (or has bytes left
over), and any value the conversions refuse. The last are found by halving the records of a schema
version until the refused one is alone: as many decodes as log2 of the records per bad record, and
none when all are good.
"""

from __future__ import annotations

import json
from binascii import b2a_base64
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from service.data.arrow_decode import (
    Declined,
    Decoded,
    decode_envelopes,
    envelope_schema,
    row_type,
    section_columns,
    unsupported,
)
from service.data.avro_schema import AvroSchema
from service.data.envelope import KAFKA_POSITION, TRUNCATE_OP, TRUNCATE_REASON
from service.data.protobuf_schema import ProtobufSchema
from service.data.registry import Registry, RegistryUnavailable, UnknownSchema, WriterSchema, frame
from service.model.columns import Column, Encoding, SchemaError

DEAD_COLUMNS = ["key", "value", "topic", "partition", "offset", "error"]


# The registry's schema type each source format reads.
KINDS = {"debezium-avro": "AVRO", "debezium-protobuf": "PROTOBUF"}


@dataclass
class Schemas:
    """The writer schemas of a task's records, by id (each read once per task)."""

    registry: Registry
    format: str = "debezium-avro"  # source.format
    # table.on_incompatible_schema is fail: a schema that can't be read or mapped stops the batch
    # (SchemaError) rather than making its records dead letters
    strict: bool = False
    by_id: dict[int, WriterSchema] = field(default_factory=dict)
    failed: dict[int, UnknownSchema] = field(default_factory=dict)  # asked once per task, too
    texts: dict[int, str] = field(default_factory=dict)  # id() of a Connect schema → its text

    def get(self, schema_id: int) -> WriterSchema:
        known = self.by_id.get(schema_id)
        if known is not None:
            return known
        if schema_id in self.failed:
            raise self.failed[schema_id]
        try:
            known = self._load(schema_id)
        except UnknownSchema as exc:
            self.failed[schema_id] = exc
            raise
        self.by_id[schema_id] = known
        return known

    def _load(self, schema_id: int) -> WriterSchema:
        registered = self.registry.schema(schema_id)  # UnknownSchema: the registry has no such id
        try:
            if registered.kind != KINDS[self.format]:
                raise UnknownSchema(
                    f"schema id {schema_id} is {registered.kind}, and source.format is {self.format}"
                )
            try:
                if registered.kind == "AVRO":
                    return AvroSchema(schema_id, registered.text)
                return ProtobufSchema(schema_id, registered.text)
            except SchemaError as exc:
                raise UnknownSchema(f"schema id {schema_id} can't be mapped to columns: {exc}") from None
        except UnknownSchema as exc:  # the schema is there, and this sink can't take it
            if self.strict:
                raise SchemaError(f"{exc} (table.on_incompatible_schema: fail)") from None
            raise

    def read_connect(self, data: bytes) -> tuple[dict[str, Any], dict[str, Any]]:
        """One framed record → its value and the Kafka Connect schema of its writer schema."""
        schema_id, payload = frame(data)
        return self.get(schema_id).read(payload)

    def read(self, data: bytes) -> tuple[dict[str, Any], str]:
        """One framed record → its value (bytes as bytes) and its schema's Connect text (normalised
        JSON, what the table's evolution follows, as a JSON event's schema section)."""
        value, connect = self.read_connect(data)
        text = self.texts.get(id(connect))
        if text is None:
            text = self.texts[id(connect)] = json.dumps(connect, sort_keys=True, separators=(",", ":"))
        return value, text

    def as_json_event(self, data: bytes) -> dict[str, Any]:
        """A framed record as Kafka Connect's JSON converter writes it, ``{"schema", "payload"}`` (what
        :func:`service.kafka.lookups.peek` reads); ValueError for anything that is not such a record."""
        try:
            value, connect = self.read_connect(data)
        except UnknownSchema as exc:
            raise ValueError(str(exc)) from None
        return {"schema": connect, "payload": value}


# Encodings whose value is bytes here where the JSON converter writes base64 text.
_BASE64 = frozenset({Encoding.BYTES_BASE64, Encoding.DECIMAL_BASE64, Encoding.VARIABLE_SCALE_DECIMAL})


def _base64(value: Any) -> Any:
    """A bytes value (or a VariableScaleDecimal's, or a list's elements) as base64 text."""
    if isinstance(value, bytes):
        return b2a_base64(value, newline=False).decode("ascii")
    if isinstance(value, dict):  # io.debezium.data.VariableScaleDecimal {scale, value}
        return {**value, "value": _base64(value.get("value"))}
    if isinstance(value, list):
        return [None if v is None else _base64(v) for v in value]
    return value


def _as_json_values(rows: list[dict[str, Any]], indices: list[int], columns: list[Column]) -> None:
    """The rows' bytes values, in place, as the JSON converter writes them (only the columns that
    need it: a walk of every value cost more than decoding the records)."""
    names = [c.name for c in columns if c.encoding in _BASE64]
    if not names:
        return
    for i in indices:
        row = rows[i]
        for image in (row.get("before"), row.get("after"), row if "op" not in row else None):
            if image:
                for name in names:
                    if image.get(name) is not None:
                        image[name] = _base64(image[name])


@dataclass
class AvroDecoded:
    """A task's records: the good ones' changes (in record order) and the bad ones as dead letters
    (:data:`DEAD_COLUMNS`)."""

    decoded: Decoded
    dead: pa.Table


def decode(
    values: Sequence[bytes | None],
    keys: Sequence[bytes | None],
    kafka: pa.Table,
    columns: list[Column],
    key: list[str],
    schemas: Schemas,
    *,
    too_big: Sequence[bool] = (),
    rejected: dict[str, str] | None = None,
    reason_too_big: str = "a record over source.max_record_bytes",
) -> AvroDecoded:
    """Decode framed Avro values and keys (``kafka``: their topic, partition and offset). A null value
    (a tombstone) is a delete of the key in its Kafka key, as in the JSON decoders; a caller that
    ignores tombstones (append mode) leaves them out. The schema sections of the records' schemas
    are in ``decoded.schemas``: the caller checks that the table takes them as they are.
    ``too_big`` marks records over the size limit, ``rejected`` the schema sections whose records are
    dead letters (an incompatible change the table refused), both with their reason."""
    dead: dict[int, str] = {}
    events: list[dict[str, Any]] = []
    key_rows: list[dict[str, Any]] = []
    sections: list[str | None] = []
    for i, (value, key_bytes) in enumerate(zip(values, keys, strict=True)):
        if too_big and too_big[i]:
            dead[i] = reason_too_big
            events.append({})
            key_rows.append({})
            sections.append(None)
            continue
        key_row: dict[str, Any] = {}
        try:
            event, section = schemas.read(value) if value is not None else ({"op": "d"}, None)
            # The key columns are in a change's row image; a tombstone takes them from the record's
            # key, and so does a delete where it can (its before image holds the key columns too: a
            # key it can't read, another converter's say, does not lose the delete).
            if key_bytes is not None and event.get("op") == "d":
                try:
                    key_row = schemas.read(key_bytes)[0]
                except RegistryUnavailable:
                    raise
                except Exception:
                    if value is None:  # a tombstone has nothing else
                        raise
        except RegistryUnavailable:
            raise  # not the record's fault: the batch fails and is retried
        except Exception as exc:  # the record's own: a dead letter (reading raises all kinds)
            dead[i] = (
                str(exc) if isinstance(exc, ValueError | LookupError) else f"{type(exc).__name__}: {exc}"
            )
            event, section, key_row = {}, None, {}
        if event.get("op") == TRUNCATE_OP:
            dead[i] = TRUNCATE_REASON
        elif rejected and section in rejected:
            dead[i] = rejected[section]
        events.append(event)
        key_rows.append(key_row)
        sections.append(section)
    groups: dict[str | None, list[int]] = {}
    for i, section in enumerate(sections):
        if i not in dead:
            groups.setdefault(section, []).append(i)
    read = _Read(events, key_rows, kafka.select(KAFKA_POSITION))
    parts: list[tuple[Decoded, list[int]]] = []
    for section, indices in groups.items():
        version = columns if section is None else section_columns(columns, section)
        if reason := unsupported(version):
            raise Declined(reason)
        _as_json_values(events, indices, version)
        _as_json_values(key_rows, indices, version)
        parts.extend(read.isolating(version, key, indices, dead))
    if not parts:  # every record dead: no changes, in the columns' types
        parts.append((read.decode(columns, key, []), []))
    return AvroDecoded(
        _in_record_order(parts, sorted({s for s in sections if s is not None})),
        _dead_letters(values, keys, kafka, dead),
    )


@dataclass
class _Read:
    """The records of a task as read: their values, keys (where needed) and Kafka positions."""

    events: list[dict[str, Any]]
    key_rows: list[dict[str, Any]]
    positions: pa.Table

    def decode(self, columns: list[Column], key: list[str], indices: list[int]) -> Decoded:
        """The records at ``indices`` laid out as parsed JSON envelopes, through the JSON path's checks."""
        body = pa.struct(list(envelope_schema(columns))[1:])  # without "payload"
        envelope = pa.Table.from_struct_array(pa.array([self.events[i] for i in indices], body))
        by_name = {c.name: c for c in columns}
        key_type = row_type([by_name[k] for k in key])
        key_table = pa.Table.from_struct_array(pa.array([self.key_rows[i] for i in indices], key_type))
        taken = self.positions.take(pa.array(indices, pa.int64()))
        return decode_envelopes(envelope, key_table, taken, columns, key)

    def isolating(
        self, columns: list[Column], key: list[str], indices: list[int], dead: dict[int, str]
    ) -> list[tuple[Decoded, list[int]]]:
        """The records at ``indices`` decoded together; when that is refused, each half on its own,
        down to the refused record, which goes to ``dead`` with the reason."""
        try:
            return [(self.decode(columns, key, indices), indices)]
        except (Declined, pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as exc:
            if len(indices) == 1:
                dead[indices[0]] = _reason(exc)
                return []
        half = len(indices) // 2
        return [
            *self.isolating(columns, key, indices[:half], dead),
            *self.isolating(columns, key, indices[half:], dead),
        ]


def _reason(exc: Exception) -> str:
    if isinstance(exc, Declined):
        return str(exc)
    return f"a value that does not fit its column's type: {type(exc).__name__}: {str(exc)[:300]}"


def _in_record_order(parts: list[tuple[Decoded, list[int]]], schemas: list[str]) -> Decoded:
    by_op: dict[str, int] = {}
    for decoded, _ in parts:
        for op, n in decoded.by_op.items():
            by_op[op] = by_op.get(op, 0) + n
    order = [i for _, indices in parts for i in indices]
    rows = pa.concat_tables([d.rows for d, _ in parts]).take(pc.sort_indices(pa.array(order, pa.int64())))
    return Decoded(rows, by_op, schemas)


def _dead_letters(
    values: Sequence[bytes | None], keys: Sequence[bytes | None], kafka: pa.Table, dead: dict[int, str]
) -> pa.Table:
    rows = sorted(dead)
    taken = kafka.take(pa.array(rows, pa.int64()))
    return pa.table(
        {
            "key": pa.array([keys[i] for i in rows], pa.binary()),
            "value": pa.array([values[i] for i in rows], pa.binary()),
            "topic": taken["topic"].combine_chunks().cast(pa.string()),
            "partition": taken["partition"].combine_chunks().cast(pa.int32()),
            "offset": taken["offset"].combine_chunks().cast(pa.int64()),
            "error": pa.array([dead[i] for i in rows], pa.string()),
        }
    )
