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
import logging
from binascii import b2a_base64
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from service.data import avro_batch
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
from service.data.envelope import RECORD_POSITION, TRUNCATE_OP, TRUNCATE_REASON
from service.data.files import DELETE_OP
from service.data.protobuf_schema import ProtobufSchema
from service.data.registry import Registry, RegistryUnavailable, UnknownSchema, WriterSchema, frame
from service.model.columns import Column, Encoding, SchemaError

logger = logging.getLogger(__name__)

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
        return value, self.section_text(connect)

    def section_text(self, connect: dict[str, Any]) -> str:
        """A Connect schema as a JSON event's schema section (normalised JSON, made once per schema)."""
        text = self.texts.get(id(connect))
        if text is None:
            text = self.texts[id(connect)] = json.dumps(connect, sort_keys=True, separators=(",", ":"))
        return text

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


def _as_json_values(rows: list[dict[str, Any]], columns: list[Column]) -> None:
    """The rows' bytes values, in place, as the JSON converter writes them (only the columns that
    need it: a walk of every value cost more than decoding the records)."""
    names = [c.name for c in columns if c.encoding in _BASE64]
    if not names:
        return
    for row in rows:
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
    dead letters (an incompatible change the table refused), both with their reason.

    Avro records are read a schema id at a time by the native decoder (:mod:`service.data.avro_batch`)
    where it is built and can lay the schema's records out; the others (Protobuf, tombstones, records
    without the header or of an unknown id, and all of them without the native decoder) one by one."""
    dead = {i: reason_too_big for i, big in enumerate(too_big) if big}
    context = _Task(values, keys, columns, key, schemas, rejected or {}, dead)
    batches, one_by_one = context.read_batches()
    groups: list[_Group] = [*batches, *context.read_one_by_one(one_by_one)]
    positions = kafka.select(RECORD_POSITION)
    parts: list[tuple[Decoded, list[int]]] = []
    for group in groups:
        version = context.version(group.section)
        parts.extend(_isolating(group, version, key, positions, list(range(len(group.indices))), dead))
    if not parts:  # every record dead: no changes, in the columns' types
        empty = _OneByOne(None, [], [], [])
        parts.append((_decode(empty, columns, key, positions, []), []))
    return AvroDecoded(
        _in_record_order(parts, sorted(context.sections)), _dead_letters(values, keys, kafka, dead)
    )


class _Group(Protocol):
    """Records of one schema section, ready to be laid out as parsed envelopes and their keys."""

    section: str | None
    indices: list[int]  # the records' places in the task's chunk

    def tables(self, columns: list[Column], key: list[str], rows: list[int]) -> tuple[pa.Table, pa.Table]:
        """The envelopes and keys of the group's ``rows``; may raise for a value that does not fit."""
        ...


@dataclass
class _OneByOne:
    """Records read one at a time: their values (and keys, where needed) as Python objects."""

    section: str | None
    indices: list[int]
    events: list[dict[str, Any]]
    key_rows: list[dict[str, Any]]

    def tables(self, columns: list[Column], key: list[str], rows: list[int]) -> tuple[pa.Table, pa.Table]:
        body = pa.struct(list(envelope_schema(columns))[1:])  # without "payload"
        envelope = pa.Table.from_struct_array(pa.array([self.events[r] for r in rows], body))
        by_name = {c.name: c for c in columns}
        key_type = row_type([by_name[k] for k in key])
        return envelope, pa.Table.from_struct_array(pa.array([self.key_rows[r] for r in rows], key_type))


@dataclass
class _Batch:
    """Records of one schema id read together by the native decoder, already laid out."""

    section: str | None
    indices: list[int]
    envelope: pa.Table
    keys: pa.Table

    def tables(self, columns: list[Column], key: list[str], rows: list[int]) -> tuple[pa.Table, pa.Table]:
        taken = pa.array(rows, pa.int64())
        return self.envelope.take(taken), self.keys.take(taken)


