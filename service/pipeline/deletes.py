"""The position-delete step: a batch's located keys → position-delete files, from each table's key
index (tables in ``delete_format: position``; the others pass through).

It runs where the plan is made (:meth:`service.pipeline.outcome.BatchOutcome.plan`, in the commit
thread): plans are made one at a time, in order, each after the one before it committed, so a
table's index always holds every earlier batch when it resolves the next; a batch that fails to
commit stops the sink, and a new start builds the index again from the table.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from pyiceberg.catalog import Catalog
from pyiceberg.table import Table

from service.data.position_deletes import FILE_COLUMN, POS_COLUMN
from service.iceberg.tables import KnownTables
from service.keyindex.build import current
from service.keyindex.index import KeyIndex
from service.keyindex.resolve import resolve
from service.pipeline.result import TableWrite

logger = logging.getLogger(__name__)


class PositionDeletes:
    """Each position-mode table's key index, and the resolution of its writes."""

    def __init__(self, catalog: Catalog, known: KnownTables, writer_properties: dict[str, str]) -> None:
        self.catalog = catalog
        self.known = known
        self.writer_properties = writer_properties  # the sink's write section: see WriteSpec
        self.indexes: dict[str, KeyIndex] = {}

    def resolve(self, write: TableWrite) -> TableWrite:
        """``write`` with the position deletes of the rows its keys replace (no located keys: as it is)."""
        if write.located is None:
            return write
        key = [c for c in write.located.column_names if c not in (FILE_COLUMN, POS_COLUMN)]
        table = self._table(write.table)
        index = self.indexes[write.table] = current(self.indexes.get(write.table), table, write.table, key)
        resolved = resolve(index, table, write.data_files, write.located, self.writer_properties)
        return replace(
            write,
            files=write.files + resolved.delete_files,
            located=None,
            position_keys=resolved.position_keys,
            resolved_at=index.snapshot_id,
        )

    def committed(self, table: str, snapshot_id: int | None) -> None:
        """A resolved write of ``table`` landed as ``snapshot_id``: the index already holds it."""
        index = self.indexes.get(table)
        if index is not None and snapshot_id is not None:
            index.ahead.add(snapshot_id)

    def _table(self, identifier: str) -> Table:
        """The table loaded for every batch with deletes to resolve (one catalog read): a
        compaction since the sink's last commit is then followed here, once, and the commit builds
        on it; on the metadata the sink's last commit left, the commit's first attempt would conflict
        and its deletes would be resolved a second time. In the soak, a maintainer compacting after
        every commit cost 435 such retries in 600 commits."""
        table = self.catalog.load_table(identifier)
        self.known.put(identifier, table, loaded=True)
        return table
