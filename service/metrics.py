"""OpenTelemetry metrics of the sink; exported by Prometheus scrape and/or OTLP (see docs/metrics.md).

Names and units follow the OpenTelemetry semantic conventions: dotted names under the ``icesink.``
namespace, UCUM units (``s``, ``By``, ``{record}``), no unit in the name (exporters add it: the
Prometheus name of ``icesink.commit.duration`` is ``icesink_commit_duration_seconds``), counts of things
plural, ``error.type`` and ``messaging.destination.*`` where a convention exists. Every metric carries
``icesink.sink_id`` and ``icesink.table``. docs/metrics.md lists every metric; keep the two in step.

This module sits below everything that reports to it: it imports only the configuration. What it
reports of maintenance comes in as the protocols ``TaskCounts`` and ``TableFigures``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Generic, Protocol, TypeVar, cast, overload
from urllib.parse import urlsplit

from opentelemetry import metrics
from opentelemetry.metrics import Counter, Histogram, ObservableGauge, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource

from service.config import MetricsConfig

_DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)

# Short attribute keys accepted by SinkMetrics.attrs() and the names they are exported under.
ATTRIBUTE_NAMES = {
    "op": "icesink.op",  # Debezium op code of a change record: c, u, d, r
    "content": "icesink.file.content",  # Iceberg file content: data, delete
    "table": "icesink.table",  # the table a commit went to (a sink of many tables)
    "task": "icesink.maintenance.task",  # compact, expire_snapshots, rewrite_manifests, remove_orphans, ...
}


class TaskCounts(Protocol):
    """What one maintenance task changed (service.maintenance.tasks.TaskResult is one)."""

    @property
    def files_rewritten(self) -> int: ...
    @property
    def files_added(self) -> int: ...
    @property
    def files_removed(self) -> int: ...
    @property
    def bytes_rewritten(self) -> int: ...
    @property
    def snapshots_expired(self) -> int: ...


class TableFigures(Protocol):
    """A table's figures the table gauges report (service.maintenance.health.TableHealth is one)."""

    @property
    def table(self) -> str: ...
    @property
    def data_files(self) -> int: ...
    @property
    def delete_files(self) -> int: ...
    @property
    def snapshots(self) -> int: ...
    @property
    def metadata_bytes(self) -> int: ...


_I = TypeVar("_I")
_Observe = Callable[["SinkMetrics"], Iterable[Observation]]


class Instrument(Generic[_I]):
    """One instrument, declared once as a class attribute of SinkMetrics: its name, kind, unit and
    description. Each SinkMetrics creates its own in ``__init__`` and holds it under the same attribute
    name (``metrics.commits``); gauges are observed through ``observe`` when the exporter collects."""

    def __init__(
        self,
        kind: str,
        name: str,
        unit: str,
        description: str,
        observe: _Observe | None = None,
        starts_at_zero: bool = False,
    ) -> None:
        self.kind = kind  # counter, histogram or gauge
        self.name = name
        self.unit = unit
        self.description = description
        self.observe = observe
        # Exported at 0 from the start, so an alert on its increase has a series before the first event.
        self.starts_at_zero = starts_at_zero
        self.attribute = ""

    def __set_name__(self, owner: type, attribute: str) -> None:
        self.attribute = attribute

    @overload
    def __get__(self, obj: None, owner: type) -> Instrument[_I]: ...
    @overload
    def __get__(self, obj: object, owner: type) -> _I: ...
    def __get__(self, obj: object, owner: type) -> Instrument[_I] | _I:
        if obj is None:
            return self
        # SinkMetrics.__init__ sets the instance's own instrument, which Python finds before this.
        raise AttributeError(f"{type(obj).__name__} has no instrument {self.attribute} yet")

    def create(self, meter: metrics.Meter, sink: SinkMetrics) -> _I:
        made: Any
        if self.kind == "counter":
            made = meter.create_counter(self.name, unit=self.unit, description=self.description)
            if self.starts_at_zero:
                made.add(0, sink.attrs())
        elif self.kind == "histogram":
            made = meter.create_histogram(
                self.name,
                unit=self.unit,
                description=self.description,
                explicit_bucket_boundaries_advisory=_DURATION_BUCKETS,
            )
        else:
            observe = self.observe
            assert observe is not None, self.name
            made = meter.create_observable_gauge(
                self.name,
                callbacks=[lambda _options: observe(sink)],
                unit=self.unit,
                description=self.description,
            )
        return cast(_I, made)


def _counter(name: str, unit: str, description: str, starts_at_zero: bool = False) -> Instrument[Counter]:
    return Instrument("counter", name, unit, description, starts_at_zero=starts_at_zero)


def _histogram(name: str, unit: str, description: str) -> Instrument[Histogram]:
    return Instrument("histogram", name, unit, description)


def _gauge(name: str, unit: str, description: str, observe: _Observe) -> Instrument[ObservableGauge]:
    return Instrument("gauge", name, unit, description, observe)


