"""The dead-letter topic: records the table can't take, with the reason and their source coordinates.

Dead letters are produced inside Spark tasks (librdkafka, one producer per task), so a batch full of
bad records never passes through the driver. Each one is made to fit what Kafka accepts: the size
limit is the smaller of the topic's ``max.message.bytes`` (asked of the cluster for every batch that
has dead letters) and the producer's ``message.max.bytes``; a record over it keeps its headers (the
reason cut to ``MAX_ERROR_BYTES``) and as much of its key and value as fits, and says so (``icesink.truncated``, ``icesink.key.size``,
``icesink.value.size``: the original sizes). A record-level refusal is the record's problem, never the
batch's: such a dead letter is sent again without its value, and when even that is refused its
source coordinates are logged and counted (``icesink.dead_letters.failed``), and the batch commits.
Errors of the topic or the cluster (unknown topic, authorization, broker unreachable) fail the write,
and the batch is retried as a whole (``TablePipeline._retrying``, service.pipeline.table): dead letters are never dropped silently.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import pyarrow as pa
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, ConfigResource
from pyspark.sql import DataFrame

from service.config import KafkaConfig
from service.kafka.lookups import client_config
from service.kafka.metadata import NO_AUTO_CREATE

logger = logging.getLogger(__name__)

# librdkafka's default message.max.bytes: the limit when the cluster does not say (or the client is
# configured lower).
CLIENT_DEFAULT_MAX_BYTES = 1_000_000
# Room for one record batch's framing: the v2 batch header (61 bytes), the record's own varints and
# one length pair per header, with plenty to spare.
FRAMING_BYTES = 1024
# librdkafka refuses a message.max.bytes below this.
MIN_MAX_BYTES = 1000
# The reason may quote the offending value in full (a value that does not fit its column, say); it is
# cut to this, so that the headers of a dead letter never outgrow the topic's limit themselves. The
# value is in the record anyway.
MAX_ERROR_BYTES = 1024
ERROR_HEADER = "icesink.error"
# Errors that concern one record (its size or shape), not the topic or the cluster.
_RECORD_ERRORS = frozenset(
    {
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.RECORD_LIST_TOO_LARGE,
        KafkaError.INVALID_MSG_SIZE,
        KafkaError.INVALID_MSG,  # a corrupt message
        KafkaError.INVALID_RECORD,
    }
)
# Header values are always bytes here; the type is librdkafka's.
Header = tuple[str, str | bytes | None]
INPUT_COLUMNS = ["key", "value", "topic", "partition", "offset", "error"]
OUTPUT_SCHEMA = "sent long, truncated long, without_value long, failed string"


@dataclass(frozen=True)
class DeadLetterSpec:
    """What a task needs to send its share of the dead letters; pickled to the Python workers."""

    client: dict[str, Any]  # librdkafka properties
    topic: str
    sink_id: str
    max_bytes: int


@dataclass
class Sent:
    """The outcome of one batch's dead letters."""

    sent: int = 0
    truncated: int = 0
    without_value: int = 0
    failed: list[dict[str, Any]] = field(default_factory=list)  # coordinates and error of each


def _producer_max_bytes(kafka: KafkaConfig) -> int:
    configured = kafka.options.get("message.max.bytes")
    return int(configured) if configured else CLIENT_DEFAULT_MAX_BYTES


def topic_max_bytes(kafka: KafkaConfig, topic: str, timeout_s: float = 15.0) -> int | None:
    """The topic's ``max.message.bytes``; for a topic not created yet, the broker default it will get.

    None when the cluster does not answer it (no DescribeConfigs permission, say).
    """
    admin = AdminClient(client_config(kafka, **NO_AUTO_CREATE))
    try:
        metadata = admin.list_topics(topic, timeout=timeout_s)  # that topic's, not the cluster's
        info = metadata.topics.get(topic)
        if info is not None and info.error is None:
            resource, key = ConfigResource(ConfigResource.Type.TOPIC, topic), "max.message.bytes"
        else:  # auto-created on the first send, with the broker's default
            broker = min(metadata.brokers)
            resource, key = ConfigResource(ConfigResource.Type.BROKER, str(broker)), "message.max.bytes"
        configs = admin.describe_configs([resource])[resource].result(timeout=timeout_s)
        return int(configs[key].value)
    except (KafkaException, ValueError, KeyError) as exc:
        logger.warning("could not read the size limit of dead-letter topic %s: %s", topic, exc)
        return None


