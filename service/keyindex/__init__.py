"""The key index of a table in ``delete_format: position``: key → (data file, row position), as of a
snapshot, and what turns a batch's changes into position-delete files with it.

- :mod:`.index`: the index itself (in memory) and how it follows the table's snapshots;
- :mod:`.lineage`: what the snapshots since a given one added and removed;
- :mod:`.build`: the index built from the table's live rows (at first use, or when it can't follow);
- :mod:`.resolve`: a batch's located keys → position-delete files, and a commit's deletes resolved
  again when a compaction moved their rows (:func:`.resolve.refresh`).

Why in memory, rebuilt from the table rather than stored: docs/deletes.md.
"""
