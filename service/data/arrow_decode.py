"""Debezium JSON → typed Arrow columns inside a Python worker: the fast decoder.

The Spark decoder (:mod:`service.data.spark_decode`) checks every field of every record and names what is
wrong, with a dozen Spark expressions per column that Spark plans and compiles again for every
micro-batch; at the batch sizes of a streaming sink that fixed cost dominates. Most batches have nothing
wrong with them. This decoder parses a whole batch with pyarrow's JSON reader and converts it with
vectorised compute. It accepts a batch only if it can decode every record exactly as the Spark decoder
would; at the first record it is not sure of, it raises :class:`Declined` with the reason and the batch
goes through the Spark decoder instead, which dead-letters what it must. So decoded values and
dead-letter reasons never depend on which decoder ran (``tests/sink/test_arrow_decoder.py`` compares
the two on good and bad records).

Output columns have the Arrow types Spark hands to ``mapInArrow`` for the same table (TIME as int64
micros, UUID as text), so :func:`service.data.files.write_files` takes either decoder's rows.
"""

from __future__ import annotations

import decimal
import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from functools import reduce

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
    IcebergType,
    IntegerType,
    LongType,
    StringType,
    TimestampType,
    TimestamptzType,
    TimeType,
    UUIDType,
)
from pyspark.sql.pandas.types import to_arrow_type

from service.data import temporal
from service.data.envelope import (
    CHANGE_ORDER,
    EXACT,
    KAFKA_POSITION,
    MAX_LONG_DIGITS,
    OFFSET,
    RECORD_POSITION,
    SOURCE_COLUMNS,
    SOURCE_FIELDS,
    STRICT_BASE64,
    TOMBSTONE_EVENT,
    TRUNCATE_OP,
    UUID_PATTERN,
    VALID_OPS,
    as_text_column,
    column_wire_type,
    spark_type,
    strict_base64,
    unscaled_decimal,
    variable_scale_text,
)
from service.data.files import DELETE_OP, OP_COLUMN
from service.model.columns import Column, Encoding, SchemaError, columns_from_envelope_schema, with_encodings

_RANK = "__icesink_rank"

# The (encoding, Iceberg type) pairs this decoder converts; any other column keeps a sink on Spark.
_SUPPORTED: dict[Encoding, tuple[type[IcebergType], ...]] = {
    Encoding.INTEGER: (IntegerType, LongType),
    Encoding.FLOATING: (FloatType, DoubleType),
    Encoding.BOOLEAN: (BooleanType,),
    Encoding.STRING: (StringType,),
    Encoding.BYTES_BASE64: (BinaryType, FixedType),
    Encoding.DECIMAL_BASE64: (DecimalType,),
    Encoding.DECIMAL_TEXT: (DecimalType,),
    Encoding.VARIABLE_SCALE_DECIMAL: (DecimalType, StringType),
    Encoding.DATE_DAYS: (DateType,),
    Encoding.TIME_MILLIS: (TimeType,),
    Encoding.TIME_MICROS: (TimeType,),
    Encoding.TIME_NANOS: (TimeType,),
    Encoding.TIMESTAMP_MILLIS: (TimestampType, TimestamptzType),
    Encoding.TIMESTAMP_MICROS: (TimestampType, TimestamptzType),
    Encoding.TIMESTAMP_NANOS: (TimestampType, TimestamptzType),
    Encoding.TIMESTAMP_ISO: (TimestamptzType,),
    Encoding.UUID_TEXT: (UUIDType, StringType),
    Encoding.DURATION_MICROS: (LongType,),
}


class Declined(ValueError):
    """The batch holds a record this decoder can't vouch for; decode it with Spark instead."""


def unsupported(columns: list[Column]) -> str | None:
    """Why this decoder can't take these columns at all, or None when it can (a list column: when it
    can take its elements)."""
    for c in columns:
        scalar = c.element() if c.is_list else c
        if not isinstance(scalar.type, _SUPPORTED.get(scalar.encoding, ())):
            return f"column {c.name} ({c.type}, encoded as {c.encoding}) has no Arrow decoder"
    return None


def wire_type(column: Column) -> pa.DataType:
    """The Arrow type of the JSON value before conversion: that of Spark's decoder (its wire type)."""
    return to_arrow_type(column_wire_type(column))


def output_type(column: Column) -> pa.DataType:
    """The Arrow type Spark hands to ``mapInArrow`` for the converted column (TIME as int64 micros,
    UUID as text, timestamptz in UTC), so that either decoder's rows go to the same writer."""
    return to_arrow_type(spark_type(column))


