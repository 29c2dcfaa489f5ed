"""Columns of a CDC table: their Iceberg type and how a value is encoded in a Debezium event.

Debezium (through Kafka Connect's JSON converter) encodes many types as plain JSON integers or strings
and says what they mean only in the ``schema`` section: ``io.debezium.time.MicroTimestamp`` is an int64
of microseconds, ``org.apache.kafka.connect.data.Decimal`` is base64 of a big-endian two's complement
unscaled integer. A :class:`Column` keeps both facts so decoding never has to guess.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from pyiceberg.schema import Schema
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
    ListType,
    LongType,
    NestedField,
    PrimitiveType,
    StringType,
    TimestampType,
    TimestamptzType,
    TimeType,
    UUIDType,
)


class Encoding(StrEnum):
    """How a column's value travels in the JSON event."""

    INTEGER = "integer"
    FLOATING = "floating"
    BOOLEAN = "boolean"
    STRING = "string"
    BYTES_BASE64 = "bytes-base64"
    DECIMAL_BASE64 = "decimal-base64"  # org.apache.kafka.connect.data.Decimal
    DECIMAL_TEXT = "decimal-text"  # decimal.handling.mode=string
    VARIABLE_SCALE_DECIMAL = "variable-scale-decimal"  # io.debezium.data.VariableScaleDecimal {scale, value}
    DATE_DAYS = "date-days"
    TIME_MILLIS = "time-millis"
    TIME_MICROS = "time-micros"
    TIME_NANOS = "time-nanos"
    TIMESTAMP_MILLIS = "timestamp-millis"
    TIMESTAMP_MICROS = "timestamp-micros"
    TIMESTAMP_NANOS = "timestamp-nanos"
    TIMESTAMP_ISO = "timestamp-iso"  # io.debezium.time.ZonedTimestamp / IsoTimestamp text
    DURATION_MICROS = "duration-micros"  # io.debezium.time.MicroDuration: int64 µs, saturating
    UUID_TEXT = "uuid-text"


VARIABLE_SCALE_DECIMAL = "io.debezium.data.VariableScaleDecimal"
DEFAULT_VARIABLE_SCALE = StringType()  # its exact text
# Logical type names (schema.name in the event) and what they become.
_LOGICAL: dict[str, tuple[Encoding, IcebergType | None]] = {
    "io.debezium.time.Date": (Encoding.DATE_DAYS, DateType()),
    "org.apache.kafka.connect.data.Date": (Encoding.DATE_DAYS, DateType()),
    "io.debezium.time.Time": (Encoding.TIME_MILLIS, TimeType()),
    "org.apache.kafka.connect.data.Time": (Encoding.TIME_MILLIS, TimeType()),
    "io.debezium.time.MicroTime": (Encoding.TIME_MICROS, TimeType()),
    "io.debezium.time.NanoTime": (Encoding.TIME_NANOS, TimeType()),
    "io.debezium.time.Timestamp": (Encoding.TIMESTAMP_MILLIS, TimestampType()),
    "org.apache.kafka.connect.data.Timestamp": (Encoding.TIMESTAMP_MILLIS, TimestampType()),
    "io.debezium.time.MicroTimestamp": (Encoding.TIMESTAMP_MICROS, TimestampType()),
    "io.debezium.time.NanoTimestamp": (Encoding.TIMESTAMP_NANOS, TimestampType()),
    "io.debezium.time.ZonedTimestamp": (Encoding.TIMESTAMP_ISO, TimestamptzType()),
    "io.debezium.data.Uuid": (Encoding.UUID_TEXT, UUIDType()),
    "io.debezium.data.Json": (Encoding.STRING, StringType()),
    "io.debezium.data.Xml": (Encoding.STRING, StringType()),
    "io.debezium.data.Enum": (Encoding.STRING, StringType()),
    "io.debezium.time.ZonedTime": (Encoding.STRING, StringType()),
    # PostgreSQL numeric without precision: its type is configured (source.variable_scale_decimal).
    VARIABLE_SCALE_DECIMAL: (Encoding.VARIABLE_SCALE_DECIMAL, None),
    "io.debezium.time.MicroDuration": (Encoding.DURATION_MICROS, LongType()),
    "io.debezium.time.Interval": (Encoding.STRING, StringType()),  # interval.handling.mode=string
}

