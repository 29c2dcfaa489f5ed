"""The key index built from a table's live rows: every live data file's keys and row positions, minus
the rows its delete files delete (position deletes by file and position, equality deletes by key and
sequence number). Run at a table's first use by a sink, and whenever the index can't follow the
table's lineage (a rollback, another writer's rows)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.manifest import DataFile, DataFileContent, ManifestContent
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation

from service.data.position_deletes import FILE_COLUMN, POS_COLUMN, canonical_table, read_columns, read_located
from service.failpoints import failpoint
from service.keyindex.index import KeyIndex
from service.keyindex.lineage import changes, since

logger = logging.getLogger(__name__)

_SEQ = "__icesink_seq"
_READERS = 8  # files read at once: object-store latency, not CPU, is what a build waits on
_PROGRESS_S = 5.0


@dataclass(frozen=True)
class LiveFiles:
    """The current snapshot's live data and delete files, each with its data sequence number."""

    data: list[tuple[DataFile, int]]
    position_deletes: list[tuple[DataFile, int]]
    equality_deletes: list[tuple[DataFile, int]]


def live_files(table: Table) -> LiveFiles:
    snapshot = table.current_snapshot()
    found = LiveFiles([], [], [])
    if snapshot is None:
        return found
    for manifest in snapshot.manifests(table.io):
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            f = entry.data_file
            f.spec_id = manifest.partition_spec_id
            seq = int(entry.sequence_number or 0)
            if manifest.content == ManifestContent.DATA:
                found.data.append((f, seq))
            elif f.content == DataFileContent.POSITION_DELETES:
                found.position_deletes.append((f, seq))
            else:
                found.equality_deletes.append((f, seq))
    return found


def build(table: Table, identifier: str, key: list[str], beat: Callable[[], None] = lambda: None) -> KeyIndex:
    """The index of ``table`` as of its current snapshot, with progress in the log; ``beat`` is called
    after each data file read (the committer proves its txnlog lock with it)."""
    started = time.monotonic()
    snapshot = table.current_snapshot()
    index = KeyIndex(identifier, key, snapshot.snapshot_id if snapshot else None)
    live = live_files(table)
    if not live.data:
        return index
    logger.info(
        "key index of %s: building from %d data file(s) (%d position- and %d equality-delete file(s))",
        identifier,
        len(live.data),
        len(live.position_deletes),
        len(live.equality_deletes),
    )
    io = table.io
    numbers = {f.file_path: index.add_file(f) for f, _ in live.data}
    seqs = {f.file_path: seq for f, seq in live.data}
    parts: list[pa.Table] = []
    rows = 0
    last_report = started
    with ThreadPoolExecutor(_READERS, "icesink-key-index") as pool:
        for i, located in enumerate(
            pool.map(lambda fs: read_located(io, fs[0].file_path, key), live.data), 1
        ):
            seq = seqs[located[FILE_COLUMN][0].as_py()] if located.num_rows else 0
            parts.append(located.append_column(_SEQ, pa.array([seq] * located.num_rows, pa.int64())))
            rows += located.num_rows
            failpoint("during_key_index_build")
            beat()
            if time.monotonic() - last_report >= _PROGRESS_S:
                last_report = time.monotonic()
                logger.info(
                    "key index of %s: %d/%d data files read, %d rows (%.0f s)",
                    identifier,
                    i,
                    len(live.data),
                    rows,
                    last_report - started,
                )
        located = pa.concat_tables(parts)
        located = located.set_column(
            located.schema.get_field_index(FILE_COLUMN), FILE_COLUMN, located[FILE_COLUMN].cast(pa.string())
        )
        if live.position_deletes:
            deleted = pa.concat_tables(
                pool.map(
                    lambda fs: read_columns(io, fs[0].file_path, ["file_path", "pos"]), live.position_deletes
                )
            )
            located = located.join(
                deleted.rename_columns([FILE_COLUMN, POS_COLUMN]),
                keys=[FILE_COLUMN, POS_COLUMN],
                join_type="left anti",
                use_threads=False,
            )
        if live.equality_deletes:
            located = _without_equality_deleted(table, located, live.equality_deletes, key, pool)
    located = _one_row_per_key(located, key, identifier)
    index.put_all(located, numbers)
    del located, parts
    pa.default_memory_pool().release_unused()  # the files' keys: gigabytes for a large table
    logger.info(
        "key index of %s: %d keys from %d data file(s) in %.1f s",
        identifier,
        len(index),
        len(live.data),
        time.monotonic() - started,
    )
    return index


