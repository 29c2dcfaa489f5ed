"""Avro records of one writer schema decoded together into Arrow, by the native decoder.

Reading Avro a record at a time in Python (fastavro, :class:`service.data.avro_schema.AvroSchema`)
costs more than everything else a task does with the record; ``icesink_avrodec`` (``service/native/``,
a small binding over Arrow's Rust ``arrow-avro``, built by ``scripts/bootstrap`` and the image) reads
a task's records of one schema id as one batch, and finds the bad ones itself: a payload that does not
match its schema, with bytes left over, truncated. It reads with the writer schema stripped of its
logical types (:func:`service.data.avro_schema.decoding_schema`), so values come as Avro's primitives,
as they do from fastavro.

:func:`envelopes` lays such a batch out as the JSON path's parsed envelopes (the fields of
:func:`service.data.arrow_decode.envelope_schema`), in the same wire types except bytes and decimals,
which stay bytes (:func:`service.data.arrow_decode.convert` takes both). Whatever it can't lay out
(a type the table's column does not expect, a map) raises :class:`NotBatchable`, and those records go
the record-at-a-time way, which gives them their dead-letter reasons.
"""

from __future__ import annotations

import logging
from base64 import b64encode
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from service.data.arrow_decode import envelope_schema, row_type, wire_type
from service.model.columns import Column, Encoding

try:
    import icesink_avrodec as _native
except ImportError:  # not built (no Rust toolchain): every record is read with fastavro
    _native = None

logger = logging.getLogger(__name__)

# Encodings whose values stay bytes (the JSON converter's base64 is only its way of writing them).
_BYTES = frozenset({Encoding.BYTES_BASE64, Encoding.DECIMAL_BASE64})


class NotBatchable(ValueError):
    """A batch the native decoder's output can't be laid out for; read its records one at a time."""


def available() -> bool:
    return _native is not None


def schema_ids(values: Sequence[bytes | None]) -> np.ndarray:
    """Each value's schema id; -1 for a null value or one without the Confluent header, -2 for one
    that ends with its own header (which the native decoder can't tell from a record's end)."""
    assert _native is not None
    return np.asarray(_native.schema_ids(list(values)), dtype=np.int64)


def decode(
    schema_id: int, schema: str, values: list[bytes]
) -> tuple[pa.StructArray | None, list[int], list[tuple[int, str]]]:
    """Framed records of ``schema_id`` (writer schema ``schema``, without logical types) → the good
    ones as one struct array (None when none is), their indices, and the bad ones' (index, reason).
    NotBatchable when the decoder can't take the schema."""
    assert _native is not None
    try:
        batch, good, bad = _native.decode(schema_id, schema, values)
    except ValueError as exc:
        raise NotBatchable(f"schema id {schema_id}: {exc}") from None
    return (None if batch is None else pa.array(batch)), good, bad


def ops(batch: pa.StructArray) -> pa.Array:
    """A decoded batch's ``op`` field as text; NotBatchable when it has none."""
    if batch.type.get_field_index("op") < 0:
        raise NotBatchable("an envelope without op")
    return _cast(batch.field("op"), pa.string(), "op")


def _child(struct: pa.StructArray, name: str, fallback: pa.DataType) -> pa.Array:
    index = struct.type.get_field_index(name)
    return struct.field(index) if index >= 0 else pa.nulls(len(struct), fallback)


