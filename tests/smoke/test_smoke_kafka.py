"""Kafka: produce and consume with confluent-kafka; read the same topic with Spark's Kafka source."""

from __future__ import annotations

from collections.abc import Callable

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from pyspark.sql import SparkSession


def _produce(bootstrap: str, topic: str, messages: list[tuple[bytes, bytes]]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=3, replication_factor=1)])[topic].result(timeout=30)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all"})
    errors: list[str] = []

    def on_delivery(err: object, _msg: object) -> None:
        if err is not None:
            errors.append(str(err))

    for key, value in messages:
        producer.produce(topic, key=key, value=value, on_delivery=on_delivery)
    assert producer.flush(30) == 0
    assert errors == []


def test_produce_and_consume(kafka_bootstrap: str, unique_name: Callable[[str], str]) -> None:
    topic = unique_name("smoke")
    sent = [(f"k{i}".encode(), f"v{i}".encode()) for i in range(20)]
    _produce(kafka_bootstrap, topic, sent)

    consumer = Consumer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "group.id": unique_name("group"),
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    received: list[tuple[bytes | None, bytes | None]] = []
    try:
        for _ in range(60):
            msg = consumer.poll(1.0)
            if msg is None:
                if len(received) == len(sent):
                    break
                continue
            assert msg.error() is None, msg.error()
            received.append((msg.key(), msg.value()))
    finally:
        consumer.close()
    assert sorted(received) == sorted(sent)


def test_spark_kafka_source_batch_read(
    spark: SparkSession, kafka_bootstrap: str, unique_name: Callable[[str], str]
) -> None:
    topic = unique_name("spark")
    sent = [(f"k{i}".encode(), f"v{i}".encode()) for i in range(30)]
    _produce(kafka_bootstrap, topic, sent)

    df = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", kafka_bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .load()
    )
    rows = df.select("key", "value", "topic", "partition", "offset").collect()
    assert sorted((bytes(r.key), bytes(r.value)) for r in rows) == sorted(sent)
    assert {r.topic for r in rows} == {topic}
    assert {r.partition for r in rows} <= {0, 1, 2}
    # offsets are dense per partition, starting at 0
    for p in {r.partition for r in rows}:
        offsets = sorted(r.offset for r in rows if r.partition == p)
        assert offsets == list(range(len(offsets)))