def max_bytes(kafka: KafkaConfig, topic: str) -> int:
    """The largest record the dead-letter topic and icesink's producer accept."""
    limits = [_producer_max_bytes(kafka), topic_max_bytes(kafka, topic)]
    return max(MIN_MAX_BYTES, min(limit for limit in limits if limit is not None))


def _header(name: str, value: object) -> Header:
    return name, str(value).encode()


def cut_error(error: bytes) -> bytes:
    """``error`` if it is within ``MAX_ERROR_BYTES``, else its start and a note that it was cut."""
    if len(error) <= MAX_ERROR_BYTES:
        return error
    note = f"... (cut from {len(error)} bytes)".encode()
    # Whole characters only: the header stays valid UTF-8.
    return error[: MAX_ERROR_BYTES - len(note)].decode(errors="ignore").encode() + note


def fit(
    key: bytes | None, value: bytes | None, headers: list[Header], max_bytes: int
) -> tuple[bytes | None, bytes | None, list[Header]]:
    """Key, value and headers of a dead letter that fits in ``max_bytes``.

    The headers always fit (the reason and the coordinates are what a dead letter is for): they are
    kept whole but for the reason, which is cut to ``MAX_ERROR_BYTES``; the key keeps what fits of the
    rest, then the value. A cut record says what it was.
    """
    headers = [
        (k, cut_error(v)) if k == ERROR_HEADER and isinstance(v, bytes) else (k, v) for k, v in headers
    ]
    key_size, value_size = len(key or b""), len(value or b"")
    marks = [
        _header("icesink.truncated", "true"),
        _header("icesink.key.size", key_size),
        _header("icesink.value.size", value_size),
    ]

    def size(items: list[Header]) -> int:
        return sum(len(k.encode()) + (len(v) if v else 0) for k, v in items)

    if FRAMING_BYTES + size(headers) + key_size + value_size <= max_bytes:
        return key, value, headers
    headers = headers + marks
    room = max(0, max_bytes - FRAMING_BYTES - size(headers))
    if key is not None:
        key = key[:room]
        room -= len(key)
    if value is not None:
        value = value[:room]
    return key, value, headers


def _record_error(error: KafkaError) -> bool:
    return error.code() in _RECORD_ERRORS


class _Task:
    """One task's producer, and the delivery reports of what it sent."""

    def __init__(self, spec: DeadLetterSpec) -> None:
        self.spec = spec
        self.producer = Producer(
            {
                **spec.client,
                "message.max.bytes": spec.max_bytes,
                # One record per request: the topic's limit applies to a whole record batch.
                "batch.num.messages": 1,
            }
        )
        self.errors: dict[int, KafkaError] = {}

    def send(self, i: int, key: bytes | None, value: bytes | None, headers: list[Header]) -> None:
        def report(error: KafkaError | None, _: object) -> None:
            if error is not None:
                self.errors[i] = error

        while True:
            try:
                self.producer.produce(self.spec.topic, value, key, headers=headers, on_delivery=report)
                return
            except BufferError:  # the local queue is full: let deliveries drain it
                self.producer.poll(1)
            except KafkaException as exc:  # refused before sending (its size, say)
                self.errors[i] = exc.args[0]
                return

    def wait(self) -> dict[int, KafkaError]:
        """Wait for every delivery; return the record-level failures, raise any other."""
        self.producer.flush()
        errors, self.errors = self.errors, {}
        for error in errors.values():
            if not _record_error(error):
                raise KafkaException(error)
        return errors