def _cast(values: pa.Array, target: pa.DataType, what: str) -> pa.Array:
    if pa.types.is_dictionary(values.type):  # an Avro enum
        values = values.dictionary_decode()
    try:
        return pc.cast(values, target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        raise NotBatchable(f"{what}: {values.type} is not {target}: {exc}") from None


def _as_wire(values: pa.Array, column: Column) -> pa.Array:
    """One column's values as the JSON path's wire type (bytes and decimals as bytes)."""
    if column.is_list:
        if not pa.types.is_list(values.type):
            raise NotBatchable(f"column {column.name}: {values.type} is not a list")
        # The elements the offsets span (flatten() would leave out those behind a null list).
        start, end = values.offsets[0].as_py(), values.offsets[-1].as_py()
        items = _as_wire(values.values.slice(start, end - start), column.element())
        offsets = pc.subtract(values.offsets, start)
        return pa.ListArray.from_arrays(offsets, items, mask=values.is_null())
    if column.encoding in _BYTES:
        return _cast(values, pa.binary(), f"column {column.name}")
    if column.encoding is Encoding.VARIABLE_SCALE_DECIMAL:
        # {scale, value}: the value as the JSON converter's base64 text (a rare type; a loop is fine)
        if not pa.types.is_struct(values.type):
            raise NotBatchable(f"column {column.name}: {values.type} is not a struct")
        raw = _child(values, "value", pa.binary()).to_pylist()
        text = pa.array([None if v is None else b64encode(v).decode("ascii") for v in raw], pa.string())
        scale = _child(values, "scale", pa.int32())
        rebuilt = pa.StructArray.from_arrays([scale, text], ["scale", "value"], mask=values.is_null())
        return _cast(rebuilt, wire_type(column), f"column {column.name}")
    return _cast(values, wire_type(column), f"column {column.name}")


def _image(struct: pa.Array, columns: list[Column]) -> pa.StructArray:
    """A row image (``before`` or ``after``) with the table's columns; a column it lacks is null."""
    if not pa.types.is_struct(struct.type):
        raise NotBatchable(f"a row image of type {struct.type}")
    assert isinstance(struct, pa.StructArray)
    children = [_as_wire(_child(struct, c.name, wire_type(c)), c) for c in columns]
    return pa.StructArray.from_arrays(children, [c.name for c in columns], mask=struct.is_null())


def envelopes(batch: pa.StructArray, columns: list[Column]) -> pa.Table:
    """A decoded batch of Debezium envelopes → the fields of ``envelope_schema(columns)`` without
    ``payload``, row for row."""
    body = envelope_schema(columns)
    source_type = body.field("source").type
    op = ops(batch)
    source = _child(batch, "source", source_type)  # a producer other than Debezium may have none
    if not pa.types.is_struct(source.type):
        raise NotBatchable(f"a source of type {source.type}")
    assert isinstance(source, pa.StructArray)
    source_fields = [_cast(_child(source, f.name, f.type), f.type, f"source.{f.name}") for f in source_type]
    empty = row_type(columns)
    return pa.table(
        {
            "before": _image(_child(batch, "before", empty), columns),
            "after": _image(_child(batch, "after", empty), columns),
            "op": op,
            "ts_ms": _cast(_child(batch, "ts_ms", pa.int64()), pa.int64(), "ts_ms"),
            "source": pa.StructArray.from_arrays(
                source_fields, [f.name for f in source_type], mask=source.is_null()
            ),
        }
    )


def key_columns(batch: pa.StructArray, columns: list[Column]) -> pa.Table:
    """A decoded batch of record keys → the key ``columns`` (in the types :func:`envelopes` gives)."""
    return pa.table({c.name: _as_wire(_child(batch, c.name, wire_type(c)), c) for c in columns})


def key_rows(rows: list[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    """Keys read one at a time (``{}`` where none was read) in the columns of ``schema``; a row
    whose key does not fit them is left null."""
    fitting = []
    for row in rows:
        try:
            pa.array([row], pa.struct(list(schema)))
            fitting.append(row)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
            fitting.append({})
    return pa.Table.from_struct_array(pa.array(fitting, pa.struct(list(schema))))


def scatter(pieces: list[tuple[list[int], pa.Table]], length: int, schema: pa.Schema) -> pa.Table:
    """``length`` rows of ``schema``: each piece's table at its row numbers, null elsewhere."""
    placed = [r for rows, _ in pieces for r in rows]
    missing = np.setdiff1d(np.arange(length), np.asarray(placed, dtype=np.int64))
    tables = [table.select(schema.names).cast(schema) for _, table in pieces]
    tables.append(pa.table({f.name: pa.nulls(len(missing), f.type) for f in schema}, schema=schema))
    order = np.argsort(np.concatenate([np.asarray(placed, dtype=np.int64), missing]), kind="stable")
    return pa.concat_tables(tables).take(pa.array(order))
