"""A real CDC source for tests: Debezium's PostgreSQL connector in the dev stack's Kafka Connect worker.

A test creates tables and runs DML in the source database (``ICESINK_CDC_DSN``, the stack's ``cdc``
database), registers a connector for its tables with :meth:`CdcSource.register`, waits until the
connector has published what it wrote (:meth:`Connector.wait_snapshot_done`,
:meth:`Connector.wait_for_events`), runs the sink, and compares the Iceberg table with ``SELECT *`` of
the source (:func:`differences`). :meth:`CdcSource.close` deletes the connectors, their replication
slots and publications, and the tables. docs/debezium.md shows the same connector configuration.
"""

from __future__ import annotations

import json
import math
import os
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, TypeVar
from uuid import UUID

import sqlalchemy as sa
from confluent_kafka import Consumer, KafkaException, TopicPartition

POSTGRES_CONNECTOR = "io.debezium.connector.postgresql.PostgresConnector"
JSON_CONVERTER = "org.apache.kafka.connect.json.JsonConverter"
AVRO_CONVERTER = "io.apicurio.registry.utils.converter.AvroConverter"
T = TypeVar("T")


def avro_converters(registry_url: str) -> dict[str, str]:
    """A connector's keys and values as Avro, Confluent wire format, through Apicurio's converter
    (it speaks Apicurio's own v2 API; the sink reads the Confluent-compatible one of the same server)."""
    base = registry_url.split("/apis/")[0]
    config = {"schema.name.adjustment.mode": "avro"}
    for side in ("key", "value"):
        config.update(
            {
                f"{side}.converter": AVRO_CONVERTER,
                f"{side}.converter.apicurio.registry.url": f"{base}/apis/registry/v2",
                f"{side}.converter.apicurio.registry.auto-register": "true",
                f"{side}.converter.apicurio.registry.find-latest": "true",
                f"{side}.converter.apicurio.registry.as-confluent": "true",
                f"{side}.converter.apicurio.registry.use-id": "contentId",
                f"{side}.converter.apicurio.registry.headers.enabled": "false",  # the id in the payload
            }
        )
    return config


class CdcError(AssertionError):
    """The CDC source did not get where a test needs it (reported as a test failure)."""


