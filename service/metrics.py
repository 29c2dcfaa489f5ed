"""OpenTelemetry metrics of the sink; exported by Prometheus scrape and/or OTLP (see docs/metrics.md).

Names and units follow the OpenTelemetry semantic conventions: dotted names under the ``icesink.``
namespace, UCUM units (``s``, ``By``, ``{record}``), no unit in the name (exporters add it: the
Prometheus name of ``icesink.commit.duration`` is ``icesink_commit_duration_seconds``), counts of things
plural, ``error.type`` and ``messaging.destination.*`` where a convention exists. Every metric carries
``icesink.sink_id`` and ``icesink.table``. docs/metrics.md lists every metric; keep the two in step.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource

from service.config import MetricsConfig

if TYPE_CHECKING:
    from service.maintenance.table_health import TableHealth
    from service.maintenance.tasks import TaskResult

_DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)

# Short attribute keys accepted by SinkMetrics.attrs() and the names they are exported under.
ATTRIBUTE_NAMES = {
    "op": "icesink.op",  # Debezium op code of a change record: c, u, d, r
    "content": "icesink.file.content",  # Iceberg file content: data, delete
    "table": "icesink.table",  # the table a commit went to (a sink of many tables)
    "task": "icesink.maintenance.task",  # compact, expire_snapshots, rewrite_manifests, remove_orphans, ...
}

# Every instrument: name -> (kind, unit). tests/ops checks the docs and the exporters against it.
INSTRUMENTS: dict[str, tuple[str, str]] = {
    "icesink.iceberg.written": ("counter", "By"),
    "icesink.iceberg.files": ("counter", "{file}"),
    "icesink.write.duration": ("histogram", "s"),
    "icesink.commit.duration": ("histogram", "s"),
    "icesink.commits": ("counter", "{commit}"),
    "icesink.commit.failures": ("counter", "{failure}"),
    "icesink.fenced": ("counter", "{event}"),
    "icesink.records": ("counter", "{record}"),
    "icesink.dead_letters": ("counter", "{record}"),
    "icesink.dead_letters.failed": ("counter", "{record}"),
    "icesink.batches.declined": ("counter", "{batch}"),
    "icesink.tables.isolated": ("counter", "{event}"),
    "icesink.kafka.lag": ("gauge", "{record}"),
    "icesink.freshness": ("gauge", "s"),
    "icesink.tables.held": ("gauge", "{record}"),
    "icesink.maintenance.duration": ("histogram", "s"),
    "icesink.maintenance.files": ("counter", "{file}"),
    "icesink.maintenance.rewritten": ("counter", "By"),
    "icesink.maintenance.snapshots_expired": ("counter", "{snapshot}"),
    "icesink.maintenance.failures": ("counter", "{failure}"),
    "icesink.table.files": ("gauge", "{file}"),
    "icesink.table.snapshots": ("gauge", "{snapshot}"),
    "icesink.table.metadata.size": ("gauge", "By"),
}


class SinkMetrics:
    """The instruments; one instance per process. Attributes name the sink and table."""

    def __init__(self, meter: metrics.Meter, sink_id: str, table: str) -> None:
        self._attrs = {"icesink.sink_id": sink_id, "icesink.table": table}
        self._lock = threading.Lock()
        self._lag: dict[tuple[str, int], int] = {}
        self._newest_committed: float | None = None  # epoch seconds of the newest committed change
        self._held: dict[str, int] = {}  # table → records whose changes are held (service.pipeline.held)
        self.written_bytes = meter.create_counter(
            "icesink.iceberg.written",
            unit="By",
            description="Bytes of Parquet files written and committed, by icesink.file.content (data, delete)",
        )
        self.written_files = meter.create_counter(
            "icesink.iceberg.files",
            unit="{file}",
            description="Parquet files written and committed, by icesink.file.content (data, delete)",
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
            description="Time from precommit to the txnlog commit of one batch",
            explicit_bucket_boundaries_advisory=_DURATION_BUCKETS,
        )
        self.commits = meter.create_counter(
            "icesink.commits", unit="{commit}", description="Batches committed (txnlog and Iceberg)"
        )
        self.commit_failures = meter.create_counter(
            "icesink.commit.failures",
            unit="{failure}",
            description="Failed Iceberg commit attempts, by error.type (conflict, unknown_outcome)",
        )
        self.fenced = meter.create_counter(
            "icesink.fenced",
            unit="{event}",
            description="Times this replica found itself fenced by a newer epoch (it stops)",
        )
        self.records = meter.create_counter(
            "icesink.records",
            unit="{record}",
            description="Change records committed, by icesink.op (c, u, d, r); dead letters excluded",
        )
        self.dead_letters = meter.create_counter(
            "icesink.dead_letters",
            unit="{record}",
            description="Records sent to the dead-letter topic (undecodable or schema-violating)",
        )
        self.dead_letters_failed = meter.create_counter(
            "icesink.dead_letters.failed",
            unit="{record}",
            description="Dead letters the topic refused even without their value; the log names each record",
        )
        # Exported at 0 from the start, so an alert on its increase has a series before the first failure.
        self.dead_letters_failed.add(0, self.attrs())
        self.declined_batches = meter.create_counter(
            "icesink.batches.declined",
            unit="{batch}",
            description="Batches the Arrow decoder declined; Spark's decoder took them",
        )
        self.tables_isolated = meter.create_counter(
            "icesink.tables.isolated",
            unit="{event}",
            description="Tables isolated by their own failure (table.on_failure: dead_letter), by "
            "icesink.table and error.type; their records go to the dead-letter topic",
        )
        self.tables_isolated.add(0, self.attrs())  # a series to alert on before the first isolation
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
            description="Age of the newest committed source change (its Kafka timestamp), now",
        )
        meter.create_observable_gauge(
            "icesink.tables.held",
            callbacks=[self._observe_held],
            unit="{record}",
            description="Records read whose changes a table holds, not yet committed "
            "(commit.table_min_records/table_max_period), by icesink.table",
        )

        self._health: dict[str, TableHealth] = {}
        self.maintenance_duration = meter.create_histogram(
            "icesink.maintenance.duration",
            unit="s",
            description="Time of one maintenance task on one table, by icesink.maintenance.task",
            explicit_bucket_boundaries_advisory=_DURATION_BUCKETS,
        )
        self.maintenance_files = meter.create_counter(
            "icesink.maintenance.files",
            unit="{file}",
            description="Files maintenance rewrote, added or removed, by icesink.maintenance.task and "
            "icesink.maintenance.action",
        )
        self.maintenance_rewritten = meter.create_counter(
            "icesink.maintenance.rewritten", unit="By", description="Bytes of files maintenance rewrote"
        )
        self.snapshots_expired = meter.create_counter(
            "icesink.maintenance.snapshots_expired", unit="{snapshot}", description="Snapshots expired"
        )
        self.maintenance_failures = meter.create_counter(
            "icesink.maintenance.failures",
            unit="{failure}",
            description="Maintenance tasks that failed, by icesink.maintenance.task and error.type",
        )
        meter.create_observable_gauge(
            "icesink.table.files",
            callbacks=[self._observe_files],
            unit="{file}",
            description="Live files of a table, by icesink.file.content (data, delete)",
        )
        meter.create_observable_gauge(
            "icesink.table.snapshots",
            callbacks=[lambda _o: self._observe_health(lambda h: h.snapshots)],
            unit="{snapshot}",
            description="Snapshots in a table's metadata",
        )
        meter.create_observable_gauge(
            "icesink.table.metadata.size",
            callbacks=[lambda _o: self._observe_health(lambda h: h.metadata_bytes)],
            unit="By",
            description="Size of a table's current metadata file",
        )

    def attrs(self, **extra: str) -> dict[str, str]:
        """The sink's attributes plus ``extra``; short keys (``op``, ``content``) get their full names."""
        return {**self._attrs, **{ATTRIBUTE_NAMES.get(k, k): v for k, v in extra.items()}}

    def commit_failed(self, error_type: str) -> None:
        self.commit_failures.add(1, self.attrs(**{"error.type": error_type}))

    def set_lag(self, lag: dict[tuple[str, int], int]) -> None:
        """Records past the committed offset, per (topic, partition); see service.kafka.lag."""
        with self._lock:
            self._lag = dict(lag)

    def set_newest_committed(self, epoch_seconds: float) -> None:
        """The timestamp of the newest change committed so far; freshness is its age when observed."""
        with self._lock:
            if self._newest_committed is None or epoch_seconds > self._newest_committed:
                self._newest_committed = epoch_seconds

    def set_freshness(self, seconds: float) -> None:
        """The newest committed change is ``seconds`` old now (same as set_newest_committed(now - s))."""
        self.set_newest_committed(time.time() - seconds)

    def set_held(self, held: dict[str, int]) -> None:
        """Records held per table; a table that held records and holds none now is reported at 0."""
        with self._lock:
            self._held = {**dict.fromkeys(self._held, 0), **held}

    def maintenance_task(self, table: str, task: str, seconds: float, result: TaskResult) -> None:
        attrs = self.attrs(table=table, task=task)
        self.maintenance_duration.record(seconds, attrs)
        for action, count in (
            ("rewritten", result.files_rewritten),
            ("added", result.files_added),
            ("removed", result.files_removed),
        ):
            if count:
                self.maintenance_files.add(count, {**attrs, "icesink.maintenance.action": action})
        if result.bytes_rewritten:
            self.maintenance_rewritten.add(result.bytes_rewritten, attrs)
        if result.snapshots_expired:
            self.snapshots_expired.add(result.snapshots_expired, attrs)

    def maintenance_failed(self, table: str, task: str, error_type: str) -> None:
        self.maintenance_failures.add(1, self.attrs(table=table, task=task, **{"error.type": error_type}))

    def set_health(self, health: TableHealth) -> None:
        with self._lock:
            self._health[health.table] = health

    def _observe_files(self, _options: CallbackOptions) -> Iterable[Observation]:
        with self._lock:
            items = sorted(self._health.items())
        for table, health in items:
            yield Observation(health.data_files, self.attrs(table=table, content="data"))
            yield Observation(health.delete_files, self.attrs(table=table, content="delete"))

    def _observe_health(self, value: Callable[[TableHealth], int]) -> Iterable[Observation]:
        with self._lock:
            items = sorted(self._health.items())
        for table, health in items:
            yield Observation(value(health), self.attrs(table=table))

    def _observe_held(self, _options: CallbackOptions) -> Iterable[Observation]:
        with self._lock:
            items = sorted(self._held.items())
        for table, records in items:
            yield Observation(records, self.attrs(table=table))

    def _observe_lag(self, _options: CallbackOptions) -> Iterable[Observation]:
        with self._lock:
            items = sorted(self._lag.items())
        for (topic, partition), lag in items:
            yield Observation(
                lag,
                self.attrs(
                    **{
                        "messaging.system": "kafka",
                        "messaging.destination.name": topic,
                        "messaging.destination.partition.id": str(partition),
                    }
                ),
            )

    def _observe_freshness(self, _options: CallbackOptions) -> Iterable[Observation]:
        with self._lock:
            newest = self._newest_committed
        if newest is not None:
            yield Observation(max(0.0, time.time() - newest), self.attrs())


