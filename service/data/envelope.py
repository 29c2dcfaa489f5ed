"""The vocabulary both Debezium decoders share: Spark's (:mod:`service.data.spark_decode`) and Arrow's
(:mod:`service.data.arrow_decode`).

What a decoded change row carries (its error column, its source position and the order of a key's
changes), what an event may say (its ops, truncates, tombstones), the types a column's JSON value is
read as and converted to, and how Kafka Connect's encodings read (strict base64, UUID text, decimals).
Both decoders take these from here, so that they agree by construction.
"""

from __future__ import annotations

import binascii
import decimal
import re
from dataclasses import replace
from decimal import Decimal

from pyiceberg.types import DecimalType, DoubleType, FloatType, IntegerType, LongType, StringType
from pyspark.sql import types as T

from service.model.columns import RESERVED_PREFIX, Column, Encoding

ERROR_COLUMN = "__icesink_error"


def record_field(name: str) -> str:
    """What a Kafka record's field (``key``, ``value``, ``topic``, ``partition``, ``offset``,
    ``timestamp``) is called in decoded rows: apart from the table's columns, which may have any of
    these names (a key-value table's ``key`` and ``value``, an event table's ``topic`` or ``offset``)."""
    return f"{RESERVED_PREFIX}{name}"


# A record's position as the frames records come in name it (Spark's Kafka source, the task reader) ...
RECORD_POSITION = ["topic", "partition", "offset"]
# ... and in decoded rows: what orders changes within a partition.
KAFKA_POSITION = [record_field(name) for name in RECORD_POSITION]
TOPIC, PARTITION, OFFSET = KAFKA_POSITION
# The fields of Debezium's `source` section that order a key's changes, most significant first:
# Postgres' change LSN, MySQL's binlog coordinates, then the source's commit time (ms).
SOURCE_FIELDS: dict[str, T.DataType] = {
    "lsn": T.LongType(),
    "file": T.StringType(),
    "pos": T.LongType(),
    "row": T.LongType(),
    "ts_ms": T.LongType(),
}
SOURCE_COLUMNS = [f"__icesink_source_{name}" for name in SOURCE_FIELDS]
# How a key's changes are ordered, most significant first (see each decoder's latest_per_key): the
# topic and partition come last only to make ties across partitions deterministic.
CHANGE_ORDER = [*SOURCE_COLUMNS, OFFSET, TOPIC, PARTITION]
# What a tombstone decodes as: a delete with neither before image nor source position.
TOMBSTONE_EVENT = '{"op":"d"}'
VALID_OPS = ("c", "r", "u", "d")
TRUNCATE_OP = "t"
# A truncate event empties the whole source table. Applying it would take a snapshot that removes
# every live data file next to the batch's own files, and Debezium gives no order between it and the
# table's other events unless the topic has one partition, so it is dead-lettered instead, visibly.
TRUNCATE_REASON = "truncate events are not applied: the table keeps the rows the source truncated"

# Padded base64 without whitespace, how Kafka Connect writes bytes and decimals. Unanchored: each engine
# anchors it its own way (Python's fullmatch, ^...\z in Java's, whose $ also matches before a final
# newline, ^...$ in RE2's).
STRICT_BASE64 = r"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?"
# io.debezium.data.Uuid text, as both decoders match it (Spark's rlike, Arrow's RE2).
UUID_PATTERN = r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"

_WIRE_TYPES: dict[Encoding, T.DataType] = {
    Encoding.INTEGER: T.LongType(),
    Encoding.FLOATING: T.DoubleType(),
    Encoding.BOOLEAN: T.BooleanType(),
    Encoding.DATE_DAYS: T.LongType(),
    Encoding.TIME_MILLIS: T.LongType(),
    Encoding.TIME_MICROS: T.LongType(),
    Encoding.TIME_NANOS: T.LongType(),
    Encoding.TIMESTAMP_MILLIS: T.LongType(),
    Encoding.TIMESTAMP_MICROS: T.LongType(),
    Encoding.TIMESTAMP_NANOS: T.LongType(),
    Encoding.VARIABLE_SCALE_DECIMAL: T.StructType(
        [T.StructField("scale", T.IntegerType()), T.StructField("value", T.StringType())]
    ),
    Encoding.DURATION_MICROS: T.LongType(),
}


