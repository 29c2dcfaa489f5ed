"""A plan's position deletes as each commit attempt sends them, and what is left once the plan landed.

A plan's delete files were resolved against the key index when the plan was made; the table may have
moved on since. So every attempt, from the table as that attempt found it:

* resolves them again if a snapshot that is not the sink's removed a data file they name (a
  compaction committed first): pyiceberg has no row delta that validates the data files a position
  delete names, and a delete of a replaced file would delete nothing while the old row lived on in the
  compacted file (:func:`service.keyindex.resolve.refresh`);
* merges a partition's smallest delete files when it would hold too many
  (:mod:`service.keyindex.merge`).

Files an attempt wrote are garbage if the catalog rejects it; once the plan is committed, its
position-keys file, and its own delete files that were merged into others or resolved again, are
needed no more.
"""

from __future__ import annotations

from collections.abc import Callable

from pyiceberg.table import Table

from service.commit.plan import SUMMARY_SINK_ID, PendingCommit
from service.keyindex.merge import DeleteMerge, merge_deletes
from service.keyindex.resolve import refresh


class PlanDeletes:
    def __init__(self, sink_id: str, writer_properties: dict[str, str]) -> None:
        self.sink_id = sink_id
        self.writer_properties = writer_properties  # the sink's write section, for the files it writes
        # A landed snapshot's plan files it did not commit: merged into others, or resolved again.
        self._unused: dict[int | None, list[str]] = {}

    def for_attempt(self, table: Table, pending: PendingCommit, keep_lock: Callable[[], None]) -> DeleteMerge:
        """The delete files to add and remove in this attempt; ``written``: the files it wrote. The
        txnlog row stays locked meanwhile: ``keep_lock`` proves it after each file read."""
        if not pending.position_keys or not pending.delete_files:
            return DeleteMerge(add=list(pending.delete_files))
        again = refresh(
            table,
            pending,
            lambda s: s.summary is not None and s.summary.get(SUMMARY_SINK_ID) == self.sink_id,
            beat=keep_lock,
        )
        files = again.delete_files if again is not None else pending.delete_files
        merge = merge_deletes(table, files, self.writer_properties, beat=keep_lock)
        if again is not None:
            merge.written.extend(f.file_path for f in again.delete_files)
            merge.merged_away.extend(f.file_path for f in pending.delete_files)  # replaced by the refresh
        return merge

    def landed(self, pending: PendingCommit, merge: DeleteMerge) -> None:
        """``merge`` is what the attempt that committed ``pending``'s snapshot sent."""
        self._unused[pending.snapshot_id] = merge.merged_away

    def leftovers(self, pending: PendingCommit) -> list[str]:
        """Files of a committed plan that nothing needs any more (deleted best effort: orphans otherwise)."""
        return [
            *([pending.position_keys] if pending.position_keys else []),
            *self._unused.pop(pending.snapshot_id, []),
        ]
