"""A table's changes held between batches, in a sink of many tables (``commit.table_min_records`` /
``commit.table_max_period``).

A database's tables are many and most are quiet: committing each one in every batch costs two small
files and one catalog commit per table per batch, whatever its share of the batch. With a per-table
cadence the Arrow path's tasks hand a table's decoded rows (already the last change per key of each
Kafka partition) back to the driver instead of writing files, and the driver holds them until the
table has enough changes, or its oldest held change waited long enough; then it writes them as one
data file and one delete file and the table is committed with the batch.

Exactly once: while a table's changes are held, the txnlog keeps its topics at the offsets of the
table's last commit (``SinkJob`` commits every other topic's progress meanwhile). Held rows live only
in this process: after a crash, or a replica taking over, the topics are read again from those
offsets. Each topic lands in one table, so holding a table back holds back nothing else.

The rows of several batches are merged with the newest batch winning: each batch's rows are already
one change per key, so the merged rows are the last change per key across the held batches, and the
one equality-delete file deletes every older row of those keys, as one batch's would.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime

import pyarrow as pa

from service.data.arrow_job import ArrowResult
from service.data.files import WriteSpec, Written, write_files
from service.model.offsets import Offsets
from service.pipeline.cadence import CommitCadence
from service.pipeline.result import TableWrite

_RANK = "__icesink_held_rank"


@dataclass
class HeldChanges:
    """One table's rows read but not yet written, from one or more batches (oldest first)."""

    table: str
    parts: list[pa.Table] = field(default_factory=list)
    offsets: Offsets = field(default_factory=dict)  # the table's topics: where the held batches end
    records: int = 0  # Kafka records the held rows come from
    by_op: dict[str, int] = field(default_factory=dict)
    newest: datetime | None = None
    since: float | None = None  # time.monotonic() when the first held batch was read

    @property
    def empty(self) -> bool:
        return self.since is None

    def age(self, now: float) -> float:
        return 0.0 if self.since is None else now - self.since

    def add(self, batch: ArrowResult, offsets: Offsets, now: float) -> None:
        """Hold a batch's rows of this table; ``offsets``: the table's topics at the batch's end."""
        self.parts.extend(batch.rows)
        self.offsets = {**self.offsets, **offsets}
        if not batch.records:
            return  # only aborted records or transaction markers: nothing to wait for
        self.records += batch.records
        for op, n in batch.by_op.items():
            self.by_op[op] = self.by_op.get(op, 0) + n
        if batch.newest is not None and (self.newest is None or batch.newest > self.newest):
            self.newest = batch.newest
        if self.since is None:
            self.since = now

    def rows(self, spec: WriteSpec) -> pa.Table:
        """The held rows merged: one change per key (upsert), the newest batch's; every row (append)."""
        parts = [p for p in self.parts if p.num_rows]
        if not parts:
            return pa.table({})
        rows = pa.concat_tables(parts, promote_options="permissive")
        if not spec.upsert:
            return rows
        ranked = rows.append_column(_RANK, pa.array(range(rows.num_rows), pa.int64()))
        last = ranked.group_by(spec.key, use_threads=False).aggregate([(_RANK, "max")])[f"{_RANK}_max"]
        return rows.take(last.sort())

    def write(self, spec: WriteSpec, started: float) -> TableWrite:
        """Write the held rows into the table as one data file and one delete file (in this process)."""
        rows = self.rows(spec)
        written = write_files(spec, rows) if rows.num_rows else Written()
        return TableWrite(
            table=self.table,
            offsets=dict(self.offsets),
            started=started,
            written=time.monotonic(),
            files=written.files,
            located=written.located,
            records=self.records,
            by_op=dict(self.by_op),
            newest=self.newest,
            decoder="arrow",
        )


class HeldTables:
    """The held changes of a sink's tables, and the cadence that says when each is due."""

    def __init__(self, cadence: CommitCadence, concurrency: int) -> None:
        self.cadence = cadence
        self.concurrency = concurrency
        self._held: dict[str, HeldChanges] = {}

    def __contains__(self, table: str) -> bool:
        return table in self._held and not self._held[table].empty

    def _holding(self) -> list[tuple[str, HeldChanges]]:
        # A copy first: the run loop asks between batches, outside the batch lock, while a batch may
        # be adding or writing a table.
        return sorted(((t, h) for t, h in list(self._held.items()) if not h.empty), key=lambda item: item[0])

    def tables(self) -> list[str]:
        return [t for t, _ in self._holding()]

    def to_hold(self, table: str, new_records: int) -> bool:
        """Whether a batch's rows of ``table`` (``new_records`` Kafka records) are handed back to be held
        rather than written by the tasks: the batch alone is not due (:meth:`big_batches` first)."""
        return not self.cadence.due(new_records, 0.0)

    def big_batches(self, new_records: dict[str, int]) -> list[str]:
        """The tables holding rows whose batch (table → its Kafka records) is due on its own: their
        held rows are committed first, so that the tasks write the batch rather than hand a large
        share of it to this process."""
        return [t for t, n in new_records.items() if t in self and self.cadence.due(n, 0.0)]

    def add(self, table: str, batch: ArrowResult, offsets: Offsets, now: float) -> bool:
        """Hold a batch's rows of ``table``; whether the table is now due."""
        held = self._held.setdefault(table, HeldChanges(table))
        held.add(batch, offsets, now)
        if held.empty:  # no record, only aborted ones or transaction markers: nothing to hold
            del self._held[table]
            return False
        return self.cadence.due(held.records, held.age(now))

    def due(self, now: float) -> list[str]:
        return [t for t, held in self._holding() if self.cadence.due(held.records, held.age(now))]

    def write(self, tables: list[str], spec_of: Callable[[str], WriteSpec]) -> list[TableWrite]:
        """Write the held rows of ``tables`` (at most ``concurrency`` at once) and stop holding them."""
        return self.take(tables, spec_of)()

    def take(self, tables: list[str], spec_of: Callable[[str], WriteSpec]) -> Callable[[], list[TableWrite]]:
        """Stop holding the rows of ``tables``; what writes them (at most ``concurrency`` at once).

        The specs are taken now, in this thread: ``spec_of`` asks the catalog, whose client is not
        shared between threads. The writing may then run in another thread (the sink's commit thread,
        service.commit.overlap) while the next batch is read."""
        held = [self._held.pop(t) for t in tables if t in self._held]
        specs = {h.table: spec_of(h.table) for h in held}

        def write() -> list[TableWrite]:
            started = time.monotonic()
            if len(held) <= 1:
                return [h.write(specs[h.table], started) for h in held]
            with ThreadPoolExecutor(min(self.concurrency, len(held)), "icesink-held") as pool:
                return list(pool.map(lambda h: h.write(specs[h.table], started), held))

        return write

    def topics(self, topics_of: Callable[[str], list[str]]) -> set[str]:
        """The topics whose offsets stay where they were last committed: those of the tables holding rows."""
        return {topic for table in self.tables() for topic in topics_of(table)}

    def counts(self) -> dict[str, int]:
        """Records held per table."""
        return {t: held.records for t, held in self._holding()}

    def summary(self) -> str:
        return ", ".join(f"{t} ({held.records})" for t, held in self._holding()) or "none"
