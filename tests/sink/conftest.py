"""Fixtures for end-to-end sink tests: a sink configuration per test and a way to run `icesink`."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from service.sample import Change, SampleSource, ensure_topic, produce
from tests.cdc import CdcSource
from tests.conftest import load_stack_env
from tests.sink import host
from tests.spark_jvm import driver_java_options

REPO = Path(__file__).resolve().parents[2]
ICESINK = [sys.executable, "-m", "service.cli"]


_ROW = {
    "type": "struct",
    "optional": True,
    "fields": [
        {"field": "id", "type": "int64", "optional": False},
        {"field": "name", "type": "string", "optional": True},
    ],
}
CHANGE_SCHEMA = {
    "type": "struct",
    "fields": [{**_ROW, "field": "before"}, {**_ROW, "field": "after"}, {"type": "string", "field": "op"}],
}


def change(key: int, name: str, source: dict[str, Any]) -> tuple[str, str]:
    """The (key, value) of a Debezium update of row (id, name) at a source position, with schemas."""
    payload = {"op": "u", "before": None, "after": {"id": key, "name": name}, "source": source}
    return json.dumps({"id": key}), json.dumps({"schema": CHANGE_SCHEMA, "payload": payload})


def _environment(changes: Mapping[str, str | None] | None) -> dict[str, str]:
    """The test's environment with ``changes`` (a None value removes the variable)."""
    return {k: v for k, v in {**os.environ, **(changes or {})}.items() if v is not None}


