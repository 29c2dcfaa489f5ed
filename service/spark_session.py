"""The sink's Spark session: the jars it needs, and the settings a streaming sink runs with."""

from __future__ import annotations

import logging
import os
import re
import socket
import sys
from collections.abc import Mapping

from pyspark import SparkContext
from pyspark.errors import PySparkRuntimeError
from pyspark.sql import SparkSession

from service import scratch, spark_jars
from service.config import SinkConfig
from service.spark_jars import SparkJarsError

logger = logging.getLogger(__name__)

ICEBERG_EXTENSIONS = "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"
# Spark's throwaway checkpoint (a local directory; the txnlog holds the truth) is written twice per
# micro-batch. Through Hadoop's FileContext and its checksummed local file system, and without Hadoop's
# native library, each write forks `chmod` (file and checksum file) and `readlink` (the rename): ~0.1 s
# of every micro-batch. Through the FileSystem API and the raw local file system nothing forks (no
# permission is set on create, the rename is java.io's). Session-wide: `maintain`'s local files, if
# any, are written without checksum files too.
CHECKPOINT_WRITES = {
    "spark.sql.streaming.checkpointFileManagerClass": (
        "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
    ),
    "spark.hadoop.fs.file.impl": "org.apache.hadoop.fs.RawLocalFileSystem",
}


class SparkUnavailable(RuntimeError):
    """No master of ``spark.master`` answers: the sink stops before it claims anything.

    Without this check a standalone driver starts anyway and its scheduler retries the registration
    for about a minute before it gives up, and a Kubernetes master's errors come later still."""


# How long a master's port has to answer (each address of an HA list).
MASTER_TIMEOUT_S = 10.0


def _with_port(address: str, default: int) -> str:
    """``host[:port]`` or ``[v6]:port``, with the default port when it names none."""
    host_end = address.rfind("]")
    return address if ":" in address[host_end + 1 :] else f"{address}:{default}"


def check_master(master: str, timeout_s: float = MASTER_TIMEOUT_S) -> str:
    """That a cluster's master answers on its port (``spark://host:port[,host:port]`` and
    ``k8s://https://host:port``); a local master needs no server. Returns what answered.

    A port that accepts a connection is all it checks: a master that answers and then refuses the
    application fails in Spark's own words, a minute later."""
    if master.startswith("spark://"):
        addresses = [_with_port(a.strip(), 7077) for a in master.removeprefix("spark://").split(",")]
    elif master.startswith("k8s://"):
        api = master.removeprefix("k8s://")
        plain = api.startswith("http://")
        addresses = [_with_port(api.split("://", 1)[-1].split("/", 1)[0], 80 if plain else 443)]
    else:
        return f"{master}: runs in this process"
    problems = []
    for address in addresses:
        host, _, port = address.rpartition(":")
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
                return f"{master}: {address} answers"
        except (OSError, ValueError) as exc:
            problems.append(f"{address}: {getattr(exc, 'strerror', None) or exc}")
    raise SparkUnavailable(
        f"spark.master {master}: no master answers ({'; '.join(problems)}); start the cluster's master "
        f"or point spark.master at one that runs"
    )


def is_local(master: str) -> bool:
    """A master that runs the executors in the driver's own JVM: ``local`` and ``local[...]``, not
    ``local-cluster[...]`` (executors in JVMs of their own)."""
    return re.fullmatch(r"local(\[.*\])?", master) is not None


def sql_literal(text: str) -> str:
    """``text`` as a Spark SQL string literal (backslashes and quotes escaped)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


# Spark's default, plus the names of the catalog settings that hold secrets (REST credential, headers).
REDACTION = "(?i)secret|password|token|access[.]?key|account[.]key|shared-key|credential|header"


def build_spark(
    config: SinkConfig, master: str | None = None, *, iceberg: Mapping[str, str] | None = None
) -> SparkSession:
    """The sink's Spark session, with the jars it needs (:mod:`service.spark_jars`).

    ``iceberg`` (``icesink maintain``): the Spark settings of an Iceberg catalog
    (:func:`service.maintenance.spark.catalog_conf`); the session then also loads Iceberg's runtime and
    its SQL extensions, which the maintenance procedures (``CALL <catalog>.system...``) need.

    A jar that is missing, can't be fetched or resolved, or lacks a class the Kafka source needs raises
    :class:`SparkJarsError` here, a cluster master that does not answer :class:`SparkUnavailable`: the
    sink builds its session before it claims anything.
    """
    # Python workers must run the same interpreter (and packages) as the driver.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    master = master or config.spark.master
    local = is_local(master)
    jars = spark_jars.resolve(config.spark, iceberg=iceberg is not None, local=local)
    spark_jars.check_files(jars)
    check_master(master)
    own = None
    if SparkContext._gateway is None:  # this process's JVM is about to start (PySpark keeps it once up)
        own = scratch.claim(config.spark)
    builder = (
        SparkSession.builder.master(master)
        .appName(config.spark.app_name or f"icesink-{config.sink_id}")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", str(config.write.parallelism))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.python.worker.reuse", "true")
        .config("spark.python.daemon.module", "service.pydaemon")  # workers start with tasks' imports
        .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
    )
    if master.startswith("local"):  # local-cluster[...] too: its executors run on this machine
        # A local-mode driver needs no address reachable from elsewhere.
        builder = builder.config("spark.driver.bindAddress", "127.0.0.1").config(
            "spark.driver.host", "127.0.0.1"
        )
    extensions: dict[str, str] = {}
    if iceberg is not None:
        extensions = {"spark.sql.extensions": ICEBERG_EXTENSIONS, "spark.redaction.regex": REDACTION}
    settings = {**CHECKPOINT_WRITES, **jars.conf, **extensions, **config.spark.conf}
    if own is not None:
        java_options = "spark.driver.extraJavaOptions"
        settings[java_options] = scratch.with_java_tmpdir(settings.get(java_options), own)
    for key, value in settings.items():
        builder = builder.config(key, value)
    try:
        spark = builder.getOrCreate()
    except PySparkRuntimeError as exc:
        # Spark resolves packages before its JVM is up: Ivy's report (above, on stderr) names the
        # module it could not find, and the gateway just exits.
        if jars.packages and exc.getCondition() == "JAVA_GATEWAY_EXITED":
            raise SparkJarsError(
                f"Spark did not start: it could not resolve the packages {', '.join(jars.packages)} "
                f"(spark.jars.packages, through Ivy in {jars.ivy_home}; Ivy's report above says which "
                f"module it did not find)"
            ) from None
        raise
    spark.sparkContext.setLogLevel("WARN")
    # The catalog's settings hold secrets (keys, credentials, tokens): set on the running session, not
    # given to the builder, which passes its settings to the JVM on its command line. Spark reads a
    # catalog's settings when the catalog is first used.
    for key, value in (iceberg or {}).items():
        spark.conf.set(key, value)
    try:
        spark_jars.check_session(spark, jars)
    except SparkJarsError:
        spark.stop()
        raise
    logger.info("Spark jars: %s", jars.describe())
    context = spark.sparkContext
    logger.info("Spark %s, master %s, application %s", spark.version, context.master, context.applicationId)
    return spark
