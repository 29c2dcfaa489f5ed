"""The Java options of the tests' Spark drivers, with a class-data-sharing archive of Spark's classes.

A suite run starts a Spark driver JVM dozens of times (the reader session of each pytest worker, sink
processes a test kills or signals, ``maintain``, ``check``, the sink hosts). Most of such a start on a
2-core machine is loading and verifying Spark's ~15,000 classes. The JVM can map them from an archive
written by an earlier run instead (JDK 13+ dynamic CDS: ``-XX:ArchiveClassesAtExit`` writes it when a
JVM exits, ``-XX:SharedArchiveFile`` maps it): measured here, a driver's start and first two jobs take
half the time (20 s -> 10.5 s, wall).

The archive belongs to one JDK, one set of Spark jars and one driver class path (the stack's jars,
``$ICESINK_SPARK_JARS``, which a local-mode sink and the readers put there): it is kept under ``.cache/cds`` with a name
made of both, written once (under a file lock: two pytest workers start together), by a small Spark
job in a JVM that exits normally. A JVM given an archive that does not match its JDK or class path
says so and runs without it (``-Xshare:auto``, the default), so a stale archive costs time, never a
test. A production sink keeps the JVM's defaults: this is the tests' own start-up.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CDS_DIR = REPO / ".cache" / "cds"
# The tests' Spark drivers run small jobs on a 2-core machine: the C1 compiler alone and the serial
# collector cost much less CPU than C2 and G1, the long-lived reader session of a pytest worker too
# (measured: its start 11.5 -> 5.4 CPU-s, a read of a small table with deletes 0.54 -> 0.34 CPU-s over
# 200 reads, as fast in wall time; C2's compilations never paid for themselves).
LEAN_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
# What the archiving JVM runs: a session, a job, Arrow in and out, a shuffle, SQL: the classes every
# test driver loads before it does anything of its own.
_WARM_UP = """
import sys
import pyarrow as pa
from pyspark.sql import SparkSession
spark = (SparkSession.builder.master("local[2]").appName("icesink-cds")
         .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
         .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
         .config("spark.sql.execution.arrow.pyspark.enabled", "true")
         .config("spark.driver.extraClassPath", sys.argv[2])
         .config("spark.driver.extraJavaOptions", sys.argv[1]).getOrCreate())
frame = spark.createDataFrame(pa.table({"k": [1, 2, 2], "v": ["a", "b", "c"]}).to_pandas())
frame.groupBy("k").count().toArrow()
frame.mapInArrow(lambda batches: batches, frame.schema).collect()
spark.sql("SELECT k, max(v) FROM VALUES (1, 'a') AS t(k, v) GROUP BY k").collect()
spark.range(1000).selectExpr("sum(id)").collect()
spark.stop()
"""


def _java_home() -> Path:
    if os.environ.get("JAVA_HOME"):
        return Path(os.environ["JAVA_HOME"])
    java = shutil.which("java")
    return Path(java).resolve().parent.parent if java else Path("/nonexistent")


def class_path() -> str:
    """The driver class path of the tests' local-mode Spark sessions: the stack's jars."""
    return os.pathsep.join(part for part in os.environ.get("ICESINK_SPARK_JARS", "").split(",") if part)


def archive_path() -> Path:
    """Where the archive of this JDK, these Spark jars and this class path is kept."""
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    release = _java_home() / "release"
    key = hashlib.sha256()
    key.update(release.read_bytes() if release.exists() else str(_java_home()).encode())
    key.update(pyspark.__version__.encode())
    for entry in class_path().split(os.pathsep):  # a jar rebuilt in place makes a new archive
        jar = Path(entry)
        key.update(
            f"{entry}:{jar.stat().st_size}:{jar.stat().st_mtime_ns}".encode() if jar.exists() else b"-"
        )
    for jar in sorted(jars.glob("*.jar")):
        key.update(f"{jar.name}:{jar.stat().st_size}".encode())
    return CDS_DIR / f"spark-{key.hexdigest()[:16]}.jsa"


def ensure_archive() -> Path | None:
    """The archive, written first if missing; None when it could not be written (the tests then run
    without one)."""
    archive = archive_path()
    if archive.exists():
        return archive
    CDS_DIR.mkdir(parents=True, exist_ok=True)
    with open(CDS_DIR / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if archive.exists():  # the other worker wrote it while this one waited
            return archive
        for stale in CDS_DIR.glob("spark-*.jsa"):  # another JDK's or Spark's: never used again
            stale.unlink()
        partial = archive.with_suffix(".partial")
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
        argv = [
            sys.executable,
            "-c",
            _WARM_UP,
            f"{LEAN_JVM} -XX:ArchiveClassesAtExit={partial}",
            class_path(),
        ]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
            failure = "" if done.returncode == 0 else f"exit {done.returncode}: {done.stderr[-2000:]}"
        except (subprocess.TimeoutExpired, OSError) as exc:
            failure = str(exc)
        if failure or not partial.exists():
            print(f"no class-data-sharing archive, the tests start without one: {failure}", file=sys.stderr)
            partial.unlink(missing_ok=True)
            return None
        partial.rename(archive)
    return archive


def driver_java_options() -> str:
    """``spark.driver.extraJavaOptions`` for a test's Spark driver: C1 and the serial collector, and the
    archive if there is one."""
    archive = archive_path()
    options = [LEAN_JVM]
    if archive.exists():
        # A mismatched archive's warning would go to the JVM's stdout, which is the command's.
        options.append(f"-XX:SharedArchiveFile={archive} -Xlog:cds=off -Xlog:cds+dynamic=off")
    return " ".join(options)
