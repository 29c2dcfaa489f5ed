"""A Spark task's read of one Kafka offset range with librdkafka, straight into Arrow, chunk by chunk.

Spark's Kafka source reads in the JVM and hands every row to the Python workers that decode it; here
the Python task that decodes a range reads it too (``confluent_kafka``), so a record crosses no
process boundary between the broker and the decoder, and a task holds one chunk of raw records at a
time rather than its whole share of the batch (:mod:`service.data.arrow_job` compacts as it goes).

A range is ``[start, end)`` of one partition, as the source planned it
(:mod:`service.kafka.stream_source`). Under ``read_committed`` librdkafka skips the records of aborted
transactions and the transaction markers, so the last record read may fall short of ``end``: the read
is over at the first record at or past ``end``, or when the partition's end is reached at or past
``end``. A range whose start Kafka no longer holds fails the read (:class:`RangeGone`), never skips.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

KAFKA_SCHEMA = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
    ]
)
SPARK_KAFKA_SCHEMA = "key binary, value binary, topic string, partition int, offset long, timestamp timestamp"
RANGE_SCHEMA = "topic string, partition int, start long, end long"
# How long a read waits for the records it was planned to read before it gives up: they were in
# Kafka when the range was planned, so a read that waits this long is facing a broker that is down.
READ_TIMEOUT_S = 120.0


class RangeGone(RuntimeError):
    """Kafka no longer holds the start of a range (retention deleted records the sink had not read)."""


@dataclass(frozen=True)
class OffsetRange:
    topic: str
    partition: int
    start: int
    end: int

    def __str__(self) -> str:
        return f"{self.topic}[{self.partition}] {self.start}..{self.end}"


def _chunk(messages: list[Any], topic: str, partition: int) -> pa.RecordBatch:
    n = len(messages)
    return pa.RecordBatch.from_arrays(
        [
            pa.array([m.key() for m in messages], pa.binary()),
            pa.array([m.value() for m in messages], pa.binary()),
            pa.repeat(pa.scalar(topic, pa.string()), n),
            pa.repeat(pa.scalar(partition, pa.int32()), n),
            pa.array([m.offset() for m in messages], pa.int64()),
            pa.array([m.timestamp()[1] * 1000 for m in messages], pa.int64()).cast(
                KAFKA_SCHEMA.field(5).type
            ),
        ],
        schema=KAFKA_SCHEMA,
    )


@dataclass
class _Reader:
    """A worker's consumer, and the topics whose metadata it holds."""

    consumer: Consumer
    topics: set[str]

    def learn(self, topic: str, timeout_s: float) -> None:
        """Ask for ``topic``'s metadata before its first assignment.

        Assigned a partition of a topic it knows nothing of, librdkafka waits for its next metadata
        refresh before it fetches: measured, 1 s for every new topic a consumer reads (a batch of 100
        one-partition topics read by two tasks took 51 s, 0.5 s with this request first, ~3 ms each).
        """
        if topic not in self.topics:
            self.consumer.list_topics(topic, timeout=timeout_s)
            self.topics.add(topic)


# One consumer per client configuration in each Python worker, kept between tasks: a new one costs
# a connection and a metadata round trip (tens of ms) per task. Spark reuses its Python workers
# (spark.python.worker.reuse), one task at a time each.
_readers: dict[str, _Reader] = {}


def _key(client: dict[str, Any]) -> str:
    return json.dumps(client, sort_keys=True, default=str)


def _reader(client: dict[str, Any]) -> _Reader:
    key = _key(client)
    if key not in _readers:
        consumer = Consumer(
            {
                **client,
                "group.id": f"icesink-read-{uuid.uuid4()}",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "auto.offset.reset": "error",  # a start Kafka no longer holds is an error, not a skip
                # A range's first fetch waits for the fetch still in flight for the range before
                # (at that partition's end, held by the broker for up to fetch.wait.max.ms):
                # measured, 11 ms per range at 10 ms, 2-3 ms at 1 ms. A range's own records are in
                # Kafka already, so a fetch waits only at its partition's end.
                "fetch.wait.max.ms": int(client.get("fetch.wait.max.ms", 1)),
                # Larger fetches than librdkafka's 1 MiB per partition (measured: a 100k-record range
                # in 0.16 s instead of 0.39 s), and a prefetch queue bounded to 32 MiB per task.
                "fetch.message.max.bytes": int(client.get("fetch.message.max.bytes", 8 << 20)),
                "queued.max.messages.kbytes": int(client.get("queued.max.messages.kbytes", 32 << 10)),
                # A full prefetch queue holds fetching back for fetch.queue.backoff.ms, 1 s by
                # default: measured, a range read stalled for a second once the queue had filled
                # past its end.
                "fetch.queue.backoff.ms": int(client.get("fetch.queue.backoff.ms", 10)),
            }
        )
        _readers[key] = _Reader(consumer, set())
    return _readers[key]


def _drop(client: dict[str, Any]) -> None:
    reader = _readers.pop(_key(client), None)
    if reader is not None:
        with contextlib.suppress(Exception):  # it failed already; closing it is only tidying up
            reader.consumer.close()


def read_range(
    client: dict[str, Any], r: OffsetRange, chunk_records: int, timeout_s: float = READ_TIMEOUT_S
) -> Iterator[pa.RecordBatch]:
    """The records of ``r`` as Arrow batches of at most ``chunk_records`` rows (:data:`KAFKA_SCHEMA`).

    ``client``: librdkafka properties (:func:`service.kafka.lookups.client_config` without its logger,
    which does not travel to the tasks), the isolation level included.
    """
    if r.end <= r.start:
        return
    reader = _reader(client)
    consumer = reader.consumer
    try:
        reader.learn(r.topic, timeout_s)
        consumer.assign([TopicPartition(r.topic, r.partition, r.start)])
        pending: list[Any] = []
        position = r.start  # the offset after the last chunk handed on
        progress = time.monotonic()
        done = False
        while not done:
            # consume() waits until it has num_messages or the timeout passed: never ask for more
            # than the range still holds (markers and aborted records take offsets too; the
            # partition's end or a record past the range then completes the call).
            left = r.end - (int(pending[-1].offset()) + 1 if pending else position)
            want = max(1, min(chunk_records - len(pending), left, 10_000))
            messages = consumer.consume(num_messages=want, timeout=0.1)
            if not messages:
                if time.monotonic() - progress >= timeout_s:
                    raise TimeoutError(f"reading {r}: no record for {timeout_s:.0f}s (is the broker up?)")
                continue
            progress = time.monotonic()
            for m in messages:
                error = m.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        if int(m.offset() or 0) >= r.end:
                            done = True
                            break
                        continue
                    if error.code() == KafkaError._AUTO_OFFSET_RESET or "out of range" in error.str().lower():
                        raise RangeGone(f"{r}: Kafka no longer holds offset {r.start} ({error.str()})")
                    raise KafkaException(error)
                offset = int(m.offset() or 0)
                if offset < r.start or m.partition() != r.partition or m.topic() != r.topic:
                    continue  # fetched for the consumer's previous range, before it was reassigned
                if offset >= r.end:
                    done = True
                    break
                pending.append(m)
                if offset == r.end - 1:
                    done = True
                    break
            if len(pending) >= chunk_records or (done and pending):
                position = int(pending[-1].offset()) + 1
                yield _chunk(pending, r.topic, r.partition)
                pending = []
    except BaseException:
        _drop(client)  # its state is unknown: the next range gets a new consumer
        raise
    consumer.unassign()  # no fetching past the range while the worker waits for its next task
