"""A real `icesink run` against the dev stack, watched the way an operator would watch it.

One sink process (Spark local mode) with the Prometheus endpoint, an OTLP/HTTP exporter (pointed at a
receiver in this test), the health endpoints and JSON logs switched on. The test drives it through
every state that moves a metric:

* start-up: /healthz answers 200 while /readyz still answers 503; /readyz turns 200 once consuming;
* batch 1 (sample changes plus two bad records): a fail point holds the Iceberg commit while the test
  commits a snapshot of its own, so the sink's first attempt conflicts and is retried;
* batch 2 (changes produced meanwhile); then idle: lag back to 0, freshness growing;
* scripts/k8s-chaos.sh's own programs produce batch 2 and then judge the result: the commit history
  is consistent and the table (read with DuckDB) holds exactly the source's rows;
* a newer replica claims the sink: the next batch is fenced, the process exits 3, and its last OTLP
  export (sent at exit) carries the fenced count.

The Postgres password is a random one (a role made for this test) and neither it nor the S3 secret
may appear anywhere in the process output or in `icesink status` / `icesink check`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from ops_helpers import (
    REPO,
    OtlpReceiver,
    Scraper,
    free_port,
    http_status,
    value,
    wait_for,
)

from service.metrics import INSTRUMENTS
from service.sample import Change, SampleSource, ensure_topic, produce
from tests.spark_jvm import driver_java_options

LOG4J_JSON = REPO / "deploy" / "log4j2" / "log4j2-json.properties"
COMMIT_FIELDS = ("table", "snapshot_id", "seq", "records", "bytes", "duration_s")
# Lines the JVM itself prints before any logging is configured (not produced by a logger).
JVM_BANNERS = ("WARNING: Using incubator modules",)


@dataclass
class PgRole:
    dsn: str
    password: str
    schema: str


@pytest.fixture
def pg_role(stack: Any) -> Iterator[PgRole]:
    """A throwaway Postgres role with a random password, owning its own txnlog schema."""
    import sqlalchemy as sa

    name = f"ops_{secrets.token_hex(4)}"
    password = f"pw-{secrets.token_hex(12)}"
    admin = sa.create_engine(stack.pg_dsn, isolation_level="AUTOCOMMIT")
    url = sa.engine.make_url(stack.pg_dsn)
    with admin.connect() as conn:
        conn.execute(sa.text(f"CREATE ROLE {name} LOGIN PASSWORD '{password}'"))
        conn.execute(sa.text(f'GRANT CONNECT, CREATE ON DATABASE "{url.database}" TO {name}'))
    dsn = url.set(username=name, password=password).render_as_string(hide_password=False)
    try:
        yield PgRole(dsn=dsn, password=password, schema=name)
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f"DROP SCHEMA IF EXISTS {name} CASCADE"))
            conn.execute(sa.text(f"DROP OWNED BY {name}"))
            conn.execute(sa.text(f"DROP ROLE {name}"))
        admin.dispose()


def icesink_command() -> list[str]:
    script = Path(sys.executable).with_name("icesink")
    return [str(script)] if script.exists() else [sys.executable, "-m", "service.cli"]


class SinkProcess:
    def __init__(self, config: Path, env: dict[str, str], workdir: Path) -> None:
        self.out = workdir / "stdout.log"
        self.err = workdir / "stderr.log"
        self.proc = subprocess.Popen(
            [*icesink_command(), "run", "--config", str(config)],
            stdout=self.out.open("wb"),
            stderr=self.err.open("wb"),
            env=env,
            cwd=REPO,
            start_new_session=True,
        )

    def output(self) -> str:
        return self.out.read_text(errors="replace") + self.err.read_text(errors="replace")

    def json_lines(self) -> list[dict[str, Any]]:
        lines = []
        for line in self.err.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                # a partly written last line is skipped; the final check parses everything
                with contextlib.suppress(ValueError):
                    lines.append(json.loads(line))
        return lines

    def alive(self) -> bool:
        return self.proc.poll() is None

    def check_alive(self) -> None:
        if not self.alive():
            tail = "\n".join(self.err.read_text(errors="replace").splitlines()[-40:])
            raise AssertionError(f"icesink run exited with {self.proc.returncode}:\n{tail}")

    def stop(self) -> None:
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


BURST, KEYS = 150, 60
CHAOS = REPO / "scripts" / "k8s-chaos.sh"


def burst(seed: int) -> list[Change]:
    source = SampleSource(keys=KEYS, seed=seed)
    return [source.next_change() for _ in range(BURST)]


def chaos_programs() -> dict[str, str]:
    """The Python programs scripts/k8s-chaos.sh runs inside the sink's pod."""
    text = CHAOS.read_text()
    return {m[1]: m[2] for m in re.finditer(r"([A-Z]+)=\$\(cat <<'PY'\n(.*?)\nPY\n\)", text, re.S)}


