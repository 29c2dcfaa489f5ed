"""The one-job Arrow path end to end, and the batches it must hand to the Spark path.

Events without a schema section and columns from the configuration: the sink decodes with the
Arrow decoder (service.data.arrow_job). A batch with a record it can't vouch for, or a key with
changes in two Kafka partitions, must still come out right: declined, then decoded, compacted and
dead-lettered by the Spark path.
"""

from __future__ import annotations

import json
from typing import Any

from confluent_kafka import Producer

from service.sample import table_columns
from tests.sink.conftest import Sink
from tests.sink.expect import appended_rows, assert_rows, topic_records

ARROW_COMMIT = "arrow decoder"
SPARK_COMMIT = "spark decoder"


def _produce_to(sink: Sink, records: list[tuple[int, dict[str, Any], str]]) -> None:
    """(Kafka partition, key, value text) records, in this order."""
    producer = Producer({"bootstrap.servers": sink.bootstrap, "enable.idempotence": True})
    for partition, key, value in records:
        producer.produce(sink.topic, key=json.dumps(key), value=value, partition=partition)
    assert producer.flush(30) == 0


def test_upsert_partitioned_resumes_through_the_arrow_path(make_sink: Any, spark: Any) -> None:
    sink: Sink = make_sink(partition_by=["country"], with_schema=False, columns=table_columns(), keys=200)
    sink.produce(1500)
    run = sink.run_until_caught_up()
    assert_rows(spark, sink.table, sink.source.expected_rows())
    log = run.log()
    assert "decoding with the Arrow decoder" in log
    assert ARROW_COMMIT in log and SPARK_COMMIT not in log, log[-3000:]

    sink.produce(800)
    run = sink.run_until_caught_up()
    assert_rows(spark, sink.table, sink.source.expected_rows())
    assert ARROW_COMMIT in run.log()


def test_append_mode_through_the_arrow_path(make_sink: Any, spark: Any) -> None:
    sink: Sink = make_sink(mode="append", with_schema=False, columns=table_columns(), keys=100)
    sink.produce(600)
    run = sink.run_until_caught_up()
    assert_rows(spark, sink.table, appended_rows(sink.history))
    assert ARROW_COMMIT in run.log()


def test_a_bad_record_sends_its_batch_to_the_spark_path(make_sink: Any, spark: Any, stack: Any) -> None:
    """The good records of the batch land, the bad one is dead-lettered with Spark's reason."""
    sink: Sink = make_sink(with_schema=False, columns=table_columns(), partitions=1)
    good = sink.source.next_change()
    sink.history.append(good)
    later = sink.source.next_change()
    sink.history.append(later)
    bad = json.dumps({"op": "c", "after": {**(good.value["after"] or {}), "id": 999, "version": 2**40}})
    _produce_to(
        sink,
        [
            (0, good.key, json.dumps(good.value)),
            (0, {"id": 999}, bad),
            (0, later.key, json.dumps(later.value)),
        ],
    )
    run = sink.run_until_caught_up()
    assert_rows(spark, sink.table, sink.source.expected_rows())
    log = run.log()
    assert "declined by the Arrow decoder (column version" in log, log[-3000:]
    assert SPARK_COMMIT in log
    letters = topic_records(stack.kafka_bootstrap, f"{sink.name}.dlq", 1)
    assert len(letters) == 1
    headers = {k: v.decode() for k, v in letters[0].headers() or []}
    assert headers["icesink.source.offset"] == "1" and "column version" in headers["icesink.error"]


def test_a_key_in_two_kafka_partitions_is_compacted_across_them(make_sink: Any, spark: Any) -> None:
    """Each task keeps its own last change; a key in two tasks would get two rows, so the batch is
    declined and the Spark path keeps the change with the highest offset across partitions."""
    sink: Sink = make_sink(with_schema=False, columns=table_columns(), partitions=2, keys=3)
    changes = [sink.source.next_change() for _ in range(30)]
    sink.history.extend(changes)
    key = changes[-1].key
    first = next(i for i, c in enumerate(changes) if c.key == key)
    assert first < len(changes) - 1, "the last change's key has only one change; pick another seed"
    # The key's first change alone in partition 1 (offset 0); everything else, its last change
    # included (the highest offset), in partition 0.
    _produce_to(sink, [(1 if i == first else 0, c.key, json.dumps(c.value)) for i, c in enumerate(changes)])
    run = sink.run_until_caught_up()
    assert_rows(spark, sink.table, sink.source.expected_rows())
    assert "a key has changes in two Kafka partitions" in run.log(), run.log()[-3000:]
