"""What a batch did, from the write step to the commit: one :class:`BatchOutcome`.

The write step (:mod:`service.pipeline.write`) makes it; the commit step
(:mod:`service.pipeline.commit`) turns it into the plan the txnlog precommits
(:class:`service.commit.plan.BatchPlan`) and reports each table's commit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from service.commit.plan import BatchPlan, PendingCommit
from service.model.offsets import Offsets
from service.pipeline.result import TableWrite


@dataclass
class BatchOutcome:
    """A batch written (or a plan without files), not yet committed.

    ``offsets``: where the sink's committed offsets stand once it lands (the topics of held or paused
    tables kept behind). ``writes``: the tables written; ``due``: what writes the held changes of
    tables that came due, run where the plan is made (in the commit thread, while the next batch is
    read). ``held`` and ``isolated`` name the tables whose records the batch held back or sent to the
    dead-letter topic. ``table`` is a one-table sink's table (its plans keep that row format);
    ``routes`` a sink of many tables' topic → table.
    """

    offsets: Offsets
    topic_ids: dict[str, str]
    table: str | None = None
    routes: dict[str, str] = field(default_factory=dict)
    writes: list[TableWrite] = field(default_factory=list)
    due: Callable[[], list[TableWrite]] | None = None
    held: list[str] = field(default_factory=list)
    isolated: list[str] = field(default_factory=list)
    note: str | None = None

    def plan(
        self, resolve: Callable[[TableWrite], TableWrite] = lambda w: w
    ) -> tuple[BatchPlan, list[tuple[TableWrite, PendingCommit]]]:
        """The txnlog's plan, and each table write with its own plan; writes the due tables first.
        ``resolve`` adds a write's position deletes (service.pipeline.deletes)."""
        writes = list(self.writes)
        if self.due is not None:
            writes += [w for w in self.due() if w.files or w.records]
        writes = [resolve(w) for w in writes]
        tables = [(w, w.plan({t: i for t, i in self.topic_ids.items() if t in w.offsets})) for w in writes]
        if self.table is None:
            return BatchPlan(
                self.offsets, [p for _, p in tables], self.topic_ids, self.routes, self.note
            ), tables
        if tables:
            return BatchPlan.of_one_table(tables[0][1]), tables
        only = PendingCommit(self.table, self.offsets, None, topic_ids=self.topic_ids, note=self.note)
        return BatchPlan.of_one_table(only), tables
