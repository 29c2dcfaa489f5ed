"""Kafka facts the driver needs outside Spark: partitions, end offsets, and a peek at the schema."""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

from service.channel.pending import Offsets
from service.config import KafkaConfig

logger = logging.getLogger(__name__)

# Java-client properties that librdkafka does not know; they are passed to Spark only.
_JAVA_ONLY = ("sasl.jaas.config", "ssl.truststore.", "ssl.keystore.", "sasl.login.", "sasl.client.callback")
EARLIEST = -2
LATEST = -1


class SourceError(RuntimeError):
    """Kafka can't be read as configured (unreachable broker, missing topic)."""


def client_config(kafka: KafkaConfig, **extra: Any) -> dict[str, Any]:
    options = {k: v for k, v in kafka.options.items() if not k.startswith(_JAVA_ONLY)}
    return {"bootstrap.servers": kafka.bootstrap_servers, **options, **extra}


def spark_options(kafka: KafkaConfig) -> dict[str, str]:
    return {
        "kafka.bootstrap.servers": kafka.bootstrap_servers,
        **{f"kafka.{k}": v for k, v in kafka.options.items()},
    }


def _consumer(kafka: KafkaConfig) -> Consumer:
    return Consumer(
        client_config(
            kafka,
            **{
                "group.id": f"icesink-admin-{uuid.uuid4()}",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
            },
        )
    )


def partitions(kafka: KafkaConfig, timeout_s: float = 15.0) -> dict[str, list[int]]:
    consumer = _consumer(kafka)
    try:
        result: dict[str, list[int]] = {}
        for topic in kafka.topics:
            try:
                meta = consumer.list_topics(topic, timeout=timeout_s)
            except KafkaException as exc:
                raise SourceError(f"Kafka at {kafka.bootstrap_servers} did not answer: {exc}") from None
            info = meta.topics.get(topic)
            if info is None or info.error is not None or not info.partitions:
                reason = info.error if info is not None and info.error is not None else "no partitions"
                raise SourceError(f"Kafka topic {topic!r} is not available ({reason})")
            result[topic] = sorted(info.partitions)
        return result
    finally:
        consumer.close()


def end_offsets(kafka: KafkaConfig, parts: dict[str, list[int]], timeout_s: float = 15.0) -> Offsets:
    consumer = _consumer(kafka)
    try:
        return {
            topic: {
                p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s)[1] for p in ps
            }
            for topic, ps in parts.items()
        }
    finally:
        consumer.close()


def starting_offsets(parts: dict[str, list[int]], committed: Offsets, default: str) -> str:
    """Spark's ``startingOffsets`` JSON: committed offsets, and the default for partitions never seen.

    Spark requires every partition of a subscribed topic to be listed when offsets are explicit.
    """
    fallback = EARLIEST if default == "earliest" else LATEST
    spec = {
        topic: {str(p): committed.get(topic, {}).get(p, fallback) for p in ps} for topic, ps in parts.items()
    }
    return json.dumps(spec)


def peek_schema(
    kafka: KafkaConfig, max_records: int = 1000, timeout_s: float = 10.0
) -> dict[str, Any] | None:
    """The ``schema`` section of the first event that has one, or None."""
    consumer = _consumer(kafka)
    try:
        consumer.subscribe(kafka.topics)
        seen = 0
        idle = 0
        while seen < max_records and idle < 3:
            messages = consumer.consume(num_messages=100, timeout=timeout_s / 3)
            if not messages:
                idle += 1
                continue
            for msg in messages:
                seen += 1
                raw = msg.value()
                if msg.error() or raw is None:
                    continue
                try:
                    event = json.loads(raw)
                except ValueError:
                    continue
                if isinstance(event, dict) and isinstance(event.get("schema"), dict):
                    schema: dict[str, Any] = event["schema"]
                    return schema
        return None
    finally:
        consumer.close()
