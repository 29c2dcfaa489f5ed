"""Dead letters that have to fit what the dead-letter topic accepts."""

from __future__ import annotations

import json
from typing import Any, cast

from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.sink.conftest import Sink
from tests.sink.expect import assert_rows, topic_records

TOPIC_LIMIT = 20_000


def _create_small_topic(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    new = NewTopic(
        topic, num_partitions=1, replication_factor=1, config={"max.message.bytes": str(TOPIC_LIMIT)}
    )
    for future in admin.create_topics([new]).values():
        future.result(30)


def _refused(bootstrap: str, topic: str, value: bytes) -> KafkaError | None:
    """Produce ``value`` as it is; the delivery error, if any."""
    errors: list[KafkaError] = []
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(topic, value, on_delivery=lambda err, _: errors.append(err) if err else None)
    assert producer.flush(30) == 0
    return errors[0] if errors else None


def test_a_dead_letter_larger_than_the_topic_accepts_is_truncated(make_sink: Any, spark: Any) -> None:
    """A 100 kB record that is not JSON goes to a dead-letter topic that takes 20 kB: it lands cut to
    fit, with headers saying so, its original size and its source coordinates; the batch commits."""
    sink: Sink = make_sink(partitions=1, keys=30, commit={"retries": 2})
    dlq = f"{sink.name}.dlq"
    _create_small_topic(sink.bootstrap, dlq)
    bad = ("{not json " + "x" * 100_000).encode()
    # The fault: the topic refuses the record as it is (and keeps nothing of it).
    refused = _refused(sink.bootstrap, dlq, bad)
    assert refused is not None and refused.code() == KafkaError.MSG_SIZE_TOO_LARGE, refused

    sink.produce(30)
    sink.send([(json.dumps({"id": 999}), bad.decode())])
    sink.produce(10)
    run = sink.run_until_caught_up()

    letters = topic_records(sink.bootstrap, dlq, 1)
    assert len(letters) == 1, [m.headers() for m in letters]
    letter = letters[0]
    headers = {k: v.decode() for k, v in letter.headers() or []}
    assert headers["icesink.truncated"] == "true"
    assert headers["icesink.value.size"] == str(len(bad))
    assert headers["icesink.source.topic"] == sink.topic
    assert (headers["icesink.source.partition"], headers["icesink.source.offset"]) == ("0", "30")
    assert "malformed" in headers["icesink.error"]
    # cast: both are set (a None would fail below all the same)
    value, key = cast(bytes, letter.value()), cast(bytes, letter.key())
    assert len(value) > 0 and bad.startswith(value)
    assert key == b'{"id": 999}'
    assert len(key) + len(value) + sum(len(k) + len(v) for k, v in headers.items()) <= TOPIC_LIMIT
    assert "1 dead letters" in run.log() and "were truncated" in run.log()
    assert_rows(spark, sink.table, sink.source.expected_rows())