_CONNECT_PRIMITIVES: dict[str, tuple[Encoding, IcebergType]] = {
    "int8": (Encoding.INTEGER, IntegerType()),
    "int16": (Encoding.INTEGER, IntegerType()),
    "int32": (Encoding.INTEGER, IntegerType()),
    "int64": (Encoding.INTEGER, LongType()),
    "float32": (Encoding.FLOATING, FloatType()),
    "float": (Encoding.FLOATING, FloatType()),
    "float64": (Encoding.FLOATING, DoubleType()),
    "double": (Encoding.FLOATING, DoubleType()),
    "boolean": (Encoding.BOOLEAN, BooleanType()),
    "string": (Encoding.STRING, StringType()),
    "bytes": (Encoding.BYTES_BASE64, BinaryType()),
}

_DEFAULT_ENCODING: dict[type[IcebergType], Encoding] = {
    IntegerType: Encoding.INTEGER,
    LongType: Encoding.INTEGER,
    FloatType: Encoding.FLOATING,
    DoubleType: Encoding.FLOATING,
    BooleanType: Encoding.BOOLEAN,
    StringType: Encoding.STRING,
    BinaryType: Encoding.BYTES_BASE64,
    FixedType: Encoding.BYTES_BASE64,
    DecimalType: Encoding.DECIMAL_BASE64,
    DateType: Encoding.DATE_DAYS,
    TimeType: Encoding.TIME_MICROS,
    TimestampType: Encoding.TIMESTAMP_MICROS,
    TimestamptzType: Encoding.TIMESTAMP_ISO,
    UUIDType: Encoding.UUID_TEXT,
}

_SIMPLE_TYPES: dict[str, IcebergType] = {
    "boolean": BooleanType(),
    "int": IntegerType(),
    "integer": IntegerType(),
    "long": LongType(),
    "bigint": LongType(),
    "float": FloatType(),
    "double": DoubleType(),
    "string": StringType(),
    "binary": BinaryType(),
    "date": DateType(),
    "time": TimeType(),
    "timestamp": TimestampType(),
    "timestamptz": TimestamptzType(),
    "uuid": UUIDType(),
}
_DECIMAL_RE = re.compile(r"^decimal\(\s*(\d+)\s*,\s*(\d+)\s*\)$")
_LIST_RE = re.compile(r"^list\s*<(.*)>$")
_FIXED_RE = re.compile(r"^fixed\[\s*(\d+)\s*\]$")


class SchemaError(ValueError):
    """A schema (configured, in an event, or in the table) that icesink can't use as it is."""


# Decoded rows carry the sink's own columns beside the table's (the change's op, its source and Kafka
# positions, its error), all named with this prefix, so that a table column may have any other name.
RESERVED_PREFIX = "__icesink_"

# Element ids of the list types built from events or configuration: a table's own element ids are
# assigned when the column is created (iceberg_schema, or the catalog's schema update).
UNASSIGNED_ID = 0


@dataclass(frozen=True)
class Column:
    """A table column: its Iceberg type (a primitive, or a list of a primitive), whether it is required,
    and how its value travels in the event (for a list: how each of its elements travels)."""

    name: str
    type: PrimitiveType | ListType
    required: bool
    encoding: Encoding

    def __post_init__(self) -> None:
        if self.name.startswith(RESERVED_PREFIX):
            raise SchemaError(
                f"column {self.name}: names starting with {RESERVED_PREFIX} are icesink's own "
                "(the decoders' working columns)"
            )

    @property
    def is_list(self) -> bool:
        return isinstance(self.type, ListType)

    def element(self) -> Column:
        """A list's elements as a column of their own, named as Iceberg names the element field
        (``tags.element``): the decoders convert each element as they convert a scalar column."""
        if not isinstance(self.type, ListType):
            raise TypeError(f"column {self.name} ({self.type}) is not a list")
        element_type = self.type.element_type
        assert isinstance(element_type, PrimitiveType)  # nested lists are refused where columns are made
        return Column(f"{self.name}.element", element_type, self.type.element_required, self.encoding)


def list_of(element: PrimitiveType, element_required: bool = False) -> ListType:
    return ListType(element_id=UNASSIGNED_ID, element=element, element_required=element_required)


