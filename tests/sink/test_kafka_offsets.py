"""Where the sink reads Kafka from, one failure story per test: aborted transactions,
``starting_offsets: latest`` across restarts, and committed offsets Kafka no longer holds."""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, Producer, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient

from service.sample import Change, SampleSource, ensure_topic, produce
from tests.sink.conftest import Sink
from tests.sink.expect import assert_rows
from txnlog import TransactionLog


def ghosts(n: int, seed: int = 5) -> list[Change]:
    """Inserts of keys 300 and above, which the tests' sources (keys < 300) never touch: a row of
    theirs in the table is a record that should never have landed."""
    source = SampleSource(keys=1000, seed=seed)
    out: list[Change] = []
    while len(out) < n:
        change = source.next_change((1.0, 0.0, 0.0))
        assert change.row is not None
        if change.row["id"] >= 300 and all(c.key != change.key for c in out):
            out.append(change)
    return out


def watermarks(sink: Sink, isolation: str = "read_uncommitted") -> dict[int, tuple[int, int]]:
    consumer = Consumer(
        {"bootstrap.servers": sink.bootstrap, "group.id": f"t-{uuid.uuid4()}", "isolation.level": isolation}
    )
    try:
        parts = consumer.list_topics(sink.topic, timeout=30).topics[sink.topic].partitions
        return {p: consumer.get_watermark_offsets(TopicPartition(sink.topic, p), timeout=30) for p in parts}
    finally:
        consumer.close()


def read_all(sink: Sink, isolation: str) -> list[Any]:
    """Every record a consumer at ``isolation`` gets from the topic."""
    consumer = Consumer(
        {
            "bootstrap.servers": sink.bootstrap,
            "group.id": f"t-{uuid.uuid4()}",
            "auto.offset.reset": "earliest",
            "isolation.level": isolation,
        }
    )
    consumer.subscribe([sink.topic])
    messages: list[Any] = []
    idle = 0
    try:
        while idle < 3:
            batch = [m for m in consumer.consume(500, timeout=1) if m.error() is None]
            messages += batch
            idle = 0 if batch else idle + 1
    finally:
        consumer.close()
    return messages


def committed_offsets(sink: Sink) -> dict[int, int]:
    status = sink.cli("status")
    assert status.returncode == 0, status.stderr
    return {int(p): o for p, o in json.loads(status.stdout)["committed_offsets"][sink.topic].items()}


def history_notes(sink: Sink) -> list[str]:
    log = TransactionLog(os.environ["ICESINK_PG_DSN"])
    try:
        return [e.payload["note"] for e in log.history(sink.name) if e.payload and e.payload.get("note")]
    finally:
        log.close()


def topic_id(sink: Sink) -> str:
    admin = AdminClient({"bootstrap.servers": sink.bootstrap})
    future = admin.describe_topics(TopicCollection([sink.topic]))[sink.topic]
    return str(future.result(30).topic_id)


def produce_to(sink: Sink, partition: int, changes: list[Change]) -> None:
    producer = Producer({"bootstrap.servers": sink.bootstrap, "enable.idempotence": True})
    for change in changes:
        producer.produce(
            sink.topic, key=json.dumps(change.key), value=json.dumps(change.value), partition=partition
        )
    assert producer.flush(30) == 0


def test_aborted_transactions_never_land(
    make_sink: Any, spark: Any, unique_name: Callable[[str], str]
) -> None:
    """A transactional producer commits two transactions and aborts two (one of them last in the
    log): the table holds only the committed changes, and the sink commits the log's end, markers
    included, instead of stopping one offset short of it."""
    sink: Sink = make_sink(keys=300)
    producer = Producer({"bootstrap.servers": sink.bootstrap, "transactional.id": unique_name("txn")})
    producer.init_transactions(30)

    def transaction(changes: list[Change], commit: bool) -> None:
        producer.begin_transaction()
        for change in changes:
            producer.produce(sink.topic, key=json.dumps(change.key), value=json.dumps(change.value))
        assert producer.flush(30) == 0  # in the log before the transaction ends, aborted or not
        if commit:
            producer.commit_transaction(30)
            sink.history.extend(changes)
        else:
            producer.abort_transaction(30)

    aborted = ghosts(60)
    transaction([sink.source.next_change() for _ in range(150)], commit=True)
    transaction(aborted[:40], commit=False)
    transaction([sink.source.next_change() for _ in range(150)], commit=True)
    transaction(aborted[40:], commit=False)

    # The aborted records really are in the log: only a read_committed consumer skips them.
    assert len(read_all(sink, "read_uncommitted")) == 300 + 60
    assert len(read_all(sink, "read_committed")) == 300
    ends = {p: high for p, (_, high) in watermarks(sink).items()}
    assert sum(ends.values()) > 360, "transaction markers take offsets of their own"

    sink.run_until_caught_up(timeout=240)
    assert_rows(spark, sink.table, sink.source.expected_rows())
    assert committed_offsets(sink) == ends