def row_type(columns: list[Column]) -> pa.StructType:
    return pa.struct([pa.field(c.name, wire_type(c)) for c in columns])


def envelope_schema(columns: list[Column]) -> pa.Schema:
    """The same fields as the Spark decoder's envelope: a wrong type anywhere in them declines.
    The source position's fields are parsed as their final types (the Spark decoder takes them as
    text and casts): one of another JSON type declines."""
    row = row_type(columns)
    source = pa.struct(
        [(name, to_arrow_type(t)) for name, t in SOURCE_FIELDS.items()]
        + [(name, pa.string()) for name in temporal.SNAPSHOT_SOURCE_FIELDS]
    )
    body = [("before", row), ("after", row), ("op", pa.string()), ("ts_ms", pa.int64()), ("source", source)]
    return pa.schema([("payload", pa.struct(body)), *body])


def key_schema(key_columns: list[Column]) -> pa.Schema:
    row = row_type(key_columns)
    return pa.schema([("payload", row), *[(f.name, f.type) for f in row]])


def _binary(values: Sequence[bytes | None] | pa.Array | pa.ChunkedArray, absent: bytes) -> pa.Array:
    """Kafka keys or values as one binary array, ``absent`` where there is none."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    array = values.cast(pa.binary()) if isinstance(values, pa.Array) else pa.array(values, pa.binary())
    return pc.fill_null(array, pa.scalar(absent, pa.binary())) if array.null_count else array


def _concatenated(texts: pa.Array, separator: bytes = b"") -> bytes:
    """The texts (a binary array without nulls) back to back, each followed by ``separator``."""
    if separator:
        texts = pc.binary_join_element_wise(texts, b"", separator)
    offsets = np.frombuffer(texts.buffers()[1], np.int32)[texts.offset : texts.offset + len(texts) + 1]
    return bytes(texts.buffers()[2].slice(int(offsets[0]), int(offsets[-1] - offsets[0])).to_pybytes())


def _parse(texts: pa.Array, schema: pa.Schema, what: str) -> pa.Table:
    """One JSON object per text (a binary array without nulls), parsed with `schema`; declines anything
    that is not exactly that. The texts are joined in Arrow: no Python object per record."""
    if len(texts) == 0:
        return schema.empty_table()
    # Objects only: pyarrow 22's reader crashes the process on a line holding a bare `null`.
    if not pc.all(pc.and_(pc.starts_with(texts, "{"), pc.ends_with(texts, "}"))).as_py():
        raise Declined(f"a {what} that is not one JSON object")
    joined = _concatenated(texts, b"\n")
    if joined.count(b"\n") != len(texts) or b"\r" in joined:
        raise Declined(f"a {what} spans lines")
    try:  # the reader passes invalid UTF-8 through into its strings
        joined.decode("utf-8")
    except UnicodeDecodeError:
        raise Declined(f"a {what} that is not UTF-8") from None
    try:
        table = pa_json.read_json(
            pa.BufferReader(joined),
            read_options=pa_json.ReadOptions(use_threads=False, block_size=len(joined) + 1),
            parse_options=pa_json.ParseOptions(
                explicit_schema=schema, unexpected_field_behavior="ignore", newlines_in_values=False
            ),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise Declined(f"a {what} the JSON reader does not take: {str(exc)[:200]}") from None
    if table.num_rows != len(texts):
        raise Declined(f"{len(texts)} {what}s parsed into {table.num_rows} rows")
    return table.combine_chunks()


def _column(table: pa.Table, name: str) -> pa.Array:
    return (
        table.column(name).chunk(0)
        if table.column(name).num_chunks
        else pa.array([], table.schema.field(name).type)
    )


def _field(struct: pa.Array, name: str) -> pa.Array:
    """A struct's child, null wherever the struct itself is null."""
    child = pc.struct_field(struct, name)
    return pc.if_else(pc.is_valid(struct), child, pa.scalar(None, child.type))


def _strict_base64(text: str, name: str) -> bytes:
    raw = strict_base64(text)
    if raw is None:
        raise Declined(f"column {name}: a value is not strict base64")
    return raw


def _unscaled(wire: pa.Array, column: Column, limit: int) -> list[int | None]:
    """Kafka Connect Decimal: a big-endian two's complement unscaled integer, as base64 text (JSON)
    or as the bytes themselves (Avro)."""
    out: list[int | None] = []
    for text in wire.to_pylist():
        if text is None:
            out.append(None)
            continue
        raw = text if isinstance(text, bytes) else _strict_base64(text, column.name)
        if not raw:
            raise Declined(f"column {column.name}: an empty decimal")
        unscaled = int.from_bytes(raw, "big", signed=True)
        if not -limit < unscaled < limit:
            raise Declined(f"column {column.name}: a decimal out of range for {column.type}")
        out.append(unscaled)
    return out


