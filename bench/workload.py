"""The standard workload: a keyed table's Debezium change stream, generated fast and produced to Kafka.

The table is the sample source's (``service.sample``: id, name, country, a decimal(10,2) amount, a date,
a microsecond timestamp, a boolean and an int version). Events carry no schema section (the sink gets
the columns from ``table.columns``), so an event is ~300 bytes of JSON, the size the targets talk about.

Unlike ``service.sample.SampleSource`` (which lists the live keys on every change), picking a live key
here is O(1), so millions of events generate in seconds. The generator keeps the same model: the final
rows (upsert) and every inserted/updated row (append), so a run can be checked by counting.
"""

from __future__ import annotations

import base64
import json
import random
import threading
import time
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from typing import Any

from service.sample import COUNTRIES, EPOCH

# table.columns of the sink (the events have no schema section)
COLUMNS: list[dict[str, Any]] = [
    {"name": "id", "type": "long", "required": True},
    {"name": "name", "type": "string"},
    {"name": "country", "type": "string"},
    {"name": "amount", "type": "decimal(10,2)"},
    {"name": "birthday", "type": "date"},
    {"name": "updated_at", "type": "timestamp"},
    {"name": "active", "type": "boolean"},
    {"name": "version", "type": "int"},
]
MIX = (0.25, 0.60, 0.15)  # inserts, updates, deletes
_BIRTHDAY0 = (date(1950, 1, 1) - date(1970, 1, 1)).days
_dumps = json.JSONEncoder(separators=(",", ":")).encode  # compact, as Kafka Connect's JSON converter


def _connect_decimal(unscaled: int) -> str:
    """Kafka Connect Decimal: base64 of the big-endian two's complement unscaled value."""
    length = max(1, (unscaled.bit_length() + 8) // 8)
    return base64.b64encode(unscaled.to_bytes(length, "big", signed=True)).decode()


@dataclass
class Event:
    key: bytes
    value: bytes
    op: str


@dataclass
class Workload:
    """N events over K keys; ``events`` holds the encoded Kafka records in order."""

    keys: int
    seed: int = 7
    events: list[Event] = field(default_factory=list)
    live: dict[int, dict[str, Any]] = field(default_factory=dict)
    appended: int = 0  # inserts + updates: the row count of an append-mode table
    _live_list: list[int] = field(default_factory=list)
    _pos: dict[int, int] = field(default_factory=dict)
    _versions: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.clock_us = (datetime(2026, 1, 1) - EPOCH) // timedelta(microseconds=1)

    # -- the model ---------------------------------------------------------------------------------

    def _add_live(self, key: int) -> None:
        if key not in self._pos:
            self._pos[key] = len(self._live_list)
            self._live_list.append(key)

    def _remove_live(self, key: int) -> None:
        i = self._pos.pop(key)
        last = self._live_list.pop()
        if last != key:
            self._live_list[i] = last
            self._pos[last] = i

    def _row(self, key: int) -> dict[str, Any]:
        """The row as it travels (Connect decimal, epoch days, epoch microseconds)."""
        rng = self.rng
        version = self._versions.get(key, 0) + 1
        self._versions[key] = version
        self.clock_us += rng.randint(1, 5_000_000)
        return {
            "id": key,
            "name": f"customer-{key}-v{version}",
            "country": COUNTRIES[rng.randrange(len(COUNTRIES))],
            "amount": _connect_decimal(rng.randint(-99_999_99, 99_999_99)),
            "birthday": rng.randint(0, 20000) + _BIRTHDAY0,
            "updated_at": self.clock_us,
            "active": rng.random() < 0.8,
            "version": version,
        }

    def next_event(self) -> Event:
        rng = self.rng
        roll = rng.random()
        live = self._live_list
        if not live or roll < MIX[0] or (len(live) < 2 and roll < MIX[0] + MIX[1]):
            key = rng.randrange(self.keys)
            op = "u" if key in self._pos else "c"
        elif roll < MIX[0] + MIX[1]:
            key, op = live[rng.randrange(len(live))], "u"
        else:
            key, op = live[rng.randrange(len(live))], "d"
        before = self.live.get(key)
        if op == "d":
            after = None
            self.live.pop(key, None)
            self._remove_live(key)
        else:
            after = self._row(key)
            self.live[key] = after
            self._add_live(key)
            self.appended += 1
        payload = {
            "before": before if before else ({"id": key} if op == "d" else None),
            "after": after,
            "op": op,
            "ts_ms": self.clock_us // 1000,
            "source": {"table": "shop.public.customers"},
        }
        return Event(
            key=json.dumps({"id": key}).encode(),
            value=_dumps(payload).encode(),
            op=op,
        )

    def generate(self, n: int) -> list[Event]:
        batch = [self.next_event() for _ in range(n)]
        self.events.extend(batch)
        return batch

    @property
    def value_bytes(self) -> int:
        return sum(len(e.value) for e in self.events)


# -- Kafka -------------------------------------------------------------------------------------------------


CREATED_TOPICS: list[str] = []  # every topic this process made: deleted when the bench ends


def ensure_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from service.sample import ensure_topic as ensure

    ensure(bootstrap, topic, partitions)
    CREATED_TOPICS.append(topic)


def delete_created_topics(bootstrap: str) -> None:
    """Delete the topics :func:`ensure_topic` made (a benchmark's million events each)."""
    from confluent_kafka.admin import AdminClient

    if not CREATED_TOPICS:
        return
    admin = AdminClient({"bootstrap.servers": bootstrap})  # alive until every future has its answer
    futures = admin.delete_topics(sorted(set(CREATED_TOPICS)))
    for topic, future in futures.items():
        try:
            future.result(timeout=30)
        except Exception as exc:  # the results are written already; say what is left behind
            print(f"could not delete topic {topic}: {exc}", flush=True)
    CREATED_TOPICS.clear()


def _producer(bootstrap: str) -> Any:
    from confluent_kafka import Producer

    return Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "batch.size": 1_000_000,
            "queue.buffering.max.messages": 1_000_000,
            "queue.buffering.max.kbytes": 1_048_576,
            "enable.idempotence": True,
        }
    )