def test_latest_is_recorded_at_the_first_claim(make_sink: Any, spark: Any) -> None:
    """``starting_offsets: latest``: changes produced after the sink's first start, while it was
    down before committing anything, are read on the next start (not skipped by a new "latest")."""
    sink: Sink = make_sink(kafka={"starting_offsets": "latest"})
    produce(sink.bootstrap, sink.topic, ghosts(30))  # before the first start: latest skips them
    at_start = {p: high for p, (_, high) in watermarks(sink).items()}

    first = sink.start(process=True)
    first.wait_for_log("consuming", timeout=180)
    first.kill(signal.SIGKILL)
    first.wait(60)
    assert "committed seq" not in first.log(), "the first run must end before it committed a batch"

    sink.produce(200)  # while the sink is down: in every partition, none of which had a batch yet
    assert all(high > at_start[p] for p, (_, high) in watermarks(sink).items())
    sink.run_until_caught_up(timeout=240)

    assert_rows(spark, sink.table, sink.source.expected_rows())
    assert any(note.startswith("starting_offsets latest") for note in history_notes(sink))


def test_records_deleted_before_they_were_read_stop_the_sink_until_reset(make_sink: Any, spark: Any) -> None:
    """Records past the committed offset are deleted (as retention would) before the sink read them:
    the sink exits 2 naming the partition and both offsets, `icesink check` says the same, and
    `icesink offsets reset --to earliest` moves on, recorded in the txnlog's history."""
    sink: Sink = make_sink(keys=300)
    sink.produce(90)
    sink.run_until_caught_up(timeout=240)
    committed = committed_offsets(sink)

    produce_to(sink, 1, ghosts(25))  # not read yet, and about to be deleted
    end = watermarks(sink)[1][1]
    admin = AdminClient({"bootstrap.servers": sink.bootstrap})
    deleted = admin.delete_records([TopicPartition(sink.topic, 1, end)], request_timeout=30)
    for future in deleted.values():
        future.result(30)
    earliest = watermarks(sink)[1][0]
    assert earliest == end > committed[1], "the records past the committed offset are really gone"

    gone = sink.start("--until-caught-up")
    assert gone.wait(120) == 2, gone.log()[-3000:]
    expected = f"topic {sink.topic} partition 1: committed offset {committed[1]}, earliest offset {earliest}"
    assert expected in gone.log()
    check = sink.cli("check")
    assert check.returncode == 1 and "FAIL committed offsets" in check.stdout and expected in check.stdout

    reset = sink.cli("offsets", "reset", "--to", "earliest")
    assert reset.returncode == 0, reset.stderr
    moved = json.loads(reset.stdout)["moved"]
    assert moved == [{"topic": sink.topic, "partition": 1, "from": committed[1], "to": earliest}]
    assert any("offsets reset to earliest" in note for note in history_notes(sink))

    sink.produce(60)
    sink.run_until_caught_up(timeout=240)
    assert_rows(spark, sink.table, sink.source.expected_rows())


def test_recreated_topic_stops_the_sink(make_sink: Any, spark: Any) -> None:
    """The topic is deleted and re-created, and gets more records than the old one had: its offsets
    look valid, so without topic ids the sink would skip the new topic's first records. It exits 2
    naming the topic id change; a reset to earliest reads the new topic from its start."""
    sink: Sink = make_sink(keys=300)
    sink.produce(60)
    sink.run_until_caught_up(timeout=240)
    committed = committed_offsets(sink)
    old_id = topic_id(sink)

    admin = AdminClient({"bootstrap.servers": sink.bootstrap})
    admin.delete_topics([sink.topic], operation_timeout=30)[sink.topic].result(30)
    deadline = time.monotonic() + 60
    while sink.topic in admin.list_topics(timeout=10).topics and time.monotonic() < deadline:
        time.sleep(0.5)
    while True:  # the deletion completes in the background
        try:
            ensure_topic(sink.bootstrap, sink.topic, 3)
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    sink.produce(240)
    assert topic_id(sink) != old_id
    ends = {p: high for p, (_, high) in watermarks(sink).items()}
    assert all(ends[p] >= o for p, o in committed.items()), "the old offsets are valid in the new topic"

    gone = sink.start("--until-caught-up")
    assert gone.wait(120) == 2, gone.log()[-3000:]
    assert f"topic {sink.topic} was deleted and re-created (topic id {old_id}, now" in gone.log()

    reset = sink.cli("offsets", "reset", "--to", "earliest")
    assert reset.returncode == 0, reset.stderr
    assert {m["partition"]: m["to"] for m in json.loads(reset.stdout)["moved"]} == {0: 0, 1: 0, 2: 0}
    sink.run_until_caught_up(timeout=240)
    assert_rows(spark, sink.table, sink.source.expected_rows())
