"""The daemon that Spark's executors fork their Python workers from (``spark.python.daemon.module``).

PySpark's own daemon (``pyspark.daemon``) imports little before it forks, so every Python worker it
starts imports what icesink's tasks run (pyarrow, pandas, pyiceberg's Parquet writer, the decoders) on
its first task: ~2.5 CPU-seconds a worker. Spark starts two or more workers on a session's first
batch, and new ones again after a minute in which they sat idle (it stops idle workers then), so a
sink of sparse traffic paid it over and over. This daemon imports those modules once, before its first
fork: a forked worker starts with them loaded (their pages shared until written), and
:func:`gc.freeze` keeps each worker's collector from walking them.
"""

from __future__ import annotations

import gc
import importlib
import sys

import pyspark.daemon

from service import pyworker

# The modules whose functions Spark's tasks run (pickled by reference, so imported by the worker):
# the Arrow path's reader, decoders and file writer, Spark's Kafka rows, the dead-letter sender, the
# task reader, and Spark's decoder (its pandas UDFs), with pyspark's Arrow serializers.
TASK_MODULES = (
    "pyspark.sql.pandas.serializers",
    "service.data.arrow_job",
    "service.data.files",
    "service.data.spark_decode",
    "service.kafka.dead_letter",
    "service.kafka.reader",
    "service.kafka.records",
)


def preload() -> None:
    """Import :data:`TASK_MODULES` and freeze what is alive. A module that fails to import is named on
    stderr and left to the task that needs it, whose error then reaches the driver as a task failure."""
    for name in TASK_MODULES:
        try:
            importlib.import_module(name)
        except Exception as exc:  # the daemon must start: the task that needs it reports it
            print(f"icesink daemon: could not preload {name}: {exc!r}", file=sys.stderr)
    pyworker.quiet_zip_importers()
    gc.collect()
    gc.freeze()


if __name__ == "__main__":
    preload()
    pyspark.daemon.manager()
