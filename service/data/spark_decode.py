"""Debezium JSON envelopes → typed change rows, as Spark expressions (parsing runs in the JVM).

Each Kafka record becomes one row: its source position, the op, the table's columns converted to
their Iceberg types, and ``__icesink_error``: null when the record is good, otherwise the reason it
goes to the dead-letter topic. Nothing is dropped silently: a value that does not fit its column
(malformed JSON, a number out of range, an undecodable decimal) is an error, never a null.

Envelopes with a ``schema`` section (``{"schema": ..., "payload": {...}}``) and without one
(``{"before": ..., "after": ..., "op": ...}``) are both accepted; the Kafka key may be
``{"payload": {"id": 1}}`` or ``{"id": 1}``. Truncate events (``op: t``) are dead letters: see
:data:`TRUNCATE_REASON`.

A tombstone (a key and a null value, what a compacted topic keeps of a deleted row) is, when asked
for (upsert mode), a delete of the key in the Kafka record key: it decodes exactly like a ``d`` event
with no before image and no source position.

Each row also carries the event's source position (:data:`SOURCE_COLUMNS`, from the envelope's
``source`` section), which orders a key's changes across partitions (:func:`latest_per_key`).

What both decoders share (those columns, the ops, the wire and converted types, strict base64, UUID
text, the decimal helpers) is in :mod:`service.data.envelope`.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from decimal import Decimal
from functools import lru_cache, reduce
from typing import Any

import pandas as pd
from pyiceberg.types import (
    DecimalType,
    FixedType,
    FloatType,
)
from pyspark.sql import Column as SparkColumn
from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from service.data import temporal
from service.data.envelope import (
    CHANGE_ORDER,
    ERROR_COLUMN,
    KAFKA_POSITION,
    MAX_DECIMAL_DIGITS,
    MAX_LONG_DIGITS,
    OFFSET,
    PARTITION,
    RECORD_POSITION,
    SOURCE_COLUMNS,
    SOURCE_FIELDS,
    STRICT_BASE64,
    TOMBSTONE_EVENT,
    TOPIC,
    TRUNCATE_OP,
    TRUNCATE_REASON,
    UUID_PATTERN,
    VALID_OPS,
    as_text_column,
    column_wire_type,
    record_field,
    spark_type,
    unscaled_decimal,
    variable_scale_text,
)
from service.data.files import DELETE_OP, OP_COLUMN
from service.model.columns import Column, Encoding

CORRUPT_COLUMN = "__icesink_corrupt"
# A Kafka record's fields, under their names in decoded rows (see envelope.record_field).
RECORD_FIELDS = [*RECORD_POSITION, "timestamp", "key", "value"]
_RECORD = [record_field(name) for name in RECORD_FIELDS]
_KEY, _VALUE_BYTES = record_field("key"), record_field("value")
_ORDER = "__icesink_order"
_JULIAN = "__icesink_julian"  # the event's timestamps were read in the Julian calendar (a snapshot)
_JULIAN_LISTS = "__icesink_julian_lists"  # its timestamp[] elements were (see temporal.julian_list)
_SOURCE = "__icesink_source"  # the envelope's source section, as JSON text
_WIRE = "__icesink_wire_"  # + the column's index: its value as the event holds it
_TEXT = "__icesink_text_"  # + index: a VariableScaleDecimal's text
_VALUE = "__icesink_value_"  # + index: the value converted to the column's type


def _unscaled_to_decimal(values: pd.Series, scale: int) -> pd.Series:
    """Kafka Connect Decimal: base64 of a big-endian two's complement unscaled integer.

    A value wider than 38 digits is null (so a dead letter): Arrow can't hold it, and handing it to
    the UDF's Arrow conversion would fail the whole batch, again at every retry.
    """

    def convert(text: object) -> Decimal | None:
        if text is None or (isinstance(text, float) and pd.isna(text)):
            return None
        try:
            raw = base64.b64decode(str(text), validate=True)
        except ValueError:
            return None
        if not raw:
            return None
        return unscaled_decimal(int.from_bytes(raw, "big", signed=True), scale)

    return values.map(convert)


_BASE64_RE = rf"^{STRICT_BASE64}\z"  # \z: no final newline


def _connect_decimal(wire: SparkColumn, scale: int) -> SparkColumn:
    """Kafka Connect Decimal → decimal as JVM expressions, for precisions of at most 18 digits.

    The same values as :func:`_unscaled_to_decimal` (strict base64, big-endian two's complement), with
    no Python worker: the bytes are read as an unsigned integer (``conv`` of their hex, at most 8 bytes)
    and the sign applied with a power of two. A longer encoding is accepted only when its extra leading
    bytes are sign extension (0x00 / 0xFF); anything else is at least 2**63 and can't fit 18 digits.
    Null (so a dead letter) when the text is not strict base64 or the value does not fit.
    """
    valid = wire.rlike(_BASE64_RE) & (F.length(wire) > 0)
    raw = F.when(valid, F.unbase64(wire))  # null for anything but strict, non-empty base64
    hexed = F.hex(raw)
    n = F.length(raw)
    last8 = F.when(n <= 8, hexed).otherwise(F.substring(hexed, -16, 16))
    prefix = F.substr(hexed, F.lit(1), (n - 8) * 2)  # the bytes before the last 8, if any
    negative = F.substring(last8, 1, 1).isin("8", "9", "A", "B", "C", "D", "E", "F")
    extension_ok = (n <= 8) | F.when(negative, prefix.rlike("^(FF)+$")).otherwise(prefix.rlike("^(00)+$"))
    unsigned = F.conv(last8, 16, 10).cast(T.DecimalType(20, 0))
    powers = F.array(*[F.lit(Decimal(2 ** (8 * i))).cast(T.DecimalType(20, 0)) for i in range(1, 9)])
    signed = F.when(negative, unsigned - F.try_element_at(powers, F.least(n, F.lit(8)))).otherwise(unsigned)
    # decimal(19,0) x decimal(max(s,1), s) has at most 38 digits: the product is exact (no rounding)
    unit = F.lit(Decimal(1).scaleb(-scale)).cast(T.DecimalType(max(scale, 1), scale))
    value = F.try_multiply(signed.try_cast(T.DecimalType(19, 0)), unit)
    return F.when(extension_ok, value)


def _decimal_udf(scale: int) -> F.UserDefinedFunction:
    @F.pandas_udf(T.DecimalType(MAX_DECIMAL_DIGITS, scale))  # type: ignore[call-overload]
    def decode(values: pd.Series) -> pd.Series:
        return _unscaled_to_decimal(values, scale)

    return decode


def _pandas_variable_scale_text(scale: Any, value: Any) -> str | None:
    """:func:`variable_scale_text` of a struct as pandas hands it over: its int scale as a float (NaN
    for null) wherever some scale in the batch is null or the struct is inside a list."""
    return None if scale is None or pd.isna(scale) else variable_scale_text(int(scale), value)


@F.pandas_udf(T.StringType())  # type: ignore[call-overload]
def _variable_scale_texts(values: pd.DataFrame) -> pd.Series:
    """The text of each VariableScaleDecimal struct (see :func:`variable_scale_text`)."""
    return pd.Series(
        [_pandas_variable_scale_text(s, v) for s, v in zip(values["scale"], values["value"], strict=True)],
        dtype=object,
    )


@F.pandas_udf(T.ArrayType(T.StringType()))  # type: ignore[call-overload]
def _variable_scale_text_lists(lists: pd.Series) -> pd.Series:
    """:func:`_variable_scale_texts` of each element of a list column (a Python UDF can't run inside
    ``transform``'s lambda)."""

    def texts(values: Any) -> list[str | None] | None:
        if values is None:
            return None
        return [None if v is None else _pandas_variable_scale_text(v["scale"], v["value"]) for v in values]

    return lists.map(texts)


# Text that Spark's cast to decimal reads as a number (surrounding spaces, a sign and an exponent
# allowed): if the cast still gives null, the number is too wide for the column.
_NUMBER_TEXT_RE = r"^\s*[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?\s*$"
_NUMBER_PARTS_RE = r"^\s*[+-]?([0-9]*)\.?([0-9]*)(?:[eE]([+-]?[0-9]+))?\s*$"


def _fits_scale(wire: SparkColumn, scale: int) -> SparkColumn:
    """Whether a number's text has no non-zero digit beyond ``scale`` digits after the point (so
    casting it to a decimal of that scale does not round it): the digits after the point less the
    exponent, less the trailing zeros. False for text that is not a number (see _NUMBER_TEXT_RE)."""
    whole, fraction, exponent = (F.regexp_extract(wire, _NUMBER_PARTS_RE, i) for i in (1, 2, 3))
    digits = F.concat(whole, fraction)
    significant = F.regexp_replace(digits, "0+$", "")
    power = F.when(exponent == "", F.lit(0)).otherwise(exponent.try_cast(T.IntegerType()))
    needed = F.length(fraction) - power - (F.length(digits) - F.length(significant))
    exact = (F.length(significant) == 0) | F.coalesce(needed <= scale, F.lit(False))
    return wire.rlike(_NUMBER_TEXT_RE) & exact


def _float_overflows(wire: SparkColumn) -> SparkColumn:
    """A finite double that is infinite as a float: Spark's cast makes it ±Infinity without a word."""
    infinity = F.lit(float("inf"))
    return (F.abs(wire.cast(T.FloatType())) == infinity) & (F.abs(wire) != infinity)


def _decimal_list_udf(scale: int) -> F.UserDefinedFunction:
    """:func:`_decimal_udf` for a list column: a Python UDF can't run inside ``transform``'s lambda."""

    @F.pandas_udf(T.ArrayType(T.DecimalType(MAX_DECIMAL_DIGITS, scale)))  # type: ignore[call-overload]
    def decode(lists: pd.Series) -> pd.Series:
        return lists.map(
            lambda values: (
                None if values is None else list(_unscaled_to_decimal(pd.Series(values, dtype=object), scale))
            )
        )

    return decode


def _convert_list(column: Column, wire: SparkColumn, julian: SparkColumn | None) -> SparkColumn:
    """A list's elements, each converted as a scalar column of the element type; a null list stays null."""
    element = column.element()
    t = element.type
    if (
        element.encoding is Encoding.DECIMAL_BASE64
        and isinstance(t, DecimalType)
        and t.precision > MAX_LONG_DIGITS
    ):
        return _decimal_list_udf(t.scale)(wire).try_cast(spark_type(column))
    return F.transform(wire, lambda value: convert(element, value, julian))


def convert(column: Column, wire: SparkColumn, julian: SparkColumn | None = None) -> SparkColumn:
    """Expression turning the wire value into the column's type; null when it does not fit (for a
    list: an element that does not fit is null, see :func:`_element_errors`). ``julian``: the event
    is a snapshot whose timestamps were read in the Julian calendar
    (:func:`service.data.temporal.spark_julian_snapshot`)."""
    if column.is_list:
        return _convert_list(column, wire, julian)
    target = spark_type(column)
    enc = column.encoding
    t = column.type
    if enc is Encoding.DECIMAL_TEXT and isinstance(t, DecimalType):
        return F.when(_fits_scale(wire, t.scale), wire.try_cast(target))  # never rounded
    if enc is Encoding.FLOATING and isinstance(t, FloatType):
        return F.when(~_float_overflows(wire), wire.try_cast(target))
    if enc is Encoding.DECIMAL_BASE64 and isinstance(t, DecimalType):
        if t.precision <= MAX_LONG_DIGITS:
            return _connect_decimal(wire, t.scale).try_cast(target)
        return _decimal_udf(t.scale)(wire).try_cast(target)
    if enc is Encoding.BYTES_BASE64:
        raw = F.call_function("try_to_binary", wire, F.lit("base64"))
        if isinstance(t, FixedType):  # bytes of another length do not fit: a dead letter
            return F.when(F.length(raw) == len(t), raw)
        return raw
    if enc in temporal.TEMPORAL:
        return temporal.spark_convert(column, wire, F.lit(False) if julian is None else julian)
    if enc is Encoding.UUID_TEXT:
        return F.when(wire.rlike(UUID_PATTERN), F.lower(wire))
    return wire.try_cast(target)


def _misfit(column: Column, wire: SparkColumn) -> SparkColumn:
    """The dead-letter reason for a present value that did not convert: "out of range" when it is a
    well-formed number (an integer or decimal too wide for the column), "would be rounded" for decimal
    text with more digits after the point than the column's scale, else "does not fit"."""
    name, value, type_text = F.lit(column.name), wire.cast("string"), F.lit(str(column.type))
    does_not_fit = F.format_string("column %s: value %s does not fit type %s", name, value, type_text)
    if column.is_list:  # its elements are checked one by one (see _element_errors)
        return does_not_fit
    if column.encoding in temporal.TEMPORAL:
        return temporal.spark_reason(column, wire)
    out_of_range = F.format_string("column %s: value %s is out of range for %s", name, value, type_text)
    t = column.type
    if column.encoding is Encoding.DECIMAL_TEXT and isinstance(t, DecimalType):
        rounded = F.format_string(
            "column %s: value %s has more digits after the point than %s holds (it would be rounded)",
            name,
            value,
            type_text,
        )
        return (
            F.when(~wire.rlike(_NUMBER_TEXT_RE), does_not_fit)
            .when(~_fits_scale(wire, t.scale), rounded)
            .otherwise(out_of_range)
        )
    well_formed = {
        Encoding.INTEGER: F.lit(True),  # parsed as a long already: only the range can fail
        Encoding.DECIMAL_BASE64: wire.rlike(_BASE64_RE) & (F.length(wire) > 0),
        Encoding.DECIMAL_TEXT: wire.rlike(_NUMBER_TEXT_RE),
    }.get(column.encoding)
    return does_not_fit if well_formed is None else F.when(well_formed, out_of_range).otherwise(does_not_fit)


def _julian_mark(column: Column) -> SparkColumn:
    """Which events' values of the column to put back from the Julian calendar (see
    :mod:`service.data.temporal`): a snapshot's scalars; every event's timestamp[] elements, no other
    list's."""
    if temporal.julian_list(column):
        return F.col(_JULIAN_LISTS)
    return F.lit(False) if column.is_list else F.col(_JULIAN)


def _element_errors(column: Column, wire: SparkColumn, converted: SparkColumn) -> list[SparkColumn]:
    """A list's dead-letter reasons: the first element that did not convert, a null element where
    the elements are required."""
    element = column.element()
    misfits = F.filter(
        F.zip_with(wire, converted, lambda value, result: F.when(value.isNotNull() & result.isNull(), value)),
        lambda value: value.isNotNull(),
    )
    errors = [F.when(F.size(misfits) > 0, _misfit(element, F.get(misfits, 0)))]
    if element.required:
        errors.append(
            F.when(
                F.exists(wire, lambda value: value.isNull()),
                F.lit(f"column {column.name}: a null element in a list of required elements"),
            )
        )
    return errors


def _row_struct(columns: list[Column]) -> T.StructType:
    return T.StructType([T.StructField(c.name, column_wire_type(c)) for c in columns])


def envelope_schema(columns: list[Column]) -> T.StructType:
    row = _row_struct(columns)
    body = [
        T.StructField("before", row),
        T.StructField("after", row),
        T.StructField("op", T.StringType()),
        T.StructField("ts_ms", T.LongType()),
        # As raw JSON text, parsed on its own (see source_schema): a `source` of an unexpected shape
        # leaves the change without a position instead of making the whole event malformed.
        T.StructField("source", T.StringType()),
    ]
    return T.StructType(
        [T.StructField("payload", T.StructType(body)), *body, T.StructField(CORRUPT_COLUMN, T.StringType())]
    )


def source_schema() -> T.StructType:
    """The source position's fields, as text: a field of another JSON type is then a null position."""
    return T.StructType([T.StructField(name, T.StringType()) for name in SOURCE_FIELDS])


def key_schema(key_columns: list[Column]) -> T.StructType:
    row = _row_struct(key_columns)
    return T.StructType(
        [T.StructField("payload", row), *row.fields, T.StructField(CORRUPT_COLUMN, T.StringType())]
    )


_JSON_OPTIONS = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT_COLUMN}


def schema_text(value: SparkColumn) -> SparkColumn:
    """The event's ``schema`` section as normalised JSON text (one distinct value per schema version)."""
    return F.get_json_object(value.cast("string"), "$.schema")


def decode(
    records: DataFrame,
    columns: list[Column],
    key: list[str],
    max_record_bytes: int,
    rejected_schemas: dict[str, str] | None = None,
    tombstones: bool = False,
    versions: dict[str, list[Column]] | None = None,
) -> DataFrame:
    """Kafka rows (key, value, topic, partition, offset, timestamp) → change rows with an error column.

    With ``tombstones`` a record with a null value is a delete of the key in its Kafka key; without,
    it is removed. The result keeps the record's fields (``key`` and ``value`` for the dead-letter
    topic, its Kafka position) under :func:`~service.data.envelope.record_field`'s names, beside the
    table's columns, and the source position in :data:`SOURCE_COLUMNS`. ``rejected_schemas`` maps schema texts (see
    :func:`schema_text`) to the reason their events are dead-lettered (an incompatible schema change
    under ``on_incompatible_schema: dead_letter``). ``versions`` maps schema texts to the columns their
    events are decoded with, for the schema versions that encode a column unlike ``columns``
    (milliseconds, then microseconds); each such version's events are decoded apart and the results
    united.
    """
    context = records.sparkSession.sparkContext.applicationId
    rejected = tuple((rejected_schemas or {}).items())

    def of(shape: list[Column], keep_tombstones: bool) -> Decoding:
        return decoding(context, tuple(shape), tuple(key), max_record_bytes, rejected, keep_tombstones)

    if not versions:
        return of(columns, tombstones).apply(records)
    section = schema_text(F.col("value"))
    # a tombstone has no schema section: it is among the others
    parts = [of(cols, False).apply(records.where(section == F.lit(text))) for text, cols in versions.items()]
    others = records.where(section.isNull() | ~section.isin(*versions))
    return reduce(DataFrame.unionByName, [*parts, of(columns, tombstones).apply(others)])


@dataclass(frozen=True, eq=False)  # Spark Columns do not compare as values
class Decoding:
    """The projections that decode one table shape's records, applied one after the other.

    Each projection names what the next refers to (the envelope's parts, then every column's wire
    value, its text for a VariableScaleDecimal, its converted value, then the values and the error),
    so an expression used twice (a conversion: as the value and in its error check) is a column
    reference, not a second copy of its tree; Spark keeps apart projections whose outputs are used more
    than once, so each is analysed and run once. Built once per Spark application and table shape
    (:func:`decoding`): a shape's expressions take thousands of calls into the JVM to build, which every
    batch the Arrow decoder declines would otherwise pay again.
    """

    keep_tombstones: bool
    projections: tuple[tuple[SparkColumn, ...], ...]

    def apply(self, records: DataFrame) -> DataFrame:
        if not self.keep_tombstones:
            records = records.where(F.col("value").isNotNull())
        return reduce(lambda frame, projection: frame.select(*projection), self.projections, records)


@lru_cache(maxsize=256)
def decoding(
    context: str,
    columns: tuple[Column, ...],
    key: tuple[str, ...],
    max_record_bytes: int,
    rejected: tuple[tuple[str, str], ...],
    tombstones: bool,
) -> Decoding:
    """The decoding of a table shape, built on its first batch in a Spark application and reused after
    that. ``context`` (the application's id) is in the key because the decimal UDFs built here belong
    to the application that was running; 256 shapes are kept (a sink of more tables builds again)."""
    del context  # in the cache key only
    return Decoding(tombstones, _projections(list(columns), list(key), max_record_bytes, rejected))


def _projections(
    columns: list[Column], key: list[str], max_record_bytes: int, rejected: tuple[tuple[str, str], ...]
) -> tuple[tuple[SparkColumn, ...], ...]:
    """:class:`Decoding`'s projections for these columns."""
    by_name = {c.name: c for c in columns}
    key_columns = [by_name[k] for k in key]
    value_text = F.coalesce(F.col("value").cast("string"), F.lit(TOMBSTONE_EVENT))
    env = F.from_json(value_text, envelope_schema(columns), _JSON_OPTIONS)
    kjson = F.from_json(F.col("key").cast("string"), key_schema(key_columns), _JSON_OPTIONS)
    parsed = (
        *[F.col(name).alias(field) for name, field in zip(RECORD_FIELDS, _RECORD, strict=True)],
        env.alias("env"),
        kjson.alias("kjson"),
    )

    has_payload = F.col("env.payload").isNotNull()

    def envelope(name: str) -> SparkColumn:
        return F.when(has_payload, F.col(f"env.payload.{name}")).otherwise(F.col(f"env.{name}"))

    staged = (
        *[F.col(c) for c in _RECORD],
        envelope("op").alias(OP_COLUMN),
        envelope("after").alias("after"),
        envelope("before").alias("before"),
        envelope("source").alias(_SOURCE),
        F.col(f"env.{CORRUPT_COLUMN}").alias("value_corrupt"),
        F.when(F.col("kjson.payload").isNotNull(), F.col("kjson.payload"))
        .otherwise(F.struct(*[F.col(f"kjson.`{k}`").alias(k) for k in key]))
        .alias("kstruct"),
        F.col(f"kjson.{CORRUPT_COLUMN}").alias("key_corrupt"),
    )

    is_delete = F.col(OP_COLUMN) == DELETE_OP
    image = F.when(is_delete, F.col("before")).otherwise(F.col("after"))
    wires = {c.name: F.col(f"{_WIRE}{i}") for i, c in enumerate(columns)}
    texts = {c.name: F.col(f"{_TEXT}{i}") for i, c in enumerate(columns)}
    values = {c.name: F.col(f"{_VALUE}{i}") for i, c in enumerate(columns)}
    source = F.from_json(F.col(_SOURCE), source_schema())
    positioned = (
        F.col("*"),
        *[
            source.getField(n).try_cast(t).alias(c)
            for (n, t), c in zip(SOURCE_FIELDS.items(), SOURCE_COLUMNS, strict=True)
        ],
        temporal.spark_julian_snapshot(F.col(_SOURCE)).alias(_JULIAN),
        *(
            [temporal.spark_julian_snapshot(F.col(_SOURCE), streamed_too=True).alias(_JULIAN_LISTS)]
            if any(temporal.julian_list(c) for c in columns)
            else []
        ),
        *[
            (
                F.coalesce(F.col(f"kstruct.`{c.name}`"), image.getField(c.name))
                if c.name in key
                else image.getField(c.name)
            ).alias(f"{_WIRE}{i}")
            for i, c in enumerate(columns)
        ],
    )
    # A VariableScaleDecimal ({scale, value}, each element's for a list) → its exact text, then
    # converted like decimal.handling.mode=string's text.
    variable_scale = [c for c in columns if c.encoding is Encoding.VARIABLE_SCALE_DECIMAL]
    as_text = (
        F.col("*"),
        *[
            (_variable_scale_text_lists if c.is_list else _variable_scale_texts)(wires[c.name]).alias(
                f"{_TEXT}{i}"
            )
            for i, c in enumerate(columns)
            if c in variable_scale
        ],
    )
    converted = (
        F.col("*"),
        *[
            (
                convert(as_text_column(c), texts[c.name])
                if c in variable_scale
                else convert(c, wires[c.name], _julian_mark(c))
            ).alias(f"{_VALUE}{i}")
            for i, c in enumerate(columns)
        ],
    )
    errors = _envelope_errors(key, rejected, max_record_bytes)
    for c in columns:
        wire, value = wires[c.name], values[c.name]
        if c in variable_scale:
            text, text_column = texts[c.name], as_text_column(c)
            misfit = F.when(text.isNotNull(), _misfit(text_column, text)).otherwise(
                _misfit(c, F.to_json(wire))
            )
            if c.is_list:  # an element that is not {scale, value}, then one whose text does not fit
                errors += _element_errors(c, wire, text) + _element_errors(text_column, text, value)
        else:
            misfit = _misfit(c, wire)
            if c.is_list:
                errors.extend(_element_errors(c, wire, value))
        errors.append(F.when(wire.isNotNull() & value.isNull(), misfit))
        if c.name in key:
            errors.append(F.when(wire.isNull(), F.lit(f"key column {c.name} is missing")))
        elif c.required:
            errors.append(F.when(~is_delete & wire.isNull(), F.lit(f"required column {c.name} is null")))
    result = (
        *[F.col(c) for c in (*_RECORD, OP_COLUMN)],
        *[values[c.name].alias(c.name) for c in columns],
        *[F.col(c) for c in SOURCE_COLUMNS],
        F.coalesce(*errors).alias(ERROR_COLUMN),
    )
    return parsed, staged, positioned, as_text, converted, result


def _envelope_errors(
    key: list[str], rejected: tuple[tuple[str, str], ...], max_record_bytes: int
) -> list[SparkColumn]:
    """The dead-letter reasons of a record as a whole (its envelope, its op, its key), first in line."""
    is_tombstone = F.col(_VALUE_BYTES).isNull()
    return [
        # A tombstone's key is all there is of it: say so when it names no row.
        F.when(is_tombstone & F.col(_KEY).isNull(), F.lit("tombstone without a key")),
        F.when(
            is_tombstone & F.col("key_corrupt").isNotNull(),
            F.lit("tombstone whose key can't be parsed (not JSON, or a key column of the wrong JSON type)"),
        ),
        *[
            F.when(
                is_tombstone & F.col(f"kstruct.`{k}`").isNull(),
                F.lit(f"tombstone whose key has no column {k}"),
            )
            for k in key
        ],
        *[
            F.when(
                schema_text(F.col(_VALUE_BYTES)) == F.lit(text),
                F.lit(f"incompatible schema change: {reason}"),
            )
            for text, reason in rejected
        ],
        F.when(
            F.length(_VALUE_BYTES) > max_record_bytes,
            F.format_string(
                "record of %d bytes exceeds source.max_record_bytes (%d)",
                F.length(_VALUE_BYTES),
                F.lit(max_record_bytes),
            ),
        ),
        F.when(
            F.col("value_corrupt").isNotNull(),
            F.lit("malformed event: not JSON or a value of the wrong JSON type"),
        ),
        F.when(F.col(OP_COLUMN).isNull(), F.lit("event has no op (not a Debezium change event)")),
        F.when(F.col(OP_COLUMN) == TRUNCATE_OP, F.lit(TRUNCATE_REASON)),
        F.when(~F.col(OP_COLUMN).isin(*VALID_OPS), F.format_string("unknown op '%s'", F.col(OP_COLUMN))),
        F.when(
            (F.col(OP_COLUMN) != DELETE_OP) & F.col("after").isNull(),
            F.lit("create/update event without an 'after' image"),
        ),
    ]


def latest_per_key(changes: DataFrame, key: list[str]) -> DataFrame:
    """The last change of every key in the batch (rule 3: one data row per key per snapshot).

    ``changes`` has the table's columns, :data:`SOURCE_COLUMNS` and the records' Kafka position
    (:data:`KAFKA_POSITION`). A key's changes are ordered by their source position (:data:`SOURCE_FIELDS`, in that
    order, a missing field lowest), then by Kafka offset. A change without a source position (a
    tombstone, an event without a ``source`` section) takes that of the closest earlier change of its
    key in the same partition, so within a partition it follows that change; offsets order changes
    only within a partition. The arrow decoder's :func:`service.data.arrow_decode.latest_per_key`
    implements the same order.
    """
    lane = KAFKA_POSITION[:2]
    keys = [F.col(f"`{k}`") for k in key]
    has_position = reduce(lambda a, b: a | b, [F.col(c).isNotNull() for c in SOURCE_COLUMNS])
    earlier = Window.partitionBy(*keys).orderBy(*lane, OFFSET).rowsBetween(Window.unboundedPreceding, 0)
    carried = F.last(F.when(has_position, F.struct(*lane, *SOURCE_COLUMNS)), ignorenulls=True).over(earlier)
    same_lane = (carried.getField(TOPIC) == F.col(TOPIC)) & (carried.getField(PARTITION) == F.col(PARTITION))
    order = F.struct(
        *[
            F.when(same_lane, carried.getField(c)).alias(c) if c in SOURCE_COLUMNS else F.col(c)
            for c in CHANGE_ORDER
        ]
    )
    others = [c for c in changes.columns if c not in key]
    latest = F.max_by(F.struct(*[F.col(f"`{c}`") for c in others]), F.col(_ORDER)).alias("latest")
    return changes.withColumn(_ORDER, order).groupBy(*keys).agg(latest).select(*keys, "latest.*")