# Base64's alphabet as 6-bit values (padding as 0); 255 marks what is not in it.
_SEXTETS = np.full(256, 255, dtype=np.uint8)
_SEXTETS[np.frombuffer(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/", np.uint8)] = (
    np.arange(64, dtype=np.uint8)
)
_SEXTETS[ord("=")] = 0
_STRICT_BASE64_RE2 = f"^{STRICT_BASE64}$"


def _left_aligned(
    values: pa.Array, lengths: np.ndarray, width: int, lookup: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Text or binary values (no nulls, none longer than ``width``) as the rows of a matrix, each
    value's bytes (through ``lookup`` if given) left-aligned with zeros after its end; also the bytes
    themselves and the values' offsets into them."""
    offsets = np.frombuffer(values.buffers()[1], np.int32)[values.offset : values.offset + len(values) + 1]
    data = np.frombuffer(values.buffers()[2], np.uint8)[offsets[0] : offsets[-1]]
    rows = np.repeat(np.arange(len(values)), lengths)
    cols = np.arange(len(data)) - np.repeat(offsets[:-1] - offsets[0], lengths)
    matrix = np.zeros((len(values), width), dtype=np.uint64)
    matrix[rows, cols] = data if lookup is None else lookup[data]
    return matrix, data, offsets


def _base64_bytes(texts: pa.Array, column: Column) -> tuple[np.ndarray, np.ndarray] | None:
    """Base64 texts (no nulls) → their bytes, left-aligned in rows of 9, and each one's length; None
    when one is longer than 12 characters (9 bytes)."""
    if not pc.all(pc.match_substring_regex(texts, _STRICT_BASE64_RE2)).as_py():
        raise Declined(f"column {column.name}: a value is not strict base64")
    lengths = pc.binary_length(texts).to_numpy()
    if (lengths == 0).any():
        raise Declined(f"column {column.name}: an empty decimal")
    if lengths.max() > 12:
        return None
    sextets, chars, offsets = _left_aligned(texts, lengths, 12, _SEXTETS)
    quads = sextets.reshape(len(texts), 3, 4)
    bits = (quads[:, :, 0] << 18) | (quads[:, :, 1] << 12) | (quads[:, :, 2] << 6) | quads[:, :, 3]
    raw = np.stack([(bits >> 16) & 255, (bits >> 8) & 255, bits & 255], axis=2).reshape(len(texts), 9)
    padding = (chars[offsets[1:] - offsets[0] - 1] == ord("=")).astype(np.int64) + (
        chars[offsets[1:] - offsets[0] - 2] == ord("=")
    ).astype(np.int64)
    return raw, lengths // 4 * 3 - padding


def _raw_bytes(values: pa.Array, column: Column) -> tuple[np.ndarray, np.ndarray] | None:
    """Binary values (no nulls) → the same layout as :func:`_base64_bytes`, in rows of 8."""
    values = values.cast(pa.binary())
    lengths = pc.binary_length(values).to_numpy()
    if (lengths == 0).any():
        raise Declined(f"column {column.name}: an empty decimal")
    if lengths.max() > 8:
        return None
    return _left_aligned(values, lengths, 8)[0], lengths


def _unscaled_int64(wire: pa.Array, column: Column, limit: int) -> pa.Array | None:
    """:func:`_unscaled` for values of up to 8 bytes, with numpy instead of a Python loop per value
    (a tenth of a task's CPU at 20,000-event batches); None when a value is longer (an overlong
    encoding), which the loop then takes. The same checks and values (``tests/unit/test_arrow_decimals.py``);
    with several faults in one batch, the reason given may name another one first."""
    present = wire.drop_null()
    if len(present) == 0:
        return pa.nulls(len(wire), pa.int64())
    if pa.types.is_binary(wire.type) or pa.types.is_fixed_size_binary(wire.type):
        laid_out = _raw_bytes(present, column)
    else:
        laid_out = _base64_bytes(present.cast(pa.string()), column)
    if laid_out is None:
        return None
    raw, size = laid_out  # each value's bytes, left-aligned, and how many there are
    if size.max() > 8:
        return None
    # Big-endian bytes → unsigned, then sign-extended from 8 * size bits.
    unsigned = np.zeros(len(present), dtype=np.uint64)
    for j in range(8):
        unsigned = np.where(j < size, (unsigned << np.uint64(8)) | raw[:, j], unsigned)
    shift = (64 - 8 * size).astype(np.uint64)
    values = (unsigned << shift).view(np.int64) >> shift.astype(np.int64)
    if ((values <= -limit) | (values >= limit)).any():
        raise Declined(f"column {column.name}: a decimal out of range for {column.type}")
    if wire.null_count == 0:
        return pa.array(values, pa.int64())
    out = np.zeros(len(wire), dtype=np.int64)
    valid = pc.is_valid(wire).to_numpy(zero_copy_only=False)
    out[valid] = values
    return pa.array(out, pa.int64(), mask=~valid)


def _decimals(wire: pa.Array, column: Column) -> pa.Array:
    t = column.type
    assert isinstance(t, DecimalType)
    target = pa.decimal128(t.precision, t.scale)
    if t.precision > MAX_LONG_DIGITS:
        unscaled = _unscaled(wire, column, 10**t.precision)
        return pa.array([None if u is None else unscaled_decimal(u, t.scale) for u in unscaled], target)
    # Up to 18 digits the unscaled value is an int64: lay it out as Arrow's 128-bit little-endian
    # two's complement (low word, then the sign extension) instead of building Decimal objects.
    fast = _unscaled_int64(wire, column, 10**t.precision)
    low = fast if fast is not None else pa.array(_unscaled(wire, column, 10**t.precision), pa.int64())
    words = np.empty((len(low), 2), dtype=np.int64)
    words[:, 0] = low.fill_null(0).to_numpy()
    words[:, 1] = words[:, 0] >> 63
    values = pa.Array.from_buffers(target, len(low), [None, pa.py_buffer(words.tobytes())])
    return pc.if_else(pc.is_valid(low), values, pa.scalar(None, target)) if low.null_count else values


# Digits with an optional fraction and exponent (money comes as a double's text: 1.234567891E7).
_DECIMAL_TEXT = re.compile(r"-?[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]{1,3})?")


def _decimal_texts(wire: pa.Array, column: Column) -> pa.Array:
    """decimal.handling.mode=string: decimal text, exactly (text that would be rounded declines)."""
    t = column.type
    assert isinstance(t, DecimalType)
    quantum = Decimal(1).scaleb(-t.scale)
    limit = Decimal(10) ** (t.precision - t.scale)
    out: list[Decimal | None] = []
    for text in wire.to_pylist():
        if text is None:
            out.append(None)
            continue
        if len(text) > 80 or not _DECIMAL_TEXT.fullmatch(text):
            raise Declined(f"column {column.name}: a decimal not written as digits")
        value = Decimal(text)
        if value.copy_abs() >= limit:  # abs() would round to the context's 28 digits
            raise Declined(f"column {column.name}: a decimal out of range for {t}")
        try:
            out.append(EXACT.quantize(value, quantum))
        except decimal.DecimalException:
            raise Declined(f"column {column.name}: a decimal that {t} holds only rounded") from None
    return pa.array(out, pa.decimal128(t.precision, t.scale))


def _variable_scale_texts(wire: pa.Array, name: str) -> pa.Array:
    """io.debezium.data.VariableScaleDecimal structs → their exact text."""
    texts: list[str | None] = []
    for value in wire.to_pylist():
        text = None if value is None else variable_scale_text(value["scale"], value["value"])
        if value is not None and text is None:
            raise Declined(f"column {name}: a variable-scale decimal that is not {{scale, base64 value}}")
        texts.append(text)
    return pa.array(texts, pa.string())


def _convert_list(column: Column, wire: pa.Array, julian: np.ndarray) -> pa.Array:
    """A list's elements converted as a scalar column of the element type (each with its event's
    ``julian`` mark), in lists of the same lengths; a null list stays null."""
    element = column.element()
    if element.required and pc.any(pc.is_null(pc.list_flatten(wire))).as_py():
        raise Declined(f"column {column.name}: a null element in a list of required elements")
    lengths = pc.fill_null(pc.list_value_length(wire), 0).to_numpy(zero_copy_only=False)
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]), pa.int32())
    values = convert(element, pc.list_flatten(wire), np.repeat(julian, lengths))
    return pa.ListArray.from_arrays(offsets, values, type=output_type(column), mask=pc.is_null(wire))


