"""A sample source database's change stream, as Debezium JSON, with a model of the source table.

Used by the demo (``python -m service.sample``), the end-to-end tests and the benchmarks: the model
says exactly which rows the table must hold after the sink has caught up.
"""

from __future__ import annotations

import argparse
import base64
import json
import random
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any

from service.kafka.lookups import CLIENT_LOGGER
from service.kafka.metadata import NO_AUTO_CREATE

COUNTRIES = ("de", "fr", "us", "jp", "br", "in")
COLUMNS_SCHEMA = [
    {"field": "id", "type": "int64", "optional": False},
    {"field": "name", "type": "string", "optional": True},
    {"field": "country", "type": "string", "optional": True},
    {
        "field": "amount",
        "type": "bytes",
        "optional": True,
        "name": "org.apache.kafka.connect.data.Decimal",
        "parameters": {"scale": "2", "connect.decimal.precision": "10"},
    },
    {"field": "birthday", "type": "int32", "optional": True, "name": "io.debezium.time.Date"},
    {"field": "updated_at", "type": "int64", "optional": True, "name": "io.debezium.time.MicroTimestamp"},
    {"field": "active", "type": "boolean", "optional": True},
    {"field": "version", "type": "int32", "optional": True},
]
EPOCH = datetime(1970, 1, 1)


def _decimal_b64(value: Decimal, scale: int = 2) -> str:
    unscaled = int(value.scaleb(scale))
    length = max(1, (unscaled.bit_length() + 8) // 8)
    return base64.b64encode(unscaled.to_bytes(length, "big", signed=True)).decode()


def table_columns() -> list[dict[str, Any]]:
    """The sample table as ``table.columns`` configuration, for events without a schema section."""
    from service.model.columns import column_from_connect

    columns = [column_from_connect(field) for field in COLUMNS_SCHEMA]
    return [{"name": c.name, "type": str(c.type), "required": c.required} for c in columns]


def envelope_schema(table: str) -> dict[str, Any]:
    row = {"type": "struct", "optional": True, "name": f"{table}.Value", "fields": COLUMNS_SCHEMA}
    return {
        "type": "struct",
        "name": f"{table}.Envelope",
        "fields": [
            {**row, "field": "before"},
            {**row, "field": "after"},
            {"field": "op", "type": "string", "optional": False},
            {"field": "ts_ms", "type": "int64", "optional": True},
        ],
    }


@dataclass
class Change:
    key: dict[str, Any]
    value: dict[str, Any]
    op: str
    row: dict[str, Any] | None  # the row as a reader should see it (None for a delete)


@dataclass
class SampleSource:
    """A table of keyed rows under random inserts, updates, deletes and re-inserts."""

    keys: int = 1000
    seed: int = 7
    with_schema: bool = True
    table: str = "shop.public.customers"
    rows: dict[int, dict[str, Any]] = field(default_factory=dict)
    versions: dict[int, int] = field(default_factory=dict)
    rng: random.Random = field(init=False)
    clock: datetime = field(init=False, default=datetime(2026, 1, 1))

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def _row(self, key: int) -> dict[str, Any]:
        version = self.versions.get(key, 0) + 1
        self.versions[key] = version
        self.clock += timedelta(microseconds=self.rng.randint(1, 5_000_000))
        return {
            "id": key,
            "name": f"customer-{key}-v{version}",
            "country": self.rng.choice(COUNTRIES),
            "amount": Decimal(self.rng.randint(-99_999_99, 99_999_99)).scaleb(-2),
            "birthday": date(1950, 1, 1) + timedelta(days=self.rng.randint(0, 20000)),
            "updated_at": self.clock,
            "active": self.rng.random() < 0.8,
            "version": version,
        }

    def _wire(self, row: dict[str, Any] | None) -> dict[str, Any] | None:
        if row is None:
            return None
        return {
            **row,
            "amount": _decimal_b64(row["amount"]),
            "birthday": (row["birthday"] - date(1970, 1, 1)).days,
            "updated_at": (row["updated_at"] - EPOCH) // timedelta(microseconds=1),
        }

    def next_change(self, mix: tuple[float, float, float] = (0.25, 0.60, 0.15)) -> Change:
        """One change: insert (of a new or deleted key), update or delete, in the given proportions."""
        roll = self.rng.random()
        live = list(self.rows)
        if not live or roll < mix[0] or (len(live) < 2 and roll < mix[0] + mix[1]):
            key = self.rng.randrange(self.keys)
            op = "u" if key in self.rows else "c"
        elif roll < mix[0] + mix[1]:
            key, op = self.rng.choice(live), "u"
        else:
            key, op = self.rng.choice(live), "d"
        before = self.rows.get(key)
        after = None if op == "d" else self._row(key)
        if after is None:
            self.rows.pop(key, None)
        else:
            self.rows[key] = after
        payload = {
            "before": self._wire(before) if before else ({"id": key} if op == "d" else None),
            "after": self._wire(after),
            "op": op,
            "ts_ms": int((self.clock - EPOCH).total_seconds() * 1000),
            "source": {"table": self.table},
        }
        key_doc: dict[str, Any] = {"id": key}
        value: dict[str, Any]
        if self.with_schema:
            value = {"schema": envelope_schema(self.table), "payload": payload}
            key_doc = {"schema": {"type": "struct", "fields": [COLUMNS_SCHEMA[0]]}, "payload": key_doc}
        else:
            value = payload
        return Change(key=key_doc, value=value, op=op, row=after)

    def expected_rows(self) -> list[dict[str, Any]]:
        return [self.rows[k] for k in sorted(self.rows)]


def produce(
    bootstrap: str,
    topic: str,
    changes: list[Change] | list[tuple[bytes, bytes]],
    options: dict[str, str] | None = None,
) -> None:
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "enable.idempotence": True,
            "logger": CLIENT_LOGGER,
            **(options or {}),
        }
    )
    for change in changes:
        if isinstance(change, tuple):  # already encoded (Avro)
            producer.produce(topic, key=change[0], value=change[1])
        else:
            producer.produce(topic, key=json.dumps(change.key), value=json.dumps(change.value))
        producer.poll(0)
    remaining = producer.flush(60)
    if remaining:
        raise RuntimeError(f"{remaining} message(s) were not delivered to {topic}")


