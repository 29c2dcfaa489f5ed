"""Fast checks of the metrics, lag and health modules (no servers): names, units, docs, behaviour."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from ops_helpers import REPO, free_port, http_status, parse_prometheus

from service.config import parse_config
from service.health import Health
from service.kafka.lag import LagMonitor, compute_lag
from service.maintenance.table_health import TableHealth
from service.maintenance.tasks import TaskResult
from service.metrics import INSTRUMENTS, SinkMetrics, otlp_metrics_url

DOC = REPO / "docs" / "metrics.md"
# Prometheus names of each instrument as the OpenTelemetry Prometheus exporter writes them.
PROMETHEUS = {
    "icesink.iceberg.written": "icesink_iceberg_written_bytes_total",
    "icesink.iceberg.files": "icesink_iceberg_files_total",
    "icesink.write.duration": "icesink_write_duration_seconds",
    "icesink.commit.duration": "icesink_commit_duration_seconds",
    "icesink.commits": "icesink_commits_total",
    "icesink.commit.failures": "icesink_commit_failures_total",
    "icesink.fenced": "icesink_fenced_total",
    "icesink.records": "icesink_records_total",
    "icesink.dead_letters": "icesink_dead_letters_total",
    "icesink.dead_letters.failed": "icesink_dead_letters_failed_total",
    "icesink.batches.declined": "icesink_batches_declined_total",
    "icesink.tables.isolated": "icesink_tables_isolated_total",
    "icesink.kafka.lag": "icesink_kafka_lag",
    "icesink.freshness": "icesink_freshness_seconds",
    "icesink.tables.held": "icesink_tables_held",
    "icesink.maintenance.duration": "icesink_maintenance_duration_seconds",
    "icesink.maintenance.files": "icesink_maintenance_files_total",
    "icesink.maintenance.rewritten": "icesink_maintenance_rewritten_bytes_total",
    "icesink.maintenance.snapshots_expired": "icesink_maintenance_snapshots_expired_total",
    "icesink.maintenance.failures": "icesink_maintenance_failures_total",
    "icesink.table.files": "icesink_table_files",
    "icesink.table.snapshots": "icesink_table_snapshots",
    "icesink.table.metadata.size": "icesink_table_metadata_size_bytes",
}


def exercise(m: SinkMetrics) -> None:
    m.written_bytes.add(100, m.attrs(content="data"))
    m.written_bytes.add(10, m.attrs(content="delete"))
    m.written_files.add(1, m.attrs(content="data"))
    m.write_duration.record(0.3, m.attrs())
    m.commit_duration.record(0.1, m.attrs())
    m.commits.add(1, m.attrs())
    m.commit_failed("conflict")
    m.fenced.add(1, m.attrs())
    m.records.add(5, m.attrs(op="c"))
    m.dead_letters.add(2, m.attrs())
    m.dead_letters_failed.add(1, m.attrs())
    m.declined_batches.add(1, m.attrs())
    m.tables_isolated.add(1, m.attrs(**{"error.type": "IncompatibleSchema"}))
    m.set_lag({("t", 0): 7, ("t", 1): 0})
    m.set_freshness(3.0)
    m.set_held({"ns.t": 12})
    result = TaskResult(
        files_rewritten=4, files_added=1, files_removed=3, bytes_rewritten=900, snapshots_expired=2
    )
    m.maintenance_task("ns.t", "compact", 1.5, result)
    m.maintenance_failed("ns.t", "expire_snapshots", "conflict")
    m.set_health(TableHealth("ns.t", 5, 2, 1, 10, 0, 100, 2000, 3, 3, 4000, 1, None, None, None))


@pytest.fixture
def collected() -> Iterator[dict[str, object]]:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    m = SinkMetrics(provider.get_meter("icesink"), "s1", "ns.t")
    exercise(m)
    data = reader.get_metrics_data()
    assert data is not None
    yield {
        metric.name: metric
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for metric in sm.metrics
    }
    provider.shutdown()


def test_every_instrument_has_its_semantic_convention_name_and_unit(collected: dict[str, object]) -> None:
    assert set(collected) == set(INSTRUMENTS)
    for name, (_kind, unit) in INSTRUMENTS.items():
        metric = collected[name]
        assert getattr(metric, "unit", None) == unit, name
        assert re.fullmatch(r"icesink(\.[a-z][a-z0-9_]*)+", name), name
        assert not re.search(r"(_|\.)(seconds|bytes|total)$", name), f"{name}: no unit in the name"


def test_attributes_use_their_documented_names(collected: dict[str, object]) -> None:
    def attrs(name: str) -> list[dict[str, object]]:
        return [dict(p.attributes or {}) for p in collected[name].data.data_points]  # type: ignore[attr-defined]

    assert {a["icesink.file.content"] for a in attrs("icesink.iceberg.written")} == {"data", "delete"}
    assert attrs("icesink.records")[0]["icesink.op"] == "c"
    assert attrs("icesink.commit.failures")[0]["error.type"] == "conflict"
    lag = attrs("icesink.kafka.lag")
    assert {(a["messaging.destination.name"], a["messaging.destination.partition.id"]) for a in lag} == {
        ("t", "0"),
        ("t", "1"),
    }
    assert [p.value for p in collected["icesink.tables.held"].data.data_points] == [12]  # type: ignore[attr-defined]
    files = {
        (a["icesink.maintenance.task"], a["icesink.maintenance.action"])
        for a in attrs("icesink.maintenance.files")
    }
    assert files == {("compact", "rewritten"), ("compact", "added"), ("compact", "removed")}
    assert attrs("icesink.maintenance.failures")[0]["error.type"] == "conflict"
    assert {a["icesink.file.content"] for a in attrs("icesink.table.files")} == {"data", "delete"}
    for name in INSTRUMENTS:
        for a in attrs(name):
            assert a["icesink.sink_id"] == "s1" and a["icesink.table"] == "ns.t"


def test_freshness_is_the_age_now_not_at_commit() -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    m = SinkMetrics(provider.get_meter("icesink"), "s1", "ns.t")

    def freshness() -> float | None:
        data = reader.get_metrics_data()
        for rm in data.resource_metrics if data else []:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    if metric.name == "icesink.freshness":
                        return float(next(iter(metric.data.data_points)).value)  # type: ignore[attr-defined]
        return None

    assert freshness() is None  # nothing committed yet: no value rather than a made-up one
    m.set_newest_committed(time.time() - 5)
    first = freshness()
    time.sleep(0.2)
    second = freshness()
    assert first is not None and second is not None and 5 <= first < second
    m.set_newest_committed(time.time() - 100)  # an older change never makes the data look older
    assert (freshness() or 0) < 10
    provider.shutdown()


def test_prometheus_names_match_the_docs() -> None:
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from prometheus_client import REGISTRY, generate_latest

    reader = PrometheusMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    try:
        exercise(SinkMetrics(provider.get_meter("icesink"), "s1", "ns.t"))
        samples = parse_prometheus(generate_latest(REGISTRY).decode())
    finally:
        provider.shutdown()  # also takes the reader's collector off the default registry
    names = {s.name for s in samples}
    for otel, prom in PROMETHEUS.items():
        assert prom in names or f"{prom}_count" in names, (
            otel,
            prom,
            sorted(n for n in names if "icesink" in n),
        )
    labels = {k for s in samples if s.name.startswith("icesink_") for k in s.labels}
    assert {"icesink_op", "icesink_file_content", "error_type", "messaging_destination_name"} <= labels

    doc = DOC.read_text()
    for otel, prom in PROMETHEUS.items():
        assert f"`{otel}`" in doc and f"`{prom}`" in doc, f"docs/metrics.md must document {otel} / {prom}"
    assert set(PROMETHEUS) == set(INSTRUMENTS)


def test_otlp_endpoint_gets_the_metrics_path() -> None:
    assert otlp_metrics_url("http://collector:4318") == "http://collector:4318/v1/metrics"
    assert otlp_metrics_url("http://collector:4318/") == "http://collector:4318/v1/metrics"
    assert otlp_metrics_url("https://x/custom/v1/metrics") == "https://x/custom/v1/metrics"


def test_lag_is_high_watermark_minus_committed() -> None:
    marks = {("a", 0): (0, 100), ("a", 1): (40, 50), ("a", 2): (0, 0), ("b", 0): (10, 30)}
    committed = {"a": {0: 90, 1: 50, 2: 0}}
    assert compute_lag(marks, committed) == {("a", 0): 10, ("a", 1): 0, ("a", 2): 0, ("b", 0): 20}
    # A committed offset below the retained range (records expired) counts only what is still there.
    assert compute_lag({("a", 0): (80, 100)}, {"a": {0: 10}}) == {("a", 0): 20}


def test_lag_monitor_polls_and_publishes() -> None:
    config = parse_config(
        {
            "sink_id": "s1",
            "kafka": {"bootstrap_servers": "127.0.0.1:1", "topics": ["a"]},
            "table": {"identifier": "ns.t", "key": ["id"]},
            "catalog": {"type": "rest"},
            "txnlog": {"dsn": "postgresql://x@h/db"},
            "metrics": {"export_interval": "2s"},
        },
        env={},
    )
    published: list[dict[tuple[str, int], int]] = []

    class Fake(LagMonitor):
        def watermarks(self, timeout_s: float = 10.0) -> dict[tuple[str, int], tuple[int, int]]:
            return {("a", 0): (0, 10 + len(published))}

    class Sink:
        def set_lag(self, lag: dict[tuple[str, int], int]) -> None:
            published.append(lag)

    offsets = {"a": {0: 4}}
    monitor = Fake(config, lambda: {"a": [0]}, lambda: offsets, Sink(), interval_s=0.05)  # type: ignore[arg-type]
    assert Fake(config, lambda: {"a": [0]}, lambda: offsets, Sink()).interval_s == 2.0  # type: ignore[arg-type]
    assert config.metrics.export_interval == timedelta(seconds=2)
    monitor.start()
    try:
        deadline = time.monotonic() + 5
        while len(published) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        monitor.stop()
    assert published[:3] == [{("a", 0): 6}, {("a", 0): 7}, {("a", 0): 8}]


def test_lag_monitor_measures_a_topic_the_pattern_picked_up_later() -> None:
    config = parse_config(
        {
            "sink_id": "s1",
            "kafka": {"bootstrap_servers": "127.0.0.1:1", "topic_pattern": "shop\\..*"},
            "table": {"identifier": "lake.{topic}", "key": ["id"]},
            "catalog": {"type": "rest"},
            "txnlog": {"dsn": "postgresql://x@h/db"},
        },
        env={},
    )
    asked: list[list[str]] = []

    class Fake(LagMonitor):
        def watermarks(self, timeout_s: float = 10.0) -> dict[tuple[str, int], tuple[int, int]]:
            parts = self.partitions()
            asked.append(sorted(parts))
            return {(t, p): (0, 5) for t, ps in parts.items() for p in ps}

    class Sink:
        def set_lag(self, lag: dict[tuple[str, int], int]) -> None:
            pass

    partitions = {"shop.a": [0]}
    monitor = Fake(config, lambda: partitions, lambda: {}, Sink())  # type: ignore[arg-type]
    assert monitor.poll_once() == {("shop.a", 0): 5}
    partitions = {**partitions, "shop.b": [0, 1]}  # the job found a new topic
    assert monitor.poll_once() == {("shop.a", 0): 5, ("shop.b", 0): 5, ("shop.b", 1): 5}
    assert asked == [["shop.a"], ["shop.a", "shop.b"]]


def test_health_endpoints() -> None:
    health = Health()
    port = health.serve("127.0.0.1", free_port())
    base = f"http://127.0.0.1:{port}"
    try:
        assert http_status(f"{base}/healthz") == 200
        assert http_status(f"{base}/readyz") == 503
        health.set_ready(sink_id="s1", epoch=3)
        assert http_status(f"{base}/readyz") == 200
        health.set_not_ready("stopped")
        assert http_status(f"{base}/readyz") == 503
        assert http_status(f"{base}/healthz") == 200
        assert http_status(f"{base}/nope") == 404
    finally:
        health.close()
