#!/usr/bin/env python3
"""icesink's local stack of real servers, all on 127.0.0.1.

    dev/stack install   fetch/build what the servers need into the cache (idempotent)
    dev/stack up        start what is not running, wait until every server answers a health check
    dev/stack status    one line per server: healthy/down, pid, address, log
    dev/stack down      stop the processes this script started (pid files), TERM then KILL
    dev/stack stop|start|restart SERVER...   one server at a time (postgres, s3, kafka, rest, connect,
                        trino, registry, glue, gcs, azurite, nessie, hive, hive3, spark-master, spark-worker-1, spark-worker-2), e.g. for outage tests; start waits for the same health check as up
    dev/stack env       print `export NAME=value` lines: eval "$(dev/stack env)"
    dev/stack logs [-n LINES]   the last lines of every server's log (what CI prints when the suite fails)

Servers: Apache Kafka 4 (KRaft, combined broker+controller), PostgreSQL (own data dir, wal_level=logical),
an S3 server (MinIO built with `go install`, else moto's server), Iceberg's REST catalog server
(JDBC backend on the dev Postgres, warehouse on the S3 server) and Kafka Connect (standalone worker with
Debezium's PostgreSQL connector, capturing the dev Postgres's `cdc` database) and Trino (a single
node with an Iceberg catalog on the REST catalog and S3, a third reader of the tables) and a schema
registry (Apicurio Registry, in-memory, its Confluent-compatible API for source.format: debezium-avro)
and AWS Glue's API (moto's server, in memory: a catalog of type glue, its files on the S3 server)
and a Google Cloud Storage emulator (fake-gcs-server built with `go install`, its bucket `warehouse`)
and an Azure Blob Storage / ADLS emulator (Azurite from the npm registry, its well-known dev account)
and a second Iceberg REST server, Nessie's (its runner jar from Maven Central, in memory, its warehouse
on the S3 server)
and two Hive metastores (the standalone metastore 4.0.0 and 3.1.3 from Maven Central with Hadoop's client
jars, each its database on the dev Postgres, their tables' locations on the S3 server)
and a Spark standalone cluster (a master and two 1-core workers from pyspark's own jars, started with a
bare environment as cluster nodes have; spark.master: $ICESINK_SPARK_MASTER).
Spark's extra jars are fetched too.

Only the standard library is used, so this runs with the venv's or the system's python3.

Environment knobs (all optional):
  ICESINK_CACHE_DIR      downloads and builds (default <repo>/.cache; may be shared between clones)
  ICESINK_RUN_DIR        data dirs, logs, pid files (default <repo>/.cache/run)
  ICESINK_KAFKA_PORT=19092  ICESINK_KAFKA_CONTROLLER_PORT=19093  ICESINK_PG_PORT=15432
  ICESINK_S3_PORT=19000  ICESINK_S3_CONSOLE_PORT=19001  ICESINK_REST_PORT=18181  ICESINK_CONNECT_PORT=18083
  ICESINK_TRINO_PORT=18080  ICESINK_REGISTRY_PORT=18085  ICESINK_REGISTRY_MANAGEMENT_PORT=18086
  ICESINK_GLUE_PORT=18087  ICESINK_GCS_PORT=18088  ICESINK_AZURITE_PORT=18089
  ICESINK_NESSIE_PORT=18095  ICESINK_NESSIE_MANAGEMENT_PORT=18096  ICESINK_HIVE_PORT=18097
  ICESINK_HIVE3_PORT=18098
  ICESINK_SPARK_MASTER_PORT=17077  ICESINK_SPARK_MASTER_UI_PORT=18090  ICESINK_SPARK_WORKER_PORT=17078
  ICESINK_SPARK_WORKER_UI_PORT=18091 (worker n: these + n - 1)
  ICESINK_TRINO_JAVA_HOME  the JDK Trino runs on (24+; default: /usr/lib/jvm/temurin-25-jdk-amd64, else
                         the newest JDK 24+ under /usr/lib/jvm)
  ICESINK_S3_SERVER      force minio | moto (default: the first that installs)
  ICESINK_GO_BUILD_TIMEOUT  seconds allowed for one `go install` of an S3 server (default 2400)
  ICESINK_STACK_TIMEOUT  seconds to wait for each server to become healthy (default 180)
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime as dt
import functools
import hashlib
import hmac
import http.client
import json
import os
import pwd
import re
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import uuid
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO
from xml.sax.saxutils import escape

REPO = Path(__file__).resolve().parent.parent
DEV = REPO / "dev"
CACHE = Path(os.environ.get("ICESINK_CACHE_DIR") or REPO / ".cache").resolve()
RUN = Path(os.environ.get("ICESINK_RUN_DIR") or REPO / ".cache" / "run").resolve()
LOGS = RUN / "logs"
PIDS = RUN / "pids"

HOST = "127.0.0.1"

# Pinned versions of what is built from source. MinIO publishes no semver tags, so the Go module
# proxy knows its commits as pseudo-versions; this one is the newest commit on its main branch.
MINIO_MODULE = "github.com/minio/minio"
MINIO_VERSION = "v0.0.0-20260212201848-7aac2a2c5b7c"
FAKE_GCS_MODULE = "github.com/fsouza/fake-gcs-server"
FAKE_GCS_VERSION = "v1.56.1"
# The newest Azurite whose package runs on the Node.js these machines have (20; 3.36 on wants 21+).
AZURITE_VERSION = "3.35.0"
# SeaweedFS was the planned second choice, but the Go module proxy answers 403 ("not available") for
# github.com/seaweedfs/seaweedfs, so it cannot be built from the registries this project may use.
S3_SERVERS = ("minio", "moto")
MAVEN_DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value else default


@dataclass(frozen=True)
class Config:
    kafka_port: int = field(default_factory=lambda: _env_int("ICESINK_KAFKA_PORT", 19092))
    kafka_controller_port: int = field(
        default_factory=lambda: _env_int("ICESINK_KAFKA_CONTROLLER_PORT", 19093)
    )
    pg_port: int = field(default_factory=lambda: _env_int("ICESINK_PG_PORT", 15432))
    s3_port: int = field(default_factory=lambda: _env_int("ICESINK_S3_PORT", 19000))
    s3_console_port: int = field(default_factory=lambda: _env_int("ICESINK_S3_CONSOLE_PORT", 19001))
    rest_port: int = field(default_factory=lambda: _env_int("ICESINK_REST_PORT", 18181))
    connect_port: int = field(default_factory=lambda: _env_int("ICESINK_CONNECT_PORT", 18083))
    trino_port: int = field(default_factory=lambda: _env_int("ICESINK_TRINO_PORT", 18080))
    registry_port: int = field(default_factory=lambda: _env_int("ICESINK_REGISTRY_PORT", 18085))
    registry_management_port: int = field(
        default_factory=lambda: _env_int("ICESINK_REGISTRY_MANAGEMENT_PORT", 18086)
    )
    glue_port: int = field(default_factory=lambda: _env_int("ICESINK_GLUE_PORT", 18087))
    gcs_port: int = field(default_factory=lambda: _env_int("ICESINK_GCS_PORT", 18088))
    azurite_port: int = field(default_factory=lambda: _env_int("ICESINK_AZURITE_PORT", 18089))
    nessie_port: int = field(default_factory=lambda: _env_int("ICESINK_NESSIE_PORT", 18095))
    nessie_management_port: int = field(
        default_factory=lambda: _env_int("ICESINK_NESSIE_MANAGEMENT_PORT", 18096)
    )
    hive_port: int = field(default_factory=lambda: _env_int("ICESINK_HIVE_PORT", 18097))
    hive3_port: int = field(default_factory=lambda: _env_int("ICESINK_HIVE3_PORT", 18098))
    # Azurite's one account and key, the same in every Azurite (published with it: not a secret).
    azure_account: str = "devstoreaccount1"
    azure_key: str = (
        "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
    )
    # A Spark standalone master and two workers (each: an RPC port and a web UI port; the UIs answer the
    # health probes).
    spark_master_port: int = field(default_factory=lambda: _env_int("ICESINK_SPARK_MASTER_PORT", 17077))
    spark_master_ui_port: int = field(default_factory=lambda: _env_int("ICESINK_SPARK_MASTER_UI_PORT", 18090))
    spark_worker_port: int = field(default_factory=lambda: _env_int("ICESINK_SPARK_WORKER_PORT", 17078))
    spark_worker_ui_port: int = field(default_factory=lambda: _env_int("ICESINK_SPARK_WORKER_UI_PORT", 18091))
    # Throwaway credentials of the local dev stack (nothing else uses them).
    pg_user: str = os.environ.get("ICESINK_PG_USER", "icesink")
    pg_password: str = os.environ.get("ICESINK_PG_PASSWORD", "icesink")
    pg_db: str = "icesink"
    pg_catalog_db: str = "iceberg_catalog"
    pg_cdc_db: str = "cdc"  # the source database Debezium captures (tests create their tables there)
    s3_access_key: str = os.environ.get("ICESINK_S3_ACCESS_KEY", "icesink")
    s3_secret_key: str = os.environ.get("ICESINK_S3_SECRET_KEY", "icesink-secret")
    region: str = "us-east-1"
    bucket: str = "warehouse"

    @property
    def s3_endpoint(self) -> str:
        return f"http://{HOST}:{self.s3_port}"

    @property
    def warehouse(self) -> str:
        return f"s3://{self.bucket}/"

    @property
    def rest_uri(self) -> str:
        return f"http://{HOST}:{self.rest_port}"

    @property
    def connect_uri(self) -> str:
        return f"http://{HOST}:{self.connect_port}"

    @property
    def trino_uri(self) -> str:
        return f"http://{HOST}:{self.trino_port}"

    @property
    def registry_uri(self) -> str:
        """The registry's Confluent-compatible API (what source.schema_registry.url names)."""
        return f"http://{HOST}:{self.registry_port}/apis/ccompat/v7"

    @property
    def glue_endpoint(self) -> str:
        """AWS Glue's API as moto's server answers it (a catalog of type glue with glue.endpoint)."""
        return f"http://{HOST}:{self.glue_port}"

    @property
    def gcs_endpoint(self) -> str:
        """The Cloud Storage JSON API as fake-gcs-server answers it (``gcs.service.host``)."""
        return f"http://{HOST}:{self.gcs_port}"

    @property
    def spark_master(self) -> str:
        return f"spark://{HOST}:{self.spark_master_port}"

    def pg_dsn(self, db: str) -> str:
        return f"postgresql+psycopg://{self.pg_user}:{self.pg_password}@{HOST}:{self.pg_port}/{db}"


CFG = Config()


class StackError(Exception):
    pass


def log(msg: str) -> None:
    print(f"[dev/stack] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------------
# small helpers


def sha256_text(*parts: str) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def stamp_ok(stamp: Path, value: str) -> bool:
    return stamp.is_file() and stamp.read_text().strip() == value


def run(argv: list[str]) -> None:
    subprocess.run(argv, check=True)


def java_home() -> Path:
    if os.environ.get("JAVA_HOME"):
        return Path(os.environ["JAVA_HOME"])
    java = shutil.which("java")
    if not java:
        raise StackError("java not found: run scripts/bootstrap (it installs openjdk-17-jdk-headless)")
    return Path(java).resolve().parent.parent


# The servers' JVMs answer a test suite's small requests on a 2-core machine: the C1 compiler alone and
# the serial collector, as the tests' Spark drivers (tests/spark_jvm.py). Over a whole suite on a fresh
# stack (dev/cpu_by_process.py): Connect, Nessie, the Hive metastore, the registry and the Spark
# daemons 1.3 -> 0.8 CPU-minutes, the REST catalog 0.8 -> 0.5, Kafka 1.4 -> 1.3, in a run whose
# unchanged processes (the sinks, the readers) took 15% more than in the first.
SERVER_JVM = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")


def java_bin(tool: str = "java") -> str:
    path = java_home() / "bin" / tool
    if not path.exists():
        raise StackError(f"{path} not found: a JDK 17+ is needed (scripts/bootstrap installs one)")
    return str(path)


def java_major() -> int:
    out = subprocess.run([java_bin(), "-version"], capture_output=True, text=True).stderr
    version = out.split('"')[1] if '"' in out else "0"
    return int(version.split(".")[0])


def pg_bindir() -> Path:
    override = os.environ.get("ICESINK_PG_BINDIR")
    candidates = (
        [Path(override)]
        if override
        else sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name), reverse=True)
    )
    for cand in candidates:
        if (cand / "postgres").exists() and (cand / "initdb").exists():
            return cand
    raise StackError(
        "PostgreSQL server binaries not found: run scripts/bootstrap (apt-get install postgresql)"
    )


