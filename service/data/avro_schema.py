"""An Avro writer schema as the Kafka Connect schema it was made from, and as the schema to decode with.

Debezium's records are Kafka Connect structs; its Avro converter writes each Connect schema as Avro,
keeping what Avro has no word for in annotations (``connect.name``, ``connect.parameters``,
``connect.type``). Turning the Avro schema back into the Connect schema (the JSON converter's
``schema`` section, :func:`connect_schema`) lets an Avro table take the same columns, encodings and
schema evolution as a JSON one (:func:`service.model.columns.columns_from_envelope_schema`): the two
formats can't map a column differently. Plain Avro logical types without a Connect name (a producer
other than Kafka Connect) map to the Connect type of the same meaning.

Records are decoded with the writer schema stripped of its logical types (:func:`decoding_schema`):
values come as Avro's primitives (a date as days, a timestamp as an integer, a decimal as its
unscaled bytes), which is what the JSON converter writes too, so that one conversion
(:func:`service.data.arrow_decode.convert`) serves both formats.
"""

from __future__ import annotations

import base64
import copy
import io
import json
from typing import Any

from fastavro import parse_schema, schemaless_reader

from service.data.registry import BadRecord, UnknownSchema
from service.model.columns import SchemaError

# Avro primitives → Kafka Connect types (an int annotated connect.type int8/int16 keeps that).
_PRIMITIVES = {
    "int": "int32",
    "long": "int64",
    "float": "float",
    "double": "float64",
    "boolean": "boolean",
    "string": "string",
    "bytes": "bytes",
}
# Avro logical types without a connect.name → the Connect (or Debezium) logical name of that meaning.
_LOGICAL_NAMES = {
    "date": "org.apache.kafka.connect.data.Date",
    "time-millis": "org.apache.kafka.connect.data.Time",
    "time-micros": "io.debezium.time.MicroTime",
    "timestamp-millis": "org.apache.kafka.connect.data.Timestamp",
    "timestamp-micros": "io.debezium.time.MicroTimestamp",
    "local-timestamp-millis": "org.apache.kafka.connect.data.Timestamp",
    "local-timestamp-micros": "io.debezium.time.MicroTimestamp",
    "uuid": "io.debezium.data.Uuid",
}
DECIMAL = "org.apache.kafka.connect.data.Decimal"


def _full_name(name: str, namespace: str | None) -> str:
    return name if "." in name or not namespace else f"{namespace}.{name}"


class _Converter:
    """One schema's walk: named types are defined once and referred to by name after that."""

    def __init__(self) -> None:
        self.named: dict[str, dict[str, Any]] = {}

    def optional(self, avro: Any, namespace: str | None, where: str) -> tuple[dict[str, Any], bool]:
        """The Connect schema of ``avro`` and whether it is optional (a union with null)."""
        if isinstance(avro, list):
            branches = [b for b in avro if b != "null"]
            if len(branches) != 1:
                raise SchemaError(
                    f"{where}: a union of {avro} (only a union of null and one type maps to a column)"
                )
            return self.schema(branches[0], namespace, where), len(branches) < len(avro)
        return self.schema(avro, namespace, where), False

    def schema(self, avro: Any, namespace: str | None, where: str) -> dict[str, Any]:
        if isinstance(avro, str):
            if avro in _PRIMITIVES:
                return {"type": _PRIMITIVES[avro]}
            name = _full_name(avro, namespace)
            if name not in self.named:
                raise SchemaError(f"{where}: unknown Avro type {avro!r}")
            return copy.deepcopy(self.named[name])
        if isinstance(avro, list):
            raise SchemaError(f"{where}: a union inside a union")
        if not isinstance(avro, dict):
            raise SchemaError(f"{where}: not an Avro schema: {avro!r}")
        kind = avro.get("type")
        if isinstance(kind, dict | list):  # {"type": {"type": "record", ...}}
            return self.schema(kind, namespace, where)
        out: dict[str, Any]
        if kind == "record":
            name = _full_name(str(avro["name"]), avro.get("namespace", namespace))
            inner = name.rsplit(".", 1)[0] if "." in name else None
            fields = []
            for f in avro.get("fields", []):
                schema, optional = self.optional(f["type"], inner, f"{where}.{f['name']}")
                fields.append({**schema, "field": f["name"], "optional": optional})
            out = {"type": "struct", "fields": fields}
            self.named[name] = out
        elif kind == "enum":
            out = {"type": "string"}
            self.named[_full_name(str(avro["name"]), avro.get("namespace", namespace))] = out
        elif kind == "fixed":
            out = {"type": "bytes"}
            self.named[_full_name(str(avro["name"]), avro.get("namespace", namespace))] = out
        elif kind == "array":
            items, optional = self.optional(avro["items"], namespace, f"{where}[]")
            out = {"type": "array", "items": {**items, "optional": optional}}
        elif kind == "map":
            values, optional = self.optional(avro["values"], namespace, f"{where}{{}}")
            out = {"type": "map", "keys": {"type": "string"}, "values": {**values, "optional": optional}}
        elif kind in _PRIMITIVES:
            out = {"type": avro.get("connect.type", _PRIMITIVES[kind])}
        else:
            raise SchemaError(f"{where}: unknown Avro type {kind!r}")
        logical = avro.get("logicalType")
        if "connect.name" in avro:
            out["name"] = avro["connect.name"]
        elif logical == "decimal":
            out["name"] = DECIMAL
        elif logical in _LOGICAL_NAMES:
            out["name"] = _LOGICAL_NAMES[logical]
        parameters = dict(avro.get("connect.parameters") or {})
        if logical == "decimal":
            parameters.setdefault("scale", str(avro.get("scale", 0)))
            parameters.setdefault("connect.decimal.precision", str(avro.get("precision", 38)))
        if parameters:
            out["parameters"] = parameters
        if "connect.version" in avro:
            out["version"] = avro["connect.version"]
        return out


