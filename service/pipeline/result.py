"""The one result of writing a batch into a table: what the commit, the metrics and the log line use."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

import pyarrow as pa
from pyiceberg.manifest import DataFile

from service.commit.plan import PendingCommit, new_snapshot_id
from service.model.offsets import Offsets


@dataclass(frozen=True)
class TableWrite:
    """A batch written into one table, not yet committed.

    ``offsets`` are where the sink's committed offsets stand once this is committed (the batch's end
    merged over what was committed before). ``started`` and ``written`` are ``time.monotonic()``
    readings around the write; a write with no files (only dead letters, or a batch of aborted records
    and transaction markers) still moves the offsets.
    """

    table: str
    offsets: Offsets
    started: float
    written: float
    files: list[DataFile] = field(default_factory=list)
    records: int = 0
    dead_letters: int = 0
    by_op: dict[str, int] = field(default_factory=dict)
    newest: datetime | None = None
    decoder: str = "spark"
    # delete_format: position: where this write's keys' rows are (service.data.position_deletes), until
    # the commit step resolves them into position deletes (service.pipeline.deletes); then the file
    # that keeps the deleted rows' keys and the snapshot their positions were resolved against
    located: pa.Table | None = None
    position_keys: str | None = None
    resolved_at: int | None = None

    @property
    def data_files(self) -> list[DataFile]:
        return [f for f in self.files if int(f.content) == 0]

    @property
    def delete_files(self) -> list[DataFile]:
        return [f for f in self.files if int(f.content) != 0]

    @property
    def write_s(self) -> float:
        return self.written - self.started

    def plan(self, topic_ids: dict[str, str]) -> PendingCommit:
        """The plan the txnlog precommits: these files, as one snapshot, with these offsets."""
        data, deletes = self.data_files, self.delete_files
        return PendingCommit(
            table=self.table,
            offsets=self.offsets,
            snapshot_id=new_snapshot_id() if self.files else None,
            data_files=data,
            delete_files=deletes,
            topic_ids=dict(topic_ids),
            position_keys=self.position_keys,
            resolved_at=self.resolved_at,
            stats={
                "records": self.records,
                "dead_letters": self.dead_letters,
                "data_rows": sum(f.record_count for f in data),
                "delete_rows": sum(f.record_count for f in deletes),
                "bytes": sum(f.file_size_in_bytes for f in self.files),
            },
        )
