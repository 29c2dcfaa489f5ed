"""What a commit reports: its metrics and its log line (one per table committed)."""

from __future__ import annotations

import logging
import time

from service.commit.plan import PendingCommit
from service.metrics import SinkMetrics
from service.pipeline.result import TableWrite

logger = logging.getLogger(__name__)


def report_commit(
    metrics: SinkMetrics, write: TableWrite, plan: PendingCommit, seq: int, commit_s: float
) -> None:
    """Count the commit in the metrics and log its line: ``committed seq N to <table>: ...``."""
    m = metrics
    attrs = m.attrs(table=write.table)
    m.commit_duration.record(commit_s, attrs)
    m.commits.add(1, attrs)
    for op, n in write.by_op.items():
        m.records.add(n, m.attrs(op=op, table=write.table))
    if write.dead_letters:
        m.dead_letters.add(write.dead_letters, attrs)
    for content, files in (("data", plan.data_files), ("delete", plan.delete_files)):
        if files:
            m.written_bytes.add(
                sum(f.file_size_in_bytes for f in files), m.attrs(content=content, table=write.table)
            )
            m.written_files.add(len(files), m.attrs(content=content, table=write.table))
    if write.newest is not None:
        m.set_freshness(max(0.0, time.time() - write.newest.timestamp()))
    logger.info(
        "committed seq %d to %s: snapshot %s, %d records (%s), %d dead letters, %d data + %d delete rows, "
        "%d bytes, write %.2fs, commit %.2fs, %s decoder",
        seq,
        plan.table,
        plan.snapshot_id,
        write.records,
        ", ".join(f"{k}={v}" for k, v in sorted(write.by_op.items())) or "none",
        write.dead_letters,
        plan.stats["data_rows"],
        plan.stats["delete_rows"],
        plan.stats["bytes"],
        write.write_s,
        commit_s,
        write.decoder,
        extra={
            "fields": {
                "table": plan.table,
                "snapshot_id": plan.snapshot_id,
                "seq": seq,
                "records": write.records,
                "bytes": plan.stats["bytes"],
                "duration_s": round(write.write_s + commit_s, 3),
                "write_s": round(write.write_s, 3),
                "commit_s": round(commit_s, 3),
                "decoder": write.decoder,
            }
        },
    )
