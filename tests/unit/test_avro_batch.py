"""The native Avro batch decoder (service/native, service/data/avro_batch.py) against the record-at-a-time
reader it stands in for: the same changes from the same records, value for value and type for type,
and the same records found bad. tests/sink/test_avro.py and test_avro_types.py run it against the
real registry and Debezium."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from fastavro import parse_schema, schemaless_writer

from service.data import avro_batch, registry_decode
from service.data.avro_schema import connect_schema
from service.data.registry import RegisteredSchema, UnknownSchema, framed
from service.model.columns import columns_from_envelope_schema


def _nullable(avro: Any) -> list[Any]:
    return ["null", avro]


COLUMNS: list[tuple[str, Any]] = [
    ("id", "long"),
    ("small", {"type": "int", "connect.type": "int16"}),
    ("i", "int"),
    ("f", "float"),
    ("d", "double"),
    ("flag", "boolean"),
    ("text", "string"),
    ("raw", "bytes"),
    ("fixed3", {"type": "fixed", "name": "F3", "size": 3}),
    ("amount", {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}),
    ("big", {"type": "bytes", "logicalType": "decimal", "precision": 30, "scale": 4}),
    (
        "any_scale",
        {
            "type": "record",
            "name": "VariableScaleDecimal",
            "connect.name": "io.debezium.data.VariableScaleDecimal",
            "fields": [{"name": "scale", "type": "int"}, {"name": "value", "type": "bytes"}],
        },
    ),
    ("day", {"type": "int", "logicalType": "date"}),
    ("t_ms", {"type": "int", "logicalType": "time-millis"}),
    ("t_us", {"type": "long", "logicalType": "time-micros"}),
    ("ts_ms", {"type": "long", "logicalType": "timestamp-millis"}),
    ("ts_us", {"type": "long", "connect.name": "io.debezium.time.MicroTimestamp"}),
    ("zoned", {"type": "string", "connect.name": "io.debezium.time.ZonedTimestamp"}),
    ("uid", {"type": "string", "logicalType": "uuid"}),
    ("mood", {"type": "enum", "name": "Mood", "symbols": ["SAD", "OK"]}),
    ("nums", {"type": "array", "items": _nullable("long")}),
    (
        "amounts",
        {"type": "array", "items": {"type": "bytes", "logicalType": "decimal", "precision": 6, "scale": 1}},
    ),
]


def _schema() -> dict[str, Any]:
    row = {
        "type": "record",
        "name": "Value",
        "fields": [
            {
                "name": name,
                "type": avro if name == "id" else _nullable(avro),
                **({} if name == "id" else {"default": None}),
            }
            for name, avro in COLUMNS
        ],
    }
    source = {
        "type": "record",
        "name": "Source",
        "fields": [
            {"name": "lsn", "type": _nullable("long"), "default": None},
            {"name": "ts_ms", "type": "long"},
            {"name": "snapshot", "type": _nullable("string"), "default": None},
        ],
    }
    return {
        "type": "record",
        "name": "Envelope",
        "namespace": "db.public.t",
        "fields": [
            {"name": "before", "type": _nullable(row), "default": None},
            {"name": "after", "type": _nullable("Value"), "default": None},
            {"name": "source", "type": source},
            {"name": "op", "type": "string"},
            {"name": "ts_ms", "type": _nullable("long"), "default": None},
        ],
    }


KEY = {
    "type": "record",
    "name": "Key",
    "namespace": "db.public.t",
    "fields": [{"name": "id", "type": "long"}],
}


def _unscaled(value: Decimal, scale: int) -> bytes:
    n = int(value.scaleb(scale))
    return n.to_bytes(max(1, (n.bit_length() + 8) // 8), "big", signed=True)


def _row(i: int) -> dict[str, Any]:
    full = i % 3 != 2  # every third row all null but its key
    return {
        "id": i,
        "small": -(i % 300) if full else None,
        "i": i * 7 if full else None,
        "f": 1.5 + i if full else None,
        "d": -2.25e100 if full else None,
        "flag": i % 2 == 0 if full else None,
        "text": f"ünï {i}" if full else None,
        "raw": bytes([i % 256, 0, 255]) if full else None,
        "fixed3": b"abc" if full else None,
        "amount": _unscaled(Decimal(i) / 100 - 5, 2) if full else None,
        "big": _unscaled(Decimal("12345678901234567890.1234") * (i + 1) % Decimal("1e25"), 4)
        if full
        else None,
        "any_scale": {"scale": 3, "value": _unscaled(Decimal("-1.5") * i, 3)} if full else None,
        "day": 18262 + i if full else None,
        "t_ms": 3_600_000 + i if full else None,
        "t_us": 3_600_000_000 + i if full else None,
        "ts_ms": 1_700_000_000_000 + i if full else None,
        "ts_us": 1_700_000_000_000_000 + i if full else None,
        "zoned": "2026-03-01T08:00:00.123Z" if full else None,
        "uid": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11" if full else None,
        "mood": ["SAD", "OK"][i % 2] if full else None,
        "nums": [i, None, -i] if full else None,
        "amounts": [_unscaled(Decimal("1.5"), 1), _unscaled(Decimal(-i), 1)] if full else None,
    }


def _write(schema: dict[str, Any], value: dict[str, Any], schema_id: int) -> bytes:
    out = io.BytesIO()
    schemaless_writer(out, parse_schema(schema), value)
    return framed(schema_id, out.getvalue())


class Registry:
    def __init__(self) -> None:
        self.schemas = {1: KEY, 2: _schema()}

    def schema(self, schema_id: int) -> RegisteredSchema:
        if schema_id not in self.schemas:
            raise UnknownSchema(f"schema id {schema_id} is not in the registry")
        return RegisteredSchema("AVRO", json.dumps(self.schemas[schema_id]))


def _records() -> tuple[list[bytes | None], list[bytes | None]]:
    schema = _schema()
    values: list[bytes | None] = []
    keys: list[bytes | None] = []
    for i in range(60):
        op = "crud"[i % 4] if i % 4 != 3 else "d"
        after = None if op == "d" else _row(i)
        before = {**{n: None for n, _ in COLUMNS}, "id": i} if op == "d" else None
        event = {
            "before": before,
            "after": after,
            "source": {"lsn": i, "ts_ms": 1, "snapshot": "false"},
            "op": op,
        }
        values.append(_write(schema, {**event, "ts_ms": 5}, 2))
        keys.append(_write(KEY, {"id": i}, 1))
    return values, keys


def _decode(values: list[bytes | None], keys: list[bytes | None]) -> registry_decode.AvroDecoded:
    registry = Registry()
    columns = columns_from_envelope_schema(connect_schema(registry.schemas[2]))
    kafka = pa.table(
        {"topic": ["t"] * len(values), "partition": [0] * len(values), "offset": range(len(values))}
    )
    schemas = registry_decode.Schemas(registry)  # type: ignore[arg-type]
    return registry_decode.decode(values, keys, kafka, columns, ["id"], schemas)


@pytest.fixture
def batches(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[int, int]]]:
    """Each call of the native decoder: (schema id, how many records it was given); values are of
    schema 2, keys of schema 1."""
    calls: list[tuple[int, int]] = []
    decode = avro_batch.decode

    def counted(schema_id: int, schema: str, values: list[bytes]) -> Any:
        calls.append((schema_id, len(values)))
        return decode(schema_id, schema, values)

    monkeypatch.setattr(avro_batch, "decode", counted)
    yield calls


def _one_by_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(avro_batch, "_native", None)


def test_the_native_decoder_is_built() -> None:
    assert avro_batch.available(), (
        "icesink_avrodec is not installed: scripts/bootstrap builds it with cargo (Rust >= 1.85); "
        "without it Avro is read a record at a time"
    )


def test_a_batch_decodes_to_the_same_changes_as_reading_record_by_record(
    batches: list[tuple[int, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    values, keys = _records()
    native = _decode(values, keys)
    assert batches == [(2, 60), (1, 15)], "the records in one batch, then the 15 deletes' keys in one"
    _one_by_one(monkeypatch)
    plain = _decode(values, keys)
    assert len(batches) == 2
    assert native.dead.num_rows == plain.dead.num_rows == 0, native.dead.column("error").to_pylist()
    assert native.decoded.rows.schema == plain.decoded.rows.schema
    assert native.decoded.rows.to_pylist() == plain.decoded.rows.to_pylist()
    assert native.decoded.by_op == plain.decoded.by_op == {"c": 15, "r": 15, "u": 15, "d": 15}
    assert native.decoded.schemas == plain.decoded.schemas and len(native.decoded.schemas) == 1


def test_a_delete_takes_its_key_from_the_record_key_when_its_before_image_has_none(
    batches: list[tuple[int, int]],
) -> None:
    schema = _schema()
    event = {"before": None, "after": None, "source": {"ts_ms": 1}, "op": "d", "ts_ms": 5}
    result = _decode([_write(schema, event, 2)], [_write(KEY, {"id": 41}, 1)])
    assert batches == [(2, 1), (1, 1)]
    assert result.decoded.rows.column("id").to_pylist() == [41]


def test_bad_records_are_the_same_dead_letters_either_way(
    batches: list[tuple[int, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    values, keys = _records()
    good = values[:6]
    assert all(v is not None for v in good)
    bad: list[bytes | None] = [
        good[0] + b"\x00",  # a byte left over
        good[1][:-4],  # cut short
        good[2][:5],  # the header alone
        good[3] + good[4][5:],  # two records in one value
        framed(9, b"\x02"),  # an unknown schema id
        b'{"op": "c"}',  # no header
    ]
    mixed = [*good, *bad, None]  # and a tombstone (of key 0)
    mixed_keys = [*keys[:6], *keys[:6], keys[0]]
    native = _decode(mixed, mixed_keys)
    assert batches == [(2, 10), (1, 1)], "the framed records of schema 2 went to the decoder together"
    _one_by_one(monkeypatch)
    plain = _decode(mixed, mixed_keys)
    for result in (native, plain):
        reasons = dict(
            zip(
                result.dead.column("offset").to_pylist(), result.dead.column("error").to_pylist(), strict=True
            )
        )
        assert sorted(reasons) == [6, 7, 8, 9, 10, 11], reasons
        assert "1 bytes left after the record" in reasons[6]
        assert all("does not match schema id 2" in reasons[o] for o in (7, 8, 9)), reasons
        assert "schema id 9 is not in the registry" in reasons[10]
        assert "not in the Confluent wire format" in reasons[11]
    assert native.decoded.rows.to_pylist() == plain.decoded.rows.to_pylist()
    assert native.decoded.rows.column("id").to_pylist() == [0, 1, 2, 3, 4, 5, 0]


def test_a_value_that_does_not_fit_its_column_is_isolated_in_the_batch(
    batches: list[tuple[int, int]],
) -> None:
    values, keys = _records()
    row = {**_row(1), "amount": _unscaled(Decimal("123456789.99"), 2)}  # 11 digits in decimal(10,2)
    event = {"before": None, "after": row, "source": {"ts_ms": 1}, "op": "c", "ts_ms": 5}
    result = _decode([*values[:4], _write(_schema(), event, 2)], keys[:5])
    assert batches == [(2, 5), (1, 1)]
    assert result.dead.column("offset").to_pylist() == [4]
    assert "a decimal out of range for decimal(10, 2)" in result.dead.column("error")[0].as_py()
    assert result.decoded.rows.num_rows == 4


def test_a_delete_whose_key_cannot_be_read_takes_its_key_from_its_before_image(
    batches: list[tuple[int, int]],
) -> None:
    schema = _schema()
    before = {**{n: None for n, _ in COLUMNS}, "id": 7}
    event = {"before": before, "after": None, "source": {"ts_ms": 1}, "op": "d", "ts_ms": 5}
    value = _write(schema, event, 2)
    keys: list[bytes | None] = [b'{"id": 7}', framed(9, b"\x0e"), _write(KEY, {"id": 7}, 1)[:-1]]
    result = _decode([value] * 3, keys)  # another converter's key, an unknown key id, a cut key
    assert batches == [(2, 3), (1, 1)], "the framed key of a known id went to the decoder"
    assert result.dead.num_rows == 0
    assert result.decoded.rows.column("id").to_pylist() == [7, 7, 7]


def test_a_delete_whose_key_has_no_header_asks_the_registry_nothing(batches: list[tuple[int, int]]) -> None:
    registry = Registry()
    asked: list[int] = []
    schema_of = registry.schema

    def schema(schema_id: int) -> RegisteredSchema:
        asked.append(schema_id)
        return schema_of(schema_id)

    registry.schema = schema  # type: ignore[method-assign]
    before = {**{n: None for n, _ in COLUMNS}, "id": 7}
    event = {"before": before, "after": None, "source": {"ts_ms": 1}, "op": "d", "ts_ms": 5}
    columns = columns_from_envelope_schema(connect_schema(registry.schemas[2]))
    kafka = pa.table({"topic": ["t"], "partition": [0], "offset": [0]})
    result = registry_decode.decode(
        [_write(_schema(), event, 2)],
        [b'{"id": 7}'],
        kafka,
        columns,
        ["id"],
        registry_decode.Schemas(registry),  # type: ignore[arg-type]
    )
    assert asked == [2], "only the value's schema was asked for"
    assert result.decoded.rows.column("id").to_pylist() == [7]


def test_a_truncate_and_a_rejected_section_give_the_same_reasons_either_way(
    batches: list[tuple[int, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    values, keys = _records()
    truncate = _write(
        _schema(), {"before": None, "after": None, "source": {"ts_ms": 1}, "op": "t", "ts_ms": 5}, 2
    )
    registry = Registry()
    columns = columns_from_envelope_schema(connect_schema(registry.schemas[2]))
    kafka = pa.table({"topic": ["t"] * 3, "partition": [0] * 3, "offset": range(3)})

    def run(rejected: dict[str, str] | None) -> registry_decode.AvroDecoded:
        schemas = registry_decode.Schemas(registry)  # type: ignore[arg-type]
        return registry_decode.decode(
            [values[0], truncate, values[1]], keys[:3], kafka, columns, ["id"], schemas, rejected=rejected
        )

    native = run(None)
    section = native.decoded.schemas[0]
    native_rejected = run({section: "the table refused this schema"})
    _one_by_one(monkeypatch)
    plain, plain_rejected = run(None), run({section: "the table refused this schema"})
    for a, b in ((native, plain), (native_rejected, plain_rejected)):
        assert a.dead.to_pylist() == b.dead.to_pylist()
        assert a.decoded.rows.to_pylist() == b.decoded.rows.to_pylist()
        assert a.decoded.schemas == b.decoded.schemas == [section]
    assert native.dead.column("offset").to_pylist() == [1]
    reasons = native_rejected.dead.column("error").to_pylist()
    assert reasons[0] == reasons[2] == "the table refused this schema" and reasons[1] != reasons[0]


def test_a_value_ending_in_its_own_header_is_read_alone_and_is_a_dead_letter(
    batches: list[tuple[int, int]],
) -> None:
    """The native decoder would take a full header after the record as the next record's start."""
    values, keys = _records()
    first = values[0]
    assert first is not None
    tailed = first + framed(2, b"")
    result = _decode([tailed, *values[1:4]], keys[:4])
    assert batches[0] == (2, 3), "the other three went to the native decoder"
    assert result.dead.column("offset").to_pylist() == [0]
    assert "5 bytes left after the record" in result.dead.column("error")[0].as_py()
    assert result.decoded.rows.num_rows == 3
