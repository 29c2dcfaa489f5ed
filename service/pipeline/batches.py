"""Between the read and the write step: a batch is written at once, or buffered while the commit
cadence (:mod:`service.pipeline.cadence`) says to wait."""

from __future__ import annotations

import logging
import time
from functools import reduce

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from service.kafka.records import KafkaRecords
from service.model.offsets import merge_offsets
from service.pipeline.cadence import Buffer, CommitCadence
from service.pipeline.read import Batch
from service.pipeline.write import BatchWriter

logger = logging.getLogger(__name__)


class Batches:
    """Between the read and the write step: each batch written at once, or buffered until the cadence
    says the buffer is due; and the tables' held changes that came due while no batch came."""

    def __init__(self, cadence: CommitCadence, writer: BatchWriter, arrow: bool) -> None:
        self.cadence = cadence
        self.writer = writer
        self.arrow = arrow  # batches try the Arrow path first (only when not buffered)
        self.buffer = Buffer()

    def take(self, batch: Batch) -> None:
        """Write one micro-batch and commit it, or buffer it while the cadence says to wait.

        With an empty buffer the Arrow path is tried first, table by table; a table's records it
        declines are written by Spark's path.
        """
        if self.arrow and not self.buffer.frames:
            self.writer.write(batch, arrow=True)
            return
        rows = batch.records.rows.persist()
        ranges = (
            rows.groupBy("topic", "partition")
            .agg(F.max("timestamp").alias("newest"), F.sum(F.length("value")).alias("bytes"))
            .collect()
        )
        buffer = self.buffer
        if not ranges:
            rows.unpersist()
            if buffer.frames:
                buffer.offsets = merge_offsets(buffer.offsets, batch.end)
            else:
                self.writer.commit_offsets(batch)
            return
        newest = max((r["newest"] for r in ranges if r["newest"] is not None), default=None)
        buffer.add(rows, batch.end, sum(r["bytes"] or 0 for r in ranges), newest, time.monotonic())
        if self.cadence.due(buffer.bytes, buffer.age(time.monotonic())):
            self.flush(batch.topic_ids)
        else:
            logger.debug("buffered %d bytes in %d batch(es); not yet due", buffer.bytes, len(buffer.frames))

    def flush(self, topic_ids: dict[str, str]) -> None:
        """Decode, compact, write and commit everything buffered, one snapshot per table."""
        buffer, self.buffer = self.buffer, Buffer()
        if not buffer.frames:
            return
        records = KafkaRecords(reduce(DataFrame.unionAll, buffer.frames))
        try:
            self.writer.write(Batch(records, buffer.offsets, topic_ids, buffer.newest), arrow=False)
        finally:
            for frame in buffer.frames:
                frame.unpersist()

    def due_when_idle(self) -> bool:
        """Whether anything is due with no new batch: a buffer past ``commit.max_period``, or held
        changes past ``commit.table_max_period``."""
        held = self.writer.held
        buffer = self.buffer
        buffered = bool(buffer.frames) and self.cadence.due(buffer.bytes, buffer.age(time.monotonic()))
        return buffered or (held is not None and bool(held.due(time.monotonic())))

    def idle(self, topic_ids: dict[str, str]) -> None:
        """Commit what came due while no micro-batch came (call under the batch lock).

        Spark runs no micro-batch while no record arrives, so the batch path alone would leave the
        buffer of the last batches before a pause, and held changes, invisible until traffic resumes.
        """
        if (held := self.writer.held) is not None:
            self.writer.commit_held(held.due(time.monotonic()), "due, no new batch", topic_ids)
        buffer = self.buffer
        if buffer.frames and self.cadence.due(buffer.bytes, buffer.age(time.monotonic())):
            logger.info(
                "commit.max_period passed with no new batch: committing %d buffered batch(es), %d bytes",
                len(buffer.frames),
                buffer.bytes,
            )
            self.flush(topic_ids)

    def land_the_rest(self, topic_ids: dict[str, str]) -> None:
        """Write and commit what the cadence buffered and the tables' held changes (the stream ended)."""
        self.flush(topic_ids)
        held = self.writer.held
        self.writer.commit_held(held.tables() if held else [], "the stream ended", topic_ids)
