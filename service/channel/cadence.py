"""When to commit: ``commit.min_size`` bytes buffered, or ``commit.max_period`` since the last commit.

Spark triggers a micro-batch every ``commit.trigger_interval``; with a cadence configured, batches are
buffered until one of the two limits is reached and then committed together. The buffered batches are
decoded and compacted as one (the last change per key across all of them), so the snapshot still
holds one row per key and its equality deletes apply only to older snapshots (rules 2 and 3).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta


@dataclass
class CommitCadence:
    min_size: int | None = None
    max_period: timedelta | None = None
    last_commit: float = field(default=0.0)

    @property
    def every_trigger(self) -> bool:
        return self.min_size is None and self.max_period is None

    def due(self, buffered_bytes: int, now: float) -> bool:
        """With neither limit set, every trigger commits; otherwise whichever limit comes first."""
        if self.every_trigger:
            return True
        if self.min_size is not None and buffered_bytes >= self.min_size:
            return True
        return self.max_period is not None and now - self.last_commit >= self.max_period.total_seconds()

    def committed(self, now: float) -> None:
        self.last_commit = now