def convert(column: Column, wire: pa.Array, julian: np.ndarray) -> pa.Array:
    """The wire values as the column's Arrow type; Declined when any one would not convert exactly.
    ``julian`` marks the events whose timestamps a snapshot read in the Julian calendar."""
    if column.is_list:
        return _convert_list(column, wire, julian)
    enc, name, target = column.encoding, column.name, output_type(column)
    try:
        if enc is Encoding.VARIABLE_SCALE_DECIMAL:
            return convert(as_text_column(column), _variable_scale_texts(wire, name), julian)
        if enc is Encoding.DECIMAL_BASE64:
            return _decimals(wire, column)
        if enc is Encoding.DECIMAL_TEXT:
            return _decimal_texts(wire, column)
        if enc is Encoding.BYTES_BASE64:
            if pa.types.is_binary(wire.type) or pa.types.is_fixed_size_binary(wire.type):  # Avro
                values = wire.cast(pa.binary())
            else:
                values = pa.array(
                    [None if v is None else _strict_base64(v, name) for v in wire.to_pylist()], pa.binary()
                )
            if (
                isinstance(column.type, FixedType)
                and pc.any(pc.not_equal(pc.binary_length(values), len(column.type))).as_py()
            ):
                raise Declined(f"column {name}: a value whose length does not fit {column.type}")
            return values
        if enc in temporal.TEMPORAL:
            return temporal.arrow_convert(column, wire, julian, target)
        if enc is Encoding.UUID_TEXT:
            if pc.any(pc.invert(pc.match_substring_regex(wire, UUID_PATTERN))).as_py():
                raise Declined(f"column {name}: a value that is not a UUID")
            return pc.utf8_lower(wire)
        if isinstance(column.type, FloatType):
            floats = pc.cast(wire, pa.float32(), safe=False)
            if pc.any(pc.and_(pc.is_inf(floats), pc.invert(pc.is_inf(wire)))).as_py():
                raise Declined(f"column {name}: a value out of the float range")
            return floats
        return pc.cast(wire, target)  # int64 → int32 raises on overflow
    except temporal.Misfit as exc:
        raise Declined(str(exc)) from None
    except (pa.ArrowInvalid, OverflowError):
        raise Declined(f"column {name}: a value that does not fit {column.type}") from None


