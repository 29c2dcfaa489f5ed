"""What the Python workers that run icesink's Spark tasks need set once per process, and at each task.

Spark puts ``pyspark.zip`` (1,300 files) on its Python workers' path, and before every task a
worker calls ``importlib.invalidate_caches()``. On Python 3.11 a zip importer answers that by reading
the archive's whole directory again, once per package of it that was imported from: measured with a
sampling profiler, 69% of the workers' CPU time in a sink of 20,000-event batches went there, more
than reading, decoding and writing the records together. Python 3.12 made the re-read lazy
(CPython gh-103200); here it is skipped while the archive is unchanged on disk, which is all the
invalidation can find on a worker's path of read-only archives.

After every task a reused worker runs a full ``gc.collect()`` (``pyspark.daemon``), which walks every
object the process tracks: the modules of pyspark, pyarrow, pyiceberg and icesink alone are ~120,000,
and the walk cost each worker ~0.1 s of CPU per task, beside the driver's work between two batches on
a machine of two cores. :func:`freeze_survivors` moves what is alive when a task starts out of the
collector's reach, so the walk after the task covers what the task made.
"""

from __future__ import annotations

import gc
import os
import sys
import zipimport
from typing import Any

_original = zipimport.zipimporter.invalidate_caches


def _invalidate_when_changed(self: Any) -> None:
    try:
        stamp = os.stat(self.archive).st_mtime_ns
    except OSError:
        stamp = None
    if getattr(self, "_icesink_stamp", None) != stamp or stamp is None:
        _original(self)
        self._icesink_stamp = stamp


def quiet_zip_importers() -> None:
    """Make ``invalidate_caches`` re-read a zip archive's directory only when the archive changed."""
    if sys.version_info < (3, 12) and zipimport.zipimporter.invalidate_caches is _original:
        zipimport.zipimporter.invalidate_caches = _invalidate_when_changed  # type: ignore[method-assign]


# Every this many tasks nothing is frozen, so that the collection after that task walks everything once:
# an object frozen while alive that became garbage in a reference cycle since is freed then.
SWEEP_EVERY = 50
_tasks = 0


def freeze_survivors() -> None:
    """Called as a task body starts: freeze every object the process tracks, except every
    ``SWEEP_EVERY``-th task. That is what the collection after the last task left alive, and the
    task's own inputs, unpickled just before (its function and spec): those are freed by reference
    counting when the task ends, or, if they hold a reference cycle, at the next sweep."""
    global _tasks
    _tasks += 1
    if _tasks % SWEEP_EVERY:
        gc.freeze()
    else:
        gc.unfreeze()
