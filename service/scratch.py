"""The process's scratch on local disk: one directory of its own in each of Spark's local directories,
and the removal of what killed processes left there.

Spark removes its local directories (``spark-*``: the driver's files, PySpark's, ``blockmgr-*``: shuffle
and spill files) in a shutdown hook, which a SIGKILL or an out-of-memory kill never runs. A sink that
crash-loops in a pod whose scratch is an emptyDir (kept across container restarts) would fill it and
have the pod evicted. So the process gives Spark directories of its own, ``icesink-<pid>-<random>``
under each of the local directories Spark would have used (``SPARK_LOCAL_DIRS``, else
``spark.local.dir``, else the system's temporary directory), holds a lock on a file in them for its
life, and at start removes every such directory whose lock nobody holds: the owner is gone. The
lock, not the process id, says so: ids are reused across container restarts. Spark's throwaway stream
checkpoint goes in the same directory (unless ``spark.checkpoint_dir`` is set).

The directories are given to Spark through ``SPARK_LOCAL_DIRS`` in the environment its JVM starts
with (in local mode that variable wins over ``spark.local.dir``), so this runs before the session is
built, once per process: a process whose Spark session is already running keeps its directories.
The driver JVM's own temporary directory (``java.io.tmpdir``, :func:`with_java_tmpdir`) is the same
directory: what the JVM's libraries unpack there at every start (lz4's and zstd's native libraries,
Spark's empty ``spark-*`` and ``artifacts-*`` directories) would otherwise pile up in the system's
temporary directory, one set per kill.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import logging
import os
import shutil
import tempfile
import uuid
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from service.config import SparkConfig

logger = logging.getLogger(__name__)

PREFIX = "icesink-"
LOCK = ".owner.lock"


@dataclass
class Scratch:
    """The directories this process owns, and the open lock files that say so."""

    directories: list[Path]
    locks: list[IO[str]]

    @property
    def root(self) -> Path:
        return self.directories[0]

    def release(self) -> None:
        """Remove the directories, the lock file last: one a still-running JVM keeps writing to stays,
        and is found stale at the next start."""
        for directory in self.directories:
            if directory.is_dir():
                for entry in directory.iterdir():
                    if entry.name == LOCK:
                        continue
                    if entry.is_dir():
                        shutil.rmtree(entry, ignore_errors=True)
                    else:
                        entry.unlink(missing_ok=True)
                if [entry.name for entry in directory.iterdir()] == [LOCK]:
                    with contextlib.suppress(OSError):
                        (directory / LOCK).unlink()
                        directory.rmdir()
        for lock in self.locks:
            lock.close()


_current: Scratch | None = None


def base_directories(spark: SparkConfig, environ: Mapping[str, str] = os.environ) -> list[Path]:
    """Where Spark would put its local directories: ``SPARK_LOCAL_DIRS``, ``spark.local.dir``, the
    temporary directory (the first that is set)."""
    listed = environ.get("SPARK_LOCAL_DIRS") or spark.conf.get("spark.local.dir") or tempfile.gettempdir()
    return [Path(part.strip()) for part in listed.split(",") if part.strip()]


def _is_stale(directory: Path) -> bool:
    """Whether nobody holds the directory's lock (its owner is gone). A directory gets this service's
    name only once its lock is held, so one without a lock file is not one of ours: left alone."""
    try:
        with open(directory / LOCK) as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            return True
    except OSError:
        return False


def remove_stale(base: Path) -> list[Path]:
    """Remove the directories under ``base`` that processes now gone left behind; the removed ones."""
    removed = []
    with contextlib.suppress(OSError):
        for directory in base.iterdir():
            if directory.name.startswith(PREFIX) and directory.is_dir() and _is_stale(directory):
                shutil.rmtree(directory, ignore_errors=True)
                removed.append(directory)
    return removed


def claim(spark: SparkConfig, environ: MutableMapping[str, str] = os.environ) -> Scratch:
    """This process's scratch directories (made once per process), the stale ones removed first; sets
    ``SPARK_LOCAL_DIRS`` for the Spark JVM the process starts next."""
    global _current
    if _current is not None:
        return _current
    directories: list[Path] = []
    locks: list[IO[str]] = []
    for base in base_directories(spark, environ):
        base.mkdir(parents=True, exist_ok=True)
        for removed in remove_stale(base):
            logger.info("removed %s, the scratch a stopped process left behind", removed)
        # Made under another name and locked before it is given this service's name: a process starting
        # at the same moment never sees it unlocked.
        making = Path(tempfile.mkdtemp(prefix=".making-", dir=base))
        lock = open(making / LOCK, "w")  # noqa: SIM115 - held open for the life of the process
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        directory = base / f"{PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}"
        making.rename(directory)
        directories.append(directory)
        locks.append(lock)
    environ["SPARK_LOCAL_DIRS"] = ",".join(str(d) for d in directories)
    _current = Scratch(directories, locks)
    atexit.register(_current.release)
    return _current


JAVA_TMPDIR = "-Djava.io.tmpdir="


def with_java_tmpdir(java_options: str | None, scratch: Scratch) -> str:
    """The driver's ``spark.driver.extraJavaOptions`` with its temporary directory in ``scratch``
    (options that already name one are kept as they are)."""
    options = java_options or ""
    if JAVA_TMPDIR in options:
        return options
    return f"{options} {JAVA_TMPDIR}{scratch.root}".strip()


def current() -> Scratch | None:
    """The scratch :func:`claim` made in this process, if any."""
    return _current
