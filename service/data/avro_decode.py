"""Debezium Avro (the Confluent wire format) → the same typed Arrow changes as the JSON decoders.

Each record is read with its own writer schema, fetched by the schema id it carries
(:mod:`service.data.registry`), stripped of logical types (:func:`service.data.avro_schema.decoding_schema`)
so that its values are the JSON converter's: the rows are then laid out as the JSON envelopes would
parse, bytes as base64, and go through the JSON path's own checks and conversions
(:func:`service.data.arrow_decode.decode_envelopes`). A column can't decode one way from JSON and
another from Avro.

There is no second decoder to hand a bad record to (Spark's reads JSON only), so this one finds the bad
records itself and returns them as dead letters with the reason: a record without the magic byte, a
schema id the registry does not know, a payload that does not match its schema (or has bytes left
over), and any value the conversions refuse. The last are found by halving the records of a schema
version until the refused one is alone: as many decodes as log2 of the records per bad record, and
none when all are good.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from fastavro import parse_schema, schemaless_reader

from service.data.arrow_decode import (
    Declined,
    Decoded,
    decode_envelopes,
    envelope_schema,
    row_type,
    section_columns,
    unsupported,
)
from service.data.avro_schema import connect_schema, connect_text, decoding_schema
from service.data.envelope import KAFKA_POSITION, TRUNCATE_OP, TRUNCATE_REASON
from service.data.registry import NotFramed, Registry, UnknownSchema, frame
from service.model.columns import Column, SchemaError

DEAD_COLUMNS = ["key", "value", "topic", "partition", "offset", "error"]


@dataclass
class _Schema:
    """One schema id, as the decoder uses it."""

    parsed: Any  # fastavro's parse of the decoding schema
    text: str  # the Connect schema it was made from (normalised JSON): the table's evolution follows it


@dataclass
class Schemas:
    """The writer schemas of a task's records, by id (parsed once per task)."""

    registry: Registry
    by_id: dict[int, _Schema] = field(default_factory=dict)

    def get(self, schema_id: int) -> _Schema:
        known = self.by_id.get(schema_id)
        if known is None:
            avro = self.registry.schema(schema_id)
            try:
                known = _Schema(parse_schema(decoding_schema(avro)), connect_text(avro))
            except Exception as exc:  # the registry's schema is not one fastavro parses
                raise UnknownSchema(f"schema id {schema_id} can't be read: {exc}") from None
            self.by_id[schema_id] = known
        return known

    def read(self, data: bytes) -> tuple[dict[str, Any], str]:
        """One framed record → its value (primitives only) and its schema's Connect text."""
        schema_id, payload = frame(data)
        schema = self.get(schema_id)
        stream = io.BytesIO(payload)
        try:
            value = schemaless_reader(stream, schema.parsed, None)
        except Exception as exc:  # fastavro raises EOFError, ValueError, UnicodeDecodeError, ...
            raise _Bad(
                f"the payload does not match schema id {schema_id}: {type(exc).__name__}: {exc}"
            ) from None
        if stream.tell() != len(payload):
            raise _Bad(
                f"the payload does not match schema id {schema_id}: "
                f"{len(payload) - stream.tell()} bytes left after the record"
            )
        if not isinstance(value, dict):
            raise _Bad(f"schema id {schema_id} is not a record schema")
        return value, schema.text

    def as_json_event(self, data: bytes) -> dict[str, Any]:
        """A framed record as Kafka Connect's JSON converter writes it, ``{"schema", "payload"}`` (what
        :func:`service.kafka.lookups.peek` reads); ValueError for anything that is not such a record."""
        try:
            schema_id, _ = frame(data)
            value, _ = self.read(data)
            return {"schema": connect_schema(self.registry.schema(schema_id)), "payload": value}
        except (UnknownSchema, SchemaError) as exc:
            raise ValueError(str(exc)) from None


class _Bad(ValueError):
    """A record's own fault: it becomes a dead letter with this reason."""


def _wire(value: Any) -> Any:
    """A decoded Avro value as the JSON converter writes it: bytes (and fixed) as base64."""
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, dict):
        return {k: _wire(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_wire(v) for v in value]
    return value


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
        try:
            event, section = schemas.read(value) if value is not None else ({"op": "d"}, None)
            key_row = schemas.read(key_bytes)[0] if key_bytes is not None else {}
        except (_Bad, NotFramed, UnknownSchema) as exc:
            dead[i] = str(exc)
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
    positions = kafka.select(KAFKA_POSITION)
    parts: list[tuple[Decoded, list[int]]] = []
    for section, indices in groups.items():
        version = columns if section is None else section_columns(columns, section)
        if reason := unsupported(version):
            raise Declined(reason)
        parts.extend(_isolating(events, key_rows, positions, version, key, indices, dead))
    if not parts:  # every record dead: no changes, in the columns' types
        parts.append((_decode_part(events, key_rows, positions, columns, key, []), []))
    return AvroDecoded(
        _in_record_order(parts, sorted({s for s in sections if s is not None})),
        _dead_letters(values, keys, kafka, dead),
    )


def _isolating(
    events: list[dict[str, Any]],
    key_rows: list[dict[str, Any]],
    positions: pa.Table,
    columns: list[Column],
    key: list[str],
    indices: list[int],
    dead: dict[int, str],
) -> list[tuple[Decoded, list[int]]]:
    """The records at ``indices`` decoded together; when that is refused, each half on its own, down to
    the refused record, which goes to ``dead`` with the reason."""
    try:
        return [(_decode_part(events, key_rows, positions, columns, key, indices), indices)]
    except (Declined, pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as exc:
        if len(indices) == 1:
            dead[indices[0]] = _reason(exc)
            return []
    half = len(indices) // 2
    return [
        *_isolating(events, key_rows, positions, columns, key, indices[:half], dead),
        *_isolating(events, key_rows, positions, columns, key, indices[half:], dead),
    ]


def _reason(exc: Exception) -> str:
    if isinstance(exc, Declined):
        return str(exc)
    return f"a value that does not fit its column's type: {type(exc).__name__}: {str(exc)[:300]}"


def _decode_part(
    events: list[dict[str, Any]],
    key_rows: list[dict[str, Any]],
    positions: pa.Table,
    columns: list[Column],
    key: list[str],
    indices: list[int],
) -> Decoded:
    body = pa.struct(list(envelope_schema(columns))[1:])  # without "payload"
    envelope = pa.Table.from_struct_array(pa.array([_wire(events[i]) for i in indices], body))
    by_name = {c.name: c for c in columns}
    key_type = row_type([by_name[k] for k in key])
    key_table = pa.Table.from_struct_array(pa.array([_wire(key_rows[i]) for i in indices], key_type))
    return decode_envelopes(envelope, key_table, positions.take(pa.array(indices, pa.int64())), columns, key)


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