class SinkMetrics:
    """The instruments; one instance per process. Attributes name the sink and table.

    Every instrument is declared once, here, in the order they are created."""

    written_bytes = _counter(
        "icesink.iceberg.written",
        "By",
        "Bytes of Parquet files written and committed, by icesink.file.content (data, delete)",
    )
    written_files = _counter(
        "icesink.iceberg.files",
        "{file}",
        "Parquet files written and committed, by icesink.file.content (data, delete)",
    )
    write_duration = _histogram(
        "icesink.write.duration", "s", "Time to decode, compact and write one batch's files"
    )
    commit_duration = _histogram(
        "icesink.commit.duration", "s", "Time from precommit to the txnlog commit of one batch"
    )
    commits = _counter("icesink.commits", "{commit}", "Batches committed (txnlog and Iceberg)")
    commit_failures = _counter(
        "icesink.commit.failures",
        "{failure}",
        "Failed Iceberg commit attempts, by error.type (conflict, unknown_outcome)",
    )
    fenced = _counter(
        "icesink.fenced", "{event}", "Times this replica found itself fenced by a newer epoch (it stops)"
    )
    records = _counter(
        "icesink.records",
        "{record}",
        "Change records committed, by icesink.op (c, u, d, r); dead letters excluded",
    )
    dead_letters = _counter(
        "icesink.dead_letters",
        "{record}",
        "Records sent to the dead-letter topic (undecodable or schema-violating)",
    )
    dead_letters_failed = _counter(
        "icesink.dead_letters.failed",
        "{record}",
        "Dead letters the topic refused even without their value; the log names each record",
        starts_at_zero=True,
    )
    declined_batches = _counter(
        "icesink.batches.declined", "{batch}", "Batches the Arrow decoder declined; Spark's decoder took them"
    )
    tables_isolated = _counter(
        "icesink.tables.isolated",
        "{event}",
        "Tables isolated by their own failure (table.on_failure: dead_letter), by "
        "icesink.table and error.type; their records go to the dead-letter topic",
        starts_at_zero=True,  # a series to alert on before the first isolation
    )
    kafka_lag = _gauge(
        "icesink.kafka.lag",
        "{record}",
        "Records in Kafka past the committed offsets, by topic and partition",
        lambda m: m._observe_lag(),
    )
    freshness = _gauge(
        "icesink.freshness",
        "s",
        "Age of the newest committed source change (its Kafka timestamp), now",
        lambda m: m._observe_freshness(),
    )
    tables_held = _gauge(
        "icesink.tables.held",
        "{record}",
        "Records read whose changes a table holds, not yet committed "
        "(commit.table_min_records/table_max_period), by icesink.table",
        lambda m: m._observe_held(),
    )
    maintenance_duration = _histogram(
        "icesink.maintenance.duration",
        "s",
        "Time of one maintenance task on one table, by icesink.maintenance.task",
    )
    maintenance_files = _counter(
        "icesink.maintenance.files",
        "{file}",
        "Files maintenance rewrote, added or removed, by icesink.maintenance.task and "
        "icesink.maintenance.action",
    )
    maintenance_rewritten = _counter(
        "icesink.maintenance.rewritten", "By", "Bytes of files maintenance rewrote"
    )
    snapshots_expired = _counter("icesink.maintenance.snapshots_expired", "{snapshot}", "Snapshots expired")
    maintenance_failures = _counter(
        "icesink.maintenance.failures",
        "{failure}",
        "Maintenance tasks that failed, by icesink.maintenance.task and error.type",
    )
    table_files = _gauge(
        "icesink.table.files",
        "{file}",
        "Live files of a table, by icesink.file.content (data, delete)",
        lambda m: m._observe_files(),
    )
    table_snapshots = _gauge(
        "icesink.table.snapshots",
        "{snapshot}",
        "Snapshots in a table's metadata",
        lambda m: m._observe_health(lambda h: h.snapshots),
    )
    table_metadata_size = _gauge(
        "icesink.table.metadata.size",
        "By",
        "Size of a table's current metadata file",
        lambda m: m._observe_health(lambda h: h.metadata_bytes),
    )

    def __init__(self, meter: metrics.Meter, sink_id: str, table: str) -> None:
        self._attrs = {"icesink.sink_id": sink_id, "icesink.table": table}
        self._lock = threading.Lock()
        self._lag: dict[tuple[str, int], int] = {}
        self._newest_committed: float | None = None  # epoch seconds of the newest committed change
        self._held: dict[str, int] = {}  # table → records whose changes are held (service.pipeline.held)
        self._health: dict[str, TableFigures] = {}
        for instrument in declared():
            setattr(self, instrument.attribute, instrument.create(meter, self))

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

    def maintenance_task(self, table: str, task: str, seconds: float, result: TaskCounts) -> None:
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

    def set_health(self, health: TableFigures) -> None:
        with self._lock:
            self._health[health.table] = health

    def _observe_files(self) -> Iterable[Observation]:
        with self._lock:
            items = sorted(self._health.items())
        for table, health in items:
            yield Observation(health.data_files, self.attrs(table=table, content="data"))
            yield Observation(health.delete_files, self.attrs(table=table, content="delete"))

    def _observe_health(self, value: Callable[[TableFigures], int]) -> Iterable[Observation]:
        with self._lock:
            items = sorted(self._health.items())
        for table, health in items:
            yield Observation(value(health), self.attrs(table=table))

    def _observe_held(self) -> Iterable[Observation]:
        with self._lock:
            items = sorted(self._held.items())
        for table, records in items:
            yield Observation(records, self.attrs(table=table))

    def _observe_lag(self) -> Iterable[Observation]:
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

    def _observe_freshness(self) -> Iterable[Observation]:
        with self._lock:
            newest = self._newest_committed
        if newest is not None:
            yield Observation(max(0.0, time.time() - newest), self.attrs())


def declared() -> list[Instrument[Any]]:
    """Every instrument of SinkMetrics, in the order they are declared (and created)."""
    return [v for v in vars(SinkMetrics).values() if isinstance(v, Instrument)]


# Every instrument: name -> (kind, unit). tests/ops checks the docs and the exporters against it.
INSTRUMENTS: dict[str, tuple[str, str]] = {i.name: (i.kind, i.unit) for i in declared()}


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