_SPECIAL_FLOAT = re.compile(rb'"(?:NaN|-?Infinity)"')
_SPECIAL_FLOATS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    if len({k for k, _ in pairs}) != len(pairs):
        raise ValueError("duplicate key")
    return dict(pairs)


def special_floats_as_numbers(texts: pa.Array, names: list[str]) -> pa.Array:
    """Debezium writes NaN and ±Infinity of a float or double column as JSON strings (``"NaN"``), which
    Spark's JSON reader takes for a double and pyarrow's does not. The events holding one are written
    again with the bare tokens pyarrow reads (``NaN``, ``Infinity``), in the images' columns ``names``
    only; an event that is not plain JSON (invalid, duplicate keys) is left as it is, to be declined."""
    if not names or not len(texts) or not _SPECIAL_FLOAT.search(_concatenated(texts)):
        return texts
    out = []
    for text in texts.to_pylist():
        try:
            event = json.loads(text, object_pairs_hook=_unique_keys) if _SPECIAL_FLOAT.search(text) else None
        except ValueError:
            event = None
        if not isinstance(event, dict):
            out.append(text)
            continue
        body = event["payload"] if isinstance(event.get("payload"), dict) else event
        for image in (body.get("before"), body.get("after")):
            if isinstance(image, dict):
                for name in names:
                    if isinstance(value := image.get(name), str) and value in _SPECIAL_FLOATS:
                        image[name] = _SPECIAL_FLOATS[value]
        out.append(json.dumps(event, separators=(",", ":")).encode())
    return pa.array(out, pa.binary())


_SCHEMA_PREFIX = re.compile(rb'\{\s*"schema"\s*:')
_PAYLOAD_SEPARATOR = re.compile(rb',\s*"payload"\s*:')


