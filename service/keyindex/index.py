"""The key index of one table: where each key's live row is, as of a snapshot of the table."""

from __future__ import annotations

import logging
from collections.abc import Hashable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyiceberg.manifest import DataFile
from pyiceberg.typedef import Record

from service.data.position_deletes import FILE_COLUMN, POS_COLUMN, canonical_keys

logger = logging.getLogger(__name__)

_POS_BITS = 32  # a row's place is one int: file number << 32 | position (a file holds < 2**32 rows)
_POS_MASK = (1 << _POS_BITS) - 1


@dataclass(frozen=True)
class FilePlace:
    """A data file the index points into: its path and partition (where its position deletes go)."""

    path: str
    spec_id: int
    partition: Record


@dataclass(frozen=True)
class OldRows:
    """Rows a batch deletes: for each, the data file (a number of :attr:`KeyIndex.files`), the
    position in it, and the key (a located table's key columns)."""

    file_numbers: list[int]
    positions: list[int]
    keys: pa.Table


class KeyIndex:
    """key → (data file, row position) of every live row of one table.

    A plain dict of the key (a one-column key's value, else a tuple; see
    :func:`service.data.position_deletes.canonical_keys`) to one int, the file's number and the row's
    position: about 100 bytes a key of an integer key in CPython (docs/deletes.md has the figures).

    ``snapshot_id`` is the snapshot the index materialises; ``ahead`` the sink's own snapshots it
    applied before they were committed (the commit step resolves a batch, then commits it), which a
    catch-up over the lineage skips.
    """

    def __init__(self, table: str, key: list[str], snapshot_id: int | None) -> None:
        self.table = table
        self.key = key
        self.snapshot_id = snapshot_id
        self.ahead: set[int] = set()
        self.rows: dict[Hashable, int] = {}
        self.files: list[FilePlace] = []
        self._numbers: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self.rows)

    def add_file(self, data_file: DataFile) -> int:
        number = self._numbers.get(data_file.file_path)
        if number is None:
            number = self._numbers[data_file.file_path] = len(self.files)
            self.files.append(FilePlace(data_file.file_path, data_file.spec_id, data_file.partition))
        return number

    def put_all(self, located: pa.Table, numbers: dict[str, int]) -> None:
        """Point each located key at its row (``numbers``: file path → file number); used to build."""
        rows = self.rows
        for k, path, pos in self._entries(located):
            rows[k] = numbers[path] << _POS_BITS | pos

    def apply(self, located: pa.Table, written: Iterable[DataFile]) -> OldRows:
        """A batch's changes: each located key now lives at its new row (or nowhere: deleted); the
        rows they lived in before are returned, to be deleted. ``written``: the batch's data files."""
        for f in written:
            self.add_file(f)
        numbers = self._numbers
        rows = self.rows
        old_files: list[int] = []
        old_positions: list[int] = []
        taken: list[int] = []
        for i, (k, path, pos) in enumerate(self._entries(located)):
            old = rows.pop(k, None) if path is None else rows.get(k)
            if path is not None:
                rows[k] = numbers[path] << _POS_BITS | pos
            if old is not None:
                old_files.append(old >> _POS_BITS)
                old_positions.append(old & _POS_MASK)
                taken.append(i)
        return OldRows(old_files, old_positions, located.select(self.key).take(pa.array(taken, pa.int64())))

    def move(self, removed: set[str], moved_to: pa.Table, added: Iterable[DataFile]) -> int:
        """Follow a compaction: the keys whose rows were in the ``removed`` files now live where
        ``moved_to`` (the added files' keys, located) says. A key the index already points elsewhere
        (a batch changed it since) keeps its place, and a key it does not hold (deleted since) is not
        brought back. Returns the number of keys moved."""
        gone = {n for path in removed if (n := self._numbers.get(path)) is not None}
        if not gone:
            return 0
        for f in added:
            self.add_file(f)
        rows = self.rows
        moved = 0
        for k, path, pos in self._entries(moved_to):
            old = rows.get(k)
            if old is not None and old >> _POS_BITS in gone:
                rows[k] = self._numbers[path] << _POS_BITS | pos
                moved += 1
        return moved

    def _entries(self, located: pa.Table) -> Iterator[tuple[Hashable, Any, Any]]:
        """(key, file path, position) of each row of a located table (no path and position: the key
        was deleted)."""
        return zip(
            canonical_keys(located, self.key),
            located[FILE_COLUMN].to_pylist(),
            located[POS_COLUMN].to_pylist(),
            strict=True,
        )

    def locate(self, keys: pa.Table) -> pa.Table:
        """Where the index says each of ``keys`` lives, as a located table (keys it does not hold are
        left out)."""
        found: list[int] = []
        paths: list[str] = []
        positions: list[int] = []
        for i, k in enumerate(canonical_keys(keys, self.key)):
            place = self.rows.get(k)
            if place is not None:
                found.append(i)
                paths.append(self.files[place >> _POS_BITS].path)
                positions.append(place & _POS_MASK)
        return (
            keys.take(pa.array(found, pa.int64()))
            .append_column(FILE_COLUMN, pa.array(paths, pa.string()))
            .append_column(POS_COLUMN, pa.array(positions, pa.int64()))
        )
