"""When to commit: ``commit.min_size`` bytes buffered, or ``commit.max_period`` since the buffer began.

Spark triggers a micro-batch every ``commit.trigger_interval``; with a cadence configured, batches are
buffered until one of the two limits is reached and then committed together. The buffered batches are
decoded and compacted as one (the last change per key across all of them), so the snapshot still
holds one row per key and its equality deletes apply only to older snapshots (rules 2 and 3).

The period counts from the moment the buffer's first batch was buffered, and it is checked between
micro-batches too (:meth:`service.pipeline.batches.Batches.idle`, from the job's run loop): Spark runs no micro-batch while no
record arrives, so a buffer left behind when traffic stops would otherwise never be committed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from pyspark.sql import DataFrame

from service.model.offsets import Offsets, merge_offsets


@dataclass(frozen=True)
class CommitCadence:
    """``min_size``: bytes of Kafka values for the sink's buffer; Kafka records for a table's held
    changes (``commit.table_min_records``, service.pipeline.held)."""

    min_size: int | None = None
    max_period: timedelta | None = None

    @property
    def every_trigger(self) -> bool:
        return self.min_size is None and self.max_period is None

    def due(self, buffered_bytes: int, buffered_for: float) -> bool:
        """With neither limit set, every trigger commits; otherwise whichever limit comes first.

        ``buffered_for``: seconds since the buffer's first batch was buffered.
        """
        if self.every_trigger:
            return True
        if self.min_size is not None and buffered_bytes >= self.min_size:
            return True
        return self.max_period is not None and buffered_for >= self.max_period.total_seconds()


@dataclass
class Buffer:
    """Micro-batches read but not yet committed."""

    frames: list[DataFrame] = field(default_factory=list)
    offsets: Offsets = field(default_factory=dict)
    bytes: int = 0
    newest: datetime | None = None
    since: float | None = None  # time.monotonic() when the first batch was buffered

    def age(self, now: float) -> float:
        return 0.0 if self.since is None else now - self.since

    def add(self, frame: DataFrame, end: Offsets, size: int, newest: datetime | None, now: float) -> None:
        self.frames.append(frame)
        self.offsets = merge_offsets(self.offsets, end)
        self.bytes += size
        if newest is not None and (self.newest is None or newest > self.newest):
            self.newest = newest
        if self.since is None:
            self.since = now
