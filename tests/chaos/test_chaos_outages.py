"""Each server the sink depends on goes away for longer than one retry while the sink runs.

Postgres (the txnlog, and the REST catalog's JDBC store) is restarted, the REST catalog and MinIO are
stopped, the Kafka broker is restarted — one after the other, ``ICESINK_CHAOS_OUTAGE_S`` seconds each
(default 20), with ``dev/stack stop/start`` (always started again). After each outage the sink must
commit again. It retries in-process with bounded backoff where it can; should it exit instead (a
supervisor's restart is the documented recovery for long outages), the test restarts it and says so.

Records that can't be decoded are produced while the catalog is down: the batch fails as a whole
and is retried, and only those records — each exactly once — reach the dead-letter topic.
At the end the table equals the model through both readers.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer

from service.sample import envelope_schema
from tests.chaos import harness as h
from tests.sink.conftest import Sink, SinkRun

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(1800)]  # slow machines: beyond the default 900 s

OUTAGE_S = float(os.environ.get("ICESINK_CHAOS_OUTAGE_S", "20"))
RETRY_LINES = (
    "transient database error",
    "outcome unknown or catalog unavailable",
    "writing the batch failed",
    "locking the sink row again",
    "conflicted",
)


def bad_records(sink: Sink) -> list[tuple[str | None, str]]:
    """Records that must go to the dead-letter topic, one per reason."""
    schema = envelope_schema(sink.source.table)

    def envelope(op: str, after: dict[str, Any]) -> str:
        return json.dumps({"schema": schema, "payload": {"op": op, "before": None, "after": after}})

    return [
        (json.dumps({"id": 1}), "{this is not json"),
        (json.dumps({"id": 2}), envelope("x", {"id": 2, "version": 1})),
        (json.dumps({"id": 3}), envelope("c", {"id": 3, "version": 2**40})),
        (None, envelope("c", {"id": None, "version": 1})),
    ]


def produce_raw(sink: Sink, records: list[tuple[str | None, str]]) -> None:
    producer = Producer({"bootstrap.servers": sink.bootstrap, "enable.idempotence": True})
    for key, value in records:
        producer.produce(sink.topic, key=key, value=value)
    assert producer.flush(60) == 0


def dead_letters(bootstrap: str, topic: str, expected: int, timeout: float = 60) -> list[dict[str, str]]:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"chaos-{uuid.uuid4()}", "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([topic])
    letters: list[dict[str, str]] = []
    deadline = time.monotonic() + timeout
    quiet = 0
    try:
        while time.monotonic() < deadline and quiet < 3:
            batch = [m for m in consumer.consume(100, timeout=2) if m.error() is None]
            for m in batch:
                headers = m.headers() or []
                pairs = headers.items() if isinstance(headers, dict) else headers
                letters.append({k: v.decode() if isinstance(v, bytes) else str(v) for k, v in pairs})
            quiet = quiet + 1 if not batch and len(letters) >= expected else 0
    finally:
        consumer.close()
    return letters


class Supervisor:
    """Keeps one sink process running, restarting it if it exits, like a Deployment would."""

    def __init__(self, sink: Sink, env: dict[str, str] | None = None) -> None:
        self.sink = sink
        self.runs: list[SinkRun] = [h.start(sink, env=env)]
        self.exits: list[int] = []

    @property
    def run(self) -> SinkRun:
        return self.runs[-1]

    def commits(self) -> int:
        return sum(h.committed_count(r) for r in self.runs)

    def wait_for_commits(self, target: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.commits() < target:
            if self.run.process.poll() is not None:
                self.exits.append(self.run.process.returncode)
                print(f"the sink exited {self.run.process.returncode}; restarting it")
                self.runs.append(h.start(self.sink))
            assert time.monotonic() < deadline, (
                f"no progress within {timeout:.0f}s ({self.commits()} of {target} commits):\n"
                f"{self.run.log()[-5000:]}"
            )
            time.sleep(1)

    def log(self) -> str:
        return "".join(r.log() for r in self.runs)


def test_outages_of_every_server(make_sink: Any, spark: Any, stack: Any) -> None:
    # Spark's decoder here (three Spark jobs per batch, with a cache): the other stories run the
    # Arrow path, and an outage must be survived on both.
    sink: Sink = make_sink(
        keys=200,
        partition_by=["country"],
        commit={"trigger_interval": "500ms"},
        txnlog={"session_timeout": "15s"},
        source={"decoder": "spark"},
    )
    sink.produce(300)
    outages = [("postgres", "restart"), ("rest", "down"), ("s3", "down"), ("kafka", "restart")]
    if stack.s3_server != "minio":
        pytest.fail(f"the object store outage needs MinIO (moto keeps its data in memory): {stack.s3_server}")
    bad = bad_records(sink)
    with h.BackgroundProducer(sink, batch=20, pause=0.5) as producer:
        # The 2nd commit waits 8s at a fail point with the txnlog row locked: Postgres goes down then.
        sup = Supervisor(sink, env={"ICESINK_FAILPOINTS": "during_catalog_commit=delay:8@2"})
        sup.wait_for_commits(1, timeout=400)
        for server, kind in outages:
            if server == "postgres":
                sup.run.wait_for_log("fail point during_catalog_commit: delay", timeout=400)
            before, exits, started = sup.commits(), len(sup.exits), time.monotonic()
            lines_before = {line: sup.log().count(line) for line in RETRY_LINES}
            if server == "kafka":
                with producer.paused(), h.server_down(server):
                    time.sleep(OUTAGE_S)
            else:
                with h.server_down(server):
                    if server == "rest":
                        produce_raw(sink, bad)  # in the batch that can't be committed now
                    time.sleep(OUTAGE_S)
            down = time.monotonic() - started
            sup.wait_for_commits(before + 2, timeout=600)
            retries = {
                line: n - lines_before[line]
                for line in RETRY_LINES
                if (n := sup.log().count(line)) > lines_before[line]
            }
            restarted = sup.exits[exits:]
            how = f"exited {restarted} and was restarted" if restarted else "retried in-process"
            h.FIGURES.outages.append(f"{server} {kind} ({down:.0f}s: {how})")
            if server == "postgres" and not restarted:
                # It was in the middle of a commit, holding the row lock: the lock went with the session.
                assert retries.get("locking the sink row again"), f"no re-lock after the restart: {retries}"
            print(
                f"{server} {kind}: down {down:.0f}s, {how}; back to committing "
                f"{time.monotonic() - started - down:.0f}s after; retry log lines: {retries}"
            )
    h.wait_caught_up(sink, sup.run)
    h.stop_gracefully(sup.run)
    h.verify_exact(spark, sink)

    letters = dead_letters(stack.kafka_bootstrap, f"{sink.name}.dlq", len(bad))
    positions = {(d["icesink.source.partition"], d["icesink.source.offset"]) for d in letters}
    h.FIGURES.dead_letters_expected += len(bad)
    h.FIGURES.dead_letters_found += len(letters)
    h.FIGURES.dead_letters_distinct += len(positions)
    reasons = sorted(d["icesink.error"] for d in letters)
    assert len(positions) == len(bad), f"dead letters: {reasons}"
    assert len(letters) == len(bad), f"dead letters sent more than once: {reasons}"
    assert all(d["icesink.source.topic"] == sink.topic for d in letters)
    for needle in ("malformed", "unknown op 'x'", "column version", "key column id is missing"):
        assert any(needle in r for r in reasons), f"no dead letter for {needle!r}: {reasons}"
