"""Each server the sink depends on goes away for longer than one retry while the sink runs.

Postgres (the txnlog, and the REST catalog's JDBC store) is restarted, the REST catalog and MinIO are
stopped, the Kafka broker is restarted — one after the other, ``ICESINK_CHAOS_OUTAGE_S`` seconds each
(default 20), with ``dev/stack stop/start`` (always started again). Each outage is shown to have
reached the sink before anything else is checked: its log written while the server was down holds a
failed attempt naming that server's address. Then the sink must commit again. It retries in-process
with bounded backoff where it can; should it exit instead (a supervisor's restart is the documented
recovery for long outages), the test restarts it and says so — but only an exit with an error that
names the server that is down: any other exit fails the test.

Postgres goes down while a commit waits at a fail point with the txnlog row locked; S3 while a
commit, its files written, waits for the txnlog row the test holds (production paused): the commit
then writes its manifests to an object store that is gone. (A batch would first load the table from
the catalog, which retries its own S3 reads for longer than the outage: the sink would only wait.)

The GCS and Azure emulators (tables on those stores) and the Hive metastore (a catalog of its type)
each go away the same way, one test each: a commit waits for the txnlog row, the server stops, the row
is let go.

Records that can't be decoded are produced while the catalog is down: the batch fails as a whole
and is retried, and only those records — each exactly once — reach the dead-letter topic.
At the end the table equals the model through both readers.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import pytest
from confluent_kafka import Consumer, Producer
from sqlalchemy import create_engine, select, text
from sqlalchemy.engine import make_url

from service.sample import envelope_schema
from tests.chaos import harness as h
from tests.sink.conftest import Sink, SinkRun
from tests.sink.test_catalogs import _s3, adls_catalog, gcs_catalog, read_everywhere
from txnlog.dsn import parse_dsn
from txnlog.schema import tables

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(1800)]  # slow machines: beyond the default 900 s

OUTAGE_S = float(os.environ.get("ICESINK_CHAOS_OUTAGE_S", "20"))
EXIT_FAILED = 1  # service.cli: an error the sink did not handle (a restart may mend it)
# A line that reports an attempt that failed (and is retried, or ends the sink).
FAILED = re.compile(r"fail|error|refused|timed out|unavailable|could not|cannot|lost|did not answer", re.I)


@dataclass(frozen=True)
class Outage:
    """A server of the stack going away: its ``dev/stack`` name and where the sink reaches it."""

    server: str
    kind: str
    host: str
    port: int
    gave_up: str = ""  # besides its address: how the sink's (or the catalog's) errors name this server
    # The store's client may end the process with SIGABRT instead of an error: pyarrow 22's Azure
    # filesystem lets the Azure SDK's "could not connect" escape as an uncaught C++ exception.
    aborts: bool = False

    def address(self) -> re.Pattern[str]:
        """The address as clients print it: ``host:port``, ``host', port=port``, ``"host", port port``."""
        return re.compile(rf"{re.escape(self.host)}\W{{1,12}}(?:port\W{{1,3}})?{self.port}\b")

    def failures(self, log: str) -> list[str]:
        """The lines of ``log`` that report a failed attempt against this server, naming it."""
        return [line for line in log.splitlines() if FAILED.search(line) and self.address().search(line)]

    def named_in(self, error: str) -> bool:
        return bool(self.address().search(error) or (self.gave_up and re.search(self.gave_up, error)))


def outages(stack: Any) -> list[Outage]:
    pg = make_url(stack.pg_dsn)
    rest, s3 = urlsplit(stack.rest_uri), urlsplit(stack.s3_endpoint)
    kafka_host, _, kafka_port = stack.kafka_bootstrap.rpartition(":")
    return [
        # The REST catalog's JDBC store is this Postgres too: its errors say SQLException, no address.
        Outage("postgres", "restart", pg.host or "127.0.0.1", pg.port or 5432, gave_up=r"SQLException"),
        Outage("rest", "down", rest.hostname or "127.0.0.1", rest.port or 80),
        Outage("s3", "down", s3.hostname or "127.0.0.1", s3.port or 80),
        # The sink's own errors for an unreachable broker (service.kafka) carry no address.
        Outage("kafka", "restart", kafka_host, int(kafka_port), gave_up=r"Kafka (at \S+ )?did not answer"),
    ]


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