def poll(what: str, probe: Callable[[], T | None], timeout: float, interval: float = 0.5) -> T:
    """``probe()`` until it returns something other than None; CdcError naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        result = probe()
        if result is not None:
            return result
        if time.monotonic() > deadline:
            raise CdcError(f"{what}: not within {timeout:.0f}s")
        time.sleep(interval)


@dataclass
class Connector:
    """One registered Debezium connector (its name is also its slot, publication and topic prefix)."""

    source: CdcSource
    name: str
    config: dict[str, str]
    tables: list[str]

    def topic(self, table: str) -> str:
        """The topic of ``schema.table``: Debezium names it ``<topic.prefix>.<schema>.<table>``."""
        return f"{self.config['topic.prefix']}.{table}"

    def status(self) -> dict[str, Any]:
        return self.source.request("GET", f"/connectors/{self.name}/status")

    def wait_running(self, timeout: float = 60) -> None:
        """The connector and its task are RUNNING; a FAILED one fails at once with its trace."""

        def probe() -> bool | None:
            status = self.status()
            states = [status["connector"], *status.get("tasks", [])]
            failed = [s for s in states if s.get("state") == "FAILED"]
            if failed:
                raise CdcError(f"connector {self.name} FAILED:\n{failed[0].get('trace', '')[:4000]}")
            running = len(states) > 1 and all(s.get("state") == "RUNNING" for s in states)
            return True if running else None

        poll(f"connector {self.name} RUNNING", probe, timeout)

    def committed_offset(self) -> dict[str, Any] | None:
        """The source offset Kafka Connect has committed, i.e. for records Kafka acknowledged."""
        offsets = self.source.request("GET", f"/connectors/{self.name}/offsets").get("offsets", [])
        return offsets[0]["offset"] if offsets else None

    def wait_snapshot_done(self, timeout: float = 60) -> None:
        """The initial snapshot is read and in Kafka, and the connector streams from the slot.

        A committed offset of the snapshot carries ``snapshot_completed`` (true on its last record), a
        streaming one has no ``snapshot`` key; the connector's heartbeats commit a streaming offset even
        when the snapshot was empty and nothing changed since. Offsets are committed only up to records
        Kafka acknowledged, so every snapshot record is in the topic by then.
        """
        self.wait_running(timeout)

        def probe() -> bool | None:
            offset = self.committed_offset()
            if offset is None:
                return None
            return True if "snapshot" not in offset or offset.get("snapshot_completed") else None

        poll(f"connector {self.name}: snapshot committed", probe, timeout)

    def wait_for_events(self, table: str, count: int, timeout: float = 60) -> int:
        """Wait until the topic of ``schema.table`` holds at least `count` records (tombstones included)."""
        topic = self.topic(table)
        consumer = Consumer(
            {"bootstrap.servers": self.source.kafka_bootstrap, "group.id": f"cdc-{self.name}"}
        )
        try:

            def probe() -> int | None:
                try:
                    meta = consumer.list_topics(topic, timeout=5).topics.get(topic)
                except KafkaException:
                    return None
                if meta is None or meta.error is not None or not meta.partitions:
                    return None
                total = 0
                for partition in meta.partitions:
                    try:
                        low, high = consumer.get_watermark_offsets(
                            TopicPartition(topic, partition), timeout=5
                        )
                    except KafkaException:  # a topic Debezium just created may not have its leader yet
                        return None
                    total += high - low
                return total if total >= count else None

            return poll(f"{count} records in {topic}", probe, timeout)
        finally:
            consumer.close()

    def delete(self) -> None:
        """Delete the connector, then its replication slot (once its task let go of it) and publication."""
        try:
            self.source.request("DELETE", f"/connectors/{self.name}")
        except CdcError as exc:
            if "404" not in str(exc):
                raise
        slot = self.config["slot.name"]

        def drop_slot() -> bool | None:
            with self.source.engine.begin() as conn:
                active = conn.execute(
                    sa.text("SELECT active FROM pg_replication_slots WHERE slot_name = :s"), {"s": slot}
                ).scalar()
                if active is None:
                    return True
                if active:
                    return None
                conn.execute(sa.text("SELECT pg_drop_replication_slot(:s)"), {"s": slot})
                return True

        poll(f"replication slot {slot} released by the deleted connector", drop_slot, 30)
        self.source.execute(f'DROP PUBLICATION IF EXISTS "{self.config["publication.name"]}"')


@dataclass
class CdcSource:
    """The stack's source database and Kafka Connect worker."""

    connect_uri: str
    dsn: str  # SQLAlchemy URL of the source database
    kafka_bootstrap: str
    connectors: list[Connector] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.engine = sa.create_engine(self.dsn, pool_size=2)

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """A Kafka Connect REST call; an error answer raises CdcError with the worker's message."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            f"{self.connect_uri}{path}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json", "Accept": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                text = resp.read().decode()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            raise CdcError(f"{method} {path}: HTTP {exc.code} {detail[:2000]}") from None
        except OSError as exc:
            raise CdcError(f"Kafka Connect at {self.connect_uri} ({method} {path}): {exc}") from None
        return json.loads(text) if text else None

    def problems(self) -> list[str]:
        """What keeps this source from capturing changes (empty when it is ready)."""
        found = []
        try:
            plugins = self.request("GET", "/connector-plugins")
            if not any(p.get("class") == POSTGRES_CONNECTOR for p in plugins):
                found.append(f"Kafka Connect at {self.connect_uri} does not list {POSTGRES_CONNECTOR}")
        except CdcError as exc:
            found.append(str(exc))
        try:
            with self.engine.connect() as conn:
                wal_level = conn.execute(sa.text("SHOW wal_level")).scalar()
            if wal_level != "logical":
                found.append(
                    f"the source Postgres runs with wal_level={wal_level}, Debezium needs logical "
                    "(it was started by an older dev/stack: `dev/stack restart postgres`)"
                )
        except sa.exc.SQLAlchemyError as exc:
            found.append(f"source database {self.engine.url!r}: {exc}")
        return found

    def execute(self, *statements: str, params: dict[str, Any] | None = None) -> None:
        """Run SQL statements in one transaction of the source database."""
        with self.engine.begin() as conn:
            for statement in statements:
                conn.execute(sa.text(statement), params or {})

    def query(self, statement: str) -> list[dict[str, Any]]:
        """Run one statement in its own transaction; its rows (e.g. of ``RETURNING *``) as psycopg
        returns the values."""
        with self.engine.begin() as conn:
            return [dict(row._mapping) for row in conn.execute(sa.text(statement))]

    def rows(self, table: str) -> list[dict[str, Any]]:
        """``SELECT *`` of ``schema.table`` (quoted as given)."""
        schema, name = table.split(".", 1)
        return self.query(f'SELECT * FROM "{schema}"."{name}"')

    def records(self, topic: str, timeout: float = 30) -> list[tuple[bytes | None, bytes | None]]:
        """Every (key, value) record the topic holds, partition by partition in offset order."""
        consumer = Consumer(
            {
                "bootstrap.servers": self.kafka_bootstrap,
                "group.id": f"read-{topic}",
                "enable.auto.commit": False,
            }
        )
        try:
            partitions = sorted(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
            ends = {
                p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10) for p in partitions
            }
            consumer.assign([TopicPartition(topic, p, low) for p, (low, _) in ends.items()])
            found: dict[int, list[tuple[int, bytes | None, bytes | None]]] = {p: [] for p in partitions}
            deadline = time.monotonic() + timeout
            while sum(map(len, found.values())) < sum(high - low for low, high in ends.values()):
                if time.monotonic() > deadline:
                    raise CdcError(f"{topic}: read {sum(map(len, found.values()))} records, expected {ends}")
                for message in consumer.consume(500, timeout=1):
                    partition, offset = message.partition(), message.offset()
                    if message.error() is None and partition is not None and offset is not None:
                        found[partition].append((offset, message.key(), message.value()))
            return [(k, v) for p in partitions for _, k, v in sorted(found[p], key=lambda r: r[0])]
        finally:
            consumer.close()

    def connector_config(
        self,
        name: str,
        tables: Iterable[str],
        *,
        schemas: bool = True,
        decimal_mode: str = "precise",
        partitions: int = 3,
        avro_registry: str | None = None,
        **extra: str,
    ) -> dict[str, str]:
        """A Debezium PostgreSQL connector for `tables` (``schema.table``), as docs/debezium.md shows it.

        `name` is also the topic prefix, the replication slot and the publication (Debezium creates it
        for exactly these tables). `schemas` is the JSON converters' schemas.enable for keys and values;
        `decimal_mode` is Debezium's decimal.handling.mode (precise, string or double).
        `avro_registry` (the registry's Confluent-compatible URL): keys and values as Avro in the
        Confluent wire format through Apicurio's converter instead (docs/avro.md shows the same).
        """
        url = self.engine.url
        config = {
            "connector.class": POSTGRES_CONNECTOR,
            "tasks.max": "1",
            "plugin.name": "pgoutput",
            "database.hostname": url.host or "127.0.0.1",
            "database.port": str(url.port or 5432),
            "database.user": url.username or "",
            "database.password": url.password or "",
            "database.dbname": url.database or "",
            "topic.prefix": name,
            "table.include.list": ",".join(tables),
            "slot.name": name,
            "publication.name": name,
            "publication.autocreate.mode": "filtered",
            "snapshot.mode": "initial",
            "decimal.handling.mode": decimal_mode,
            "key.converter": JSON_CONVERTER,
            "key.converter.schemas.enable": str(schemas).lower(),
            "value.converter": JSON_CONVERTER,
            "value.converter.schemas.enable": str(schemas).lower(),
            "heartbeat.interval.ms": "1000",
            "topic.creation.default.partitions": str(partitions),
            "topic.creation.default.replication.factor": "1",
        }
        if avro_registry is not None:
            config.update(avro_converters(avro_registry))
        return {**config, **extra}

    def register(self, name: str, tables: list[str], **options: Any) -> Connector:
        """Register a connector (see :meth:`connector_config`) and wait until it runs."""
        config = self.connector_config(name, tables, **options)
        connector = Connector(self, name, config, list(tables))
        self.connectors.append(connector)
        self.request("POST", "/connectors", {"name": name, "config": config})
        connector.wait_running()
        return connector

    def close(self) -> None:
        """Delete every connector registered here (slots, publications) and drop its tables."""
        try:
            for connector in self.connectors:
                connector.delete()
                for table in connector.tables:
                    schema, name = table.split(".", 1)
                    self.execute(f'DROP TABLE IF EXISTS "{schema}"."{name}"')
        finally:
            self.engine.dispose()


CORPUS = Path(__file__).parent / "sink" / "corpus"


def write_corpus(
    name: str,
    description: str,
    key: list[str],
    records: list[tuple[bytes | None, bytes | None]],
    **header: Any,
) -> None:
    """With ``ICESINK_WRITE_CORPUS=1``, save a connector's records as ``tests/sink/corpus/<name>.jsonl``
    (see the folder's README); otherwise do nothing."""
    if os.environ.get("ICESINK_WRITE_CORPUS") != "1":
        return
    lines = [json.dumps({"description": description, "key": key, **header})]
    lines += [
        json.dumps({"key": None if k is None else k.decode(), "value": None if v is None else v.decode()})
        for k, v in records
    ]
    (CORPUS / f"{name}.jsonl").write_text("\n".join(lines) + "\n")


def differences(
    source: list[dict[str, Any]], table: list[dict[str, Any]], key: str | None, reader: str
) -> list[str]:
    """Value-by-value differences between rows of the source and a reader's rows of the table.

    With a `key` (upsert mode) rows are matched by it; without one (append mode, where a key has a row
    per version) the two must hold the same rows the same number of times. Values must be equal and
    of the same Python type. A timestamptz is compared as an instant: pyspark returns it as a naive
    datetime in the local time of its process, which ``astimezone`` reads as such. A uuid is compared
    as its text: Spark has no UUID type and returns the text. Bytes are compared as ``bytes`` (Spark
    returns a bytearray). Lists (PostgreSQL arrays) are compared
    element by element, in order, with the same rules.
    """
    zoned = {c for row in source for c, v in row.items() if _is_zoned(v)}

    def normal(v: Any, zoned: bool) -> Any:
        if isinstance(v, list):
            return [normal(e, zoned) for e in v]
        if zoned and isinstance(v, datetime):
            return v.astimezone(UTC)
        if isinstance(v, bytearray | memoryview):
            return bytes(v)
        return str(v) if isinstance(v, UUID) else v

    def comparable(row: dict[str, Any]) -> dict[str, Any]:
        return {c: normal(v, c in zoned) for c, v in row.items()}

    want, got = [comparable(r) for r in source], [comparable(r) for r in table]
    if key is None:
        missing, extra = Counter(map(_fingerprint, want)), Counter(map(_fingerprint, got))
        missing, extra = missing - extra, extra - missing
        return [f"{reader}: missing {dict(row)}" for row in missing.elements()] + [
            f"{reader}: unexpected {dict(row)}" for row in extra.elements()
        ]
    wanted, read = {row[key]: row for row in want}, {row[key]: row for row in got}
    found = []
    if len(read) != len(got):
        found.append(f"{reader}: {len(got) - len(read)} duplicate key(s)")
    found += [f"{reader}: missing {key}={k}: {wanted[k]}" for k in sorted(wanted.keys() - read.keys())]
    found += [f"{reader}: unexpected {key}={k}: {read[k]}" for k in sorted(read.keys() - wanted.keys())]
    for k in sorted(wanted.keys() & read.keys()):
        expected, actual = wanted[k], read[k]
        if set(expected) != set(actual):
            found.append(f"{reader}: {key}={k}: columns {sorted(actual)} != source {sorted(expected)}")
            continue
        found += [
            f"{reader}: {key}={k} {column}: source {value!r}, table {actual[column]!r}"
            for column, value in expected.items()
            if not _same(value, actual[column])
        ]
    return found


def _same(expected: Any, actual: Any) -> bool:
    """Equal and of the same Python type, element by element for lists (a NaN is the same as a NaN)."""
    if isinstance(expected, list) and isinstance(actual, list):
        return len(expected) == len(actual) and all(map(_same, expected, actual))
    if isinstance(expected, float) and isinstance(actual, float) and math.isnan(expected):
        return math.isnan(actual)
    return bool(expected == actual) and type(expected) is type(actual)


def _is_zoned(value: Any) -> bool:
    """A timestamptz, or a list holding one."""
    if isinstance(value, list):
        return any(_is_zoned(v) for v in value)
    return isinstance(value, datetime) and value.tzinfo is not None


def _fingerprint(row: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    """A row as a hashable value that tells types apart (1 and 1.0, Decimal('1.1') and '1.1') but, like
    ``==``, not a decimal's scale (Decimal('1.5') and Decimal('1.50')), in lists too."""

    def token(value: Any) -> str:
        if isinstance(value, list):
            return f"list:[{', '.join(map(token, value))}]"
        if isinstance(value, Decimal):
            value = value.normalize()
        return f"{type(value).__name__}:{value!r}"

    return tuple(sorted((column, token(value)) for column, value in row.items()))
