"""Kafka facts the driver needs outside Spark: partitions, end offsets, and a peek at the schema."""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient

from service.config import KafkaConfig
from service.kafka import metadata
from service.kafka.metadata import NO_AUTO_CREATE
from service.model.offsets import Offsets

logger = logging.getLogger(__name__)
# librdkafka's own log lines go through Python logging (JSON when configured), never raw to stderr.
# They are delivered when a client polls; what is left unpolled when a client closes is dropped.
CLIENT_LOGGER = logging.getLogger("icesink.kafka")

# Java-client properties that librdkafka does not know; they are passed to Spark only.
_JAVA_ONLY = ("sasl.jaas.config", "ssl.truststore.", "ssl.keystore.", "sasl.login.", "sasl.client.callback")

# (topic, partition) → (earliest offset, end offset)
Watermarks = dict[tuple[str, int], tuple[int, int]]


class SourceError(RuntimeError):
    """Kafka can't be read as configured (unreachable broker, missing topic)."""


_JAAS_FIELD = re.compile(r'\b(username|password)\s*=\s*"((?:[^"\\]|\\.)*)"')


def jaas_credentials(jaas: str) -> dict[str, str]:
    """``sasl.username``/``sasl.password`` from a Java client's ``sasl.jaas.config`` for PLAIN or
    SCRAM (``...LoginModule required username="u" password="p";``), so that one set of client
    properties serves Spark's source and librdkafka alike; other login modules map to nothing."""
    if "PlainLoginModule" not in jaas and "ScramLoginModule" not in jaas:
        return {}
    fields = {k: v.replace('\\"', '"').replace("\\\\", "\\") for k, v in _JAAS_FIELD.findall(jaas)}
    return {f"sasl.{k}": fields[k] for k in ("username", "password") if k in fields}


def client_config(kafka: KafkaConfig, **extra: Any) -> dict[str, Any]:
    """librdkafka's properties: ``kafka.options`` without the Java client's own, whose PLAIN or SCRAM
    credentials in ``sasl.jaas.config`` become ``sasl.username``/``sasl.password`` (unless given)."""
    options = {k: v for k, v in kafka.options.items() if not k.startswith(_JAVA_ONLY)}
    jaas = kafka.options.get("sasl.jaas.config")
    mapped = {k: v for k, v in jaas_credentials(jaas).items() if k not in options} if jaas else {}
    return {
        "bootstrap.servers": kafka.bootstrap_servers,
        "logger": CLIENT_LOGGER,
        **mapped,
        **options,
        **extra,
    }


def task_client(kafka: KafkaConfig) -> dict[str, Any]:
    """The librdkafka properties a Spark task reads its offset range with (service.kafka.reader):
    the client's, at the sink's isolation level, without the logger object, which stays here."""
    options = client_config(kafka, **{"isolation.level": kafka.isolation_level}, **NO_AUTO_CREATE)
    options.pop("logger")
    return options


# Spark's tasks read bounded offset ranges, and the broker holds a fetch that finds no new data for
# fetch.max.wait.ms (500 ms by default): a read of a partition paid it once or more, and a task that
# reads many small partitions one after the other (a sink of many topics, whose partitions are
# coalesced into few tasks) paid it for each. Measured: 100 one-partition topics, 30,000 records, read
# in 2 tasks: 26 s with the default, 1.8 s with 10 ms. A bounded read has nothing to wait for;
# ``kafka.options`` may still set it.
SPARK_FETCH_MAX_WAIT_MS = "10"


def spark_options(kafka: KafkaConfig) -> dict[str, str]:
    """Options for Spark's Kafka source: the client properties as ``kafka.<key>``, and the isolation level."""
    return {
        "kafka.bootstrap.servers": kafka.bootstrap_servers,
        "kafka.fetch.max.wait.ms": SPARK_FETCH_MAX_WAIT_MS,
        **{f"kafka.{k}": v for k, v in kafka.options.items()},
        "kafka.isolation.level": kafka.isolation_level,
    }


def consumer(kafka: KafkaConfig, purpose: str = "admin", isolation_level: str | None = None) -> Consumer:
    """A consumer for offsets and peeks, in a group of its own, at the sink's isolation level unless
    told otherwise.

    With read_committed the high watermark it reports is the last stable offset: the end of what
    the sink can read, past committed transactions and their markers, short of an open transaction.
    """
    return Consumer(
        client_config(
            kafka,
            **{
                "group.id": f"icesink-{purpose}-{uuid.uuid4()}",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "isolation.level": isolation_level or kafka.isolation_level,
                **NO_AUTO_CREATE,
            },
        )
    )


def admin(kafka: KafkaConfig) -> AdminClient:
    return AdminClient(client_config(kafka, **NO_AUTO_CREATE))


def partitions(kafka: KafkaConfig, timeout_s: float = 15.0) -> dict[str, list[int]]:
    """The partitions of every topic the sink reads: those listed (each must exist), or every topic
    the pattern matches now (none is fine: topics created later are read when they appear)."""
    named = None if kafka.topic_pattern is not None else kafka.topics
    try:
        found = metadata.partitions(admin(kafka), named, timeout_s)
    except KafkaException as exc:
        raise SourceError(f"Kafka at {kafka.bootstrap_servers} did not answer: {exc}") from None
    if named is None:
        return {
            name: ps for name, ps in sorted(found.items()) if kafka.reads(name) and not name.startswith("__")
        }
    for topic in named:
        if topic not in found:
            raise SourceError(f"Kafka topic {topic!r} is not available (unknown topic or no partitions)")
    return found


