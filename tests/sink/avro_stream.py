"""A Debezium-shaped Avro stream produced from Python: envelopes of a small ``accounts`` table, their
writer schemas registered in the stack's schema registry, framed in the Confluent wire format.

What Debezium's Avro converter would write for a PostgreSQL table ``accounts (id bigint primary key,
name text, balance numeric(10,2)[, tier int])``: the key a record of ``id``, the value an envelope of
``before``/``after`` (one named record, referred to by name the second time), ``source`` (with the LSN)
and ``op``. Version 2 adds the optional ``tier`` column.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from tests import avro

BALANCE = {
    "type": "bytes",
    "logicalType": "decimal",
    "precision": 10,
    "scale": 2,
    "connect.name": "org.apache.kafka.connect.data.Decimal",
    "connect.version": 1,
    "connect.parameters": {"scale": "2", "connect.decimal.precision": "10"},
}


def _value_fields(version: int) -> list[dict[str, Any]]:
    fields: list[dict[str, Any]] = [
        {"name": "id", "type": "long"},
        {"name": "name", "type": ["null", "string"], "default": None},
        {"name": "balance", "type": ["null", BALANCE], "default": None},
    ]
    if version >= 2:
        fields.append(
            {"name": "tier", "type": ["null", {"type": "int", "connect.type": "int16"}], "default": None}
        )
    return fields


def envelope(namespace: str, version: int) -> dict[str, Any]:
    value = {"type": "record", "name": "Value", "namespace": namespace, "fields": _value_fields(version)}
    return {
        "type": "record",
        "name": "Envelope",
        "namespace": namespace,
        "connect.name": f"{namespace}.Envelope",
        "fields": [
            {"name": "before", "type": ["null", value], "default": None},
            {"name": "after", "type": ["null", "Value"], "default": None},
            {
                "name": "source",
                "type": {
                    "type": "record",
                    "name": "Source",
                    "namespace": "io.debezium.connector.postgresql",
                    "fields": [
                        {"name": "ts_ms", "type": "long"},
                        {"name": "lsn", "type": ["null", "long"], "default": None},
                    ],
                },
            },
            {"name": "op", "type": "string"},
            {"name": "ts_ms", "type": ["null", "long"], "default": None},
        ],
    }


def key_schema(namespace: str) -> dict[str, Any]:
    return {
        "type": "record",
        "name": "Key",
        "namespace": namespace,
        "fields": [{"name": "id", "type": "long"}],
    }


def unscaled(amount: Decimal) -> bytes:
    value = int(amount.scaleb(2))
    return value.to_bytes((value.bit_length() + 8) // 8, "big", signed=True)


@dataclass
class AccountsStream:
    """The records of one topic and the rows the source holds after them."""

    registry: str
    topic: str
    version: int = 1
    lsn: int = 1000
    rows: dict[int, dict[str, Any]] = field(default_factory=dict)
    ids: dict[str, int] = field(default_factory=dict)  # "key", "v1", "v2" → schema id

    def __post_init__(self) -> None:
        namespace = self.topic.replace("-", "_")
        self.schemas = {v: envelope(namespace, v) for v in (1, 2)}
        self.key = key_schema(namespace)
        self.ids["key"] = avro.register(self.registry, f"{self.topic}-key", self.key)
        self.ids["v1"] = avro.register(self.registry, f"{self.topic}-value", self.schemas[1])

    def evolve(self) -> None:
        """The source table gains the column ``tier``: version 2 of the value schema."""
        self.version = 2
        self.ids["v2"] = avro.register(self.registry, f"{self.topic}-value", self.schemas[2])

    def _image(self, row: dict[str, Any]) -> dict[str, Any]:
        image = {"id": row["id"], "name": row["name"], "balance": None}
        if row["balance"] is not None:
            image["balance"] = unscaled(row["balance"])
        if self.version >= 2:
            image["tier"] = row.get("tier")
        return image

    def _event(self, op: str, before: dict[str, Any] | None, after: dict[str, Any] | None) -> bytes:
        self.lsn += 1
        value = {
            "before": None if before is None else self._image(before),
            "after": None if after is None else self._image(after),
            "source": {"ts_ms": 1_700_000_000_000 + self.lsn, "lsn": self.lsn},
            "op": op,
            "ts_ms": 1_700_000_000_000 + self.lsn,
        }
        return avro.framed(self.ids[f"v{self.version}"], self.schemas[self.version], value)

    def key_of(self, key: int) -> bytes:
        return avro.framed(self.ids["key"], self.key, {"id": key})

    def upsert(
        self, key: int, name: str | None, balance: Decimal | None, tier: int | None = None
    ) -> list[tuple[bytes, bytes | None]]:
        before = copy.deepcopy(self.rows.get(key))
        row = {"id": key, "name": name, "balance": balance}
        if self.version >= 2:
            row["tier"] = tier
        self.rows[key] = row
        return [(self.key_of(key), self._event("u" if before else "c", before, row))]

    def delete(self, key: int) -> list[tuple[bytes, bytes | None]]:
        before = self.rows.pop(key)
        return [(self.key_of(key), self._event("d", before, None)), (self.key_of(key), None)]

    def expected(self) -> list[dict[str, Any]]:
        """The source's rows as the readers return them (every column of the newest version)."""
        out = []
        for row in self.rows.values():
            full = dict(row)
            if self.version >= 2:
                full.setdefault("tier", None)
            out.append(full)
        return out