def otlp_metrics_url(endpoint: str) -> str:
    """``http://collector:4318`` -> ``http://collector:4318/v1/metrics``; a URL with a path is kept."""
    parts = urlsplit(endpoint)
    if parts.path in ("", "/"):
        return endpoint.rstrip("/") + "/v1/metrics"
    return endpoint


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("icesink")
    except PackageNotFoundError:
        return "unknown"


def setup_metrics(config: MetricsConfig, sink_id: str, table: str) -> SinkMetrics:
    """Install a MeterProvider with the configured exporters and return the sink's instruments.

    The provider is shut down at interpreter exit, which pushes a last OTLP export (so a replica that
    stops because it was fenced still reports it).
    """
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
                OTLPMetricExporter(endpoint=otlp_metrics_url(config.otlp_endpoint)),
                export_interval_millis=int(config.export_interval.total_seconds() * 1000),
            )
        )
    provider = MeterProvider(
        metric_readers=readers,
        resource=Resource.create(
            {"service.name": "icesink", "service.version": _version(), "icesink.sink_id": sink_id}
        ),
    )
    return SinkMetrics(provider.get_meter("icesink", _version()), sink_id, table)


def noop_metrics(sink_id: str = "", table: str = "") -> SinkMetrics:
    """Instruments that record nowhere (for tools and tests that don't export)."""
    return SinkMetrics(MeterProvider().get_meter("icesink"), sink_id, table)