def _parse_primitive(text: str) -> PrimitiveType:
    key = text.strip().lower()
    if key in _SIMPLE_TYPES:
        return _SIMPLE_TYPES[key]  # type: ignore[return-value]
    if match := _DECIMAL_RE.match(key):
        precision, scale = int(match.group(1)), int(match.group(2))
        if not 0 < precision <= 38 or scale > precision:
            raise SchemaError(f"decimal({precision},{scale}): precision must be 1..38 and scale <= precision")
        return DecimalType(precision, scale)
    if match := _FIXED_RE.match(key):
        return FixedType(int(match.group(1)))
    raise SchemaError(
        f"unknown column type {text!r}; use one of {sorted(_SIMPLE_TYPES)}, decimal(p,s), fixed[n], "
        "or list<...> of one of them"
    )


def parse_iceberg_type(text: str) -> PrimitiveType | ListType:
    """``long``, ``decimal(10,2)``, ``fixed[16]``, ``list<int>`` (optional elements) ... → the pyiceberg
    type. Lists of lists are refused: a PostgreSQL array of any dimension arrives as one flat list."""
    if match := _LIST_RE.match(text.strip().lower()):
        if _LIST_RE.match(match.group(1).strip()):
            raise SchemaError(f"column type {text!r}: lists of lists are not supported")
        return list_of(_parse_primitive(match.group(1)))
    return _parse_primitive(text)


def default_encoding(iceberg_type: IcebergType) -> Encoding:
    """How a value of this type travels unless told otherwise (a list: how its elements travel)."""
    if isinstance(iceberg_type, ListType):
        return default_encoding(iceberg_type.element_type)
    return _DEFAULT_ENCODING.get(type(iceberg_type), Encoding.STRING)


def column_from_config(name: str, type_text: str, required: bool, encoding: str | None) -> Column:
    iceberg_type = parse_iceberg_type(type_text)
    if encoding is None:
        enc = default_encoding(iceberg_type)
    elif encoding in _LOGICAL:
        enc = _LOGICAL[encoding][0]
    else:
        try:
            enc = Encoding(encoding)
        except ValueError:
            raise SchemaError(
                f"column {name}: unknown encoding {encoding!r}; use a Debezium logical name "
                f"({', '.join(sorted(_LOGICAL))}) or one of {[e.value for e in Encoding]}"
            ) from None
    if enc is Encoding.VARIABLE_SCALE_DECIMAL:
        element = iceberg_type.element_type if isinstance(iceberg_type, ListType) else iceberg_type
        check_variable_scale_type(element, f"column {name}")
    return Column(name, iceberg_type, required, enc)


def check_variable_scale_type(iceberg_type: IcebergType, where: str) -> None:
    """A VariableScaleDecimal lands as its exact text or in a decimal column; nothing else holds it."""
    if not isinstance(iceberg_type, StringType | DecimalType):
        raise SchemaError(
            f"{where}: {VARIABLE_SCALE_DECIMAL} lands in a string or decimal(p,s) column, not {iceberg_type}"
        )


def column_from_connect(
    field: dict[str, Any], *, variable_scale: PrimitiveType = DEFAULT_VARIABLE_SCALE
) -> Column:
    """Map one field of a Kafka Connect JSON schema (``{"type", "name", "parameters", "optional", "field"}``).

    ``variable_scale`` is the type of ``io.debezium.data.VariableScaleDecimal`` fields (PostgreSQL
    ``numeric`` without precision), which have no scale of their own: string or decimal(p,s)
    (``source.variable_scale_decimal``).
    """
    name = field.get("field")
    connect_type = field.get("type")
    logical = field.get("name")
    if not isinstance(name, str) or not isinstance(connect_type, str):
        raise SchemaError(f"schema field without a name or type: {field}")
    required = not field.get("optional", True)
    if connect_type == "array":
        return _list_from_connect(name, field.get("items"), required, variable_scale)
    if logical == "org.apache.kafka.connect.data.Decimal":
        params = field.get("parameters") or {}
        scale = int(params.get("scale", 0))
        precision = int(params.get("connect.decimal.precision", 38))
        return Column(name, DecimalType(min(precision, 38), scale), required, Encoding.DECIMAL_BASE64)
    if logical == VARIABLE_SCALE_DECIMAL:
        return Column(name, variable_scale, required, Encoding.VARIABLE_SCALE_DECIMAL)
    if isinstance(logical, str) and logical in _LOGICAL:
        encoding, iceberg_type = _LOGICAL[logical]
        return Column(name, iceberg_type, required, encoding)  # type: ignore[arg-type]
    if connect_type in _CONNECT_PRIMITIVES:
        encoding, iceberg_type = _CONNECT_PRIMITIVES[connect_type]
        return Column(name, iceberg_type, required, encoding)  # type: ignore[arg-type]
    raise SchemaError(
        f"column {name}: unsupported Kafka Connect type {connect_type!r} ({logical or 'no logical name'})"
    )