def wire_type(encoding: Encoding) -> T.DataType:
    """The Spark type a JSON value is parsed into before conversion (text for everything else)."""
    return _WIRE_TYPES.get(encoding, T.StringType())


def column_wire_type(column: Column) -> T.DataType:
    """The Spark type a column's JSON value is parsed into: its encoding's wire type, or for a list
    column an array of it."""
    element = wire_type(column.encoding)
    return T.ArrayType(element) if column.is_list else element


def spark_type(column: Column) -> T.DataType:
    """The Spark type of a converted column (TIME travels as int64 micros, UUID as text; a list as an
    array of its converted elements)."""
    if column.is_list:
        return T.ArrayType(spark_type(column.element()))
    t = column.type
    if isinstance(t, IntegerType):
        return T.IntegerType()
    if isinstance(t, LongType):
        return T.LongType()
    if isinstance(t, FloatType):
        return T.FloatType()
    if isinstance(t, DoubleType):
        return T.DoubleType()
    if isinstance(t, DecimalType):
        return T.DecimalType(t.precision, t.scale)
    mapping: dict[str, T.DataType] = {
        "boolean": T.BooleanType(),
        "string": T.StringType(),
        "binary": T.BinaryType(),
        "date": T.DateType(),
        "time": T.LongType(),
        "timestamp": T.TimestampNTZType(),
        "timestamptz": T.TimestampType(),
        "uuid": T.StringType(),
    }
    key = str(t)
    if key.startswith("fixed"):
        return T.BinaryType()
    return mapping[key]


MAX_DECIMAL_DIGITS = 38  # the widest decimal of Spark, Arrow's decimal128 and Iceberg
MAX_LONG_DIGITS = 18  # unscaled values of up to 18 digits fit in 8 bytes (a long)
# Decimal arithmetic that is exact or raises. Python's default context rounds to 28 digits (scaling a
# wider unscaled value in it would silently drop digits): this one keeps every digit, takes any
# exponent and traps rounding (Inexact).
EXACT = decimal.Context(
    prec=decimal.MAX_PREC,
    Emax=decimal.MAX_EMAX,
    Emin=decimal.MIN_EMIN,
    traps=[decimal.Inexact, decimal.InvalidOperation, decimal.DivisionByZero, decimal.Overflow],
)


def unscaled_decimal(unscaled: int, scale: int) -> Decimal | None:
    """The decimal ``unscaled * 10**-scale`` exactly, or None when it has more than 38 digits."""
    if not -(10**MAX_DECIMAL_DIGITS) < unscaled < 10**MAX_DECIMAL_DIGITS:
        return None
    return Decimal(unscaled).scaleb(-scale, EXACT)


_STRICT_BASE64 = re.compile(STRICT_BASE64)


def strict_base64(text: str) -> bytes | None:
    """The bytes of padded base64 without whitespace, or None for anything else."""
    return binascii.a2b_base64(text) if _STRICT_BASE64.fullmatch(text) else None


# PostgreSQL's numeric has up to 16383 digits after the point and 131072 before: a VariableScaleDecimal
# beyond these is not from PostgreSQL, and its text would be unbounded (a scale of 2**31 is 2 GB of zeros).
_MAX_VARIABLE_SCALE = 16383
_MAX_VARIABLE_SCALE_BYTES = 64 * 1024  # 157826 digits: PostgreSQL's widest numeric fits


def variable_scale_text(scale: object, value: object) -> str | None:
    """``io.debezium.data.VariableScaleDecimal`` (``{"scale": s, "value": base64 of the big-endian two's
    complement unscaled integer}``) → its exact decimal text, without exponent (``1.5``, ``-0.001``,
    ``100``); None when it is not such a value. Both decoders use it, so they agree by construction."""
    if not isinstance(scale, int) or not isinstance(value, str) or abs(scale) > _MAX_VARIABLE_SCALE:
        return None
    raw = strict_base64(value)
    if not raw or len(raw) > _MAX_VARIABLE_SCALE_BYTES:
        return None
    return format(Decimal(int.from_bytes(raw, "big", signed=True)).scaleb(-scale, EXACT), "f")


def as_text_column(column: Column) -> Column:
    """A VariableScaleDecimal column once its value (each element's, for a list) is text: a string, or
    decimal text to convert."""
    scalar = column.element() if column.is_list else column
    return replace(
        column, encoding=Encoding.STRING if isinstance(scalar.type, StringType) else Encoding.DECIMAL_TEXT
    )