# What an Avro envelope of the sample carries beyond the schema section: the source's names (a sink of
# many tables routes by them, `table.identifier: demo.{source.table}`).
_SOURCE = {
    "type": "struct",
    "optional": False,
    "fields": [
        {"field": "db", "type": "string", "optional": True},
        {"field": "schema", "type": "string", "optional": True},
        {"field": "table", "type": "string", "optional": True},
    ],
}


def as_avro(changes: list[Change], table: str, registry_url: str, topic: str) -> list[tuple[bytes, bytes]]:
    """The changes as Debezium's Avro converter would write them: the Confluent wire format, keys and
    values, their schemas registered in the registry under ``<topic>-key`` and ``<topic>-value``."""
    import io
    import struct

    from fastavro import parse_schema, schemaless_writer

    from service.data.avro_schema import avro_of_connect, avro_values
    from service.data.registry import register

    envelope = envelope_schema(table)
    envelope = {**envelope, "fields": [*envelope["fields"], {**_SOURCE, "field": "source"}]}
    key = {"type": "struct", "fields": [COLUMNS_SCHEMA[0]]}
    schemas = {
        "value": (envelope, avro_of_connect(envelope, f"{table}.Envelope")),
        "key": (key, avro_of_connect(key, f"{table}.Key")),
    }
    ids = {side: register(registry_url, f"{topic}-{side}", avro) for side, (_, avro) in schemas.items()}
    parsed = {side: parse_schema(avro) for side, (_, avro) in schemas.items()}

    def encode(side: str, document: dict[str, Any]) -> bytes:
        connect = schemas[side][0]
        payload = document.get("payload", document)
        out = io.BytesIO()
        out.write(b"\x00" + struct.pack(">I", ids[side]))
        schemaless_writer(out, parsed[side], avro_values(connect, payload))
        return out.getvalue()

    return [(encode("key", c.key), encode("value", c.value)) for c in changes]


def ensure_topic(bootstrap: str, topic: str, partitions: int = 3) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap, **NO_AUTO_CREATE}, logger=CLIENT_LOGGER)
    info = admin.list_topics(topic, timeout=15).topics.get(topic)  # that topic's, not the cluster's
    if info is not None and info.error is None:
        return
    futures = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
    for future in futures.values():
        try:
            future.result(30)
        except Exception as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise


def main() -> None:
    p = argparse.ArgumentParser(description="Produce a sample table's Debezium change stream to Kafka.")
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--events", type=int, default=5000)
    p.add_argument("--keys", type=int, default=1000)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--partitions", type=int, default=3)
    p.add_argument("--no-schema", action="store_true", help="envelopes without the schema section")
    p.add_argument(
        "--table", default=SampleSource.table, help="the source table the events name (source.table)"
    )
    p.add_argument(
        "--format", choices=("json", "avro"), default="json", help="Debezium JSON, or Avro through --registry"
    )
    p.add_argument("--registry", help="with --format avro: the schema registry's Confluent-compatible URL")
    args = p.parse_args()
    if args.format == "avro" and not args.registry:
        p.error("--format avro needs --registry")
    source = SampleSource(keys=args.keys, seed=args.seed, with_schema=not args.no_schema, table=args.table)
    ensure_topic(args.bootstrap, args.topic, args.partitions)
    changes = [source.next_change() for _ in range(args.events)]
    if args.format == "avro":
        produce(args.bootstrap, args.topic, as_avro(changes, args.table, args.registry, args.topic))
    else:
        produce(args.bootstrap, args.topic, changes)
    ops = {op: sum(1 for c in changes if c.op == op) for op in "cud"}
    print(
        f"produced {len(changes)} changes to {args.topic} ({ops}); the source table now has "
        f"{len(source.rows)} rows"
    )


if __name__ == "__main__":
    main()