def _list_from_connect(name: str, items: Any, required: bool, variable_scale: PrimitiveType) -> Column:
    """A Kafka Connect array → a list column whose elements are mapped like a scalar column of the
    ``items`` schema (optional elements unless the items say otherwise). Debezium sends a PostgreSQL
    array of any dimension as one flat array (see docs/types.md), so arrays of arrays never come."""
    if not isinstance(items, dict):
        raise SchemaError(f"column {name}: an array schema without an items schema")
    element = column_from_connect({**items, "field": f"{name}.element"}, variable_scale=variable_scale)
    if not isinstance(element.type, PrimitiveType):
        raise SchemaError(f"column {name}: arrays of {items.get('type')} are not supported")
    return Column(name, list_of(element.type, element.required), required, element.encoding)


def columns_from_envelope_schema(
    schema: dict[str, Any], *, variable_scale: PrimitiveType = DEFAULT_VARIABLE_SCALE
) -> list[Column]:
    """Columns of the ``after`` struct of a Debezium envelope's ``schema`` section (``variable_scale``:
    see :func:`column_from_connect`)."""
    for field in schema.get("fields", []):
        if field.get("field") in ("after", "before") and field.get("type") == "struct":
            return [column_from_connect(f, variable_scale=variable_scale) for f in field.get("fields", [])]
    raise SchemaError("the event's schema section has no 'after'/'before' struct")


def columns_for_table(schema: Schema, encodings: dict[str, Encoding] | None = None) -> list[Column]:
    """Columns of an existing table, with encodings from the events' schema where known."""
    result = []
    for field in schema.fields:
        field_type = field.field_type
        if not (
            isinstance(field_type, PrimitiveType)
            or (isinstance(field_type, ListType) and isinstance(field_type.element_type, PrimitiveType))
        ):
            raise SchemaError(
                f"column {field.name}: nested type {field_type} is not supported (only lists of primitives)"
            )
        encoding = (encodings or {}).get(field.name) or default_encoding(field_type)
        result.append(Column(field.name, field_type, field.required, encoding))
    return result


def check_key_types(types: Mapping[str, IcebergType], key: list[str]) -> None:
    """Key columns must be primitives: Iceberg's identifier fields can't be lists (nor can the
    equality deletes that match rows by key)."""
    nested = [f"{k} ({types[k]})" for k in key if k in types and not isinstance(types[k], PrimitiveType)]
    if nested:
        raise SchemaError(
            f"key column(s) {', '.join(nested)} are not primitive: a key column can't be a list"
        )


def with_encodings(columns: list[Column], encodings: Mapping[str, Encoding]) -> list[Column]:
    """The same columns, each encoded as ``encodings`` says where it names it (one schema version's
    encodings: a column's encoding can change between versions while its type stays)."""
    return [replace(c, encoding=encodings.get(c.name, c.encoding)) for c in columns]


def iceberg_schema(columns: list[Column], key: list[str]) -> Schema:
    """A fresh table schema; key columns become required identifier fields."""
    names = [c.name for c in columns]
    missing = [k for k in key if k not in names]
    if missing:
        raise SchemaError(f"key column(s) {missing} are not among the columns {names}")
    check_key_types({c.name: c.type for c in columns}, key)
    element_ids = iter(range(len(columns) + 1, 2 * len(columns) + 1))  # after the columns' ids
    fields = [
        NestedField(
            field_id=i + 1,
            name=c.name,
            field_type=(
                ListType(next(element_ids), c.type.element_type, c.type.element_required)
                if isinstance(c.type, ListType)
                else c.type
            ),
            required=c.required or c.name in key,
        )
        for i, c in enumerate(columns)
    ]
    ids = [f.field_id for f in fields if f.name in key]
    return Schema(*fields, identifier_field_ids=ids)