def split_schema_sections(values: list[bytes]) -> tuple[list[bytes], list[str | None]]:
    """Kafka Connect's JSON converter writes ``{"schema":{...},"payload":{...}}``, schema first.
    Returns the values without their schema section and each value's section as normalised JSON text
    (None for a value without one). The cut is at the first ``,"payload":`` (whitespace allowed),
    which can't be inside a JSON string (its quotes would be escaped); if it is a key inside the
    section, what precedes it is not valid JSON on its own, and the batch is declined. A section and a
    remainder that both parse make the whole event valid JSON.
    """
    stripped: list[bytes] = []
    raw_sections: list[bytes | None] = []
    for value in values:
        prefix = _SCHEMA_PREFIX.match(value)
        if prefix is None:
            stripped.append(value)
            raw_sections.append(None)
            continue
        cut = _PAYLOAD_SEPARATOR.search(value, prefix.end())
        if cut is None:
            raise Declined("an event with a schema section but no payload after it")
        raw_sections.append(value[prefix.end() : cut.start()])
        stripped.append(b"{" + value[cut.start() + 1 :])
    texts: dict[bytes, str] = {}
    for section in {s for s in raw_sections if s is not None}:
        try:
            texts[section] = json.dumps(json.loads(section), sort_keys=True, separators=(",", ":"))
        except ValueError:
            raise Declined("a schema section the Arrow decoder can't cut out of its event") from None
    return stripped, [None if s is None else texts[s] for s in raw_sections]


def section_columns(columns: list[Column], section: str) -> list[Column]:
    """``columns`` encoded as the schema section says (one schema version may send a column in
    milliseconds, the next in microseconds). A section that maps to no columns leaves them as they
    are: the caller's check of the sections declines such a batch."""
    try:
        encodings = {c.name: c.encoding for c in columns_from_envelope_schema(json.loads(section))}
    except (SchemaError, AttributeError, TypeError):  # not a Kafka Connect schema (or not an object)
        return columns
    return with_encodings(columns, encodings)


def _decode_by_version(
    values: pa.Array,
    keys: pa.Array,
    kafka: pa.Table,
    versions: list[list[Column]],
    key: list[str],
) -> Decoded:
    """Each record decoded with its own schema version's columns (``versions``, one per record): the
    records of each distinct encoding decoded together, their rows put back in record order."""
    groups: dict[tuple[Encoding, ...], list[int]] = {}
    columns_of: dict[tuple[Encoding, ...], list[Column]] = {}
    for i, columns in enumerate(versions):
        encodings = tuple(c.encoding for c in columns)
        groups.setdefault(encodings, []).append(i)
        columns_of[encodings] = columns
    parts: list[pa.Table] = []
    order: list[int] = []
    by_op: dict[str, int] = {}
    for encodings, indices in groups.items():
        if reason := unsupported(columns_of[encodings]):
            raise Declined(reason)
        taken = pa.array(indices, pa.int64())
        part = decode(values.take(taken), keys.take(taken), kafka.take(taken), columns_of[encodings], key)
        parts.append(part.rows)
        order.extend(indices)
        for op, n in part.by_op.items():
            by_op[op] = by_op.get(op, 0) + n
    rows = pa.concat_tables(parts).take(pc.sort_indices(pa.array(order, pa.int64())))
    return Decoded(rows, by_op)


@dataclass
class Decoded:
    """A batch's changes: the table's columns, :data:`OP_COLUMN`, the source position
    (:data:`SOURCE_COLUMNS`) and the Kafka position (topic, partition, offset), in record order;
    and the distinct schema sections of the events (normalised JSON), when asked for."""

    rows: pa.Table
    by_op: dict[str, int] = field(default_factory=dict)
    schemas: list[str] = field(default_factory=list)

    @property
    def records(self) -> int:
        return self.rows.num_rows


def decode(
    values: Sequence[bytes | None] | pa.Array | pa.ChunkedArray,
    keys: Sequence[bytes | None] | pa.Array | pa.ChunkedArray,
    kafka: pa.Table,
    columns: list[Column],
    key: list[str],
    schema_sections: bool = False,
) -> Decoded:
    """Decode Kafka values with their keys and Kafka positions (``kafka``: topic, partition, offset).

    A null value (a tombstone) is a delete of the key in its Kafka key, decoded like the Spark
    decoder does (a ``d`` event with neither before image nor source position); a caller that
    ignores tombstones (append mode) leaves them out. With ``schema_sections``, the events' schema
    sections are cut out before parsing and returned, and each event is decoded with the encodings
    of its own section: the caller must check that each section is a schema the table takes as it is
    (no evolution pending) before using the result.
    """
    schemas: list[str] = []
    texts = _binary(values, TOMBSTONE_EVENT.encode())
    key_texts = _binary(keys, b"{}")
    if schema_sections:
        cut, sections = split_schema_sections(texts.to_pylist())
        texts = pa.array(cut, pa.binary())
        schemas = sorted({s for s in sections if s is not None})
        by_section = {s: section_columns(columns, s) for s in schemas}
        if any(v != columns for v in by_section.values()):
            versions = [columns if s is None else by_section[s] for s in sections]
            decoded = _decode_by_version(texts, key_texts, kafka, versions, key)
            decoded.schemas = schemas
            return decoded
    texts = special_floats_as_numbers(texts, [c.name for c in columns if c.encoding is Encoding.FLOATING])
    envelope = _parse(texts, envelope_schema(columns), "record value")
    by_name = {c.name: c for c in columns}
    key_table = _parse(key_texts, key_schema([by_name[k] for k in key]), "record key")
    return decode_envelopes(envelope, key_table, kafka.select(RECORD_POSITION), columns, key, schemas)