def produce(bootstrap: str, topic: str, events: list[Event]) -> float:
    """Produce every event and wait for delivery; returns the seconds it took."""
    return produce_many(bootstrap, {topic: events})


def produce_many(bootstrap: str, events: dict[str, list[Event]]) -> float:
    """Produce each topic's events with one producer (a producer per topic waits for its
    connection and the topic's metadata each time) and wait for delivery; returns the seconds."""
    started = time.monotonic()
    producer = _producer(bootstrap)
    for topic, mine in events.items():
        for e in mine:
            while True:
                try:
                    producer.produce(topic, key=e.key, value=e.value)
                    break
                except BufferError:
                    producer.poll(0.05)
            producer.poll(0)
    if producer.flush(120):
        raise RuntimeError(f"events not delivered to {', '.join(events)}")
    return time.monotonic() - started


class SteadyProducer(threading.Thread):
    """Produces ``events`` at ``rate`` per second (in 20 ms slices) in the background."""

    def __init__(self, bootstrap: str, topic: str, events: list[Event], rate: float) -> None:
        super().__init__(daemon=True, name="steady-producer")
        self.bootstrap, self.topic, self.events, self.rate = bootstrap, topic, events, rate
        self.started_at: float | None = None  # wall clock
        self.finished_at: float | None = None
        self.behind_s = 0.0  # how far the producer fell behind its schedule at worst
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            producer = _producer(self.bootstrap)
            slice_s = 0.02
            per_slice = max(1, round(self.rate * slice_s))
            self.started_at = time.time()
            t0 = time.monotonic()
            for i in range(0, len(self.events), per_slice):
                due = t0 + (i / self.rate)
                now = time.monotonic()
                if due > now:
                    time.sleep(due - now)
                else:
                    self.behind_s = max(self.behind_s, now - due)
                for e in self.events[i : i + per_slice]:
                    producer.produce(self.topic, key=e.key, value=e.value)
                producer.poll(0)
            producer.flush(120)
            self.finished_at = time.time()
        except BaseException as exc:  # reported by the caller
            self.error = exc