def send_partition(spec: DeadLetterSpec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` body: one task's dead letters → one row of counts (and the failed coordinates)."""
    rows = [row for batch in batches for row in batch.to_pylist()]
    if not rows:
        return
    task = _Task(spec)
    outcome = Sent()
    letters = []
    for i, row in enumerate(rows):
        headers = [
            _header(ERROR_HEADER, row["error"]),
            _header("icesink.source.topic", row["topic"]),
            _header("icesink.source.partition", row["partition"]),
            _header("icesink.source.offset", row["offset"]),
            _header("icesink.sink-id", spec.sink_id),
        ]
        key, value, headers = fit(row["key"], row["value"], headers, spec.max_bytes)
        outcome.truncated += int(value != row["value"] or key != row["key"])
        letters.append((key, headers))
        task.send(i, key, value, headers)
    refused = task.wait()
    for i in refused:  # the same dead letter without its value
        key, headers = letters[i]
        task.send(i, key, None, [*headers, _header("icesink.value.dropped", "true")])
    failed = task.wait()
    for i, error in failed.items():
        row = rows[i]
        outcome.failed.append(
            {k: row[k] for k in ("topic", "partition", "offset", "error")} | {"kafka_error": str(error)}
        )
    outcome.without_value = len(refused) - len(failed)
    outcome.sent = len(rows) - len(failed)
    yield pa.RecordBatch.from_pydict(
        {
            "sent": [outcome.sent],
            "truncated": [outcome.truncated],
            "without_value": [outcome.without_value],
            "failed": [json.dumps(outcome.failed)],
        }
    )


def send(bad: DataFrame, kafka: KafkaConfig, topic: str, sink_id: str) -> Sent:
    """Send the dead letters of ``bad`` (the Kafka columns and ``error``); see the module's docstring."""
    spec = DeadLetterSpec(client_config(kafka), topic, sink_id, max_bytes(kafka, topic))
    rows = bad.select(*INPUT_COLUMNS).mapInArrow(partial(send_partition, spec), OUTPUT_SCHEMA).collect()
    return _reported(spec, rows)


def send_rows(bad: pa.Table, kafka: KafkaConfig, topic: str, sink_id: str) -> Sent:
    """:func:`send` for dead letters already in the driver (``bad``: the columns of :data:`INPUT_COLUMNS`;
    the Avro path's tasks hand back the few records they found bad)."""
    spec = DeadLetterSpec(client_config(kafka), topic, sink_id, max_bytes(kafka, topic))
    counts = send_partition(spec, iter(bad.select(INPUT_COLUMNS).to_batches()))
    return _reported(spec, [row for batch in counts for row in batch.to_pylist()])


def _reported(spec: DeadLetterSpec, rows: list[Any]) -> Sent:
    """The tasks' counts summed, and what was truncated, dropped or refused logged."""
    topic = spec.topic
    outcome = Sent()
    for row in rows:
        outcome.sent += row["sent"]
        outcome.truncated += row["truncated"]
        outcome.without_value += row["without_value"]
        outcome.failed += json.loads(row["failed"])
    if outcome.truncated:
        logger.warning(
            "%d dead letter(s) over the %d bytes topic %s accepts were truncated (headers icesink.truncated, "
            "icesink.key.size, icesink.value.size)",
            outcome.truncated,
            spec.max_bytes,
            topic,
        )
    if outcome.without_value:
        logger.warning(
            "%d dead letter(s) refused by topic %s even truncated were sent without their value "
            "(header icesink.value.dropped)",
            outcome.without_value,
            topic,
        )
    for failed in outcome.failed:
        logger.error(
            "dead letter refused by topic %s even without its value; the record at %s[%s]@%s (%s) is not "
            "in the dead-letter topic: %s",
            topic,
            failed["topic"],
            failed["partition"],
            failed["offset"],
            failed["error"],
            failed["kafka_error"],
        )
    return outcome