def _without_equality_deleted(
    table: Table,
    located: pa.Table,
    deletes: list[tuple[DataFile, int]],
    key: list[str],
    pool: ThreadPoolExecutor,
) -> pa.Table:
    """The rows no equality delete removes: one with a higher sequence number than the row's, on the
    row's key (the sink's equality deletes are on its key columns; a table switched from
    ``equality`` to ``position`` keeps them until a compaction applies them)."""
    schema = table.schema()

    def read(fs: tuple[DataFile, int]) -> pa.Table:
        f, seq = fs
        names = [schema.find_column_name(i) for i in f.equality_ids or []]
        if sorted(n for n in names if n) != sorted(key):
            raise ValueError(
                f"equality delete file {f.file_path} deletes by {names}, not by the key {key}: the key "
                "index can't tell which rows it removes"
            )
        keys = canonical_table(read_columns(table.io, f.file_path, key), key)
        return keys.append_column("__delete_seq", pa.array([seq] * keys.num_rows, pa.int64()))

    deleted = pa.concat_tables(pool.map(read, deletes))
    newest = deleted.group_by(key, use_threads=False).aggregate([("__delete_seq", "max")])
    joined = located.join(newest, keys=key, join_type="left outer", use_threads=False)
    alive = pc.or_(
        pc.is_null(joined["__delete_seq_max"]), pc.greater_equal(joined[_SEQ], joined["__delete_seq_max"])
    )
    return joined.filter(alive).drop_columns(["__delete_seq_max"])


def _one_row_per_key(located: pa.Table, key: list[str], identifier: str) -> pa.Table:
    """A key should have one live row; if another writer left two, the newest (sequence number, then
    file and position) is the one the index keeps, and the count goes to the log."""
    counts = located.group_by(key, use_threads=False).aggregate([([], "count_all")])
    if counts.num_rows == located.num_rows:
        return located
    logger.warning(
        "key index of %s: %d keys have more than one live row; the newest of each is indexed",
        identifier,
        located.num_rows - counts.num_rows,
    )
    ordered = located.sort_by([(_SEQ, "ascending"), (FILE_COLUMN, "ascending"), (POS_COLUMN, "ascending")])
    ranked = ordered.append_column("__rank", pa.array(range(ordered.num_rows), pa.int64()))
    last = ranked.group_by(key, use_threads=False).aggregate([("__rank", "max")])["__rank_max"]
    return ordered.take(last)


def current(index: KeyIndex | None, table: Table, identifier: str, key: list[str]) -> KeyIndex:
    """``index`` brought to ``table``'s current snapshot; built afresh when there is none yet or it
    can't follow.

    It follows the snapshots since its own, skipping the sink's (``index.ahead``, applied when they
    were resolved): a compaction's (data files replaced: the keys in them move to the added files) and
    one that only rewrote delete files are followed; anything else (another writer's rows or deletes,
    a rollback) means a build."""
    if index is None or index.key != key:
        return build(table, identifier, key)
    after = since(table, index.snapshot_id)
    if after is None:
        logger.info(
            "key index of %s: snapshot %s left the lineage; building again", identifier, index.snapshot_id
        )
        return build(table, identifier, key)
    for snapshot in after:
        if snapshot.snapshot_id in index.ahead:
            continue
        step = changes(table, snapshot)
        if step.keeps_rows:
            continue
        # Only a compaction ("replace": the same rows in other files) is followed; another writer's
        # copy-on-write update also removes and adds data files, with rows the index never saw.
        if (
            not step.replaces_data
            or snapshot.summary is None
            or snapshot.summary.operation != Operation.REPLACE
        ):
            logger.info(
                "key index of %s: snapshot %d (%s) was written by another writer; building again",
                identifier,
                snapshot.snapshot_id,
                snapshot.summary.operation if snapshot.summary else "?",
            )
            return build(table, identifier, key)
        moved_to = (
            pa.concat_tables([read_located(table.io, f.file_path, key) for f in step.added_data])
            if step.added_data
            else None
        )
        moved = (
            index.move({f.file_path for f in step.removed_data}, moved_to, step.added_data)
            if moved_to is not None
            else 0
        )
        logger.info(
            "key index of %s: followed snapshot %d: %d data file(s) replaced by %d, %d key(s) moved",
            identifier,
            snapshot.snapshot_id,
            len(step.removed_data),
            len(step.added_data),
            moved,
        )
    current_snapshot = table.current_snapshot()
    index.snapshot_id = current_snapshot.snapshot_id if current_snapshot else None
    index.ahead -= {s.snapshot_id for s in after}  # one not seen yet (a table loaded before it) stays
    return index
