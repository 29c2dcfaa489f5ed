"""A task's read of offset ranges with librdkafka (service.kafka.reader), against the real broker."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from pyspark import TaskContext

from service.data.arrow_job import Output, Ranges
from service.kafka import reader
from service.kafka.reader import OffsetRange, read_range
from service.kafka.records import ranges_frame


def _topics(bootstrap: str, names: list[str]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(n, 1, 1) for n in names]).values():
        future.result(30)


def test_one_reader_reads_many_topics_it_never_saw_each_exactly(
    kafka_bootstrap: str, unique_name: Callable[[str], str]
) -> None:
    """A worker's consumer meets topics one range after the other (a sink of many tables): each topic's
    metadata is asked for before its first assignment, and every range yields exactly its records."""
    names = [unique_name(f"reader{i}") for i in range(6)]
    _topics(kafka_bootstrap, names)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True})
    for i, name in enumerate(names):
        for n in range(10 + i):
            producer.produce(name, key=str(n).encode(), value=f"{name}:{n}".encode())
    assert producer.flush(30) == 0
    client = {"bootstrap.servers": kafka_bootstrap, "isolation.level": "read_committed"}
    reader._drop(client)

    for i, name in enumerate(names):
        start, end = 2, 10 + i  # a range that starts past the partition's first record
        rows = [b.to_pylist() for b in read_range(client, OffsetRange(name, 0, start, end), 4, timeout_s=30)]
        values = [r["value"].decode() for chunk in rows for r in chunk]
        assert values == [f"{name}:{n}" for n in range(start, end)]
        assert [len(chunk) for chunk in rows][:-1] == [4] * (len(rows) - 1)  # chunks of chunk_records
        assert name in reader._readers[reader._key(client)].topics


def test_a_range_ending_in_an_aborted_transaction_ends_at_its_last_committed_record(
    kafka_bootstrap: str, unique_name: Callable[[str], str]
) -> None:
    """Under read_committed the aborted records and the markers take offsets but yield nothing: the read
    is over at the partition's end, not after waiting for records that never come."""
    name = unique_name("reader_aborted")
    _topics(kafka_bootstrap, [name])
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": unique_name("txn")})
    producer.init_transactions(30)
    producer.begin_transaction()
    for n in range(5):
        producer.produce(name, value=f"kept {n}".encode())
    producer.commit_transaction(30)
    producer.begin_transaction()
    for n in range(5):
        producer.produce(name, value=f"aborted {n}".encode())
    producer.flush(30)
    producer.abort_transaction(30)
    high = _high(kafka_bootstrap, name)
    assert high == 12  # 5 records, a commit marker, 5 aborted records, an abort marker: the abort happened

    client = {"bootstrap.servers": kafka_bootstrap, "isolation.level": "read_committed"}
    values = [
        r["value"].decode()
        for b in read_range(client, OffsetRange(name, 0, 0, high), 100, 30)
        for r in b.to_pylist()
    ]
    assert values == [f"kept {n}" for n in range(5)]


def _high(bootstrap: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "icesink-test-watermarks"})
    try:
        return int(consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)[1])
    finally:
        consumer.close()


def _planned() -> list[OffsetRange]:
    ranges = [OffsetRange("shop.public.o'rders\\x", 0, 5, 2**40), OffsetRange("shop.public.items", 3, 0, 7)]
    return ranges + [OffsetRange(f"t{i}", i % 3, i, i + 1) for i in range(40)]


def test_a_batch_ranges_frame_keeps_every_range_as_planned_one_task_per_core(spark: Any) -> None:
    """Spark's decoder reads a batch's ranges through this DataFrame."""
    ranges = _planned()
    frame = ranges_frame(spark, ranges)
    assert frame.schema.simpleString() == "struct<topic:string,partition:int,start:bigint,end:bigint>"
    assert [OffsetRange(*r) for r in frame.collect()] == ranges
    assert frame.rdd.getNumPartitions() == spark.sparkContext.defaultParallelism
    assert ranges_frame(spark, ranges[:1]).rdd.getNumPartitions() == 1


def test_the_ranges_job_gives_every_range_to_one_task_at_most_one_per_core(spark: Any) -> None:
    """The Arrow path's tasks get the batch's ranges through this job: each range exactly once."""
    ranges = _planned()

    def run(given: list[OffsetRange], tasks: int | None = None) -> list[Output]:
        job = Ranges(spark, given, read=lambda r: iter(()))
        return job.run(
            lambda rs: [Output("range", str(r), target=str(TaskContext.get().partitionId())) for r in rs],  # type: ignore[union-attr]
            tasks,
        )

    out = run(ranges)
    assert sorted(o.text for o in out) == sorted(str(r) for r in ranges)
    assert len({o.target for o in out}) == spark.sparkContext.defaultParallelism
    assert len({o.target for o in run(ranges[:1])}) == 1
    assert len({o.target for o in run(ranges, tasks=1)}) == 1
    assert len({o.target for o in run(ranges, tasks=64)}) == spark.sparkContext.defaultParallelism
    assert run([]) == []