def venv_bin(tool: str) -> str | None:
    path = REPO / ".venv" / "bin" / tool
    return str(path) if path.exists() else shutil.which(tool)


def port_open(port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=timeout):
            return True
    except OSError:
        return False


def tail(path: Path, lines: int = 40) -> str:
    if not path.exists():
        return f"(no log at {path})"
    with path.open("rb") as fh:
        fh.seek(0, os.SEEK_END)
        fh.seek(max(0, fh.tell() - 64 * 1024))
        data = fh.read().decode(errors="replace").splitlines()
    return "\n".join(data[-lines:])


# --------------------------------------------------------------------------------------------------
# processes: started in their own session (pgid == pid), tracked by pid files


def proc_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def proc_cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def group_members(pgid: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members


# --------------------------------------------------------------------------------------------------
# S3: a minimal SigV4 client (health check and bucket creation without boto3)


def s3_request(method: str, path: str, query: str = "") -> tuple[int, bytes]:
    now = dt.datetime.now(dt.UTC)
    amz_date, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    host = f"{HOST}:{CFG.s3_port}"
    payload = hashlib.sha256(b"").hexdigest()
    headers = {"host": host, "x-amz-content-sha256": payload, "x-amz-date": amz_date}
    signed = ";".join(sorted(headers))
    canonical = "\n".join(
        [method, path, query, "".join(f"{k}:{headers[k]}\n" for k in sorted(headers)), signed, payload]
    )
    scope = f"{day}/{CFG.region}/s3/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = ("AWS4" + CFG.s3_secret_key).encode()
    for part in (day, CFG.region, "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    headers["authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={CFG.s3_access_key}/{scope}, "
        f"SignedHeaders={signed}, Signature={signature}"
    )
    conn = http.client.HTTPConnection(HOST, CFG.s3_port, timeout=5)
    try:
        conn.request(method, path + (f"?{query}" if query else ""), headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


# --------------------------------------------------------------------------------------------------
# Kafka: a Metadata request (v4) over the wire, no client library needed


def kafka_metadata(port: int) -> str:
    client_id = b"icesink-dev-stack"
    header = struct.pack(">hhih", 3, 4, 7, len(client_id)) + client_id
    body = struct.pack(">ib", 0, 0)  # no topics, allow_auto_topic_creation=false
    with socket.create_connection((HOST, port), timeout=5) as sock:
        sock.settimeout(5)
        sock.sendall(struct.pack(">i", len(header) + len(body)) + header + body)
        size_raw = _recv(sock, 4)
        data = _recv(sock, struct.unpack(">i", size_raw)[0])
    correlation, _throttle, n_brokers = struct.unpack_from(">iii", data, 0)
    if correlation != 7 or n_brokers < 1:
        raise StackError(f"metadata response lists {n_brokers} brokers")
    node_id, host_len = struct.unpack_from(">ih", data, 12)
    host = data[18 : 18 + host_len].decode()
    (bport,) = struct.unpack_from(">i", data, 18 + host_len)
    return f"broker {node_id} at {host}:{bport}"


def _recv(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise StackError("connection closed by broker")
        buf += chunk
    return buf


# --------------------------------------------------------------------------------------------------
# install: Maven jars, REST launcher, S3 server


# What `dev/stack install` fetches with Maven: dev/maven/<module>/pom.xml -> its runtime jars in this folder.
MAVEN_MODULES: dict[str, Path] = {
    "kafka": CACHE / "kafka" / "libs",
    "rest-catalog": CACHE / "rest-catalog" / "libs",
    "spark": CACHE / "jars",
    "connect": CACHE / "connect" / "libs",
    # A Kafka Connect plugin lives in a folder of its own under the worker's plugin.path.
    "debezium-postgres": CACHE / "connect" / "plugins" / "debezium-connector-postgres",
    "apicurio-converter": CACHE / "connect" / "plugins" / "apicurio-registry-converter",
    "hive-hadoop": CACHE / "hive" / "hadoop-libs",
}
DEBEZIUM_POSTGRES = "io.debezium.connector.postgresql.PostgresConnector"


def _maven_want(module: str) -> str:
    return sha256_text((DEV / "maven" / module / "pom.xml").read_text(), MAVEN_DEPENDENCY_PLUGIN)


def maven_fetched(module: str) -> bool:
    return stamp_ok(MAVEN_MODULES[module] / ".stamp", _maven_want(module))


def pom_property(module: str, name: str) -> str:
    match = re.search(rf"<{re.escape(name)}>([^<]+)</", (DEV / "maven" / module / "pom.xml").read_text())
    if not match:
        raise StackError(f"dev/maven/{module}/pom.xml has no <{name}> property")
    return match[1].strip()


def check_connect_matches_kafka() -> None:
    """Kafka Connect's worker is a Kafka client of the broker's own release: the two poms must agree."""
    broker, worker = pom_property("kafka", "kafka.version"), pom_property("connect", "kafka.version")
    if broker != worker:
        raise StackError(
            f"dev/maven/connect/pom.xml has kafka.version {worker} but dev/maven/kafka/pom.xml has {broker}: "
            "set both to the same Kafka release"
        )


def mvn(what: str, *args: str) -> None:
    """Run a Maven goal with the cache's local repository (downloads from Maven Central land there)."""
    if not shutil.which("mvn"):
        raise StackError("mvn not found: run scripts/bootstrap (it installs maven)")
    argv = ["mvn", "-B", "-q", f"-Dmaven.repo.local={CACHE / 'm2'}", *args]
    res = subprocess.run(
        argv, capture_output=True, text=True, env={**os.environ, "JAVA_HOME": str(java_home())}
    )
    if res.returncode != 0:
        raise StackError(
            f"Maven failed for {what} (it downloads from Maven Central into {CACHE / 'm2'}):\n"
            f"{res.stdout[-4000:]}\n{res.stderr[-2000:]}"
        )


def maven_fetch(module: str) -> list[Path]:
    """Copy the runtime jars of dev/maven/<module>/pom.xml into its folder (skipped when the pom is unchanged)."""
    pom = DEV / "maven" / module / "pom.xml"
    dest = MAVEN_MODULES[module]
    stamp = dest / ".stamp"
    want = _maven_want(module)
    if not stamp_ok(stamp, want):
        log(f"fetching {module} jars with Maven into {dest}")
        tmp = CACHE / "maven-tmp" / module  # not beside dest: a plugin.path folder must hold only plugins
        shutil.rmtree(tmp, ignore_errors=True)
        mvn(
            str(pom),
            "-f",
            str(pom),
            f"{MAVEN_DEPENDENCY_PLUGIN}:copy-dependencies",
            "-DincludeScope=runtime",
            f"-DoutputDirectory={tmp}",
        )
        shutil.rmtree(dest, ignore_errors=True)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp.rename(dest)
        stamp.write_text(want + "\n")
    return sorted(dest.glob("*.jar"))


APICURIO_AVRO_CONVERTER = "io.apicurio.registry.utils.converter.AvroConverter"


def converter_manifest() -> None:
    """Apicurio's converter jar has no ServiceLoader manifest, and the worker discovers plugins by
    manifest only (``plugin.discovery: service_load``): a jar of just that manifest sits beside it."""
    jar = MAVEN_MODULES["apicurio-converter"] / "icesink-converter-manifest.jar"
    if jar.exists():
        return
    tmp = jar.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w") as zf:
        zf.writestr(
            "META-INF/services/org.apache.kafka.connect.storage.Converter", APICURIO_AVRO_CONVERTER + "\n"
        )
    tmp.rename(jar)


def spark_jars() -> list[Path]:
    return sorted((CACHE / "jars").glob("*.jar"))


def build_rest_launcher() -> Path:
    src = DEV / "rest-catalog" / "org" / "apache" / "iceberg" / "rest" / "LoopbackRESTCatalogServer.java"
    libs = CACHE / "rest-catalog" / "libs"
    classes = CACHE / "rest-catalog" / "classes"
    want = sha256_text(src.read_text(), *sorted(p.name for p in libs.glob("*.jar")))
    if not stamp_ok(classes / ".stamp", want):
        log("compiling the loopback REST catalog launcher")
        shutil.rmtree(classes, ignore_errors=True)
        classes.mkdir(parents=True)
        run([java_bin("javac"), "-d", str(classes), "-cp", f"{libs}/*", str(src)])
        (classes / ".stamp").write_text(want + "\n")
    return classes


def go_env() -> dict[str, str]:
    go = CACHE / "go"
    return {
        **os.environ,
        "GOBIN": str(CACHE / "bin"),
        "GOMODCACHE": str(go / "mod"),
        "GOCACHE": str(go / "build"),
        "GOPATH": str(go / "path"),
        "GOFLAGS": "-modcacherw",
        "GOTOOLCHAIN": os.environ.get("GOTOOLCHAIN", "auto"),
        "CGO_ENABLED": "0",
    }


GO_BUILDS: set[subprocess.Popen[bytes]] = set()  # the `go install` processes running now


def go_install(name: str, module: str, version: str, binary: str, *, required: bool = False) -> bool:
    """Build one Go binary into CACHE/bin. A failure of an optional one (an S3 server with another to
    fall back on) is remembered so later installs do not retry it; a required one is tried each time."""
    target = CACHE / "bin" / binary
    stamp = CACHE / "bin" / f".{binary}.version"
    failed = CACHE / "bin" / f".{binary}.failed"
    if target.exists() and stamp_ok(stamp, version):
        return True
    forced = os.environ.get("ICESINK_S3_SERVER") == name
    if failed.exists() and stamp_ok(failed, version) and not forced and not required:
        log(
            f"skipping {name}: its build failed before (see {CACHE / 'logs' / (binary + '-build.log')}); "
            f"set ICESINK_S3_SERVER={name} to retry"
        )
        return False
    if not shutil.which("go"):
        log(f"skipping {name}: no Go toolchain (scripts/bootstrap installs golang-go)")
        return False
    timeout = _env_int("ICESINK_GO_BUILD_TIMEOUT", 2400)
    build_log = CACHE / "logs" / f"{binary}-build.log"
    build_log.parent.mkdir(parents=True, exist_ok=True)
    (CACHE / "bin").mkdir(parents=True, exist_ok=True)
    log(f"building {name} with `go install {module}@{version}` (up to {timeout}s; log {build_log})")
    started = time.monotonic()
    with build_log.open("w") as out:
        proc = subprocess.Popen(
            ["go", "install", f"{module}@{version}"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=go_env(),
            cwd=CACHE,
            start_new_session=True,
        )
        GO_BUILDS.add(proc)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = -1
            out.write(f"\n[dev/stack] build killed after {timeout}s\n")
        finally:
            GO_BUILDS.discard(proc)
    if rc == 0 and target.exists():
        stamp.write_text(version + "\n")
        failed.unlink(missing_ok=True)
        log(f"built {name} in {time.monotonic() - started:.0f}s")
        return True
    failed.write_text(version + "\n")
    log(f"{name} build failed (rc={rc}); last lines of {build_log}:\n{tail(build_log, 15)}")
    return False


def install_s3_server() -> str:
    forced = os.environ.get("ICESINK_S3_SERVER")
    if forced and forced not in S3_SERVERS:
        raise StackError(f"ICESINK_S3_SERVER must be one of {', '.join(S3_SERVERS)}")
    order = [forced] if forced else list(S3_SERVERS)
    for name in order:
        if name == "minio" and go_install("minio", MINIO_MODULE, MINIO_VERSION, "minio"):
            return name
        if name == "moto":
            # Not looked for here: scripts/bootstrap may still be filling the venv beside this install;
            # starting the stack says so if moto_server is missing.
            return name
    raise StackError(f"no S3 server could be installed (tried {', '.join(order)})")


def installed_s3_server() -> str | None:
    path = CACHE / "s3-server"
    return path.read_text().strip() if path.exists() else None


# ---- Trino: the server without plugins (trino-server-core) and the Iceberg plugin (its own zip), both
# from Maven Central. 476 is the newest release of which Maven Central serves both archives (the
# trino-server tarball of 476 would bring some 40 plugins, 820 MB, for the one needed).

TRINO_VERSION = "476"
TRINO_JAVA = 24  # the Java release Trino 476 requires at least
TRINO_HOME = CACHE / "trino" / f"server-{TRINO_VERSION}"
TEMURIN_25 = Path("/usr/lib/jvm/temurin-25-jdk-amd64")


def jdk_release(home: Path) -> int:
    """The major Java release of a JDK folder, from its `release` file (0 when unreadable)."""
    try:
        match = re.search(r'^JAVA_VERSION="(\d+)', (home / "release").read_text(), re.M)
    except OSError:
        return 0
    return int(match[1]) if match else 0


def trino_java_home() -> Path:
    """The JDK Trino runs on: ICESINK_TRINO_JAVA_HOME, else Temurin 25, else the newest JDK 24+ installed.
    Kafka, Connect and the REST catalog stay on the default JDK (JAVA_HOME / java on the PATH)."""
    override = os.environ.get("ICESINK_TRINO_JAVA_HOME")
    jvms = Path("/usr/lib/jvm")
    found = sorted(jvms.iterdir(), key=jdk_release, reverse=True) if jvms.is_dir() else []
    for home in [Path(override)] if override else [TEMURIN_25, *found]:
        if (home / "bin" / "java").exists() and jdk_release(home) >= TRINO_JAVA:
            return home
    raise StackError(
        f"Trino {TRINO_VERSION} needs a JDK {TRINO_JAVA}+: none at {override or f'{TEMURIN_25} or under {jvms}'} "
        "(set ICESINK_TRINO_JAVA_HOME to one)"
    )


def _trino_want() -> str:
    return sha256_text(TRINO_VERSION, "lib", "plugin/iceberg")


def trino_installed() -> bool:
    return stamp_ok(TRINO_HOME / ".stamp", _trino_want())


def _unpack(name: str, data: IO[bytes] | None, dest: Path) -> None:
    if data is None or ".." in Path(name).parts or Path(name).is_absolute():
        raise StackError(f"unexpected archive member {name!r}")
    target = dest / name
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("wb") as out:
        shutil.copyfileobj(data, out)


def trino_install() -> Path:
    """Unpack the server's lib/ and the Iceberg plugin into TRINO_HOME; nothing else of the tarball
    (launchers, the other plugins) is needed to run `java -cp lib/* io.trino.server.TrinoServer`."""
    trino_java_home()
    if trino_installed():
        return TRINO_HOME
    archives = {}
    for artifact, ext in (("trino-server-core", "tar.gz"), ("trino-iceberg", "zip")):
        coordinate = f"io.trino:{artifact}:{TRINO_VERSION}:{ext}"
        log(f"fetching {coordinate} with Maven")
        mvn(coordinate, f"{MAVEN_DEPENDENCY_PLUGIN}:get", f"-Dartifact={coordinate}", "-Dtransitive=false")
        archives[artifact] = (
            CACHE / "m2" / "io" / "trino" / artifact / TRINO_VERSION / f"{artifact}-{TRINO_VERSION}.{ext}"
        )
    tmp = TRINO_HOME.with_name(TRINO_HOME.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    log(f"unpacking Trino {TRINO_VERSION} (server lib/ and the Iceberg plugin) into {TRINO_HOME}")
    with tarfile.open(archives["trino-server-core"]) as tar:
        top = f"trino-server-core-{TRINO_VERSION}/"
        for member in tar:
            if member.isfile() and member.name.startswith(top + "lib/"):
                _unpack(member.name.removeprefix(top), tar.extractfile(member), tmp)
    with zipfile.ZipFile(archives["trino-iceberg"]) as zf:
        for info in zf.infolist():
            if not info.is_dir():
                with zf.open(info) as data:
                    _unpack(f"plugin/iceberg/{Path(info.filename).name}", data, tmp)
    shutil.rmtree(TRINO_HOME, ignore_errors=True)
    tmp.rename(TRINO_HOME)
    (TRINO_HOME / ".stamp").write_text(_trino_want() + "\n")
    return TRINO_HOME


# ---- Nessie: its Quarkus server's runner jar from Maven Central (0.99.0, the newest published there;
# built for Java 21: Temurin 25 runs it), an Iceberg REST catalog at /iceberg

NESSIE_VERSION = "0.99.0"
NESSIE_JAR = (
    CACHE / "m2" / "org" / "projectnessie" / "nessie" / "nessie-quarkus" / NESSIE_VERSION
) / f"nessie-quarkus-{NESSIE_VERSION}-runner.jar"  # run where Maven put it (245 MB: no copy)


def nessie_installed() -> bool:
    return NESSIE_JAR.exists()


def nessie_install() -> None:
    trino_java_home()  # the same JDK 24+ runs it
    if nessie_installed():
        return
    coordinate = f"org.projectnessie.nessie:nessie-quarkus:{NESSIE_VERSION}:jar:runner"
    log(f"fetching {coordinate} with Maven")
    mvn(coordinate, f"{MAVEN_DEPENDENCY_PLUGIN}:get", f"-Dartifact={coordinate}", "-Dtransitive=false")


def nessie_start() -> subprocess.Popen[bytes]:
    """Its version store in memory (a restart forgets every table, as the registry's schemas); the
    warehouse ``s3://warehouse/nessie`` on the S3 server, whose keys reach it through the environment."""
    if not nessie_installed():
        raise StackError("Nessie is not installed: run dev/stack install")
    java_home = trino_java_home()
    s3 = "nessie.catalog.service.s3.default-options"
    argv = [
        str(java_home / "bin" / "java"),
        "-Xms64m",
        "-Xmx384m",
        *SERVER_JVM,
        f"-Dquarkus.http.host={HOST}",
        f"-Dquarkus.http.port={CFG.nessie_port}",
        f"-Dquarkus.management.host={HOST}",
        f"-Dquarkus.management.port={CFG.nessie_management_port}",
        "-Dquarkus.log.console.format=%d{HH:mm:ss} %-5p [%c{2.}] %s%e%n",
        "-Dnessie.version.store.type=IN_MEMORY",
        "-Dnessie.server.authentication.enabled=false",
        "-Dnessie.catalog.default-warehouse=warehouse",
        f"-Dnessie.catalog.warehouses.warehouse.location=s3://{CFG.bucket}/nessie",
        f"-D{s3}.endpoint={CFG.s3_endpoint}/",
        f"-D{s3}.path-style-access=true",
        f"-D{s3}.region={CFG.region}",
        f"-D{s3}.access-key=urn:nessie-secret:quarkus:icesink.s3-keys",
        "-jar",
        str(NESSIE_JAR),
    ]
    # The S3 keys in the application.properties Quarkus reads from ./config (not on the command line;
    # its secrets lookup does not find them as environment variables).
    data = RUN / "nessie"
    (data / "config").mkdir(parents=True, exist_ok=True)
    secrets = data / "config" / "application.properties"
    secrets.touch(mode=0o600)
    secrets.write_text(
        f"icesink.s3-keys.name={CFG.s3_access_key}\nicesink.s3-keys.secret={CFG.s3_secret_key}\n"
    )
    return spawn(SERVICES["nessie"], argv, env={**os.environ, "JAVA_HOME": str(java_home)}, cwd=data)


def nessie_health() -> str:
    config = json.loads(http_get(CFG.nessie_port, "/iceberg/v1/config"))
    return f"Nessie {NESSIE_VERSION}, warehouse {config.get('defaults', {}).get('warehouse')}"


# ---- Hive metastores: the standalone metastore's distribution from Maven Central, each on the dev Postgres
# (a database of its own), the tables' locations on the S3 server. 4.0.0, not 4.0.1: 4.0.1 dropped the
# Thrift call get_table, which pyiceberg 0.12 and Spark's built-in Hive 2.3 client (Iceberg's HiveCatalog
# in the maintainer) still make. 3.1.3 beside it: the 3.x line many clusters still run.

HIVE_MAIN = "org.apache.hadoop.hive.metastore.HiveMetaStore"


@dataclass(frozen=True)
class HiveMetastore:
    """One release of Hive's standalone metastore as a server of the stack (``service``)."""

    service: str
    version: str
    artifact: str  # its binary distribution: <artifact>-<version>-bin.tar.gz
    schema_tool: str  # the class of its schematool
    port: int
    db: str
    warehouse: str  # the S3 bucket's folder a namespace without a location goes to
    # Settings a release needs beyond the common ones (_hive_site).
    settings: Mapping[str, str] = field(default_factory=dict)

    @property
    def home(self) -> Path:
        return CACHE / "hive" / f"metastore-{self.version}"

    @property
    def run(self) -> Path:
        return RUN / self.service

    @property
    def marker(self) -> str:
        """Its command line's mark: its jars' directory (both releases run the same main class)."""
        return f"metastore-{self.version}{os.sep}lib"


HIVE = HiveMetastore(
    "hive",
    "4.0.0",
    "hive-standalone-metastore-server",
    "org.apache.hadoop.hive.metastore.tools.schematool.MetastoreSchemaTool",
    CFG.hive_port,
    "hive_metastore",
    "hive",
)
HIVE3 = HiveMetastore(
    "hive3",
    "3.1.3",
    "hive-standalone-metastore",
    "org.apache.hadoop.hive.metastore.tools.MetastoreSchemaTool",
    CFG.hive3_port,
    "hive3_metastore",
    "hive3",
    {
        # 3.x's defaults name classes of hive-exec, which its standalone distribution does not ship: the
        # metastore would refuse to start ("... class not found").
        "metastore.expression.proxy": "org.apache.hadoop.hive.metastore.DefaultPartitionExpressionProxy",
        # The housekeeper that times out a dead committer's lock is one of 3.x's "remote" tasks, started
        # only after the compactor's Initiator, also a hive-exec class: without it here, a lock a killed
        # sink held would be kept for good. Every 5 s, as 4.x's above.
        "metastore.task.threads.always": "org.apache.hadoop.hive.metastore.events.EventCleanerTask,"
        "org.apache.hadoop.hive.metastore.RuntimeStatsCleanerTask,"
        "org.apache.hadoop.hive.metastore.txn.AcidHouseKeeperService",
        "metastore.timedout.txn.reaper.interval": "5s",
        # 3.x puts a new database under the managed root, external tables or not (4.x: the external one).
        "metastore.warehouse.dir": f"s3://{CFG.bucket}/hive3",
    },
)
METASTORES = (HIVE, HIVE3)


def hive_installed(ms: HiveMetastore) -> bool:
    return stamp_ok(ms.home / ".stamp", sha256_text(ms.version)) and maven_fetched("hive-hadoop")


def hive_install(ms: HiveMetastore) -> Path:
    """Unpack ``<artifact>:<version>:tar.gz:bin``'s jars and its Postgres schema scripts; the Hadoop jars
    it needs and Postgres's JDBC driver come from dev/maven/hive-hadoop (fetched with the other modules)."""
    if stamp_ok(ms.home / ".stamp", sha256_text(ms.version)):
        return ms.home
    coordinate = f"org.apache.hive:{ms.artifact}:{ms.version}:tar.gz:bin"
    log(f"fetching {coordinate} with Maven")
    mvn(coordinate, f"{MAVEN_DEPENDENCY_PLUGIN}:get", f"-Dartifact={coordinate}", "-Dtransitive=false")
    archive = (
        CACHE / "m2" / "org" / "apache" / "hive" / ms.artifact / ms.version
    ) / f"{ms.artifact}-{ms.version}-bin.tar.gz"
    tmp = ms.home.with_name(ms.home.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    log(f"unpacking the Hive metastore {ms.version} into {ms.home}")
    keep = ("lib/", "scripts/metastore/upgrade/postgres/")
    with tarfile.open(archive) as tar:
        for member in tar:
            name = member.name.partition("/")[2]  # under apache-hive-metastore-<version>-bin/
            if member.isfile() and name.startswith(keep):
                _unpack(name, tar.extractfile(member), tmp)
    shutil.rmtree(ms.home, ignore_errors=True)
    tmp.rename(ms.home)
    (ms.home / ".stamp").write_text(sha256_text(ms.version) + "\n")
    return ms.home


def _hive_site_text(ms: HiveMetastore) -> str:
    """The metastore's configuration (metastore-site.xml); the S3 keys reach S3A through the
    environment, as the other servers' do."""
    values = {
        "javax.jdo.option.ConnectionURL": f"jdbc:postgresql://{HOST}:{CFG.pg_port}/{ms.db}",
        "javax.jdo.option.ConnectionDriverName": "org.postgresql.Driver",
        "javax.jdo.option.ConnectionUserName": CFG.pg_user,
        "javax.jdo.option.ConnectionPassword": CFG.pg_password,
        "metastore.thrift.bind.host": HOST,
        "metastore.thrift.port": str(ms.port),
        # s3:// (what pyiceberg and Iceberg write) through S3A. Iceberg's tables are external tables of
        # Hive's, which must lie outside its managed tables' root.
        "metastore.warehouse.dir": f"s3://{CFG.bucket}/{ms.warehouse}-managed",
        "metastore.warehouse.external.dir": f"s3://{CFG.bucket}/{ms.warehouse}",
        "fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
        "fs.s3a.endpoint": CFG.s3_endpoint,
        "fs.s3a.endpoint.region": CFG.region,
        "fs.s3a.path.style.access": "true",
        "metastore.compactor.initiator.on": "false",  # Hive ACID's compactions: none here
        # A commit takes the table's lock in the metastore; a committer killed holding it leaves it until
        # the housekeeper times it out (Hive's default: 300 s without a heartbeat, checked every 60 s; the
        # housekeeper is off unless asked for). The tests' kills need it sooner.
        "metastore.housekeeping.threads.on": "true",
        "metastore.txn.timeout": "20s",
        "metastore.acid.housekeeper.interval": "5s",
        **ms.settings,
    }
    return (
        "<configuration>\n"
        + "".join(
            f"  <property><name>{k}</name><value>{escape(v)}</value></property>\n" for k, v in values.items()
        )
        + "</configuration>\n"
    )


def _hive_site(ms: HiveMetastore) -> Path:
    """Its configuration's directory, the file written in it for this user only (Postgres's password
    is in it)."""
    conf = ms.run / "conf"
    conf.mkdir(parents=True, exist_ok=True)
    site = conf / "metastore-site.xml"
    site.touch(mode=0o600)
    site.write_text(_hive_site_text(ms))
    return conf


def hive_stale(ms: HiveMetastore) -> str | None:
    """A metastore started with another configuration than hive_start writes now."""
    site = ms.run / "conf" / "metastore-site.xml"
    if site.exists() and site.read_text() == _hive_site_text(ms):
        return None
    return f"its configuration changed ({site})"


def _hive_classpath(ms: HiveMetastore, conf: Path) -> str:
    # The metastore's own jars before Hadoop's (the order its launcher uses: HADOOP_USER_CLASSPATH_FIRST).
    return os.pathsep.join([str(conf), str(ms.home / "lib" / "*"), str(MAVEN_MODULES["hive-hadoop"] / "*")])


def hive_start(ms: HiveMetastore) -> subprocess.Popen[bytes]:
    """Creates its database and schema (Hive's schematool) the first time, then starts the metastore."""
    if not hive_installed(ms):
        raise StackError(f"the Hive metastore {ms.version} is not installed: run dev/stack install")
    conf = _hive_site(ms)
    java = str(java_home() / "bin" / "java")
    env = {
        **os.environ,
        "METASTORE_HOME": str(ms.home),  # where schematool finds its scripts
        "AWS_ACCESS_KEY_ID": CFG.s3_access_key,
        "AWS_SECRET_ACCESS_KEY": CFG.s3_secret_key,
    }
    if not _hive_schema_ready(ms):
        # A schema without its version row is a schematool run cut short: start it again from nothing.
        psql(f'DROP DATABASE IF EXISTS "{ms.db}"')
        psql(f'CREATE DATABASE "{ms.db}"')
        log(f"creating the Hive metastore's schema in database {ms.db} (schematool)")
        with SERVICES[ms.service].log.open("ab") as out:
            res = subprocess.run(
                [
                    java,
                    "-cp",
                    _hive_classpath(ms, conf),
                    ms.schema_tool,
                    "-initSchema",
                    "-dbType",
                    "postgres",
                ],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=ms.home,
            )
        if res.returncode != 0 or not _hive_schema_ready(ms):
            log_path = SERVICES[ms.service].log
            raise StackError(f"Hive's schematool failed (exit {res.returncode}): see {log_path}")
    argv = [java, "-Xms64m", "-Xmx384m", *SERVER_JVM, "-cp", _hive_classpath(ms, conf), HIVE_MAIN]
    return spawn(SERVICES[ms.service], argv, env=env, cwd=ms.run)


def _hive_schema_ready(ms: HiveMetastore) -> bool:
    """The metastore's schema is whole: its database exists and holds the version row schematool
    writes last."""
    if psql(f"SELECT 1 FROM pg_database WHERE datname = '{ms.db}'") != "1":
        return False
    if psql("SELECT to_regclass('public.\"VERSION\"') IS NOT NULL", db=ms.db) != "t":
        return False
    return psql('SELECT count(*) FROM "VERSION"', db=ms.db) == "1"


def _thrift_call(port: int, method: str) -> list[str]:
    """Call ``method`` (no arguments, a list of strings back) in Thrift's binary protocol, as the
    metastore speaks it (strict, unframed): a health probe that needs no Thrift library."""
    name = method.encode()
    request = struct.pack(">Ii", 0x80010001, len(name)) + name + struct.pack(">i", 1) + b"\x00"
    with socket.create_connection((HOST, port), timeout=5) as sock, sock.makefile("rb") as stream:
        sock.sendall(request)

        def take(size: int) -> bytes:
            data = bytes(stream.read(size))
            if len(data) != size:
                raise StackError(f"{method}: the connection closed mid-answer")
            return data

        def read(fmt: str) -> tuple[int, ...]:
            return struct.unpack(fmt, take(struct.calcsize(fmt)))

        def string() -> str:
            (length,) = read(">i")
            return take(length).decode()

        (version,) = read(">I")
        string()  # the method's name
        read(">i")  # the sequence id
        if version & 0xFF != 2:  # not a reply: an exception
            raise StackError(f"{method}: the metastore answered with an exception")
        (field_type,) = read(">b")
        if field_type != 15:  # the success field: a list (0 would be the struct's end: no result)
            raise StackError(f"{method}: no result (field type {field_type})")
        read(">h")
        _, count = read(">bi")
        return [string() for _ in range(count)]


def hive_health(ms: HiveMetastore) -> str:
    databases = _thrift_call(ms.port, "get_all_databases")
    return f"Hive metastore {ms.version}, {len(databases)} database(s)"


# ---- the schema registry: Apicurio Registry's Quarkus app from Maven Central (Java 21+: Temurin 25)

REGISTRY_VERSION = "3.3.3"
REGISTRY_HOME = CACHE / "apicurio" / f"registry-{REGISTRY_VERSION}"


def registry_installed() -> bool:
    return stamp_ok(REGISTRY_HOME / ".stamp", sha256_text(REGISTRY_VERSION))


def registry_install() -> Path:
    """Unpack ``apicurio-registry-app:<version>:tar.gz:all`` (a Quarkus fast-jar: quarkus-run.jar)."""
    trino_java_home()  # the same JDK 24+ runs it
    if registry_installed():
        return REGISTRY_HOME
    coordinate = f"io.apicurio:apicurio-registry-app:{REGISTRY_VERSION}:tar.gz:all"
    log(f"fetching {coordinate} with Maven")
    mvn(coordinate, f"{MAVEN_DEPENDENCY_PLUGIN}:get", f"-Dartifact={coordinate}", "-Dtransitive=false")
    archive = (
        CACHE
        / "m2"
        / "io"
        / "apicurio"
        / "apicurio-registry-app"
        / REGISTRY_VERSION
        / f"apicurio-registry-app-{REGISTRY_VERSION}-all.tar.gz"
    )
    tmp = REGISTRY_HOME.with_name(REGISTRY_HOME.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    log(f"unpacking Apicurio Registry {REGISTRY_VERSION} into {REGISTRY_HOME}")
    with tarfile.open(archive) as tar:
        for member in tar:
            if member.isfile():
                _unpack(member.name, tar.extractfile(member), tmp)
    shutil.rmtree(REGISTRY_HOME, ignore_errors=True)
    tmp.rename(REGISTRY_HOME)
    (REGISTRY_HOME / ".stamp").write_text(sha256_text(REGISTRY_VERSION) + "\n")
    return REGISTRY_HOME


def cmd_install(_: argparse.Namespace) -> int:
    if java_major() < 17:
        raise StackError("Java 17+ is required (Kafka 4 brokers need it): run scripts/bootstrap")
    pg_bindir()
    CACHE.mkdir(parents=True, exist_ok=True)
    check_connect_matches_kafka()
    # The Go builds are CPU; everything else here waits on downloads: they run side by side.
    trino_java_home()  # Trino, the registry and Nessie need a JDK 24+: said before any build starts
    builds = GoBuilds()
    builds.start()
    try:
        for module in MAVEN_MODULES:
            maven_fetch(module)
        converter_manifest()
        build_rest_launcher()
        trino_install()
        registry_install()
        azurite_install()
        nessie_install()
        for ms in METASTORES:
            hive_install(ms)
    except BaseException:
        builds.cancel()
        raise
    s3 = builds.result()
    (CACHE / "s3-server").write_text(s3 + "\n")
    log(f"install complete (S3 server: {s3}; cache {CACHE})")
    return 0


class GoBuilds(threading.Thread):
    """The Go-built servers (the GCS emulator, then the S3 server), built in a thread of their own
    while the install downloads the rest. When a download fails the install stops at once: cancel()
    kills the build in progress (its own process group), which the next install does again."""

    def __init__(self) -> None:
        super().__init__(name="go-builds", daemon=True)
        self.s3_server = ""
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            if not go_install(
                "fake-gcs-server", FAKE_GCS_MODULE, FAKE_GCS_VERSION, "fake-gcs-server", required=True
            ):
                raise StackError("fake-gcs-server (the GCS emulator) could not be built: see the log above")
            self.s3_server = install_s3_server()
        except BaseException as exc:  # handed to the main thread by result()
            self.error = exc

    def cancel(self) -> None:
        for proc in list(GO_BUILDS):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)

    def result(self) -> str:
        """The S3 server built, once the builds are done; their failure raised here."""
        self.join()
        if self.error is not None:
            raise self.error
        return self.s3_server


# --------------------------------------------------------------------------------------------------
# services


@dataclass
class Service:
    name: str
    port: int
    marker: str  # substring of the process command line, to recognise our own pid
    start: Callable[[], subprocess.Popen[bytes]]
    health: Callable[[], str]  # returns a short description, raises when unhealthy
    stop_signal: int = signal.SIGTERM
    after_healthy: Callable[[], None] | None = None
    # Why a running server must be restarted to take what its start now writes (None: it need not).
    stale: Callable[[], str | None] | None = None
    proc: subprocess.Popen[bytes] | None = None

    @property
    def log(self) -> Path:
        return LOGS / f"{self.name}.log"

    @property
    def pidfile(self) -> Path:
        return PIDS / f"{self.name}.pid"

    def pid(self) -> int | None:
        """Pid of our running process (None when the pid file is missing, stale or not ours)."""
        try:
            pid = int(self.pidfile.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        if proc_alive(pid) and self.marker in proc_cmdline(pid):
            return pid
        return None

    def check(self) -> tuple[bool, str]:
        try:
            return True, self.health()
        except Exception as exc:  # any failure of a health probe means "not healthy"
            return False, f"{type(exc).__name__}: {exc}".strip()


def spawn(
    svc: Service,
    argv: list[str],
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    user: str | None = None,
) -> subprocess.Popen[bytes]:
    LOGS.mkdir(parents=True, exist_ok=True)
    PIDS.mkdir(parents=True, exist_ok=True)
    with svc.log.open("ab") as out:
        now = dt.datetime.now().isoformat(timespec="seconds")
        out.write(f"\n==== {now} dev/stack up: {shlex.join(argv)}\n".encode())
        out.flush()
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
            start_new_session=True,
            user=user,
            group=user,
        )
    svc.pidfile.write_text(f"{proc.pid}\n")
    return proc


# ---- PostgreSQL


def pg_os_user() -> str | None:
    """initdb/postgres refuse to run as root: then they run as the `postgres` OS user."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        run(["useradd", "--system", "--home-dir", "/var/lib/postgresql", "--shell", "/bin/bash", "postgres"])
    return "postgres"


def pg_home() -> Path:
    """Where the cluster lives: RUN/postgres, unless the postgres OS user cannot reach it (under /root...)."""
    home = RUN / "postgres"
    user = pg_os_user()
    if user is None:
        return home
    home.mkdir(parents=True, exist_ok=True)
    shutil.chown(home, user, user)
    if subprocess.run(["test", "-w", str(home)], user=user).returncode == 0:
        return home
    alt = Path("/var/tmp") / f"icesink-pg-{sha256_text(str(RUN))[:12]}"
    alt.mkdir(parents=True, exist_ok=True)
    shutil.chown(alt, user, user)
    (RUN / "postgres" / "DATA_IS_ELSEWHERE").write_text(f"{alt}\n")
    return alt


def pg_start() -> subprocess.Popen[bytes]:
    home, user, bindir = pg_home(), pg_os_user(), pg_bindir()
    data, sock = home / "data", home / "sock"
    if not (data / "PG_VERSION").exists():
        log(f"initdb {data}")
        shutil.rmtree(data, ignore_errors=True)
        with tempfile.NamedTemporaryFile("w", dir=home, delete=False) as pwfile:
            pwfile.write(CFG.pg_password + "\n")
        if user:
            shutil.chown(pwfile.name, user, user)
        try:
            res = subprocess.run(
                [
                    str(bindir / "initdb"),
                    "-D",
                    str(data),
                    "-U",
                    CFG.pg_user,
                    f"--pwfile={pwfile.name}",
                    "--auth-host=scram-sha-256",
                    "--auth-local=trust",
                    "-E",
                    "UTF8",
                    "--no-locale",
                ],
                capture_output=True,
                text=True,
                user=user,
                group=user,
            )
        finally:
            os.unlink(pwfile.name)
        if res.returncode != 0:
            raise StackError(f"initdb failed:\n{res.stdout}\n{res.stderr}")
    sock.mkdir(exist_ok=True)
    if user:
        shutil.chown(sock, user, user)
    argv = [
        str(bindir / "postgres"),
        "-D",
        str(data),
        "-p",
        str(CFG.pg_port),
        "-c",
        f"listen_addresses={HOST}",
        "-c",
        f"unix_socket_directories={sock}",
        "-c",
        "max_connections=200",
        # Logical decoding for Debezium (pgoutput): one slot and one WAL sender per running connector.
        # A slot that a killed test left behind keeps WAL; max_slot_wal_keep_size bounds what it can keep.
        *("-c", "wal_level=logical"),
        *("-c", "max_replication_slots=20"),
        *("-c", "max_wal_senders=20"),
        *("-c", "max_slot_wal_keep_size=1GB"),
    ]
    return spawn(SERVICES["postgres"], argv, user=user)


def psql(sql: str, db: str = "postgres") -> str:
    bindir = pg_bindir()
    res = subprocess.run(
        [
            str(bindir / "psql"),
            "-h",
            HOST,
            "-p",
            str(CFG.pg_port),
            "-U",
            CFG.pg_user,
            "-d",
            db,
            "-v",
            "ON_ERROR_STOP=1",
            "-Atc",
            sql,
        ],
        capture_output=True,
        text=True,
        timeout=20,
        env={**os.environ, "PGPASSWORD": CFG.pg_password},
    )
    if res.returncode != 0:
        raise StackError(res.stderr.strip() or f"psql exited {res.returncode}")
    return res.stdout.strip()


def pg_health() -> str:
    if not port_open(CFG.pg_port):
        raise StackError(f"nothing listens on {HOST}:{CFG.pg_port}")
    version, wal_level = psql("SELECT version(), current_setting('wal_level')").split("|")
    return f"{version.split(' on ')[0]}, wal_level={wal_level}"


def pg_wal_level_warning() -> None:
    """A cluster started by an older dev/stack runs without logical decoding until it is restarted."""
    wal_level = psql("SHOW wal_level")
    if wal_level != "logical":
        log(
            f"warning: postgres runs with wal_level={wal_level} (started before the stack had a CDC source); "
            "Debezium needs wal_level=logical: `dev/stack restart postgres` applies it"
        )


def pg_create_databases() -> None:
    for db in (CFG.pg_db, CFG.pg_catalog_db, CFG.pg_cdc_db):
        if psql(f"SELECT 1 FROM pg_database WHERE datname = '{db}'") != "1":
            psql(f'CREATE DATABASE "{db}"')
            log(f"created database {db}")


# ---- S3 server


def s3_server() -> str:
    state = RUN / "s3-server"
    if SERVICES["s3"].pid() and state.exists():
        return state.read_text().strip()
    installed = installed_s3_server()
    if not installed:
        raise StackError("no S3 server installed: run dev/stack install")
    return installed


def s3_start() -> subprocess.Popen[bytes]:
    name = s3_server()
    (RUN / "s3-server").parent.mkdir(parents=True, exist_ok=True)
    (RUN / "s3-server").write_text(name + "\n")
    svc = SERVICES["s3"]
    svc.marker = {"minio": "minio", "moto": "moto_server"}[name]
    data = RUN / name
    data.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "AWS_ACCESS_KEY_ID": CFG.s3_access_key, "AWS_SECRET_ACCESS_KEY": CFG.s3_secret_key}
    if name == "minio":
        env.update(
            MINIO_ROOT_USER=CFG.s3_access_key,
            MINIO_ROOT_PASSWORD=CFG.s3_secret_key,
            MINIO_REGION=CFG.region,
            MINIO_BROWSER="off",
            MINIO_UPDATE="off",
            # The scanner (usage totals, lifecycle, healing: nothing the tests use) walks every object
            # about once a minute by default; a dev warehouse reaches tens of thousands of objects
            # after a few suites, and MinIO then burned 4% of a core doing it (0.05% on an empty one).
            # "slowest" scans every 30 minutes.
            MINIO_SCANNER_SPEED="slowest",
        )
        argv = [
            str(CACHE / "bin" / "minio"),
            "server",
            "--quiet",
            "--address",
            f"{HOST}:{CFG.s3_port}",
            "--console-address",
            f"{HOST}:{CFG.s3_console_port}",
            str(data / "data"),
        ]
    else:
        moto = venv_bin("moto_server")
        if not moto:
            raise StackError("moto_server not found (install the dev extras: scripts/bootstrap)")
        argv = [moto, "-H", HOST, "-p", str(CFG.s3_port)]
    return spawn(svc, argv, env=env, cwd=data)


def s3_health() -> str:
    status, body = s3_request("GET", f"/{CFG.bucket}", "list-type=2&max-keys=1")
    if status != 200:
        raise StackError(f"list bucket {CFG.bucket}: HTTP {status} {body[:200]!r}")
    return f"{s3_server()}, bucket {CFG.bucket} listable"


def s3_create_bucket() -> None:
    status, _ = s3_request("HEAD", f"/{CFG.bucket}")
    if status == 200:
        return
    status, body = s3_request("PUT", f"/{CFG.bucket}")
    if status not in (200, 409):
        raise StackError(f"create bucket {CFG.bucket}: HTTP {status} {body[:300]!r}")
    log(f"created bucket {CFG.bucket}")


def s3_ready() -> str:
    """Before the bucket exists any answer of the server counts; the bucket is created right after."""
    status, _ = s3_request("GET", "/")
    if status != 200:
        raise StackError(f"list buckets: HTTP {status}")
    return "answers"


# ---- AWS Glue (moto's server)


def glue_start() -> subprocess.Popen[bytes]:
    """moto's server, for its AWS Glue API only (the tables' files stay on the S3 server): its Data
    Catalog in memory, conditional table updates (VersionId) as AWS's."""
    moto = venv_bin("moto_server")
    if not moto:
        raise StackError("moto_server not found (install the dev extras: scripts/bootstrap)")
    data = RUN / "glue"
    data.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "AWS_ACCESS_KEY_ID": CFG.s3_access_key, "AWS_SECRET_ACCESS_KEY": CFG.s3_secret_key}
    return spawn(SERVICES["glue"], [moto, "-H", HOST, "-p", str(CFG.glue_port)], env=env, cwd=data)


def glue_health() -> str:
    """GetDatabases through the Glue API (JSON 1.1, as the AWS SDKs call it; moto checks no signature)."""
    conn = http.client.HTTPConnection(HOST, CFG.glue_port, timeout=5)
    try:
        conn.request(
            "POST",
            "/",
            body=b"{}",
            headers={
                "Content-Type": "application/x-amz-json-1.1",
                "X-Amz-Target": "AWSGlue.GetDatabases",
                "Authorization": f"AWS4-HMAC-SHA256 Credential={CFG.s3_access_key}/20260101/{CFG.region}/glue/aws4_request, SignedHeaders=host, Signature=0",
            },
        )
        resp = conn.getresponse()
        body = resp.read()
    finally:
        conn.close()
    if resp.status != 200:
        raise StackError(f"GetDatabases: HTTP {resp.status} {body[:200]!r}")
    return f"AWS Glue API (moto), {len(json.loads(body).get('DatabaseList', []))} database(s)"


# ---- Google Cloud Storage (fake-gcs-server)


def gcs_installed() -> bool:
    return (CACHE / "bin" / "fake-gcs-server").exists() and stamp_ok(
        CACHE / "bin" / ".fake-gcs-server.version", FAKE_GCS_VERSION
    )


def gcs_start() -> subprocess.Popen[bytes]:
    """The Cloud Storage JSON API over plain HTTP, objects in files under the run directory. It takes
    any bearer token: clients give one (``gcs.oauth2.token``), as they would a real token."""
    binary = CACHE / "bin" / "fake-gcs-server"
    if not gcs_installed():
        raise StackError("fake-gcs-server is not installed: run dev/stack install")
    data = RUN / "gcs"
    data.mkdir(parents=True, exist_ok=True)
    argv = [
        str(binary),
        "-backend",
        "filesystem",
        "-filesystem-root",
        str(data),
        "-host",
        HOST,
        "-port",
        str(CFG.gcs_port),
        "-scheme",
        "http",
        "-external-url",
        CFG.gcs_endpoint,
        "-public-host",
        f"{HOST}:{CFG.gcs_port}",
        "-log-level",
        "warn",
    ]
    return spawn(SERVICES["gcs"], argv, cwd=data)


def gcs_health() -> str:
    buckets = json.loads(http_get(CFG.gcs_port, "/storage/v1/b?project=icesink")).get("items", [])
    return f"fake-gcs-server {FAKE_GCS_VERSION}, bucket(s): {', '.join(b['name'] for b in buckets) or 'none'}"


def gcs_create_bucket() -> None:
    """The bucket the tests' GCS warehouses live in (its name is the S3 server's: ``warehouse``)."""
    buckets = json.loads(http_get(CFG.gcs_port, "/storage/v1/b?project=icesink")).get("items", [])
    if any(b["name"] == CFG.bucket for b in buckets):
        return
    conn = http.client.HTTPConnection(HOST, CFG.gcs_port, timeout=10)
    try:
        body = json.dumps({"name": CFG.bucket})
        conn.request("POST", "/storage/v1/b?project=icesink", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        answer = resp.read()
    finally:
        conn.close()
    if resp.status not in (200, 409):  # 409: made meanwhile
        raise StackError(f"create bucket {CFG.bucket}: HTTP {resp.status} {answer[:200]!r}")


# ---- Azure Blob Storage / ADLS (Azurite)

AZURITE_HOME = CACHE / "azurite" / AZURITE_VERSION


def azurite_installed() -> bool:
    return stamp_ok(AZURITE_HOME / ".stamp", AZURITE_VERSION)


def azurite_install() -> None:
    """``npm install azurite`` into the cache (its own prefix: nothing global)."""
    if azurite_installed():
        return
    if not shutil.which("npm"):
        raise StackError("npm not found: run scripts/bootstrap (it installs npm for Azurite)")
    log(f"installing Azurite {AZURITE_VERSION} with npm into {AZURITE_HOME}")
    shutil.rmtree(AZURITE_HOME, ignore_errors=True)
    AZURITE_HOME.mkdir(parents=True)
    run(
        [
            "npm",
            "install",
            "--no-audit",
            "--no-fund",
            "--prefix",
            str(AZURITE_HOME),
            f"azurite@{AZURITE_VERSION}",
        ]
    )
    (AZURITE_HOME / ".stamp").write_text(AZURITE_VERSION + "\n")


def azurite_start() -> subprocess.Popen[bytes]:
    """Azurite's Blob service (what pyarrow's AzureFileSystem and Iceberg's ADLSFileIO use), its data
    under the run directory, requests authenticated with the account's shared key."""
    if not azurite_installed():
        raise StackError("Azurite is not installed: run dev/stack install")
    data = RUN / "azurite"
    data.mkdir(parents=True, exist_ok=True)
    argv = [
        str(AZURITE_HOME / "node_modules" / ".bin" / "azurite-blob"),
        "--blobHost",
        HOST,
        "--blobPort",
        str(CFG.azurite_port),
        "--location",
        str(data),
        "--skipApiVersionCheck",
    ]
    return spawn(SERVICES["azurite"], argv, cwd=data)


def azurite_health() -> str:
    """Any answer of the Blob service (an unsigned request is refused, which shows it is serving)."""
    conn = http.client.HTTPConnection(HOST, CFG.azurite_port, timeout=5)
    try:
        conn.request("GET", f"/{CFG.azure_account}?comp=list")
        status = conn.getresponse().status
    finally:
        conn.close()
    if status >= 500:
        raise StackError(f"list containers: HTTP {status}")
    return f"Azurite {AZURITE_VERSION}, account {CFG.azure_account}"


# ---- Kafka


KAFKA_LOG4J = """\
status = warn
appender.out.type = Console
appender.out.name = STDOUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.out.ref = STDOUT
logger.state.name = state.change.logger
logger.state.level = warn
"""


def properties(props: dict[str, str]) -> str:
    """A Java .properties file's text (values as they are: none here needs escaping)."""
    return "".join(f"{k}={v}\n" for k, v in props.items())


def kafka_properties(data: Path) -> str:
    props = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.bootstrap.servers": f"{HOST}:{CFG.kafka_controller_port}",
        "listeners": f"PLAINTEXT://{HOST}:{CFG.kafka_port},CONTROLLER://{HOST}:{CFG.kafka_controller_port}",
        "advertised.listeners": f"PLAINTEXT://{HOST}:{CFG.kafka_port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": str(data),
        "num.partitions": "3",
        "default.replication.factor": "1",
        "min.insync.replicas": "1",
        "auto.create.topics.enable": "true",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "10",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "10",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        "log.retention.hours": "168",
        "log.segment.bytes": str(64 * 1024 * 1024),
    }
    return properties(props)


def kafka_java(main: str, *args: str) -> list[str]:
    home = RUN / "kafka"
    return [
        java_bin(),
        "-Xms128m",
        "-Xmx512m",
        *SERVER_JVM,
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={home / 'log4j2.properties'}",
        "-cp",
        f"{CACHE / 'kafka' / 'libs'}/*",
        main,
        *args,
    ]


def kafka_start() -> subprocess.Popen[bytes]:
    home = RUN / "kafka"
    data = home / "data"
    home.mkdir(parents=True, exist_ok=True)
    (home / "log4j2.properties").write_text(KAFKA_LOG4J)
    props = home / "server.properties"
    props.write_text(kafka_properties(data))
    if not (data / "meta.properties").exists():
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        log(f"formatting Kafka storage {data} (cluster {cluster_id})")
        shutil.rmtree(data, ignore_errors=True)
        res = subprocess.run(
            kafka_java(
                "kafka.tools.StorageTool",
                "format",
                "--standalone",
                f"--cluster-id={cluster_id}",
                "-c",
                str(props),
            ),
            capture_output=True,
            text=True,
        )
        if res.returncode != 0:
            raise StackError(f"Kafka storage format failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    return spawn(SERVICES["kafka"], kafka_java("kafka.Kafka", str(props)), cwd=home)


def kafka_health() -> str:
    return kafka_metadata(CFG.kafka_port)


# ---- Iceberg REST catalog


def rest_start() -> subprocess.Popen[bytes]:
    home = RUN / "rest-catalog"
    home.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": CFG.s3_access_key,
        "AWS_SECRET_ACCESS_KEY": CFG.s3_secret_key,
        "AWS_REGION": CFG.region,
        "CATALOG_CATALOG__IMPL": "org.apache.iceberg.jdbc.JdbcCatalog",
        "CATALOG_URI": f"jdbc:postgresql://{HOST}:{CFG.pg_port}/{CFG.pg_catalog_db}",
        "CATALOG_JDBC_USER": CFG.pg_user,
        "CATALOG_JDBC_PASSWORD": CFG.pg_password,
        "CATALOG_JDBC_SCHEMA__VERSION": "V1",
        "CATALOG_WAREHOUSE": CFG.warehouse,
        "CATALOG_IO__IMPL": "org.apache.iceberg.aws.s3.S3FileIO",
        "CATALOG_S3_ENDPOINT": CFG.s3_endpoint,
        "CATALOG_S3_PATH__STYLE__ACCESS": "true",
        "CATALOG_S3_ACCESS__KEY__ID": CFG.s3_access_key,
        "CATALOG_S3_SECRET__ACCESS__KEY": CFG.s3_secret_key,
        "CATALOG_CLIENT_REGION": CFG.region,
        "CATALOG_REST_HOST": HOST,
        "CATALOG_REST_PORT": str(CFG.rest_port),
    }
    classpath = f"{CACHE / 'rest-catalog' / 'classes'}:{CACHE / 'rest-catalog' / 'libs'}/*"
    argv = [
        java_bin(),
        "-Xms64m",
        "-Xmx512m",
        *SERVER_JVM,
        "-Djava.awt.headless=true",
        "-cp",
        classpath,
        "org.apache.iceberg.rest.LoopbackRESTCatalogServer",
    ]
    return spawn(SERVICES["rest"], argv, env=env, cwd=home)


def http_get(port: int, path: str) -> bytes:
    """The body of a GET on 127.0.0.1:port that must answer 200 (a health probe)."""
    conn = http.client.HTTPConnection(HOST, port, timeout=5)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        body = resp.read()
    finally:
        conn.close()
    if resp.status != 200:
        raise StackError(f"GET {path}: HTTP {resp.status} {body[:200]!r}")
    return body


def rest_health() -> str:
    json.loads(http_get(CFG.rest_port, "/v1/config"))
    return "GET /v1/config ok"


# ---- Kafka Connect (standalone worker) with Debezium's PostgreSQL connector


def connect_properties(home: Path) -> str:
    props = {
        "bootstrap.servers": f"{HOST}:{CFG.kafka_port}",
        "listeners": f"http://{HOST}:{CFG.connect_port}",
        "rest.advertised.host.name": HOST,
        "rest.advertised.port": str(CFG.connect_port),
        # Defaults only: each connector names its own converters (see tests/cdc.py, docs/debezium.md).
        "key.converter": "org.apache.kafka.connect.json.JsonConverter",
        "value.converter": "org.apache.kafka.connect.json.JsonConverter",
        # Standalone mode keeps source offsets in a local file; connectors themselves are registered
        # over REST and are not kept across a restart of the worker.
        "offset.storage.file.filename": str(home / "offsets.dat"),
        "offset.flush.interval.ms": "1000",
        "plugin.path": str(MAVEN_MODULES["debezium-postgres"].parent),
        # Every plugin here ships a ServiceLoader manifest: no scan of every class on the plugin path.
        "plugin.discovery": "service_load",
    }
    return properties(props)


def connect_start() -> subprocess.Popen[bytes]:
    if not (maven_fetched("connect") and maven_fetched("debezium-postgres")):
        raise StackError("Kafka Connect and the Debezium connector are not installed: run dev/stack install")
    home = RUN / "connect"
    home.mkdir(parents=True, exist_ok=True)
    (home / "log4j2.properties").write_text(KAFKA_LOG4J)
    props = home / "worker.properties"
    props.write_text(connect_properties(home))
    argv = [
        java_bin(),
        "-Xms64m",
        "-Xmx512m",
        *SERVER_JVM,
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={home / 'log4j2.properties'}",
        "-cp",
        f"{MAVEN_MODULES['connect']}/*",
        "org.apache.kafka.connect.cli.ConnectStandalone",
        str(props),
    ]
    return spawn(SERVICES["connect"], argv, cwd=home)


def connect_health() -> str:
    body = http_get(CFG.connect_port, "/connector-plugins")
    versions = [p.get("version") for p in json.loads(body) if p.get("class") == DEBEZIUM_POSTGRES]
    if not versions:
        raise StackError(f"GET /connector-plugins does not list {DEBEZIUM_POSTGRES}: {body[:300]!r}")
    return f"Debezium PostgresConnector {versions[0]}"


# ---- Trino (single node: coordinator and worker in one JVM)


def trino_iceberg_catalog() -> dict[str, str]:
    """The Iceberg catalog `iceberg`: the stack's REST catalog, its S3 server through Trino's native S3
    file system (path-style). The keys come from the server's environment, never from a file or the
    command line (docs/trino.md is the recipe)."""
    return {
        "connector.name": "iceberg",
        "iceberg.catalog.type": "rest",
        "iceberg.rest-catalog.uri": CFG.rest_uri,
        "fs.native-s3.enabled": "true",
        "s3.endpoint": CFG.s3_endpoint,
        "s3.region": CFG.region,
        "s3.path-style-access": "true",
        "s3.aws-access-key": "${ENV:AWS_ACCESS_KEY_ID}",
        "s3.aws-secret-key": "${ENV:AWS_SECRET_ACCESS_KEY}",
    }


def trino_config() -> dict[str, str]:
    return {
        "coordinator": "true",
        "node-scheduler.include-coordinator": "true",
        "http-server.http.port": str(CFG.trino_port),
        "discovery.uri": CFG.trino_uri,
        "node.environment": "icesink_dev",
        "node.id": "icesink-dev-trino",
        "node.bind-ip": HOST,
        "node.internal-address": HOST,
        "plugin.dir": str(TRINO_HOME / "plugin"),
        # Tests add catalogs of other types (JDBC, Glue, Nessie) with CREATE CATALOG; their properties
        # name secrets as ${ENV:...}, resolved from the server's environment like the static one's.
        # The file store's folder is set in etc/catalog-store.properties (trino_start).
        "catalog.management": "dynamic",
        "catalog.store": "file",
        "http-server.log.enabled": "false",
        "log.enable-console": "true",  # to stdout, which is the stack's log file for the server
    }


# Trino's recommended JVM flags (its jvm.config) with a heap sized for a laptop's test stack. Not
# SERVER_JVM: Trino's idle threads (its pause meter, its task executor's) spin on timed waits, and under
# C1 alone they cost it more CPU than C2's compilations saved (3.0 against 2.3 CPU-seconds a minute idle).
TRINO_JVM = (
    "-Xms512m",
    "-Xmx2G",
    "-XX:+UseG1GC",
    "-XX:G1HeapRegionSize=32M",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-XX:+ExitOnOutOfMemoryError",
    "-XX:-OmitStackTraceInFastThrow",
    "-XX:ReservedCodeCacheSize=256M",
    "-XX:PerMethodRecompilationCutoff=10000",
    "-XX:PerBytecodeRecompilationCutoff=10000",
    "-Djdk.attach.allowAttachSelf=true",
    "-Djdk.nio.maxCachedBufferSize=2000000",
    "-Dfile.encoding=UTF-8",
    "-XX:+EnableDynamicAgentLoading",
    "--enable-native-access=ALL-UNNAMED",
    "-Djava.awt.headless=true",
)


def trino_start() -> subprocess.Popen[bytes]:
    if not trino_installed():
        raise StackError("Trino is not installed: run dev/stack install")
    home = RUN / "trino"
    catalogs = home / "etc" / "catalog"
    catalogs.mkdir(parents=True, exist_ok=True)
    config = home / "etc" / "config.properties"
    config.write_text(properties(trino_config()))
    for made in catalogs.glob("*.properties"):  # catalogs tests made with CREATE CATALOG: theirs to make
        made.unlink()
    (catalogs / "iceberg.properties").write_text(properties(trino_iceberg_catalog()))
    # Read from the working directory, as Trino's launcher lays it out.
    (home / "etc" / "catalog-store.properties").write_text(properties({"catalog.config-dir": str(catalogs)}))
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": CFG.s3_access_key,
        "AWS_SECRET_ACCESS_KEY": CFG.s3_secret_key,
        "ICESINK_PG_PASSWORD": CFG.pg_password,  # a JDBC catalog's, in CREATE CATALOG as ${ENV:...}
        "JAVA_HOME": str(trino_java_home()),
    }
    argv = [
        str(trino_java_home() / "bin" / "java"),
        *TRINO_JVM,
        f"-Dconfig={config}",
        "-cp",
        f"{TRINO_HOME / 'lib'}/*",
        "io.trino.server.TrinoServer",
    ]
    return spawn(SERVICES["trino"], argv, env=env, cwd=home)


def trino_stale() -> str | None:
    """A Trino started with another configuration than trino_start writes now (one started before its
    catalogs became dynamic would refuse the catalog tests' CREATE CATALOG)."""
    config = RUN / "trino" / "etc" / "config.properties"
    if config.exists() and config.read_text() == properties(trino_config()):
        return None
    return f"its configuration changed ({config})"


def trino_health() -> str:
    info = json.loads(http_get(CFG.trino_port, "/v1/info"))
    if info.get("starting", True):
        raise StackError("GET /v1/info: still starting")
    return f"Trino {info.get('nodeVersion', {}).get('version', '?')}, GET /v1/info ok"


def registry_start() -> subprocess.Popen[bytes]:
    """In-memory storage (its default, H2 in memory): schemas live as long as the process, which suits
    tests; a restart forgets them (the tests register what they produce with)."""
    if not registry_installed():
        raise StackError("the schema registry is not installed: run dev/stack install")
    java_home = trino_java_home()
    argv = [
        str(java_home / "bin" / "java"),
        "-Xms64m",
        "-Xmx384m",
        *SERVER_JVM,
        f"-Dquarkus.http.host={HOST}",
        f"-Dquarkus.http.port={CFG.registry_port}",
        f"-Dquarkus.management.host={HOST}",
        f"-Dquarkus.management.port={CFG.registry_management_port}",
        "-Dquarkus.log.console.format=%d{HH:mm:ss} %-5p [%c{2.}] %s%e%n",
        "-jar",
        str(REGISTRY_HOME / "quarkus-run.jar"),
    ]
    return spawn(
        SERVICES["registry"], argv, env={**os.environ, "JAVA_HOME": str(java_home)}, cwd=REGISTRY_HOME
    )


def registry_health() -> str:
    subjects = json.loads(http_get(CFG.registry_port, "/apis/ccompat/v7/subjects"))
    return f"Apicurio Registry {REGISTRY_VERSION}, {len(subjects)} subject(s)"


# ---- a Spark standalone cluster: a master and two 1-core workers (pyspark's own distribution)

SPARK_WORKERS = 2
SPARK_WORKER_CORES = 1
SPARK_WORKER_MEMORY = "1g"  # what the executors of one worker may take together


def spark_home() -> Path:
    """pyspark's directory in the venv: its jars are a Spark distribution's (master, worker, executor)."""
    found = sorted((REPO / ".venv" / "lib").glob("python3*/site-packages/pyspark/jars"))
    if not found:
        raise StackError("pyspark is not installed in .venv: run scripts/bootstrap")
    return found[-1].parent


def spark_scala_version() -> str:
    """The Scala version Spark is built for, from its spark-core jar's name (spark-core_2.13-4.1.3.jar)."""
    for jar in (spark_home() / "jars").glob("spark-core_*.jar"):
        return jar.name.split("_", 1)[1].split("-", 1)[0]
    raise StackError(f"no spark-core jar in {spark_home() / 'jars'}")


def spark_daemon(main: str, *args: str, options: tuple[str, ...] = ()) -> list[str]:
    """A Spark daemon's command line: java straight on pyspark's jars (the distribution's `spark-class`
    only builds this same command)."""
    home = spark_home()
    return [
        java_bin(),
        "-Xms64m",
        "-Xmx256m",
        *SERVER_JVM,
        *options,
        "-cp",
        f"{home / 'conf'}:{home / 'jars'}/*",
        main,
        *args,
    ]


def spark_environment(work: Path) -> dict[str, str]:
    """A bare environment, as a cluster node has: nothing of the developer's shell (no venv, no
    credentials, no PYSPARK_PYTHON), so what only the driver has shows up as a failure in the tests."""
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(work),
        "JAVA_HOME": str(java_home()),
        "SPARK_HOME": str(spark_home()),
        # what a worker's launcher of executors needs to find the jars (spark-class sets it too)
        "SPARK_SCALA_VERSION": spark_scala_version(),
        "SPARK_LOCAL_DIRS": str(work / "local"),
        "SPARK_LOG_DIR": str(work),
    }


def spark_master_start() -> subprocess.Popen[bytes]:
    work = RUN / "spark-master"
    work.mkdir(parents=True, exist_ok=True)
    argv = spark_daemon(
        "org.apache.spark.deploy.master.Master",
        "--host",
        HOST,
        "--port",
        str(CFG.spark_master_port),
        "--webui-port",
        str(CFG.spark_master_ui_port),
    )
    return spawn(SERVICES["spark-master"], argv, env=spark_environment(work), cwd=work)


def spark_cluster_state() -> dict[str, object]:
    state: dict[str, object] = json.loads(http_get(CFG.spark_master_ui_port, "/json/"))
    return state


def spark_master_health() -> str:
    state = spark_cluster_state()
    if state.get("status") != "ALIVE":
        raise StackError(f"master status {state.get('status')}")
    return f"Spark master {CFG.spark_master}, {state.get('aliveworkers', 0)} worker(s) alive"


def spark_worker(n: int) -> tuple[int, int, Path]:
    """Worker ``n`` (1-based): its RPC port, web UI port and work directory."""
    return CFG.spark_worker_port + n - 1, CFG.spark_worker_ui_port + n - 1, RUN / f"spark-worker-{n}"


def spark_worker_start(n: int) -> subprocess.Popen[bytes]:
    port, ui_port, work = spark_worker(n)
    (work / "local").mkdir(parents=True, exist_ok=True)
    argv = spark_daemon(
        "org.apache.spark.deploy.worker.Worker",
        "--host",
        HOST,
        "--port",
        str(port),
        "--webui-port",
        str(ui_port),
        "--cores",
        str(SPARK_WORKER_CORES),
        "--memory",
        SPARK_WORKER_MEMORY,
        "--work-dir",
        str(work / "apps"),
        CFG.spark_master,
        # Each executor fetches its own copy of the application's jars into its directory: the
        # directories of finished applications go after ten minutes.
        options=(
            "-Dspark.worker.cleanup.enabled=true",
            "-Dspark.worker.cleanup.interval=120",
            "-Dspark.worker.cleanup.appDataTtl=600",
        ),
    )
    return spawn(SERVICES[f"spark-worker-{n}"], argv, env=spark_environment(work), cwd=work)


def spark_worker_health(n: int) -> str:
    port = spark_worker(n)[0]
    workers = spark_cluster_state().get("workers")
    for worker in workers if isinstance(workers, list) else []:
        if worker.get("port") == port and worker.get("state") == "ALIVE":
            return f"{worker.get('cores')} core(s), {worker.get('memory')} MB, registered with {CFG.spark_master}"
    raise StackError(f"no alive worker on port {port} at the master")


SERVICES: dict[str, Service] = {
    "postgres": Service(
        "postgres",
        CFG.pg_port,
        "postgres",
        pg_start,
        pg_health,
        signal.SIGINT,
        after_healthy=pg_create_databases,
    ),
    "s3": Service("s3", CFG.s3_port, "minio", s3_start, s3_health, after_healthy=s3_create_bucket),
    "kafka": Service("kafka", CFG.kafka_port, "kafka.Kafka", kafka_start, kafka_health),
    "rest": Service("rest", CFG.rest_port, "LoopbackRESTCatalogServer", rest_start, rest_health),
    "connect": Service("connect", CFG.connect_port, "ConnectStandalone", connect_start, connect_health),
    "trino": Service(
        "trino", CFG.trino_port, "io.trino.server.TrinoServer", trino_start, trino_health, stale=trino_stale
    ),
    "registry": Service("registry", CFG.registry_port, "quarkus-run.jar", registry_start, registry_health),
    "glue": Service("glue", CFG.glue_port, f"-p {CFG.glue_port}", glue_start, glue_health),
    "gcs": Service(
        "gcs", CFG.gcs_port, "fake-gcs-server", gcs_start, gcs_health, after_healthy=gcs_create_bucket
    ),
    "azurite": Service("azurite", CFG.azurite_port, "azurite-blob", azurite_start, azurite_health),
    "nessie": Service("nessie", CFG.nessie_port, "nessie-quarkus", nessie_start, nessie_health),
    **{
        ms.service: Service(
            ms.service,
            ms.port,
            ms.marker,
            functools.partial(hive_start, ms),
            functools.partial(hive_health, ms),
            stale=functools.partial(hive_stale, ms),
        )
        for ms in METASTORES
    },
    "spark-master": Service(
        "spark-master", CFG.spark_master_port, "deploy.master.Master", spark_master_start, spark_master_health
    ),
    **{
        f"spark-worker-{n}": Service(
            f"spark-worker-{n}",
            spark_worker(n)[0],
            f"--port {spark_worker(n)[0]} ",
            lambda n=n: spark_worker_start(n),  # type: ignore[misc]
            lambda n=n: spark_worker_health(n),  # type: ignore[misc]
        )
        for n in range(1, SPARK_WORKERS + 1)
    },
}

SPARK_WORKER_NAMES = [f"spark-worker-{n}" for n in range(1, SPARK_WORKERS + 1)]


def _sync_s3_marker() -> None:
    state = RUN / "s3-server"
    name = state.read_text().strip() if state.exists() else installed_s3_server()
    if name:
        SERVICES["s3"].marker = {"minio": "minio", "moto": "moto_server"}[name]


# --------------------------------------------------------------------------------------------------
# commands


def ensure_started(svc: Service) -> None:
    if svc.pid():
        why = svc.stale() if svc.stale else None
        if why is None:
            return
        log(f"restarting {svc.name}: {why}")
        stop(svc)
    if port_open(svc.port):
        raise StackError(
            f"{svc.name}: port {HOST}:{svc.port} is taken by a process dev/stack did not start "
            f"(another checkout's stack? stop it there, or override the port)"
        )
    log(f"starting {svc.name} (log {svc.log})")
    svc.proc = svc.start()


def wait_healthy(svc: Service, timeout: float, probe: Callable[[], str] | None = None) -> str:
    deadline = time.monotonic() + timeout
    while True:
        if svc.proc is not None and svc.proc.poll() is not None:
            raise StackError(f"{svc.name} exited with code {svc.proc.returncode} while starting")
        try:
            return (probe or svc.health)()
        except Exception as exc:
            if time.monotonic() > deadline:
                raise StackError(f"{svc.name} not healthy after {timeout:.0f}s: {exc}") from exc
        time.sleep(0.5)


def fail(svc: Service, err: Exception) -> int:
    print(f"dev/stack up: {svc.name} FAILED: {err}", file=sys.stderr)
    print(f"dev/stack up: {svc.name} log: {svc.log}\n---- last lines of {svc.log} ----", file=sys.stderr)
    print(tail(svc.log), file=sys.stderr)
    return 1


def installed() -> bool:
    return (
        (CACHE / "s3-server").exists()
        and all(maven_fetched(module) for module in MAVEN_MODULES)
        and trino_installed()
        and registry_installed()
        and gcs_installed()
        and azurite_installed()
        and nessie_installed()
        and all(hive_installed(ms) for ms in METASTORES)
        and (MAVEN_MODULES["apicurio-converter"] / "icesink-converter-manifest.jar").exists()
    )


def cmd_up(_: argparse.Namespace) -> int:
    if not installed():
        cmd_install(argparse.Namespace())
    _sync_s3_marker()
    timeout = float(_env_int("ICESINK_STACK_TIMEOUT", 180))
    started = time.monotonic()
    # Start the independent servers together, then wait for each; the REST catalog needs Postgres and S3.
    order = ["postgres", "s3", "kafka", "spark-master"]
    for name in order:
        try:
            ensure_started(SERVICES[name])
        except Exception as exc:
            return fail(SERVICES[name], exc)
    for name in order:
        svc = SERVICES[name]
        try:
            if name == "s3":
                wait_healthy(svc, timeout, s3_ready)
            else:
                wait_healthy(svc, timeout)
            if svc.after_healthy:
                svc.after_healthy()
            wait_healthy(svc, timeout)
        except Exception as exc:
            return fail(svc, exc)
    pg_wal_level_warning()
    # Then the servers that need those: the REST catalog (Postgres, S3), Kafka Connect (Kafka) and Trino
    # (its catalog is the REST catalog; it connects to it at the first query, so it starts alongside), and
    # Spark's workers (the master).
    later = [
        "rest",
        "connect",
        "trino",
        "registry",
        "glue",
        "gcs",
        "azurite",
        "nessie",
        "hive",
        "hive3",
        *SPARK_WORKER_NAMES,
    ]
    for name in later:
        try:
            ensure_started(SERVICES[name])
        except Exception as exc:
            return fail(SERVICES[name], exc)
    for name in later:
        try:
            wait_healthy(SERVICES[name], timeout)
            if SERVICES[name].after_healthy:
                SERVICES[name].after_healthy()  # type: ignore[misc]
        except Exception as exc:
            return fail(SERVICES[name], exc)
    log(f"stack healthy in {time.monotonic() - started:.1f}s")
    return cmd_status(argparse.Namespace())


def cmd_status(_: argparse.Namespace) -> int:
    _sync_s3_marker()
    all_ok = True
    for svc in SERVICES.values():
        ok, detail = svc.check()
        pid = svc.pid()
        all_ok &= ok
        label = f"s3 ({s3_server_name_or_unknown()})" if svc.name == "s3" else svc.name
        print(
            f"{label:<16} {'healthy' if ok else 'DOWN':<8} pid {pid or '-':<8} {HOST}:{svc.port:<6} "
            f"log {svc.log}  [{detail}]"
        )
    return 0 if all_ok else 1


def s3_server_name_or_unknown() -> str:
    try:
        return s3_server()
    except StackError:
        return "not installed"


def stop(svc: Service, timeout: float = 30.0) -> None:
    pid = svc.pid()
    if pid is None:
        if svc.pidfile.exists():
            svc.pidfile.unlink()
        return
    log(f"stopping {svc.name} (pid {pid})")
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, svc.stop_signal)
    deadline = time.monotonic() + timeout
    while group_members(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    leftovers = group_members(pid)
    if leftovers:
        log(f"{svc.name} did not stop within {timeout:.0f}s: SIGKILL {leftovers}")
        for member in leftovers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(member, signal.SIGKILL)
        while group_members(pid):
            time.sleep(0.1)
    svc.pidfile.unlink(missing_ok=True)


def cmd_down(_: argparse.Namespace) -> int:
    _sync_s3_marker()
    # The servers that need others first; then every other one, so that none is ever left running.
    first = (
        *SPARK_WORKER_NAMES,
        "spark-master",
        "hive3",
        "hive",
        "nessie",
        "azurite",
        "gcs",
        "glue",
        "registry",
        "trino",
        "connect",
        "rest",
        "kafka",
    )
    last = ("s3", "postgres")
    rest = [name for name in SERVICES if name not in first and name not in last]
    for name in (*first, *rest, *last):
        stop(SERVICES[name])
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    _sync_s3_marker()
    for name in args.servers:
        stop(SERVICES[name])
    return 0


def cmd_start(args: argparse.Namespace) -> int:
    _sync_s3_marker()
    timeout = float(_env_int("ICESINK_STACK_TIMEOUT", 180))
    for name in args.servers:
        svc = SERVICES[name]
        try:
            ensure_started(svc)
            wait_healthy(svc, timeout, s3_ready if name == "s3" else None)
            if svc.after_healthy:
                svc.after_healthy()
            wait_healthy(svc, timeout)
        except Exception as exc:
            return fail(svc, exc)
        log(f"{name} healthy")
    return 0


def cmd_restart(args: argparse.Namespace) -> int:
    cmd_stop(args)
    return cmd_start(args)


def cmd_env(_: argparse.Namespace) -> int:
    _sync_s3_marker()
    jars = spark_jars()
    if not jars:
        log("warning: Spark jars not fetched yet (run dev/stack install)")
    values = {
        "ICESINK_KAFKA_BOOTSTRAP": f"{HOST}:{CFG.kafka_port}",
        "ICESINK_PG_DSN": CFG.pg_dsn(CFG.pg_db),
        "ICESINK_REST_URI": CFG.rest_uri,
        "ICESINK_CONNECT_URI": CFG.connect_uri,
        "ICESINK_TRINO_URI": CFG.trino_uri,
        "ICESINK_SCHEMA_REGISTRY_URL": CFG.registry_uri,
        "ICESINK_GLUE_ENDPOINT": CFG.glue_endpoint,
        "ICESINK_GCS_ENDPOINT": CFG.gcs_endpoint,
        "ICESINK_AZURITE_AUTHORITY": f"{HOST}:{CFG.azurite_port}",
        "ICESINK_NESSIE_URI": f"http://{HOST}:{CFG.nessie_port}/iceberg",
        "ICESINK_HIVE_URI": f"thrift://{HOST}:{CFG.hive_port}",
        "ICESINK_HIVE3_URI": f"thrift://{HOST}:{CFG.hive3_port}",
        "ICESINK_AZURE_ACCOUNT": CFG.azure_account,
        "ICESINK_AZURE_ACCOUNT_KEY": CFG.azure_key,
        "ICESINK_SPARK_MASTER": CFG.spark_master,
        "ICESINK_SPARK_MASTER_UI": f"http://{HOST}:{CFG.spark_master_ui_port}",
        "ICESINK_CDC_DSN": CFG.pg_dsn(CFG.pg_cdc_db),
        "ICESINK_S3_ENDPOINT": CFG.s3_endpoint,
        "ICESINK_WAREHOUSE": CFG.warehouse,
        "AWS_ACCESS_KEY_ID": CFG.s3_access_key,
        "AWS_SECRET_ACCESS_KEY": CFG.s3_secret_key,
        "AWS_REGION": CFG.region,
        "AWS_DEFAULT_REGION": CFG.region,
        "ICESINK_SPARK_JARS": ",".join(str(j) for j in jars),
        "ICESINK_S3_SERVER": s3_server_name_or_unknown(),
        "JAVA_HOME": str(java_home()),
    }
    for name, value in values.items():
        print(f"export {name}={shlex.quote(value)}")
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    """Each server's state and the end of its log, so that a failed CI run shows what the servers said."""
    for svc in SERVICES.values():
        if not svc.log.exists():
            continue
        ok, detail = svc.check()
        print(f"==== {svc.name}: {'healthy' if ok else 'DOWN'}, pid {svc.pid() or '-'} [{detail}]; {svc.log}")
        with svc.log.open("rb") as f:
            f.seek(max(0, svc.log.stat().st_size - 200 * args.lines))
            tail = f.read().decode("utf-8", "replace").splitlines()[-args.lines :]
        print("\n".join(tail))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="dev/stack", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name, func in (
        ("install", cmd_install),
        ("up", cmd_up),
        ("status", cmd_status),
        ("down", cmd_down),
        ("env", cmd_env),
    ):
        sub.add_parser(name).set_defaults(func=func)
    logs = sub.add_parser("logs", help="the last lines of every server's log")
    logs.add_argument("-n", "--lines", type=int, default=30)
    logs.set_defaults(func=cmd_logs)
    for name, handler, text in (
        ("stop", cmd_stop, "stop these servers (only processes dev/stack started)"),
        ("start", cmd_start, "start these servers and wait until they are healthy"),
        ("restart", cmd_restart, "stop, then start these servers"),
    ):
        one = sub.add_parser(name, help=text)
        one.add_argument("servers", nargs="+", choices=list(SERVICES), metavar="SERVER")
        one.set_defaults(func=handler)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except StackError as exc:
        print(f"dev/stack {args.command}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