def uncaught_error(log: str) -> str:
    """What an exited sink printed of the error it did not handle: its traceback, chained causes
    included (from the first traceback at the start of a line), to the end of ``log``."""
    at = re.search(r"^Traceback \(most recent call last\):$", log, re.M)
    return log[at.start() :] if at else ""


class Supervisor:
    """Keeps one sink process running, restarting it if it exits, like a Deployment would — but only
    when the exit is an error naming the server that is down (any other exit fails the test)."""

    def __init__(self, sink: Sink, env: dict[str, str] | None = None) -> None:
        self.sink = sink
        self.runs: list[SinkRun] = [h.start(sink, env=env)]
        self.exits: list[int] = []

    @property
    def run(self) -> SinkRun:
        return self.runs[-1]

    def commits(self) -> int:
        return sum(h.committed_count(r) for r in self.runs)

    def mark(self) -> list[int]:
        """Where each run's log ends now: :meth:`log_since` returns what was written after."""
        return [r.log_path.stat().st_size for r in self.runs]

    def log_since(self, mark: list[int], run: int | None = None) -> str:
        """What the runs (or run number ``run``) logged since ``mark`` (all of a run started since)."""

        def since(i: int) -> str:
            data = self.runs[i].log_path.read_bytes()
            return data[mark[i] if i < len(mark) else 0 :].decode(errors="replace")

        return since(run) if run is not None else "".join(since(i) for i in range(len(self.runs)))

    def wait_for_commits(
        self, target: int, timeout: float, outage: Outage | None = None, mark: list[int] | None = None
    ) -> None:
        """Wait for ``target`` commits in all; a run that exits is restarted if it exited with an
        error naming ``outage``'s server (in what it logged since ``mark``, when the server went down)."""
        deadline = time.monotonic() + timeout
        while self.commits() < target:
            if self.run.process.poll() is not None:
                code = self.run.process.returncode
                error = uncaught_error(self.log_since(mark or [], len(self.runs) - 1))
                assert outage is not None, (
                    f"the sink exited {code} with every server up:\n{self.run.log()[-5000:]}"
                )
                if outage.aborts and code == -signal.SIGABRT:
                    error = self.log_since(mark or [], len(self.runs) - 1)[
                        -3000:
                    ]  # C++'s what(), no traceback
                assert (
                    code == EXIT_FAILED or (outage.aborts and code == -signal.SIGABRT)
                ) and outage.named_in(error), (
                    f"the sink exited {code} after {outage.server} went down, but not of an error naming it "
                    f"({outage.host}:{outage.port}):\n{(error or self.run.log())[-5000:]}"
                )
                self.exits.append(code)
                print(f"the sink exited {code} ({outage.server} down); restarting it")
                self.runs.append(h.start(self.sink))
            assert time.monotonic() < deadline, (
                f"no progress within {timeout:.0f}s ({self.commits()} of {target} commits):\n"
                f"{self.run.log()[-5000:]}"
            )
            time.sleep(1)


@contextlib.contextmanager
def txnlog_row_held(sink: Sink) -> Iterator[Callable[[], bool]]:
    """The sink's txnlog row locked by another session for the block (as a claimer would); yields
    whether a session of the sink now waits for it."""
    sinks = tables(sink.config["txnlog"].get("schema", "icesink")).sinks
    engine = create_engine(parse_dsn(os.environ["ICESINK_PG_DSN"]))

    try:
        with engine.connect() as holder:
            holder.execute(select(sinks.c.sink_id).where(sinks.c.sink_id == sink.name).with_for_update())
            pid = holder.execute(text("SELECT pg_backend_pid()")).scalar_one()

            def sink_waits() -> bool:
                with engine.connect() as conn:  # a transaction of its own: pg_stat_activity is a snapshot
                    query = text(
                        "SELECT count(*) FROM pg_stat_activity WHERE :pid = ANY(pg_blocking_pids(pid))"
                    )
                    return bool(conn.execute(query, {"pid": pid}).scalar_one())

            yield sink_waits
            holder.rollback()
    finally:
        engine.dispose()