def topic_ids(client: AdminClient, topics: list[str], timeout_s: float = 15.0) -> dict[str, str]:
    """Each topic's id: a topic deleted and re-created under the same name gets a new one."""
    futures = client.describe_topics(TopicCollection(list(topics)), request_timeout=timeout_s)
    try:
        return {topic: str(future.result(timeout_s).topic_id) for topic, future in futures.items()}
    except KafkaException as exc:
        raise SourceError(f"Kafka could not describe the topics {topics}: {exc}") from None


def watermarks(client: Consumer, parts: Mapping[str, list[int]], timeout_s: float = 15.0) -> Watermarks:
    """(earliest, end) offset per topic-partition; the end is the last stable offset under read_committed."""
    out: Watermarks = {}
    for topic, ps in parts.items():
        for p in ps:
            low, high = client.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s)
            out[(topic, p)] = (int(low), int(high))
    return out


def end_offsets(kafka: KafkaConfig, parts: Mapping[str, list[int]], timeout_s: float = 15.0) -> Offsets:
    """Where each partition ends (the last stable offset under read_committed)."""
    return _offsets(kafka, parts, timeout_s, end=True)


def earliest_offsets(kafka: KafkaConfig, parts: Mapping[str, list[int]], timeout_s: float = 15.0) -> Offsets:
    """The first offset each partition still holds."""
    return _offsets(kafka, parts, timeout_s, end=False)


def _offsets(kafka: KafkaConfig, parts: Mapping[str, list[int]], timeout_s: float, end: bool) -> Offsets:
    client = consumer(kafka)
    try:
        marks = watermarks(client, parts, timeout_s)
    finally:
        client.close()
    result: Offsets = {}
    for (topic, p), (low, high) in marks.items():
        result.setdefault(topic, {})[p] = high if end else low
    return result


@dataclass(frozen=True)
class Peek:
    """What the first records of some topics say: a schema section, the Debezium source, the key's fields."""

    schema: dict[str, Any] | None = None
    source: dict[str, str] = field(default_factory=dict)  # db, schema, table of the first event with one
    key_fields: list[str] = field(default_factory=list)  # the record key's field names, when it has any


# How a record's key or value reads as the JSON converter's ``{"schema", "payload"}`` (or a bare
# payload): json.loads for Debezium JSON; for Avro, service.data.registry_decode.Schemas.as_json_event.
# Raises ValueError for what is not such a record.
Parse = Callable[[bytes], Any]


def _key_fields(raw: bytes | None, parse: Parse = json.loads) -> list[str]:
    """A Debezium record key's fields: from its schema section, else the payload's names."""
    try:
        key = parse(raw) if raw else None
    except ValueError:
        return []
    if isinstance(key, dict) and isinstance(key.get("schema"), dict):
        fields = key["schema"].get("fields") or []
        return [f["field"] for f in fields if isinstance(f, dict) and "field" in f]
    if isinstance(key, dict) and isinstance(key.get("payload"), dict):
        return list(key["payload"])
    return list(key) if isinstance(key, dict) else []


def peek(
    kafka: KafkaConfig,
    topics: list[str],
    max_records: int = 1000,
    timeout_s: float = 10.0,
    parse: Parse = json.loads,
) -> Peek:
    """Read the first records of ``topics`` until a change event with a schema section is found.

    The topics' partitions are assigned, not subscribed to: a subscription joins a consumer group,
    which the broker holds for ``group.initial.rebalance.delay.ms`` (3 s by default) — per peek, and a
    sink of many topics peeks at each. The read stops where each partition ends, rather than waiting
    for records that may never come.
    """
    client = consumer(kafka, "peek")
    found = Peek()
    try:
        parts = metadata.partitions(admin(kafka), topics, timeout_s)
        ends = {tp: high for tp, (low, high) in watermarks(client, parts, timeout_s).items() if high > low}
        if not ends:
            return found
        client.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t, p in ends])
        seen = 0
        deadline = time.monotonic() + timeout_s
        while ends and seen < max_records and time.monotonic() < deadline:
            messages = client.consume(num_messages=100, timeout=0.5)
            if not messages:  # past the last records (transaction markers take offsets too)?
                done = client.position([TopicPartition(t, p) for t, p in ends])
                ends = {
                    (tp.topic, tp.partition): ends[(tp.topic, tp.partition)]
                    for tp in done
                    if tp.offset < ends[(tp.topic, tp.partition)]
                }
                continue
            for msg in messages:
                seen += 1
                raw = msg.value()
                if msg.error() or raw is None:
                    continue
                try:
                    event = parse(raw)
                except ValueError:
                    continue
                if not isinstance(event, dict):
                    continue
                payload = event.get("payload") if isinstance(event.get("payload"), dict) else event
                source = payload.get("source") if isinstance(payload, dict) else None
                if not found.source and isinstance(source, dict):
                    names = {
                        k: str(source[k]) for k in ("db", "schema", "table") if source.get(k) is not None
                    }
                    found = Peek(found.schema, names, found.key_fields or _key_fields(msg.key(), parse))
                if not found.key_fields and (fields := _key_fields(msg.key(), parse)):
                    found = Peek(found.schema, found.source, fields)
                if isinstance(event.get("schema"), dict):
                    return Peek(event["schema"], found.source, found.key_fields)
                where = (str(msg.topic()), int(msg.partition() or 0))
                if int(msg.offset() or 0) + 1 >= ends.get(where, 0):
                    ends.pop(where, None)
        return found
    finally:
        client.close()