@dataclass
class _Task:
    """One call's records and what it found out about them so far (``dead``: index → reason)."""

    values: Sequence[bytes | None]
    keys: Sequence[bytes | None]
    columns: list[Column]
    key: list[str]
    schemas: Schemas
    rejected: dict[str, str]
    dead: dict[int, str]
    # the schema sections of every record read, dead ones too (the caller checks the table takes them)
    sections: set[str] = field(default_factory=set)

    def version(self, section: str | None) -> list[Column]:
        """The columns of a schema section (the table's, for tombstones); Declined when this decoder
        can't take them at all."""
        version = self.columns if section is None else section_columns(self.columns, section)
        if reason := unsupported(version):
            raise Declined(reason)
        return version

    def read_batches(self) -> tuple[list[_Batch], list[int]]:
        """The Avro records the native decoder reads, a batch per schema id; and those left to read
        one by one."""
        pending = np.ones(len(self.values), dtype=bool)
        pending[list(self.dead)] = False
        if self.schemas.format != "debezium-avro" or not avro_batch.available():
            return [], np.flatnonzero(pending).tolist()
        ids = avro_batch.schema_ids(self.values)
        rest = np.flatnonzero(pending & (ids < 0)).tolist()
        batches = []
        for schema_id in np.unique(ids[pending & (ids >= 0)]).tolist():
            indices = np.flatnonzero(pending & (ids == schema_id)).tolist()
            try:
                batch = self._read_batch(schema_id, indices)
            except (avro_batch.NotBatchable, UnknownSchema, SchemaError) as exc:
                # the records' own reasons come from reading them one by one
                logger.debug("schema id %s: read record by record (%s)", schema_id, exc)
                rest.extend(indices)
                continue
            if batch is not None:
                batches.append(batch)
        return batches, sorted(rest)

    def _read_batch(self, schema_id: int, indices: list[int]) -> _Batch | None:
        """One schema id's records through the native decoder. Nothing is marked dead until the
        batch is laid out: when it can't be (NotBatchable), every one of its records is read again
        one by one, which gives each its own outcome."""
        schema = self._avro(schema_id)
        values = [self.values[i] for i in indices]
        array, good, bad = avro_batch.decode(schema_id, schema.decoding_text, values)  # type: ignore[arg-type]
        dead = {indices[j]: reason for j, reason in bad}
        members = [indices[j] for j in good]
        section = self.schemas.section_text(schema.connect)
        if array is None:
            self.dead.update(dead)
            return None
        truncated = pc.equal(avro_batch.ops(array), TRUNCATE_OP).fill_null(False).to_pylist()
        dead.update((m, TRUNCATE_REASON) for m, t in zip(members, truncated, strict=True) if t)
        kept = [r for r, t in enumerate(truncated) if not t]
        self.sections.add(section)  # as for records read one by one: truncates and rejected ones too
        if section in self.rejected:
            dead.update((members[r], self.rejected[section]) for r in kept)
            kept = []
        if not kept:
            self.dead.update(dead)
            return None
        version = self.version(section)
        envelope = avro_batch.envelopes(array.take(pa.array(kept, pa.int64())), version)
        members = [members[r] for r in kept]
        deletes = pc.fill_null(pc.equal(envelope["op"], DELETE_OP), False).to_numpy(zero_copy_only=False)
        keys = self._batch_keys(members, deletes, envelope, version)
        self.dead.update(dead)
        return _Batch(section, members, envelope, keys)

    def _avro(self, schema_id: int) -> AvroSchema:
        schema = self.schemas.get(schema_id)
        if not isinstance(schema, AvroSchema):
            raise avro_batch.NotBatchable(f"schema id {schema_id} is not Avro")
        return schema

    def _batch_keys(
        self, members: list[int], deletes: np.ndarray, envelope: pa.Table, version: list[Column]
    ) -> pa.Table:
        """The key columns of a batch's deletes from their record keys, read a key schema id at a time
        like the values; null where a delete has no key or it can't be read (its before image holds
        the key columns too), and for the other changes."""
        by_name = {c.name: c for c in version}
        key_columns = [by_name[k] for k in self.key]
        image = envelope.schema.field("after").type
        schema = pa.schema([image.field(k) for k in self.key])
        rows = [r for r in np.flatnonzero(deletes).tolist() if self.keys[members[r]] is not None]
        ids = avro_batch.schema_ids([self.keys[members[r]] for r in rows])
        pieces: list[tuple[list[int], pa.Table]] = []
        for key_id in np.unique(ids).tolist():
            at = [rows[j] for j in np.flatnonzero(ids == key_id).tolist()]
            keys = [self.keys[members[r]] for r in at]
            try:
                if key_id < 0:  # no wire-format header: not a key this reader knows (no registry call)
                    raise avro_batch.NotBatchable("a key without the Confluent header")
                array, good, _ = avro_batch.decode(key_id, self._avro(key_id).decoding_text, keys)  # type: ignore[arg-type]
                if array is not None:
                    pieces.append(([at[g] for g in good], avro_batch.key_columns(array, key_columns)))
            except (avro_batch.NotBatchable, UnknownSchema, SchemaError):
                pieces.append((at, avro_batch.key_rows([self._key(k) for k in keys], schema)))
        return avro_batch.scatter(pieces, len(members), schema)

    def _key(self, data: bytes | None) -> dict[str, Any]:
        """A delete's key columns read one at a time; {} when it can't be read."""
        if data is None:
            return {}
        try:
            return self.schemas.read(data)[0]
        except RegistryUnavailable:
            raise
        except Exception:
            return {}

    def read_one_by_one(self, indices: list[int]) -> list[_OneByOne]:
        """The records at ``indices`` read one at a time, grouped by schema section."""
        groups: dict[str | None, _OneByOne] = {}
        for i in indices:
            value, key_bytes = self.values[i], self.keys[i]
            key_row: dict[str, Any] = {}
            try:
                event, section = self.schemas.read(value) if value is not None else ({"op": "d"}, None)
                # The key columns are in a change's row image; a tombstone takes them from the
                # record's key, and so does a delete where it can (its before image holds the key
                # columns too: a key it can't read, another converter's say, does not lose the delete).
                if key_bytes is not None and event.get("op") == "d":
                    try:
                        key_row = self.schemas.read(key_bytes)[0]
                    except RegistryUnavailable:
                        raise
                    except Exception:
                        if value is None:  # a tombstone has nothing else
                            raise
            except RegistryUnavailable:
                raise  # not the record's fault: the batch fails and is retried
            except Exception as exc:  # the record's own: a dead letter (reading raises all kinds)
                self.dead[i] = (
                    str(exc) if isinstance(exc, ValueError | LookupError) else f"{type(exc).__name__}: {exc}"
                )
                continue
            if section is not None:
                self.sections.add(section)
            if event.get("op") == TRUNCATE_OP:
                self.dead[i] = TRUNCATE_REASON
                continue
            if section in self.rejected:
                self.dead[i] = self.rejected[section]
                continue
            group = groups.setdefault(section, _OneByOne(section, [], [], []))
            group.indices.append(i)
            group.events.append(event)
            group.key_rows.append(key_row)
        for group in groups.values():
            version = self.version(group.section)
            _as_json_values(group.events, version)
            _as_json_values(group.key_rows, version)
        return list(groups.values())


def _decode(
    group: _Group, columns: list[Column], key: list[str], positions: pa.Table, rows: list[int]
) -> Decoded:
    """The group's ``rows`` through the JSON path's checks and conversions."""
    envelope, key_table = group.tables(columns, key, rows)
    taken = positions.take(pa.array([group.indices[r] for r in rows], pa.int64()))
    return decode_envelopes(envelope, key_table, taken, columns, key)


def _isolating(
    group: _Group,
    columns: list[Column],
    key: list[str],
    positions: pa.Table,
    rows: list[int],
    dead: dict[int, str],
) -> list[tuple[Decoded, list[int]]]:
    """The group's ``rows`` decoded together; when that is refused, each half on its own, down to the
    refused record, which goes to ``dead`` with the reason."""
    try:
        return [(_decode(group, columns, key, positions, rows), [group.indices[r] for r in rows])]
    except (Declined, pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as exc:
        if len(rows) == 1:
            dead[group.indices[rows[0]]] = _reason(exc)
            return []
    half = len(rows) // 2
    return [
        *_isolating(group, columns, key, positions, rows[:half], dead),
        *_isolating(group, columns, key, positions, rows[half:], dead),
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
