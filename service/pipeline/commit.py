"""The commit step: a batch's outcome becomes one plan, the committer lands it, each table's commit
is reported.

Plans go to :class:`service.commit.overlap.Commits` one at a time, in order; with ``commit.overlap``
the plan is made and committed in its thread while the next batch is read and written. Everything
that runs there is here or below (the plan, the held tables' writes, the report): nothing in the job.
"""

from __future__ import annotations

import logging

from service.commit.committer import CommitResult
from service.commit.overlap import Commits
from service.commit.plan import BatchPlan, PendingCommit
from service.iceberg.tables import KnownTables
from service.metrics import SinkMetrics
from service.pipeline.deletes import PositionDeletes
from service.pipeline.outcome import BatchOutcome
from service.pipeline.positions import Positions
from service.pipeline.report import report_commit
from service.pipeline.result import TableWrite

logger = logging.getLogger(__name__)


class CommitStep:
    """Hands each :class:`BatchOutcome` to the committer and reports it."""

    def __init__(
        self,
        commits: Commits,
        metrics: SinkMetrics,
        positions: Positions,
        known: KnownTables,
        writer_properties: dict[str, str],
    ) -> None:
        self.commits = commits
        self.metrics = metrics
        self.positions = positions
        # in the commit thread, with the committer's catalog (its own: see service.commit.overlap)
        self.deletes = PositionDeletes(commits.committer.catalog, known, writer_properties)

    def submit(self, outcome: BatchOutcome) -> None:
        """Commit ``outcome`` after the plan before it (raises that one's failure, if it failed)."""
        # The offsets of the last plan handed over: committed, or being committed in the background.
        self.positions.handed_over(outcome.offsets)
        made: list[tuple[TableWrite, PendingCommit]] = []

        def plan() -> BatchPlan:
            batch_plan, tables = outcome.plan(self.deletes.resolve)
            made.extend(tables)
            for write, _ in tables:
                self.metrics.write_duration.record(write.write_s, self.metrics.attrs(table=write.table))
            return batch_plan

        def done(result: CommitResult, commit_s: float) -> None:
            for write, table_plan in made:
                self.deletes.committed(write.table, table_plan.snapshot_id)
                report_commit(self.metrics, write, table_plan, result.seq, commit_s)
            if not made:
                logger.info("committed seq %d: offsets only (no records to write)", result.seq)
            if outcome.held or outcome.isolated:
                logger.debug(
                    "seq %d held back tables %s, dead-lettered tables %s",
                    result.seq,
                    outcome.held,
                    outcome.isolated,
                )
            if (progress := self.positions.progress(outcome.offsets)) is not None:
                logger.info("catch-up progress: %s", progress)

        self.commits.submit(plan, done)

    def wait(self) -> None:
        """Until the plan in flight is committed; raises its failure."""
        self.commits.wait()

    def failed(self) -> bool:
        return self.commits.failed()

    def close(self) -> Exception | None:
        """Stop committing; returns the failure of the commit in flight, if it failed."""
        return self.commits.close()