def record_times(bootstrap: str, topic: str, timeout_s: float = 120) -> dict[int, list[tuple[int, float]]]:
    """Every record's (offset, Kafka timestamp in seconds) per partition, read back from the topic."""
    import uuid

    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"icesink-bench-{uuid.uuid4()}",
            "enable.auto.commit": False,
            "fetch.max.bytes": 52_428_800,
        }
    )
    try:
        meta = consumer.list_topics(topic, timeout=15).topics[topic]
        parts = sorted(meta.partitions)
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=15)[1] for p in parts}
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        out: dict[int, list[tuple[int, float]]] = {p: [] for p in parts}
        remaining = {p for p in parts if ends[p] > 0}
        deadline = time.monotonic() + timeout_s
        while remaining and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=10_000, timeout=1):
                p, offset = msg.partition(), msg.offset()
                if msg.error() or p is None or offset is None:
                    continue
                out[p].append((offset, msg.timestamp()[1] / 1000.0))
                if offset + 1 >= ends[p]:
                    remaining.discard(p)
        return out
    finally:
        consumer.close()


# -- the same events in Avro ------------------------------------------------------------------------------

# The workload's table as Debezium's Avro converter writes it (the Connect names carry the logical types).
_AVRO_ROW: dict[str, Any] = {
    "type": "record",
    "name": "Value",
    "namespace": "bench.customers",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "name", "type": ["null", "string"], "default": None},
        {"name": "country", "type": ["null", "string"], "default": None},
        {
            "name": "amount",
            "type": [
                "null",
                {
                    "type": "bytes",
                    "logicalType": "decimal",
                    "precision": 10,
                    "scale": 2,
                    "connect.name": "org.apache.kafka.connect.data.Decimal",
                    "connect.parameters": {"scale": "2", "connect.decimal.precision": "10"},
                },
            ],
            "default": None,
        },
        {
            "name": "birthday",
            "type": ["null", {"type": "int", "connect.name": "io.debezium.time.Date"}],
            "default": None,
        },
        {
            "name": "updated_at",
            "type": ["null", {"type": "long", "connect.name": "io.debezium.time.MicroTimestamp"}],
            "default": None,
        },
        {"name": "active", "type": ["null", "boolean"], "default": None},
        {"name": "version", "type": ["null", "int"], "default": None},
    ],
}
AVRO_KEY: dict[str, Any] = {
    "type": "record",
    "name": "Key",
    "namespace": "bench.customers",
    "fields": [{"name": "id", "type": "long"}],
}
AVRO_VALUE: dict[str, Any] = {
    "type": "record",
    "name": "Envelope",
    "namespace": "bench.customers",
    "fields": [
        {"name": "before", "type": ["null", _AVRO_ROW], "default": None},
        {"name": "after", "type": ["null", "Value"], "default": None},
        {"name": "op", "type": "string"},
        {"name": "ts_ms", "type": ["null", "long"], "default": None},
    ],
}


def as_avro(events: list[Event], registry_url: str, subject: str) -> list[Event]:
    """The same events in Avro, Confluent wire format, their schemas registered under ``subject``."""
    import io
    import struct

    from fastavro import parse_schema, schemaless_writer

    from service.data.registry import register

    key_id = register(registry_url, f"{subject}-key", AVRO_KEY)
    value_id = register(registry_url, f"{subject}-value", AVRO_VALUE)
    key_schema, value_schema = parse_schema(AVRO_KEY), parse_schema(AVRO_VALUE)

    def encode(schema: Any, schema_id: int, record: dict[str, Any]) -> bytes:
        out = io.BytesIO()
        out.write(b"\x00" + struct.pack(">I", schema_id))
        schemaless_writer(out, schema, record)
        return out.getvalue()

    def image(row: dict[str, Any] | None) -> dict[str, Any] | None:
        if row is None or "amount" not in row:
            return row if row is None else {"id": row["id"]}
        return {**row, "amount": base64.b64decode(row["amount"])}

    out = []
    for e in events:
        payload = json.loads(e.value)
        record = {
            "before": image(payload["before"]),
            "after": image(payload["after"]),
            "op": payload["op"],
            "ts_ms": payload["ts_ms"],
        }
        out.append(
            Event(encode(key_schema, key_id, json.loads(e.key)), encode(value_schema, value_id, record), e.op)
        )
    return out