def run_program(
    code: str, args: list[str], env: dict[str, str], config: Path
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        env={**env, "ICESINK_CONFIG": str(config), "ICESINK_FAILPOINTS": ""},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )


def bad_records(bootstrap: str, topic: str) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(topic, key=b'{"id": 1}', value=b"this is not JSON")
    producer.produce(topic, key=b'{"id": 2}', value=json.dumps({"payload": {"op": "x", "after": {"id": 2}}}))
    assert producer.flush(30) == 0


def test_metrics_health_and_logs_of_a_real_run(
    stack: Any,
    spark_classes: Any,
    rest_catalog: Any,
    pg_role: PgRole,
    unique_name: Callable[[str], str],
    tmp_path: Path,
) -> None:
    from txnlog import TransactionLog

    topic = unique_name("ops")
    sink_id = topic.replace("_", "-")
    table = f"ops.{topic}"
    otlp = OtlpReceiver()  # bound first: a port it picks is then never handed out as free
    metrics_port, health_port = free_port(), free_port()

    ensure_topic(stack.kafka_bootstrap, topic, partitions=3)
    ensure_topic(stack.kafka_bootstrap, f"{topic}.dlq", partitions=1)
    # Two bursts as scripts/k8s-chaos.sh produces them (SampleSource(seed=first + i), BURST changes each),
    # so its consistency checks can judge this run too.
    first_seed = secrets.randbelow(10**6)
    wave1 = burst(first_seed + 1)
    produce(stack.kafka_bootstrap, topic, wave1)
    bad_records(stack.kafka_bootstrap, topic)

    config = tmp_path / "sink.yaml"
    config.write_text(
        f"""
sink_id: {sink_id}
kafka:
  bootstrap_servers: ${{ICESINK_KAFKA_BOOTSTRAP}}
  topics: [{topic}]
  dead_letter_topic: {topic}.dlq
table:
  identifier: {table}
  key: [id]
  mode: upsert
catalog:
  type: rest
  uri: ${{ICESINK_REST_URI}}
  s3.endpoint: ${{ICESINK_S3_ENDPOINT}}
  s3.access-key-id: ${{AWS_ACCESS_KEY_ID}}
  s3.secret-access-key: ${{AWS_SECRET_ACCESS_KEY}}
  s3.region: ${{AWS_REGION}}
txnlog:
  schema: {pg_role.schema}
commit:
  trigger_interval: 1s
write:
  parallelism: 1
spark:
  master: local[2]
  conf:
    spark.ui.showConsoleProgress: "false"
    spark.driver.extraJavaOptions: "{driver_java_options()}"
metrics:
  prometheus_port: {metrics_port}
  otlp_endpoint: {otlp.endpoint}
  export_interval: 1s
health:
  host: 127.0.0.1
  port: {health_port}
log:
  format: json
"""
    )
    release = tmp_path / "release"
    env = {
        **os.environ,
        # The DSN (with its password) only ever travels in the environment, as in the Helm chart.
        "ICESINK_TXNLOG__DSN": pg_role.dsn,
        # The first commit is held until the test has committed beside it (see below).
        "ICESINK_FAILPOINTS": f"during_catalog_commit=wait:{release}@1",
        "SPARK_SUBMIT_OPTS": f"-Dlog4j2.configurationFile={LOG4J_JSON}",
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("ICESINK_PG_DSN", None)  # nothing may fall back to the stack's admin DSN
    started = time.monotonic()
    sink = SinkProcess(config, env, tmp_path)
    scraper = Scraper(f"http://127.0.0.1:{metrics_port}/metrics")
    health = f"http://127.0.0.1:{health_port}"
    try:
        # -- probes: alive at once, ready only once consuming -------------------------------------
        def first_health() -> int | None:
            sink.check_alive()
            return http_status(f"{health}/healthz")

        assert wait_for("/healthz", first_health, 120) == 200
        assert http_status(f"{health}/readyz") == 503, "/readyz must answer 503 before the sink consumes"
        scraper.start()

        def ready() -> bool:
            sink.check_alive()
            return http_status(f"{health}/readyz") == 200

        wait_for("/readyz to answer 200", ready, 300)
        ready_at = time.monotonic() - started

        # -- batch 1 conflicts once: the test commits while the sink's commit is held -----------------
        def held() -> bool:
            sink.check_alive()
            return any("fail point during_catalog_commit" in e.get("message", "") for e in sink.json_lines())

        wait_for("the first commit to reach the fail point", held, 400)
        import pyarrow as pa

        ours = rest_catalog.load_table(table)
        ours.append(pa.Table.from_pylist([], schema=ours.schema().as_arrow()))
        release.touch()  # the held commit now meets this snapshot
        chaos = chaos_programs()
        res = run_program(chaos["PRODUCE"], [str(first_seed + 2), str(BURST), str(KEYS)], env, config)
        assert res.returncode == 0, f"the chaos script's producer failed:\n{res.stderr}"
        wave2 = burst(first_seed + 2)

        good = wave1 + wave2
        by_op = {op: sum(1 for c in good if c.op == op) for op in "cud"}

        def all_committed() -> bool:
            sink.check_alive()
            samples = scraper.latest()
            committed = sum(value(samples, "icesink_records_total", icesink_op=op) or 0 for op in by_op)
            return committed == len(good)

        wait_for(f"all {len(good)} good records to be committed", all_committed, 400)

        def caught_up() -> bool:
            lag = [s for s in scraper.latest() if s.name == "icesink_kafka_lag"]
            if not lag and not any(s.name == "icesink_kafka_lag" for s in scraper.all_samples()):
                raise AssertionError(
                    "icesink.kafka.lag is not exported at all: SinkJob.run must start "
                    "service.kafka.lag.start_lag_monitor once consuming (see docs/metrics.md)"
                )
            return len(lag) == 3 and all(s.value == 0 for s in lag)

        wait_for("the lag to drop to 0 on all 3 partitions", caught_up, 60)
        time.sleep(2.5)  # idle: freshness must grow between scrapes without commits
        samples = scraper.latest()
        caught_up_at = time.monotonic() - started

        # -- every metric moved ------------------------------------------------------------------------
        assert (value(samples, "icesink_commits_total") or 0) >= 2
        for op, n in by_op.items():
            assert value(samples, "icesink_records_total", icesink_op=op) == n, op
        assert value(samples, "icesink_dead_letters_total") == 2
        for content in ("data", "delete"):
            assert (
                value(samples, "icesink_iceberg_written_bytes_total", icesink_file_content=content) or 0
            ) > 0
            assert (value(samples, "icesink_iceberg_files_total", icesink_file_content=content) or 0) > 0
        for hist in ("icesink_write_duration_seconds", "icesink_commit_duration_seconds"):
            assert (value(samples, f"{hist}_count") or 0) >= 2, hist
            assert (value(samples, f"{hist}_sum") or 0) > 0, hist
            assert value(samples, f"{hist}_bucket", le="+Inf") == value(samples, f"{hist}_count")
        assert (value(samples, "icesink_commit_failures_total", error_type="conflict") or 0) >= 1
        lag_seen = [s.value for s in scraper.all_samples() if s.name == "icesink_kafka_lag"]
        assert max(lag_seen) > 0, "the lag gauge never showed the backlog"
        lag_labels = {
            (s.labels["messaging_destination_name"], s.labels["messaging_destination_partition_id"])
            for s in samples
            if s.name == "icesink_kafka_lag"
        }
        assert lag_labels == {(topic, "0"), (topic, "1"), (topic, "2")}
        freshness = [
            (t, s.value)
            for t, ss in scraper.history
            for s in ss
            if s.name == "icesink_freshness_seconds" and t > scraper.history[-1][0] - 2.5
        ]
        assert len(freshness) >= 2 and freshness[-1][1] > freshness[0][1] >= 0, freshness
        for s in samples:
            if s.name.startswith("icesink_"):
                assert s.labels.get("icesink_sink_id") == sink_id and s.labels.get("icesink_table") == table

        # -- the chaos script's checks agree: history consistent, rows exactly the source's -------------
        res = run_program(chaos["CHECK"], ["120"], env, config)
        assert res.returncode == 0 and "commit history ok" in res.stdout, res.stdout + res.stderr
        query_env = {**env, "ICESINK_QUERY_TOOL": str(REPO / "dev" / "compose" / "query.py")}
        rows = [str(first_seed + 1), "2", str(BURST), str(KEYS)]
        res = run_program(chaos["ROWS"], rows, query_env, config)
        assert res.returncode == 0 and "rows ok" in res.stdout, res.stdout + res.stderr
        cli_output = res.stdout + res.stderr

        # -- other commands print no secrets either ---------------------------------------------------
        for command in ("status", "check"):
            res = subprocess.run(
                [*icesink_command(), command, "--config", str(config)],
                capture_output=True,
                text=True,
                env={**env, "ICESINK_FAILPOINTS": ""},
                cwd=REPO,
                timeout=180,
            )
            assert res.returncode == 0, f"icesink {command}:\n{res.stdout}\n{res.stderr}"
            cli_output += res.stdout + res.stderr
            if command == "status":
                assert json.loads(res.stdout)["committed_seq"] >= 2

        # -- a newer replica takes over: fenced, exit 3, the last export says so -----------------------
        fencer = TransactionLog(pg_role.dsn, schema=pg_role.schema)
        try:
            fencer.claim(sink_id, "ops-test-newer-replica")
        finally:
            fencer.close()
        produce(stack.kafka_bootstrap, topic, burst(first_seed + 3)[:5])
        rc = sink.proc.wait(300)
        assert rc == 3, f"a fenced replica exits 3, got {rc}"
    finally:
        scraper.stop()
        sink.stop()
        otlp.close()

    # -- OTLP: same instruments, semantic-convention units, the fenced count in the final export ------
    assert otlp.exports, "no OTLP export received"
    assert set(otlp.paths) == {"/v1/metrics"}
    assert any(r.get("service.name") == "icesink" for r in otlp.resources)
    # icesink.tables.held is a sink of many tables holding changes (commit.table_min_records), and the
    # maintenance and table-health instruments are `icesink maintain`'s; their export is checked in
    # test_ops_observability.py.
    for name, (_kind, unit) in INSTRUMENTS.items():
        if name == "icesink.tables.held" or name.startswith(("icesink.maintenance.", "icesink.table.")):
            continue
        metric = otlp.last(name)
        assert metric is not None, f"{name} never exported over OTLP"
        assert metric.unit == unit, (name, metric.unit)
    fenced = otlp.last("icesink.fenced")
    assert fenced is not None and sum(v for _, v in fenced.points) == 1

    # -- logs: every line JSON, one per commit with its fields, no secret anywhere --------------------
    output = sink.output()
    stray = [
        line
        for line in sink.err.read_text(errors="replace").splitlines()
        if line.strip() and not line.startswith("{") and not line.startswith(JVM_BANNERS)
    ]
    assert not stray, "non-JSON lines in a JSON-logging run:\n" + "\n".join(stray[:20])
    entries = [json.loads(line) for line in sink.err.read_text().splitlines() if line.startswith("{")]
    commits = [e for e in entries if e.get("message", "").startswith("committed seq")]
    assert len(commits) >= 2
    for entry in commits:
        assert all(k in entry for k in COMMIT_FIELDS), entry
        assert entry["table"] == table and entry["records"] > 0 and entry["bytes"] > 0
    for secret, what in (
        (pg_role.password, "the Postgres password"),
        (stack.secret_key, "the S3 secret key"),
    ):
        assert secret not in output, f"{what} appears in the sink's output"
        assert secret not in cli_output, f"{what} appears in icesink status/check output"
    print(f"ready after {ready_at:.0f}s, caught up after {caught_up_at:.0f}s")