def connect_schema(avro: Any) -> dict[str, Any]:
    """The Kafka Connect schema (as the JSON converter writes it) that an Avro schema was made from."""
    return _Converter().schema(avro, None, "value")


def decoding_schema(avro: Any) -> Any:
    """The writer schema without its logical types: the same binary encoding, decoded to primitives."""
    if isinstance(avro, list):
        return [decoding_schema(a) for a in avro]
    if not isinstance(avro, dict):
        return avro
    return {k: decoding_schema(v) for k, v in avro.items() if k != "logicalType"}


class AvroSchema:
    """An Avro writer schema from the registry (:class:`service.data.registry.WriterSchema`)."""

    def __init__(self, schema_id: int, text: str) -> None:
        self.schema_id = schema_id
        try:
            avro = json.loads(text)
        except ValueError:
            raise UnknownSchema(f"schema id {schema_id}: the registry's Avro schema is not JSON") from None
        try:
            self.connect = connect_schema(avro)
        except (KeyError, TypeError, AttributeError) as exc:  # not the shape of an Avro schema
            raise UnknownSchema(f"schema id {schema_id} is not a valid Avro schema: {exc!r}") from None
        plain = decoding_schema(avro)
        self.decoding_text = json.dumps(plain)  # what the native batch decoder reads with
        try:
            self._parsed = parse_schema(plain)
        except Exception as exc:  # fastavro's own errors for what is not valid Avro
            raise UnknownSchema(f"schema id {schema_id} is not a valid Avro schema: {exc}") from None

    def read(self, payload: bytes) -> tuple[dict[str, Any], dict[str, Any]]:
        stream = io.BytesIO(payload)
        try:
            value = schemaless_reader(stream, self._parsed, None)
        except Exception as exc:  # fastavro raises EOFError, ValueError, UnicodeDecodeError, ...
            raise BadRecord(
                f"the payload does not match schema id {self.schema_id}: {type(exc).__name__}: {exc}"
            ) from None
        if stream.tell() != len(payload):
            raise BadRecord(
                f"the payload does not match schema id {self.schema_id}: "
                f"{len(payload) - stream.tell()} bytes left after the record"
            )
        if not isinstance(value, dict):
            raise BadRecord(f"schema id {self.schema_id} is not a record schema")
        return value, self.connect


_CONNECT_PRIMITIVES = {
    "int8": "int",
    "int16": "int",
    "int32": "int",
    "int64": "long",
    "float": "float",
    "float32": "float",
    "float64": "double",
    "double": "double",
    "boolean": "boolean",
    "string": "string",
    "bytes": "bytes",
}


def avro_of_connect(connect: dict[str, Any], name: str) -> dict[str, Any]:
    """The Avro schema Kafka Connect's Avro converters write for a Connect schema (the inverse of
    :func:`connect_schema`, for what a Debezium envelope holds): optional as a union with null,
    Connect's names and parameters as annotations, a Decimal as Avro's decimal. ``name``: the full
    name of the top record; nested records are named after their field."""
    kind = connect["type"]
    out: dict[str, Any]
    if kind == "struct":
        fields = []
        for f in connect.get("fields", []):
            schema = avro_of_connect(f, f"{name}_{f['field']}")
            fields.append(
                {"name": f["field"], "type": ["null", schema], "default": None}
                if f.get("optional", True)
                else {"name": f["field"], "type": schema}
            )
        out = {"type": "record", "name": name.rsplit(".", 1)[-1], "fields": fields}
        if "." in name:
            out["namespace"] = name.rsplit(".", 1)[0]
    elif kind == "array":
        items = connect["items"]
        item = avro_of_connect(items, f"{name}_item")
        out = {"type": "array", "items": ["null", item] if items.get("optional", True) else item}
    elif kind in _CONNECT_PRIMITIVES:
        out = {"type": _CONNECT_PRIMITIVES[kind]}
        if kind in ("int8", "int16"):
            out["connect.type"] = kind
    else:
        raise SchemaError(f"{name}: Kafka Connect type {kind!r} has no Avro form here")
    if "name" in connect and kind != "struct":
        out["connect.name"] = connect["name"]
    if connect.get("parameters"):
        out["connect.parameters"] = dict(connect["parameters"])
    if connect.get("name") == DECIMAL:
        params = connect.get("parameters") or {}
        out.update(
            logicalType="decimal",
            scale=int(params.get("scale", 0)),
            precision=int(params.get("connect.decimal.precision", 38)),
        )
    return out


def avro_values(connect: dict[str, Any], value: Any) -> Any:
    """A JSON converter's value of ``connect`` as the Avro writer takes it: bytes from base64."""
    if value is None:
        return None
    kind = connect["type"]
    if kind == "bytes":
        return base64.b64decode(value)
    if kind == "struct":
        return {f["field"]: avro_values(f, value.get(f["field"])) for f in connect.get("fields", [])}
    if kind == "array":
        return [avro_values(connect["items"], v) for v in value]
    return value
