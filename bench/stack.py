"""The local dev stack's endpoints (``dev/stack env``), catalogs and a Spark session for the baselines."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Stack:
    kafka: str
    pg_dsn: str
    rest_uri: str
    s3_endpoint: str
    access_key: str
    secret_key: str
    region: str
    jars: tuple[str, ...]
    schema_registry_url: str = ""  # the registry's Confluent-compatible API (--avro)

    def catalog_properties(self) -> dict[str, str]:
        return {
            "uri": self.rest_uri,
            "s3.endpoint": self.s3_endpoint,
            "s3.access-key-id": self.access_key,
            "s3.secret-access-key": self.secret_key,
            "s3.region": self.region,
        }

    def catalog(self) -> Any:
        from pyiceberg.catalog import load_catalog

        return load_catalog("rest", type="rest", **self.catalog_properties())


def load_stack() -> Stack:
    """Endpoints from the environment, filled in from ``dev/stack env`` (which the bench exports)."""
    res = subprocess.run([str(REPO / "dev" / "stack"), "env"], capture_output=True, text=True, timeout=60)
    if res.returncode != 0:
        raise SystemExit(f"`dev/stack env` failed: {res.stderr}")
    for line in res.stdout.splitlines():
        match = re.fullmatch(r"export ([A-Z0-9_]+)=(.*)", line.strip())
        if match:
            os.environ.setdefault(match[1], shlex.split(match[2])[0] if match[2] else "")
    os.environ["NO_PROXY"] = os.environ["no_proxy"] = "127.0.0.1,localhost"
    env = os.environ
    return Stack(
        kafka=env["ICESINK_KAFKA_BOOTSTRAP"],
        pg_dsn=env["ICESINK_PG_DSN"],
        rest_uri=env["ICESINK_REST_URI"].rstrip("/"),
        s3_endpoint=env["ICESINK_S3_ENDPOINT"],
        access_key=env["AWS_ACCESS_KEY_ID"],
        secret_key=env["AWS_SECRET_ACCESS_KEY"],
        region=env.get("AWS_REGION", "us-east-1"),
        jars=tuple(j for j in env["ICESINK_SPARK_JARS"].split(",") if j),
        schema_registry_url=env.get("ICESINK_SCHEMA_REGISTRY_URL", ""),
    )


def spark_session(stack: Stack, cores: int = 2) -> Any:
    """local[cores] with the Iceberg catalog ``rest`` (as tests/conftest.py), for baselines and readers."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from readers import spark_conf

    conf = {
        **spark_conf(cores=cores),
        "spark.sql.streaming.numRecentProgressUpdates": "10000",
        "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
    }
    builder = SparkSession.builder.master(f"local[{cores}]").appName("icesink-bench")
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def load_average() -> tuple[float, float, float]:
    return os.getloadavg()


def machine() -> dict[str, Any]:
    mem_kib = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            mem_kib = int(line.split()[1])
    cpu = ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    return {"nproc": os.cpu_count(), "memory_gib": round(mem_kib / 1024 / 1024, 1), "cpu": cpu}