def _unwrapped(table: pa.Table) -> Callable[[str], pa.Array]:
    """A field of a table of envelopes (or keys), wherever it is: inside ``payload`` (the JSON
    converter with schemas) or at the top (without; Avro)."""
    if "payload" not in table.column_names:
        return lambda name: _column(table, name)
    payload = _column(table, "payload")
    has_payload = pc.is_valid(payload)
    return lambda name: pc.if_else(has_payload, _field(payload, name), _column(table, name))


def decode_envelopes(
    envelope: pa.Table,
    key_table: pa.Table,
    positions: pa.Table,
    columns: list[Column],
    key: list[str],
    schemas: list[str] | None = None,
) -> Decoded:
    """Parsed events → changes. ``envelope`` has the fields of :func:`envelope_schema` (``payload``
    optional), ``key_table`` those of :func:`key_schema`, one row per record; ``positions`` their
    Kafka positions. Values are in the JSON converter's wire types (a date as days, bytes as
    base64), whichever format they came in, except that bytes and decimals may also come as bytes
    (Avro's batch decoder, :mod:`service.data.avro_batch`). Declined at the first value or event
    that is not right."""
    body = _unwrapped(envelope)

    op, after, before, source = body("op"), body("after"), body("before"), body("source")
    if op.null_count:
        raise Declined("an event without an op")
    if pc.any(pc.equal(op, TRUNCATE_OP)).as_py():
        raise Declined("a truncate event, which is a dead letter")
    if pc.any(pc.invert(pc.is_in(op, pa.array(VALID_OPS)))).as_py():
        raise Declined("an event with an unknown op")
    is_delete = pc.equal(op, DELETE_OP)
    if pc.any(pc.and_(pc.invert(is_delete), pc.is_null(after))).as_py():
        raise Declined("a create/update event without an 'after' image")

    julian = temporal.arrow_julian_snapshot(source)  # see spark_decode._julian_mark
    julian_lists = temporal.arrow_julian_snapshot(source, streamed_too=True)
    no_julian = np.zeros(len(julian), dtype=bool)
    key_field = _unwrapped(key_table)
    out: dict[str, pa.Array] = {}
    for c in columns:
        wire = pc.if_else(is_delete, _field(before, c.name), _field(after, c.name))
        if c.name in key:
            from_key = key_field(c.name)
            wire = pc.coalesce(from_key, wire)
            if wire.null_count:
                raise Declined(f"key column {c.name} is missing")
        elif c.required and pc.any(pc.and_(pc.invert(is_delete), pc.is_null(wire))).as_py():
            raise Declined(f"required column {c.name} is null")
        mark = julian_lists if temporal.julian_list(c) else no_julian if c.is_list else julian
        out[c.name] = convert(c, wire, mark)
    out[OP_COLUMN] = op
    for name, column in zip(SOURCE_FIELDS, SOURCE_COLUMNS, strict=True):
        out[column] = _field(source, name)
    counts = pc.value_counts(op).to_pylist()
    rows = _with_positions(out, positions)
    return Decoded(rows, {str(c["values"]): int(c["counts"]) for c in counts}, schemas or [])


def _with_positions(columns: dict[str, pa.Array], positions: pa.Table) -> pa.Table:
    """The decoded columns with the records' positions (``positions``: :data:`RECORD_POSITION`), under
    the names of :data:`KAFKA_POSITION`, apart from any table column called ``topic`` or ``offset``."""
    return pa.table(
        {
            **columns,
            **{
                name: positions[field].combine_chunks()
                for field, name in zip(RECORD_POSITION, KAFKA_POSITION, strict=True)
            },
        }
    )