@dataclass
class SinkRun:
    """A sink process started by a test, or a run in this pytest process's sink host (tests/sink/host.py:
    the same exit code and log, in a warm Spark session)."""

    process: subprocess.Popen[str] | host.HostedProcess
    log_path: Path

    def wait(self, timeout: float = 300) -> int:
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            pytest.fail(f"icesink did not finish within {timeout}s; log:\n{self.log()[-4000:]}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """SIGKILL takes the whole process group (Spark's JVM too), like a pod being killed; other
        signals go to the icesink process only, as Kubernetes sends SIGTERM to the main process.
        A run in the sink host is stopped instead of SIGKILLed (a clean-up, never a test's fault: a
        test that kills starts a process, ``Sink.start(process=True)``)."""
        if isinstance(self.process, host.HostedProcess):
            self.process.send_signal(sig)
        elif self.process.poll() is None:
            if sig == signal.SIGKILL:
                os.killpg(self.process.pid, sig)
            else:
                os.kill(self.process.pid, sig)

    def wait_for_log(self, needle: str, timeout: float = 120, count: int = 1) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.log().count(needle) >= count:
                return
            if self.process.poll() is not None:
                pytest.fail(
                    f"icesink exited ({self.process.returncode}) before logging {needle!r}:\n{self.log()[-4000:]}"
                )
            time.sleep(0.25)
        pytest.fail(
            f"icesink did not log {needle!r} {count} time(s) within {timeout}s:\n{self.log()[-4000:]}"
        )


@dataclass
class Sink:
    """One test's sink: its config file, topic, table and a model source."""

    name: str
    config: dict[str, Any]
    path: Path
    bootstrap: str
    source: SampleSource
    history: list[Change] = field(default_factory=list)
    runs: list[SinkRun] = field(default_factory=list)

    @property
    def topic(self) -> str:
        return str(self.config["kafka"]["topics"][0])

    @property
    def table(self) -> str:
        return str(self.config["table"]["identifier"])

    def save(self) -> None:
        """Write the configuration whole (a temporary file renamed over it): a test's ``icesink status``
        saves it while a run in the sink host may be reading it."""
        text = yaml.safe_dump(self.config)
        if self.path.exists() and self.path.read_text() == text:
            return
        partial = self.path.with_name(f".{self.path.name}.{os.getpid()}.{threading.get_ident()}")
        partial.write_text(text)
        partial.replace(self.path)

    def produce(self, n: int, mix: tuple[float, float, float] = (0.25, 0.60, 0.15)) -> list[Change]:
        changes = [self.source.next_change(mix) for _ in range(n)]
        produce(self.bootstrap, self.topic, changes)
        self.history.extend(changes)
        return changes

    def send(
        self, records: Sequence[tuple[str | None, str | None]], partition: int | None = None
    ) -> list[tuple[int, int]]:
        """Produce raw (key, value) records, to one partition if given (a None value is a tombstone);
        returns where each one landed, as (partition, offset)."""
        from confluent_kafka import Producer

        landed: list[tuple[int, int]] = []

        def delivered(err: Any, msg: Any) -> None:
            assert err is None, err
            landed.append((msg.partition(), msg.offset()))

        producer = Producer({"bootstrap.servers": self.bootstrap, "enable.idempotence": True})
        for key, value in records:
            if partition is None:
                producer.produce(self.topic, key=key, value=value, on_delivery=delivered)
            else:
                producer.produce(self.topic, key=key, value=value, on_delivery=delivered, partition=partition)
        assert producer.flush(30) == 0
        return landed

    def start(
        self, *args: str, env: Mapping[str, str | None] | None = None, process: bool = False
    ) -> SinkRun:
        """Start `icesink run`; ``env`` adds variables to the test's environment (None removes one).
        ``process``: a process of its own, never a run in the sink host, for a test whose story is a
        SIGKILL (a hosted run can only be stopped: tests/sink/host.py)."""
        return self.start_cli("run", *args, env=env, process=process)

    def start_cli(
        self, *args: str, env: Mapping[str, str | None] | None = None, process: bool = False
    ) -> SinkRun:
        """Start `icesink <args> --config <this sink>` in the background (``run``, ``maintain``, ...)."""
        self.save()
        log_path = self.path.with_name(f"{self.name}-run{len(self.runs)}.log")
        argv, environment = [*args, "--config", str(self.path)], _environment(env)
        with log_path.open("w") as log:
            # A run with variables of its own is a process, as is one the test asks to be a process or
            # one the sink host does not take.
            hosted = None if env or process else host.start(argv, environment, log_path, REPO)
            running = hosted or subprocess.Popen(
                [*ICESINK, *argv],
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
                text=True,
                env=environment,
                start_new_session=True,
            )
        run = SinkRun(running, log_path)
        self.runs.append(run)
        return run

    def run_until_caught_up(
        self, timeout: float = 300, env: Mapping[str, str | None] | None = None
    ) -> SinkRun:
        run = self.start("--until-caught-up", env=env)
        code = run.wait(timeout)
        assert code == 0, f"icesink run --until-caught-up exited {code}:\n{run.log()[-6000:]}"
        return run

    def cli(
        self, *args: str, env: Mapping[str, str | None] | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """`icesink <args> --config <this sink>` run to its end, its output captured (in the sink host
        for `run`, `maintain --once` and the commands that start no Spark: tests/sink/host.py)."""
        self.save()
        argv, environment = [*args, "--config", str(self.path)], _environment(env)
        return (None if env else host.run(argv, environment, timeout, REPO)) or subprocess.run(
            [*ICESINK, *argv],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=environment,
        )


def new_sink(
    stack: Any,
    unique_name: Callable[[str], str],
    directory: Path,
    mode: str = "upsert",
    partition_by: list[str] | None = None,
    catalog: dict[str, str] | None = None,
    with_schema: bool = True,
    columns: list[dict[str, Any]] | None = None,
    keys: int = 300,
    seed: int = 11,
    partitions: int = 3,
    **overrides: Any,
) -> Sink:
    """A sink configuration on the stack (topic created, table not yet), its files in ``directory``;
    `make_sink` is the fixture for one test, a module-scoped fixture may call this itself."""
    name = unique_name("sink")
    topic = unique_name("cdc")
    ensure_topic(stack.kafka_bootstrap, topic, partitions)
    config: dict[str, Any] = {
        "sink_id": name,
        "kafka": {"bootstrap_servers": stack.kafka_bootstrap, "topics": [topic]},
        "table": {
            "identifier": f"{unique_name('ns')}.customers",
            "key": ["id"],
            "mode": mode,
            "partition_by": partition_by or [],
            **({"columns": columns} if columns else {}),
        },
        "catalog": catalog
        or {
            "name": "rest",
            "type": "rest",
            "uri": stack.rest_uri,
            "s3.endpoint": stack.s3_endpoint,
            "s3.access-key-id": "${AWS_ACCESS_KEY_ID}",
            "s3.secret-access-key": "${AWS_SECRET_ACCESS_KEY}",
            "s3.region": stack.region,
        },
        "txnlog": {"dsn": "${ICESINK_PG_DSN}"},
        "commit": {"trigger_interval": "1s"},
        "write": {"parallelism": 2},
        "spark": {
            "master": "local[2]",
            "conf": {"spark.driver.memory": "1g", "spark.driver.extraJavaOptions": driver_java_options()},
        },
    }
    for section, values in overrides.items():
        if isinstance(values, dict):
            config.setdefault(section, {}).update(values)
        else:
            config[section] = values
    return Sink(
        name=name,
        config=config,
        path=directory / f"{name}.yaml",
        bootstrap=stack.kafka_bootstrap,
        source=SampleSource(keys=keys, seed=seed, with_schema=with_schema),
    )


@pytest.fixture
def make_sink(
    stack: Any, spark_classes: Any, unique_name: Callable[[str], str], tmp_path: Path
) -> Iterator[Callable[..., Sink]]:
    sinks: list[Sink] = []

    def make(*args: Any, **kwargs: Any) -> Sink:
        sink = new_sink(stack, unique_name, tmp_path, *args, **kwargs)
        sinks.append(sink)
        return sink

    yield make
    for sink in sinks:
        for run in sink.runs:
            run.kill()


@contextlib.contextmanager
def open_cdc(stack: Any) -> Iterator[CdcSource]:
    """The stack's CDC source (Postgres database `cdc`, Kafka Connect with Debezium); the connectors
    registered through it are deleted at the end, with their replication slots, publications and tables."""
    env = load_stack_env(("ICESINK_CONNECT_URI", "ICESINK_CDC_DSN"))
    source = CdcSource(env["ICESINK_CONNECT_URI"], env["ICESINK_CDC_DSN"], stack.kafka_bootstrap)
    problems = source.problems()
    if problems:
        source.close()
        pytest.fail(
            "the stack's CDC source is not ready (`dev/stack up`):\n  " + "\n  ".join(problems), pytrace=False
        )
    try:
        yield source
    finally:
        source.close()


@pytest.fixture
def cdc(stack: Any) -> Iterator[CdcSource]:
    """:func:`open_cdc` for one test."""
    with open_cdc(stack) as source:
        yield source