@contextlib.contextmanager
def server_down(outage: Outage, sink: Sink, run: SinkRun) -> Iterator[float]:
    """``dev/stack stop`` the server for the block (yields when it was stopped, ``time.monotonic()``);
    it is started again whatever happens.

    S3 goes away while a commit, its files written, is about to write its manifests: with nothing
    else in flight (the producer paused by the caller), one record is produced and its batch's
    commit waits for the txnlog row this test holds; the row is let go once S3 is down. (A commit
    behind another batch's write, or a batch's write, would first load the table from the catalog,
    which retries its own S3 reads for longer than the outage: the sink would only wait.)
    """
    try:
        if outage.server == "s3":
            h.wait_caught_up(sink, run)
            with txnlog_row_held(sink) as sink_waits:
                sink.produce(1)
                h.wait_until(sink_waits, 120, "the sink's commit to wait for its txnlog row")
                h.dev_stack("stop", outage.server)
        else:
            h.dev_stack("stop", outage.server)
        yield time.monotonic()
    finally:
        h.dev_stack("start", outage.server)


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
    if stack.s3_server != "minio":
        pytest.fail(f"the object store outage needs MinIO (moto keeps its data in memory): {stack.s3_server}")
    bad = bad_records(sink)
    with h.BackgroundProducer(sink, batch=20, pause=0.5) as producer:
        # The 2nd commit waits 8s at a fail point with the txnlog row locked: Postgres goes down then.
        sup = Supervisor(sink, env={"ICESINK_FAILPOINTS": "during_catalog_commit=delay:8@2"})
        sup.wait_for_commits(1, timeout=400)
        for outage in outages(stack):
            server = outage.server
            if server == "postgres":
                sup.run.wait_for_log("fail point during_catalog_commit: delay", timeout=400)
            assert sup.run.process.poll() is None, f"the sink is not running:\n{sup.run.log()[-5000:]}"
            before, exits, mark = sup.commits(), len(sup.exits), sup.mark()
            # No production while Kafka is down (the model must match Kafka), nor while S3 is (its
            # story needs the sink idle but for one commit).
            quiet = producer.paused() if server in ("kafka", "s3") else contextlib.nullcontext()
            with quiet, server_down(outage, sink, sup.run) as started:
                if server == "rest":
                    produce_raw(sink, bad)  # in the batch that can't be committed now
                time.sleep(OUTAGE_S)
            down = time.monotonic() - started
            # The sink noticed: an attempt against the server failed while it was down.
            noticed = outage.failures(sup.log_since(mark))
            assert noticed, (
                f"nothing in the sink's log while {server} was down ({down:.0f}s) names a failed attempt "
                f"against {outage.host}:{outage.port}:\n{sup.log_since(mark)[-5000:]}"
            )
            sup.wait_for_commits(before + 2, timeout=600, outage=outage, mark=mark)
            restarted = sup.exits[exits:]
            how = f"exited {restarted} and was restarted" if restarted else "retried in-process"
            h.FIGURES.outages.append(f"{server} {outage.kind} ({down:.0f}s: {how})")
            if server == "postgres" and not restarted:
                # It was in the middle of a commit, holding the row lock: the lock went with the session.
                relocks = sup.log_since(mark).count("locking the sink row again")
                assert relocks, "no re-lock after the restart"
            print(
                f"{server} {outage.kind}: down {down:.0f}s, {how}; back to committing "
                f"{time.monotonic() - started - down:.0f}s after; {len(noticed)} failed attempt(s) "
                f"naming it, the first: {noticed[0][:300]}"
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


def _on_store(store: str, request: Any, stack: Any, name: str) -> tuple[dict[str, str], Outage]:
    """A catalog whose warehouse is on ``store`` (a server of the stack), and that server's outage."""
    if store == "gcs":
        endpoint = urlsplit(request.getfixturevalue("gcs"))
        catalog = gcs_catalog(stack, endpoint.geturl(), name)
    else:
        azurite = request.getfixturevalue("azurite")
        endpoint = urlsplit(f"http://{azurite['adls.blob-storage-authority']}")
        catalog = adls_catalog(stack, azurite, name)
    host, port = endpoint.hostname or "127.0.0.1", endpoint.port or 80
    return catalog, Outage(store, "down", host, port, aborts=store == "azurite")


@pytest.mark.parametrize("store", ["gcs", "azurite"])
def test_an_object_store_outage_while_a_commit_writes_its_manifests_loses_nothing(
    make_sink: Any, spark: Any, stack: Any, unique_name: Any, request: Any, store: str
) -> None:
    """Tables on Google Cloud Storage or Azure Blob Storage (the stack's emulators), the emulator stopped
    as S3 is above: a commit, its data files written, waits for the txnlog row the test holds, which is
    let go once the store is down. That commit can't land while the store is down (shown: no commit in
    the outage), and lands after: pyarrow's GCS client retries a request for up to 15 minutes, so the
    commit waits; on Azure pyarrow aborts the process (SIGABRT, the Azure SDK's error naming the store),
    which is restarted as a Deployment would; any other exit fails the test.
    Nothing lost or doubled, by pyiceberg and Spark (and DuckDB on GCS)."""
    catalog, outage = _on_store(store, request, stack, unique_name(f"{store}out"))
    sink: Sink = make_sink(
        catalog=catalog,
        keys=150,
        table={"delete_format": "position"},
        commit={"trigger_interval": "500ms"},
        maintenance={"orphans": {"enabled": False}},
    )
    _a_commit_outlives_an_outage(sink, outage)
    problems = read_everywhere(spark, sink)
    assert not problems, "\n".join(problems)


def test_a_hive_metastore_outage_while_a_commit_waits_loses_nothing(
    make_sink: Any, spark: Any, stack: Any, hive: str, trino: str
) -> None:
    """A Hive metastore catalog, the metastore stopped while a commit, its files written, waits for the
    txnlog row the test holds (let go once the metastore is down): the commit's Thrift calls fail (the
    sink's log names the metastore's address), no commit lands in the outage, and the commit lands
    after, in-process or after a restart of an exit naming the metastore. Exact by every reader."""
    uri = urlsplit(hive)
    outage = Outage("hive", "down", uri.hostname or "127.0.0.1", uri.port or 9083)
    sink: Sink = make_sink(
        catalog={"name": "hive", "type": "hive", "uri": hive, **_s3(stack)},
        keys=150,
        table={"delete_format": "position"},
        commit={"trigger_interval": "500ms"},
    )
    mark = _a_commit_outlives_an_outage(sink, outage)
    assert outage.failures(mark), f"no failed call naming the metastore in the sink's log:\n{mark[-5000:]}"
    problems = read_everywhere(spark, sink)
    assert not problems, "\n".join(problems)


def _a_commit_outlives_an_outage(sink: Sink, outage: Outage) -> str:
    """Run the sink under a :class:`Supervisor`, stop ``outage``'s server while a commit waits for the
    txnlog row (held by the test, let go once the server is down), start it again after
    ``OUTAGE_S``: no commit lands meanwhile, one lands after, and the sink catches up. What the sink
    logged from the outage on."""
    sink.produce(200)
    sup = Supervisor(sink)
    sup.wait_for_commits(1, timeout=400)
    h.wait_caught_up(sink, sup.run)
    before, mark = sup.commits(), sup.mark()
    try:
        with txnlog_row_held(sink) as sink_waits:
            sink.produce(20)
            h.wait_until(sink_waits, 120, "the sink's commit to wait for its txnlog row")
            h.dev_stack("stop", outage.server)
        started = time.monotonic()
        time.sleep(OUTAGE_S)
        during = sup.commits()
        down = time.monotonic() - started
    finally:
        h.dev_stack("start", outage.server)
    assert during == before, (
        f"{during - before} commit(s) landed while {outage.server} was down: they did not need it"
    )
    sup.wait_for_commits(before + 1, timeout=900, outage=outage, mark=mark)
    how = f"exited {sup.exits} and was restarted" if sup.exits else "waited in-process"
    h.FIGURES.outages.append(f"{outage.server} down ({down:.0f}s: {how})")
    print(
        f"{outage.server} down {down:.0f}s: the commit {how}, "
        f"landing {time.monotonic() - started - down:.0f}s after"
    )
    sink.produce(100)
    h.wait_caught_up(sink, sup.run)
    h.stop_gracefully(sup.run)
    return sup.log_since(mark)
