"""Kafka lag behind the committed offsets, fed into the ``icesink.kafka.lag`` gauge.

A daemon thread asks the brokers for each partition's watermarks every ``metrics.export_interval``
(clamped to 1..60 s) and compares the high watermark with the offsets the sink has committed (the
job's ``offsets``: the next offset to read, per topic and partition, as held by the txnlog). A
partition with no committed offset yet counts everything still retained (high - low watermark) when
the sink starts from the earliest offsets, and 0 when it starts from the latest.

The job starts it once it is consuming::

    start_lag_monitor(self.config, lambda: self.partitions, lambda: self.offsets, self.metrics)

Both are read at every measurement: a topic the sink's pattern picks up while it runs is measured
from then on.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from service.config import SinkConfig
from service.kafka import lookups
from service.kafka.lookups import Watermarks
from service.metrics import SinkMetrics

logger = logging.getLogger(__name__)

Offsets = Mapping[str, Mapping[int, int]]


def compute_lag(watermarks: Watermarks, committed: Offsets) -> dict[tuple[str, int], int]:
    """Records per partition between the committed offset and the high watermark (never negative)."""
    lag: dict[tuple[str, int], int] = {}
    for (topic, partition), (low, high) in watermarks.items():
        done = committed.get(topic, {}).get(partition, low)
        lag[(topic, partition)] = max(0, high - max(done, low))
    return lag


class LagMonitor:
    def __init__(
        self,
        config: SinkConfig,
        partitions: Callable[[], Mapping[str, list[int]]],
        committed: Callable[[], Offsets],
        metrics: SinkMetrics,
        interval_s: float | None = None,
    ) -> None:
        self.config = config
        self.partitions = partitions
        self.committed = committed
        self.metrics = metrics
        if interval_s is None:
            interval_s = min(60.0, max(1.0, config.metrics.export_interval.total_seconds()))
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._consumer: Any = None
        self._failing = False

    def watermarks(self, timeout_s: float = 10.0) -> Watermarks:
        if self._consumer is None:
            self._consumer = lookups.consumer(self.config.kafka, "lag")
        return lookups.watermarks(
            self._consumer, {t: list(ps) for t, ps in self.partitions().items()}, timeout_s
        )

    def poll_once(self) -> dict[tuple[str, int], int]:
        """Measure and publish the lag once; returns it."""
        marks = self.watermarks()
        lag = compute_lag(marks, self.committed())
        self.metrics.set_lag(lag)
        return lag

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll_once()
                if self._failing:
                    logger.info("Kafka lag measurement works again")
                self._failing = False
            except Exception as exc:  # Kafka down: say it once per outage, keep the last values
                if not self._failing:
                    logger.warning("cannot measure Kafka lag (%s: %s); will retry", type(exc).__name__, exc)
                self._failing = True
            self._stop.wait(self.interval_s)
        if self._consumer is not None:
            self._consumer.close()

    def start(self) -> LagMonitor:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="icesink-lag", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)


def start_lag_monitor(
    config: SinkConfig,
    partitions: Callable[[], Mapping[str, list[int]]],
    committed: Callable[[], Offsets],
    metrics: SinkMetrics,
) -> LagMonitor:
    """Start measuring lag in the background; the thread is a daemon, ``stop()`` ends it early."""
    return LagMonitor(config, partitions, committed, metrics).start()
