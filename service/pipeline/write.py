"""The write step: a batch's records into each table it touches, one :class:`BatchOutcome`.

Each table the batch touches writes its topics' records (:class:`~service.pipeline.table.TablePipeline`):
the Arrow path first when it is on (in a sink of many tables, every ready table in one Spark job),
Spark's path for what that declines. A paused table is skipped (its records stay in Kafka), an
isolated one's records go to the dead-letter topic, and a table whose changes are held
(``commit.table_min_records``/``table_max_period``) hands its rows to :class:`HeldTables` until it is
due. The outcome goes to the commit step.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace

from pyspark.sql import functions as F

from service.config import SinkConfig
from service.kafka import dead_letter
from service.kafka.records import KafkaRecords
from service.metrics import SinkMetrics
from service.model.offsets import Offsets
from service.pipeline.commit import CommitStep
from service.pipeline.held import HeldTables
from service.pipeline.isolation import TABLE_FAILURES
from service.pipeline.outcome import BatchOutcome
from service.pipeline.positions import Positions
from service.pipeline.read import Batch
from service.pipeline.result import TableWrite
from service.pipeline.routes import Routes
from service.pipeline.table import ArrowTables, write_arrow_tables

logger = logging.getLogger(__name__)


class _Records:
    """A batch's records, kept (persisted) once a second path or table's job reads them again."""

    def __init__(self, batch: KafkaRecords) -> None:
        self.batch = batch
        self.kept = False

    def keep(self) -> None:
        if not self.kept:
            self.batch = self.batch.persist()
            self.kept = True

    def release(self) -> None:
        if self.kept:
            self.batch.unpersist()


class BatchWriter:
    """Writes batches into their tables and hands each outcome to the commit step."""

    def __init__(
        self,
        config: SinkConfig,
        routes: Routes,
        positions: Positions,
        held: HeldTables | None,
        commit: CommitStep,
        metrics: SinkMetrics,
    ) -> None:
        self.config = config
        self.routes = routes
        self.positions = positions
        self.held = held
        self.commit = commit
        self.metrics = metrics

    def write(self, batch: Batch, arrow: bool) -> None:
        """Write ``batch`` into its tables and commit it (nothing is committed if nothing moved)."""
        arrow = arrow or self.config.source.framed  # Avro, Protobuf have only this path
        offsets = self.positions.covering(batch.end)
        writes: list[TableWrite] = []
        isolated: list[str] = []
        records = _Records(batch.records)
        touched = self.routes.touched(
            batch.end, self.positions.read if self.held else self.positions.committed
        )
        if arrow and len(touched) > 1 and batch.records.ranges is None:  # each table's job reads its rows
            records.keep()
        try:
            done = ArrowTables()
            if arrow and self.routes.many:
                done = self._arrow_tables(records.batch, touched, offsets, batch)
            due = self._hold(done, offsets, touched)
            for identifier, topics in touched.items():
                if identifier in done.held or identifier in self.routes.paused:  # paused: left in Kafka
                    continue
                if identifier not in self.routes.isolated:
                    if self.held is not None and identifier in self.held and identifier not in done.writes:
                        # Spark's path writes this batch: the changes held from earlier ones land first.
                        # Not under the isolation below: held rows that fail to land stop the sink, and
                        # the next start reads them again.
                        self.commit_held([identifier], "its batch takes Spark's path", batch.topic_ids)
                    try:
                        write = done.writes.get(identifier) or self._write_table(
                            identifier, records, topics, offsets, arrow, batch
                        )
                        writes.append(write)
                        continue
                    except Exception as exc:
                        self.routes.isolate_or_raise(identifier, exc)
                if identifier in self.routes.isolated:
                    self._dead_letter_table(identifier, self._of(records.batch, topics))
                    isolated.append(identifier)
        finally:
            records.release()
        if self.routes.many:
            writes = [w for w in writes if w.files or w.records]
        offsets = self.positions.kept_behind(offsets, self._behind())
        if writes or due is not None or offsets != self.positions.committed:
            outcome = self._outcome(offsets, batch.topic_ids, writes, due)
            self.commit.submit(replace(outcome, held=sorted(done.held), isolated=isolated))

    def _write_table(
        self,
        identifier: str,
        records: _Records,
        topics: list[str],
        offsets: Offsets,
        arrow: bool,
        batch: Batch,
    ) -> TableWrite:
        """One table's write of the batch: the Arrow path (a one-table sink), else Spark's."""
        pipeline = self.routes.pipelines[identifier]
        mine = self._offsets_of(identifier, offsets) if self.routes.many else offsets
        one_job_each = not self.routes.many or self.config.source.framed  # Avro, Protobuf: no Spark path
        if arrow and one_job_each and pipeline.arrow_ready():
            write = pipeline.write_arrow(self._of(records.batch, topics), mine)
            if write is not None:
                return write
        if arrow:  # declined, or not for the Arrow path: Spark's path reads the batch again
            records.keep()
        return pipeline.write_spark(self._of(records.batch, topics).rows, mine, batch.newest)

    def _arrow_tables(
        self, records: KafkaRecords, touched: dict[str, list[str]], offsets: Offsets, batch: Batch
    ) -> ArrowTables:
        """The tables of a batch the Arrow path can take, written (or, for a table whose changes are
        held, decoded) in one Spark job; the others (and any it declined) are left to Spark's path,
        table by table."""
        ready = {
            identifier: (pipeline, topics, self._offsets_of(identifier, offsets))
            for identifier, topics in touched.items()
            if (pipeline := self.routes.pipelines.get(identifier)) is not None and pipeline.arrow_ready()
        }
        if not ready:
            return ArrowTables()
        hold = set()
        if self.held is not None:
            new_records = {
                t: self.positions.records_in(batch.end, topics) for t, (_, topics, _) in ready.items()
            }
            self.commit_held(
                self.held.big_batches(new_records), "a batch big enough on its own", batch.topic_ids
            )
            hold = {t for t, n in new_records.items() if self.held.to_hold(t, n)}
        try:
            return write_arrow_tables(records, ready, hold)
        except TABLE_FAILURES as exc:  # one table's own failure: found again, table by table, below
            logger.warning(
                "writing %d tables in one job failed (%s); writing them one by one", len(ready), exc
            )
            return ArrowTables()

    def _hold(
        self, done: ArrowTables, offsets: Offsets, touched: dict[str, list[str]]
    ) -> Callable[[], list[TableWrite]] | None:
        """Hold the batch's rows of the tables whose changes are held; take those now due (by their
        count, or by the age of their oldest held change, whether this batch touched them or not):
        what writes them, with the batch's plan (in the commit thread).

        A table this batch touched whose rows it did not hold (declined, or not for the Arrow path) is
        left alone here: its batch takes Spark's path, and its held rows are committed first, as a plan
        of their own (:meth:`write`), never beside that batch's files in one plan."""
        if self.held is None:
            return None
        now = time.monotonic()
        for identifier, rows in done.held.items():
            self.held.add(identifier, rows, self._offsets_of(identifier, offsets), now)
        due = [t for t in self.held.due(now) if t in done.held or t not in touched]
        if due or done.held:
            logger.debug(
                "changes held (records) for %s; due now: %s", self.held.summary(), ", ".join(due) or "none"
            )
        if not due:
            return None
        return self.held.take(due, lambda t: self.routes.pipelines[t].write_spec())

    def commit_held(self, tables: list[str], why: str, topic_ids: dict[str, str]) -> None:
        """Write and commit the held changes of ``tables`` as a plan of their own."""
        if self.held is None or not tables:
            return
        writes = [
            w
            for w in self.held.write(tables, lambda t: self.routes.pipelines[t].write_spec())
            if w.files or w.records
        ]
        moved = {t: o for w in writes for t, o in w.offsets.items()}
        offsets = self.positions.kept_behind(self.positions.covering(moved), self._behind())
        logger.info("committing the held changes of %d table(s): %s", len(tables), why)
        if writes or offsets != self.positions.committed:
            self.commit.submit(self._outcome(offsets, topic_ids, writes))
        self.metrics.set_held(self.held.counts())

    def commit_offsets(self, batch: Batch) -> None:
        """Commit a batch that held no record to read: only aborted records or transaction markers.

        Their offsets are done with; committing them keeps the lag at zero and spares the next start
        reading them again.
        """
        offsets = self.positions.kept_behind(self.positions.covering(batch.end), self._behind())
        if offsets == self.positions.committed:
            return
        now = time.monotonic()
        writes = [] if self.routes.many else [TableWrite(t, offsets, now, now) for t in self.routes.pipelines]
        self.commit.submit(self._outcome(offsets, batch.topic_ids, writes))

    def _outcome(
        self,
        offsets: Offsets,
        topic_ids: dict[str, str],
        writes: list[TableWrite],
        due: Callable[[], list[TableWrite]] | None = None,
    ) -> BatchOutcome:
        return BatchOutcome(
            offsets,
            dict(topic_ids),
            table=self.routes.one_table,
            routes=self.routes.recorded,
            writes=writes,
            due=due,
        )

    def _behind(self) -> set[str]:
        """Topics whose committed offsets must not move: those of paused tables and of tables
        holding changes."""
        behind = self.routes.paused_topics()
        if self.held is not None:
            behind |= self.held.topics(self.routes.topics_of)
        return behind

    def _offsets_of(self, identifier: str, offsets: Offsets) -> Offsets:
        """``offsets`` of every topic that lands in the table (those the batch did not move too: a
        table's last commit then says where each of its topics stands, which reseed relies on)."""
        return {t: offsets[t] for t in self.routes.topics_of(identifier) if t in offsets}

    def _of(self, records: KafkaRecords, topics: list[str]) -> KafkaRecords:
        return records.of_topics(topics) if self.routes.many else records

    def _dead_letter_table(self, identifier: str, records: KafkaRecords) -> None:
        """An isolated table's records of this batch, to the dead-letter topic with the reason."""
        reason = f"table {identifier} isolated: {self.routes.isolated[identifier]}"
        sent = dead_letter.send(
            records.rows.withColumn("error", F.lit(reason)),
            self.config.kafka,
            self.config.dead_letter_topic,
            self.config.sink_id,
        )
        if sent.sent:
            self.metrics.dead_letters.add(sent.sent, self.metrics.attrs(table=identifier))
            logger.warning(
                "table %s is isolated: %d record(s) sent to the dead-letter topic", identifier, sent.sent
            )
        if sent.failed:
            self.metrics.dead_letters_failed.add(len(sent.failed), self.metrics.attrs(table=identifier))