def _with_carried_sources(rows: pa.Table, key: list[str]) -> tuple[pa.Table, dict[str, pa.Array]]:
    """The source position of each row, or for a row without one that of the closest earlier row of
    its key in its partition, with the rows in the order these positions are given in."""
    sources = {c: rows[c].combine_chunks() for c in SOURCE_COLUMNS}
    has = reduce(pc.or_, [pc.is_valid(a) for a in sources.values()]).to_numpy(zero_copy_only=False)
    if has.all() or not has.any():
        return rows, sources  # nothing to carry
    order = pc.sort_indices(rows, [(k, "ascending") for k in [*key, *KAFKA_POSITION]])
    rows, has = rows.take(order), has[order.to_numpy()]
    n = rows.num_rows
    starts = np.zeros(n, dtype=bool)  # where a (key, topic, partition) lane begins
    starts[0] = True
    for name in [*key, *KAFKA_POSITION[:2]]:
        column = rows[name].combine_chunks()
        starts[1:] |= pc.not_equal(column.slice(1), column.slice(0, n - 1)).to_numpy(zero_copy_only=False)
    lane = np.cumsum(starts)
    last = np.maximum.accumulate(np.where(has, np.arange(n), -1))  # closest row with a position so far
    source_row = np.maximum(last, 0)
    missing = pa.array((last < 0) | (lane[source_row] != lane))
    taken = pa.array(source_row)
    carried = {
        c: pc.if_else(missing, pa.scalar(None, a.type), a.take(taken))
        for c, a in ((c, rows[c].combine_chunks()) for c in SOURCE_COLUMNS)
    }
    return rows, carried


def latest_per_key(rows: pa.Table, key: list[str]) -> pa.Table:
    """The last change of every key, in the order of :func:`service.data.spark_decode.latest_per_key`:
    source position (a row without one takes that of the closest earlier change of its key in its
    partition), then offset; topic and partition only make ties across partitions deterministic."""
    if rows.num_rows == 0:
        return rows
    rows, sources = _with_carried_sources(rows, key)
    order = pa.table({name: sources.get(name, rows[name]) for name in CHANGE_ORDER})
    ranked = pc.sort_indices(order, [(name, "ascending") for name in CHANGE_ORDER], null_placement="at_start")
    rows = rows.take(ranked).append_column(_RANK, pa.array(range(rows.num_rows), pa.int64()))
    last = rows.group_by(key, use_threads=False).aggregate([(_RANK, "max")])
    positions = last[f"{_RANK}_max"]
    return rows.take(pc.take(positions, pc.sort_indices(positions))).drop_columns([_RANK])


_ROW = "__icesink_row"


class LatestPerKey:
    """:func:`latest_per_key` over a task's rows given chunk by chunk, in offset order per partition,
    holding two rows per key at most rather than every change.

    Per key it keeps the last change so far and, if another, the last row (by offset) of each of the
    key's partitions that has a source position: a later row without one (a tombstone) takes its
    position from that row, exactly as if the whole batch had been compacted at once.
    """

    def __init__(self, key: list[str]) -> None:
        self.key = key
        self.rows: pa.Table | None = None

    @property
    def nbytes(self) -> int:
        return 0 if self.rows is None else self.rows.nbytes

    def add(self, rows: pa.Table) -> None:
        if rows.num_rows == 0:
            return
        merged = rows if self.rows is None else pa.concat_tables([self.rows, rows])
        merged = merged.append_column(_ROW, pa.array(np.arange(merged.num_rows), pa.int64()))
        keep = np.union1d(latest_per_key(merged, self.key)[_ROW].to_numpy(), self._last_with_source(merged))
        self.rows = merged.take(pa.array(keep)).drop_columns([_ROW]).combine_chunks()

    def _last_with_source(self, rows: pa.Table) -> np.ndarray:
        """Row numbers of each (key, topic, partition)'s last row with a source position."""
        has = reduce(pc.or_, [pc.is_valid(rows[c]) for c in SOURCE_COLUMNS])
        lanes = [*self.key, *KAFKA_POSITION[:2]]
        with_source = rows.select([*lanes, OFFSET, _ROW]).filter(has)
        if with_source.num_rows == 0:
            return np.empty(0, dtype=np.int64)
        last = with_source.group_by(lanes, use_threads=False).aggregate([(OFFSET, "max")])
        joined = with_source.join(last, lanes, join_type="inner").filter(
            pc.equal(pc.field(OFFSET), pc.field(f"{OFFSET}_max"))
        )
        return np.asarray(joined[_ROW].to_numpy(), dtype=np.int64)

    def result(self) -> pa.Table:
        """The last change of every key (what :func:`latest_per_key` gives for all the rows added)."""
        if self.rows is None:
            raise ValueError("no rows were added")
        return latest_per_key(self.rows, self.key)
