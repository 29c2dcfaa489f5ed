"""OpenTelemetry metrics of the sink; exported by Prometheus scrape and/or OTLP (see docs/metrics.md)."""

from __future__ import annotations

import threading
from collections.abc import Iterable

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource

from service.config import MetricsConfig

_DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class SinkMetrics:
    """The instruments; one instance per process. Attributes name the sink and table."""

    def __init__(self, meter: metrics.Meter, sink_id: str, table: str) -> None:
        self._attrs = {"icesink.sink_id": sink_id, "icesink.table": table}
        self._lock = threading.Lock()
        self._lag: dict[tuple[str, int], int] = {}
        self._freshness_s: float | None = None
        self.written_bytes = meter.create_counter(
            "icesink.iceberg.written",
            unit="By",
            description="Bytes of Parquet files written (data and delete files)",
        )
        self.written_files = meter.create_counter(
            "icesink.iceberg.files", unit="{file}", description="Parquet files written, by content"
        )
        self.write_duration = meter.create_histogram(
            "icesink.write.duration",
            unit="s",
            description="Time to decode, compact and write one batch's files",
            explicit_bucket_boundaries_advisory=_DURATION_BUCKETS,
        )
        self.commit_duration = meter.create_histogram(
            "icesink.commit.duration",
            unit="s",
            description="Time from precommit to the txnlog commit",
            explicit_bucket_boundaries_advisory=_DURATION_BUCKETS,
        )
        self.commits = meter.create_counter(
            "icesink.commits", unit="{commit}", description="Commits that succeeded"
        )
        self.commit_failures = meter.create_counter(
            "icesink.commit.failures", unit="{failure}", description="Failed commit attempts, by error.type"
        )
        self.fenced = meter.create_counter(
            "icesink.fenced",
            unit="{event}",
            description="Times this replica found itself fenced by a newer epoch",
        )
        self.records = meter.create_counter(
            "icesink.records", unit="{record}", description="Change records, by op"
        )
        self.dead_letters = meter.create_counter(
            "icesink.dead_letters", unit="{record}", description="Records sent to the dead-letter topic"
        )
        meter.create_observable_gauge(
            "icesink.kafka.lag",
            callbacks=[self._observe_lag],
            unit="{record}",
            description="Records in Kafka past the committed offsets, by topic and partition",
        )
        meter.create_observable_gauge(
            "icesink.freshness",
            callbacks=[self._observe_freshness],
            unit="s",
            description="Age of the newest committed source change at its commit",
        )

    def attrs(self, **extra: str) -> dict[str, str]:
        return {**self._attrs, **extra}

    def commit_failed(self, error_type: str) -> None:
        self.commit_failures.add(1, self.attrs(**{"error.type": error_type}))

    def set_lag(self, lag: dict[tuple[str, int], int]) -> None:
        with self._lock:
            self._lag = dict(lag)

    def set_freshness(self, seconds: float) -> None:
        with self._lock:
            self._freshness_s = seconds

    def _observe_lag(self, _options: CallbackOptions) -> Iterable[Observation]:
        with self._lock:
            items = list(self._lag.items())
        for (topic, partition), lag in items:
            yield Observation(
                lag,
                self.attrs(
                    **{
                        "messaging.destination.name": topic,
                        "messaging.destination.partition.id": str(partition),
                    }
                ),
            )

    def _observe_freshness(self, _options: CallbackOptions) -> Iterable[Observation]:
        with self._lock:
            value = self._freshness_s
        if value is not None:
            yield Observation(value, self.attrs())


def setup_metrics(config: MetricsConfig, sink_id: str, table: str) -> SinkMetrics:
    """Install a MeterProvider with the configured exporters and return the sink's instruments."""
    readers: list[MetricReader] = []
    if config.prometheus_port is not None:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from prometheus_client import start_http_server

        start_http_server(config.prometheus_port, addr="0.0.0.0")
        readers.append(PrometheusMetricReader())
    if config.otlp_endpoint:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

        readers.append(
            PeriodicExportingMetricReader(
                OTLPMetricExporter(endpoint=config.otlp_endpoint),
                export_interval_millis=int(config.export_interval.total_seconds() * 1000),
            )
        )
    provider = MeterProvider(
        metric_readers=readers,
        resource=Resource.create({"service.name": "icesink", "icesink.sink_id": sink_id}),
    )
    return SinkMetrics(provider.get_meter("icesink"), sink_id, table)


def noop_metrics(sink_id: str = "", table: str = "") -> SinkMetrics:
    """Instruments that record nowhere (for tools and tests that don't export)."""
    return SinkMetrics(MeterProvider().get_meter("icesink"), sink_id, table)
