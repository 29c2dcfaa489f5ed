"""The Kafka read options side by side: `python -m bench.read_path [--events N] [--repeats R]`.

The same records (the standard workload, two partitions) read into the Python tasks three ways, in
one run, each a Spark job over the whole topic that hands every record to a Python task as Arrow:

* ``spark-source``: Spark's Kafka source (the JVM consumer), then ``mapInArrow`` (``source.reader:
  spark``, the path before the task reader);
* ``tasks``: an RDD job of one element per offset range, whose task reads its range itself with
  librdkafka (``source.reader: tasks``, the Arrow path);
* ``tasks-via-jvm``: the task reader's rows handed to the JVM and on to a second Python task (what
  Spark's decoder gets when the Arrow path declines a batch under ``source.reader: tasks``).

Per option: wall seconds and CPU seconds of the whole process tree (driver, JVM, Python workers),
median of ``--repeats``, and both per event. The tasks count records and value bytes only, so the
figures are the read's alone.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from typing import Any

import pyarrow as pa

from bench.procmem import tree_cpu_seconds
from bench.sink import unique
from bench.stack import load_stack, spark_session
from bench.workload import Workload, ensure_topic, produce

COUNT_SCHEMA = "records long, bytes long"


def _count(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    records = size = 0
    for batch in batches:
        records += batch.num_rows
        size += sum(len(v) for v in batch.column("value").to_pylist() if v is not None)
    yield pa.RecordBatch.from_pydict({"records": [records], "bytes": [size]})


def _read_and_count(
    read: Callable[[Any], Iterator[pa.RecordBatch]], ranges: Iterable[Any]
) -> Iterator[dict[str, int]]:
    counted = next(_count(chunk for r in ranges for chunk in read(r)))
    yield from counted.to_pylist()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.read_path", description=__doc__)
    p.add_argument("--events", type=int, default=200_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--chunk", type=int, default=10_000, help="records a task reads at a time (tasks)")
    args = p.parse_args(argv)

    from confluent_kafka.admin import AdminClient, OffsetSpec

    from service.kafka.records import KafkaRecords
    from service.kafka.stream_source import batch_ranges

    stack = load_stack()
    topic = unique("readpath")
    ensure_topic(stack.kafka, topic, 2)
    workload = Workload(keys=max(1, args.events // 5))
    seconds = produce(stack.kafka, topic, workload.generate(args.events))
    print(f"produced {args.events} events to {topic} in {seconds:.1f}s", flush=True)

    from confluent_kafka import TopicPartition

    admin = AdminClient({"bootstrap.servers": stack.kafka})
    ends = {
        tp.partition: f.result().offset
        for tp, f in admin.list_offsets(
            {TopicPartition(topic, p): OffsetSpec.latest() for p in (0, 1)}
        ).items()
    }
    client = {"bootstrap.servers": stack.kafka, "isolation.level": "read_committed"}
    spark = spark_session(stack)
    ranges = batch_ranges({topic: {0: 0, 1: 0}}, {topic: ends}, lambda _: {})
    batch = KafkaRecords.of_ranges(spark, ranges, client, args.chunk)
    if batch.read is None:
        raise SystemExit("KafkaRecords.of_ranges gave no task-side reader")
    read = batch.read
    options: dict[str, Callable[[], list[Any]]] = {
        "spark-source": lambda: (
            spark.read.format("kafka")
            .option("kafka.bootstrap.servers", stack.kafka)
            .option("kafka.isolation.level", "read_committed")
            .option("subscribe", topic)
            .load()
            .select("key", "value", "topic", "partition", "offset", "timestamp")
            .mapInArrow(_count, COUNT_SCHEMA)
            .collect()
        ),
        "tasks": lambda: (
            spark.sparkContext.parallelize(list(batch.ranges or ()), 2)
            .mapPartitions(partial(_read_and_count, read))
            .collect()
        ),
        "tasks-via-jvm": lambda: batch.rows.mapInArrow(_count, COUNT_SCHEMA).collect(),
    }
    me = os.getpid()
    figures: dict[str, dict[str, float]] = {}
    for name, run in options.items():
        run()  # warm-up: JIT, the Python workers, the consumer's first connection
        walls, cpus = [], []
        for _ in range(args.repeats):
            cpu, started = tree_cpu_seconds(me), time.monotonic()
            rows = run()
            walls.append(time.monotonic() - started)
            cpus.append(tree_cpu_seconds(me) - cpu)
            read = sum(r["records"] for r in rows)
            if read != args.events:
                raise SystemExit(f"{name} read {read} records, expected {args.events}")
        figures[name] = {"wall_s": statistics.median(walls), "cpu_s": statistics.median(cpus)}
    load = os.getloadavg()
    print(f"\n{args.events} events, {args.repeats} repeats (median), load average {load[0]:.1f}")
    print("| option | wall s | CPU s | wall µs/event | CPU µs/event |")
    print("| --- | --- | --- | --- | --- |")
    for name, f in figures.items():
        print(
            f"| {name} | {f['wall_s']:.2f} | {f['cpu_s']:.2f} | {f['wall_s'] * 1e6 / args.events:.1f} "
            f"| {f['cpu_s'] * 1e6 / args.events:.1f} |"
        )
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
