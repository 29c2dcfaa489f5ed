"""Shared fixtures: the local dev stack (real servers, see dev/stack) and clients for it.

The endpoints come from the environment (the names `dev/stack env` prints); when they are not set the
output of `dev/stack env` is loaded into os.environ, so code under test sees the same values. A server
that is not healthy fails the session loudly: these tests are never skipped for a missing stack.
Sub-folders add their own fixtures in their own conftest.py files.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import hmac
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlencode

import pytest

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # makes `readers` importable from any test module
    sys.path.insert(0, str(REPO))

if TYPE_CHECKING:
    from pyiceberg.catalog.rest import RestCatalog
    from pyspark.sql import SparkSession

    from tests.cluster import SparkCluster
    from tests.google_oauth import GoogleTokenService


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--record-durations",
        metavar="PATH",
        help="merge each test's seconds into the JSON at PATH (tests/durations.json orders the xdist workers' work)",
    )


def pytest_configure(config: pytest.Config) -> None:
    from tests.scheduling import DurationRecorder

    if path := config.getoption("--record-durations"):
        config.pluginmanager.register(DurationRecorder(Path(path)), "icesink-durations")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from tests.scheduling import heaviest_first

    if getattr(config, "workerinput", None) is not None:  # an xdist worker: the scheduler's order
        heaviest_first(items)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """``--dist loadfile`` refined: the heaviest units first (tests/scheduling.py)."""
    from tests.scheduling import make_scheduler

    return make_scheduler(config, log) if config.option.dist == "loadfile" else None


STACK_VARS = (
    "ICESINK_KAFKA_BOOTSTRAP",
    "ICESINK_PG_DSN",
    "ICESINK_REST_URI",
    "ICESINK_S3_ENDPOINT",
    "ICESINK_WAREHOUSE",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_REGION",
    "ICESINK_SPARK_JARS",
    "ICESINK_S3_SERVER",
    "ICESINK_SCHEMA_REGISTRY_URL",
)


@dataclass(frozen=True)
class Stack:
    kafka_bootstrap: str
    pg_dsn: str
    rest_uri: str
    s3_endpoint: str
    warehouse: str
    access_key: str
    secret_key: str
    region: str
    spark_jars: tuple[str, ...]
    s3_server: str
    schema_registry_url: str  # the registry's Confluent-compatible API

    def pyiceberg_properties(self) -> dict[str, str]:
        """Properties of a pyiceberg RestCatalog on this stack (S3 path-style is pyiceberg's default
        with an explicit endpoint; s3.force-virtual-addressing stays false)."""
        return {
            "type": "rest",
            "uri": self.rest_uri,
            "s3.endpoint": self.s3_endpoint,
            "s3.access-key-id": self.access_key,
            "s3.secret-access-key": self.secret_key,
            "s3.region": self.region,
            "s3.force-virtual-addressing": "false",
        }


def load_stack_env(names: tuple[str, ...] = STACK_VARS) -> dict[str, str]:
    """The stack's variables; missing ones are taken from `dev/stack env` and exported into os.environ."""
    if any(not os.environ.get(name) for name in names):
        res = subprocess.run([str(REPO / "dev" / "stack"), "env"], capture_output=True, text=True, timeout=60)
        if res.returncode != 0:
            pytest.fail(f"`dev/stack env` failed ({res.returncode}):\n{res.stderr}", pytrace=False)
        for line in res.stdout.splitlines():
            match = re.fullmatch(r"export ([A-Z0-9_]+)=(.*)", line.strip())
            if match:
                os.environ.setdefault(match[1], shlex.split(match[2])[0] if match[2] else "")
    missing = [name for name in names if not os.environ.get(name)]
    if missing:
        pytest.fail(f"stack variables not set: {', '.join(missing)} (run `dev/stack install`)", pytrace=False)
    return {name: os.environ[name] for name in names}


def _check_health(stack: Stack) -> list[str]:
    problems = []
    host, _, port = stack.kafka_bootstrap.rpartition(":")
    try:
        from confluent_kafka.admin import AdminClient

        socket.create_connection((host, int(port)), timeout=3).close()
        AdminClient({"bootstrap.servers": stack.kafka_bootstrap}).list_topics(timeout=10)
    except Exception as exc:
        problems.append(f"Kafka at {stack.kafka_bootstrap}: {exc}")
    try:
        import sqlalchemy as sa

        engine = sa.create_engine(stack.pg_dsn)
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
        engine.dispose()
    except Exception as exc:
        problems.append(f"Postgres at {stack.pg_dsn}: {exc}")
    try:
        with urllib.request.urlopen(f"{stack.rest_uri}/v1/config", timeout=5) as resp:
            resp.read()
    except Exception as exc:
        problems.append(f"REST catalog at {stack.rest_uri}: {exc}")
    try:
        import boto3

        s3 = boto3.client(
            "s3",
            endpoint_url=stack.s3_endpoint,
            aws_access_key_id=stack.access_key,
            aws_secret_access_key=stack.secret_key,
            region_name=stack.region,
        )
        s3.head_bucket(Bucket=stack.warehouse.removeprefix("s3://").strip("/").split("/")[0])
    except Exception as exc:
        problems.append(f"S3 ({stack.s3_server}) at {stack.s3_endpoint}: {exc}")
    return problems


@pytest.fixture(scope="session")
def stack() -> Stack:
    env = load_stack_env()
    # Local servers only: never send loopback requests through a proxy from the environment.
    os.environ["NO_PROXY"] = os.environ["no_proxy"] = "127.0.0.1,localhost"
    # The GCS emulator's bearer token (any: it checks none), named in catalogs as
    # ${ICESINK_TEST_GCS_TOKEN}. Set once for the session, not by each test: a change of the pytest
    # process's environment starts the sink host again (tests/sink/host.py), when a test sets the
    # variable and again when it is unset.
    os.environ.setdefault("ICESINK_TEST_GCS_TOKEN", "emulator-token")
    result = Stack(
        kafka_bootstrap=env["ICESINK_KAFKA_BOOTSTRAP"],
        pg_dsn=env["ICESINK_PG_DSN"],
        rest_uri=env["ICESINK_REST_URI"].rstrip("/"),
        s3_endpoint=env["ICESINK_S3_ENDPOINT"],
        warehouse=env["ICESINK_WAREHOUSE"],
        access_key=env["AWS_ACCESS_KEY_ID"],
        secret_key=env["AWS_SECRET_ACCESS_KEY"],
        region=env["AWS_REGION"],
        spark_jars=tuple(j for j in env["ICESINK_SPARK_JARS"].split(",") if j),
        s3_server=env["ICESINK_S3_SERVER"],
        schema_registry_url=env["ICESINK_SCHEMA_REGISTRY_URL"].rstrip("/"),
    )
    problems = _check_health(result)
    if problems:
        pytest.fail(
            "the dev stack is not healthy (start it with `dev/stack up`; logs in .cache/run/logs):\n  "
            + "\n  ".join(problems),
            pytrace=False,
        )
    return result


@pytest.fixture(scope="session")
def kafka_bootstrap(stack: Stack) -> str:
    return stack.kafka_bootstrap


@pytest.fixture(scope="session")
def pg_dsn(stack: Stack) -> str:
    return stack.pg_dsn


@pytest.fixture(scope="session")
def rest_catalog(stack: Stack) -> RestCatalog:
    from pyiceberg.catalog import load_catalog
    from pyiceberg.catalog.rest import RestCatalog

    catalog = load_catalog("rest", **stack.pyiceberg_properties())
    assert isinstance(catalog, RestCatalog)
    return catalog


@pytest.fixture(scope="session")
def trino(stack: Stack) -> str:
    """The stack's Trino server (its URI), a third reader of the tables; fails loudly when it is down.
    Only the tests that read through Trino ask for it, so the other tests run without it."""
    uri = load_stack_env(("ICESINK_TRINO_URI",))["ICESINK_TRINO_URI"].rstrip("/")
    try:
        with urllib.request.urlopen(f"{uri}/v1/info", timeout=5) as resp:
            info = json.load(resp)
        assert not info.get("starting", True), "still starting"
    except Exception as exc:
        pytest.fail(
            f"Trino at {uri} is not healthy ({exc}): `dev/stack up` (or `dev/stack start trino`) starts it; "
            "log in .cache/run/logs/trino.log",
            pytrace=False,
        )
    return uri


def _answering(server: str, what: str, address: str, probe: Callable[[], object]) -> None:
    """Fail the test with the way out when the stack's ``server`` does not answer ``probe``."""
    try:
        probe()
    except Exception as exc:
        pytest.fail(
            f"{what} at {address} does not answer ({exc}): `dev/stack up` (or `dev/stack start {server}`); "
            f"log in .cache/run/logs/{server}.log",
            pytrace=False,
        )


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return bytes(resp.read())


@pytest.fixture(scope="session")
def glue(stack: Stack) -> str:
    """The stack's AWS Glue API (moto's server; its endpoint), for catalogs of type glue."""
    endpoint = load_stack_env(("ICESINK_GLUE_ENDPOINT",))["ICESINK_GLUE_ENDPOINT"].rstrip("/")

    def databases() -> object:
        import boto3

        return boto3.client("glue", endpoint_url=endpoint, region_name=stack.region).get_databases()

    _answering("glue", "the Glue API", endpoint, databases)
    return endpoint


@pytest.fixture(scope="session")
def gcs(stack: Stack) -> str:
    """The stack's Google Cloud Storage emulator (fake-gcs-server; its endpoint), its bucket ``warehouse``."""
    endpoint = load_stack_env(("ICESINK_GCS_ENDPOINT",))["ICESINK_GCS_ENDPOINT"].rstrip("/")
    _answering("gcs", "the GCS emulator", endpoint, lambda: _get(f"{endpoint}/storage/v1/b/warehouse"))
    return endpoint


@pytest.fixture(scope="session")
def gcs_service_account(gcs: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GoogleTokenService]:
    """A service account's JSON key (``key_file``) for clients that authenticate to the GCS emulator
    with one, its ``token_uri`` at a stand-in for Google's token service, which is also the account's
    metadata server (``metadata_host``; tests/google_oauth.py)."""
    from tests.google_oauth import GoogleTokenService

    service = GoogleTokenService()
    token_uri = service.start()
    service.write_key(tmp_path_factory.mktemp("gcs-key") / "service-account.json", token_uri)
    yield service
    service.stop()


@pytest.fixture(scope="session")
def nessie(stack: Stack) -> str:
    """The stack's Nessie server: its Iceberg REST API's URI (the warehouse on the S3 server)."""
    uri = load_stack_env(("ICESINK_NESSIE_URI",))["ICESINK_NESSIE_URI"].rstrip("/")
    _answering("nessie", "Nessie", uri, lambda: _get(f"{uri}/v1/config"))
    return uri


def _metastore(server: str, variable: str, label: str) -> str:
    """The Thrift URI (``variable``) of the stack's Hive metastore ``server``, once it lists databases."""
    uri = load_stack_env((variable,))[variable]

    def databases() -> object:
        from pyiceberg.catalog.hive import HiveCatalog

        return HiveCatalog("probe", uri=uri).list_namespaces()

    _answering(server, label, uri, databases)
    return uri


@pytest.fixture(scope="session")
def hive(stack: Stack) -> str:
    """The stack's Hive metastore 4.0.0: its Thrift URI (its database on the stack's Postgres, a
    namespace's default location under ``s3://warehouse/hive``)."""
    return _metastore("hive", "ICESINK_HIVE_URI", "the Hive metastore")


@pytest.fixture(scope="session")
def hive3(stack: Stack) -> str:
    """The stack's Hive metastore 3.1.3: its Thrift URI (a namespace's default location under
    ``s3://warehouse/hive3``)."""
    return _metastore("hive3", "ICESINK_HIVE3_URI", "the Hive 3 metastore")


@pytest.fixture(scope="session")
def azurite(stack: Stack) -> dict[str, str]:
    """The stack's Azure Blob Storage emulator (Azurite) as pyiceberg's ADLS properties, its container
    ``warehouse`` made; the account key named as an environment variable (``${ICESINK_AZURE_ACCOUNT_KEY}``)."""
    env = load_stack_env(("ICESINK_AZURITE_AUTHORITY", "ICESINK_AZURE_ACCOUNT", "ICESINK_AZURE_ACCOUNT_KEY"))
    os.environ.setdefault("ICESINK_AZURE_ACCOUNT_KEY", env["ICESINK_AZURE_ACCOUNT_KEY"])
    props = {
        "adls.account-name": env["ICESINK_AZURE_ACCOUNT"],
        "adls.account-key": "${ICESINK_AZURE_ACCOUNT_KEY}",
        "adls.blob-storage-authority": env["ICESINK_AZURITE_AUTHORITY"],
        "adls.blob-storage-scheme": "http",
        "adls.dfs-storage-authority": env["ICESINK_AZURITE_AUTHORITY"],
        "adls.dfs-storage-scheme": "http",
    }

    def container() -> object:
        from pyarrow.fs import AzureFileSystem, FileType

        fs = AzureFileSystem(
            account_name=env["ICESINK_AZURE_ACCOUNT"],
            account_key=env["ICESINK_AZURE_ACCOUNT_KEY"],
            blob_storage_authority=env["ICESINK_AZURITE_AUTHORITY"],
            blob_storage_scheme="http",
            dfs_storage_authority=env["ICESINK_AZURITE_AUTHORITY"],
            dfs_storage_scheme="http",
        )
        if fs.get_file_info("warehouse").type is FileType.NotFound:
            fs.create_dir("warehouse")
        return None

    _answering("azurite", "Azurite", env["ICESINK_AZURITE_AUTHORITY"], container)
    return props


def azure_account_sas(account: str, key: str, *, hours: float = 12) -> str:
    """An account SAS token for ``account``'s Blob service (which its Data Lake endpoint shares), every
    resource type, read/add/create/write/delete/list, over HTTP too (the emulator's scheme), signed with
    the base64 account ``key`` as Azure's "Create an account SAS" describes for version 2021-08-06.
    Without a leading ``?``, as `az storage account generate-sas` prints it."""
    expiry = datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=hours)
    fields = {
        "sv": "2021-08-06",
        "ss": "b",
        "srt": "sco",
        "sp": "racwdl",
        "se": expiry.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "spr": "https,http",
    }
    # account, permissions, services, resource types, start, expiry, IP range, protocols, version,
    # encryption scope: each followed by a newline
    signed = [account, fields["sp"], fields["ss"], fields["srt"], "", fields["se"], "", fields["spr"]]
    to_sign = "\n".join([*signed, fields["sv"], ""]) + "\n"
    digest = hmac.new(base64.b64decode(key), to_sign.encode(), hashlib.sha256).digest()
    return urlencode({**fields, "sig": base64.b64encode(digest).decode()})


@pytest.fixture(scope="session")
def azurite_sas(azurite: dict[str, str]) -> dict[str, str]:
    """:func:`azurite` authenticated by an account SAS token instead of the account key, the token named
    as an environment variable of the tests' own (``${ICESINK_TEST_AZURE_SAS_TOKEN}``)."""
    key = os.environ["ICESINK_AZURE_ACCOUNT_KEY"]  # set by azurite
    os.environ["ICESINK_TEST_AZURE_SAS_TOKEN"] = azure_account_sas(azurite["adls.account-name"], key)
    props = {k: v for k, v in azurite.items() if k != "adls.account-key"}
    return {**props, "adls.sas-token": "${ICESINK_TEST_AZURE_SAS_TOKEN}"}


@pytest.fixture(scope="session")
def spark_cluster(stack: Stack) -> SparkCluster:
    """The stack's Spark standalone cluster (a master, two 1-core workers); fails loudly unless both
    workers are alive."""
    from tests.cluster import WORKERS, cluster_from_environment

    load_stack_env(("ICESINK_SPARK_MASTER", "ICESINK_SPARK_MASTER_UI"))
    cluster = cluster_from_environment()
    try:
        alive = len(cluster.alive_workers())
    except Exception as exc:
        pytest.fail(
            f"the Spark master at {cluster.ui} does not answer ({exc}): `dev/stack up`", pytrace=False
        )
    if alive < WORKERS:
        pytest.fail(
            f"the Spark master at {cluster.ui} has {alive} alive worker(s), not {WORKERS}: `dev/stack up` "
            "(logs .cache/run/logs/spark-*.log)",
            pytrace=False,
        )
    return cluster


@pytest.fixture(scope="session", autouse=True)
def spark_local_dirs(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Spark's scratch directories (``spark-*``, each with a copy of the jars, ~116 MB) under pytest's
    own temporary directory, for this process and every sink it starts: a sink killed by a test never
    removes its own, and pytest keeps only its last few runs' directories."""
    if not os.environ.get("SPARK_LOCAL_DIRS"):
        os.environ["SPARK_LOCAL_DIRS"] = str(tmp_path_factory.mktemp("spark"))


@pytest.fixture(scope="session")
def spark_classes(stack: Stack) -> Path | None:
    """The archive of Spark's classes the tests' drivers start from (tests/spark_jvm.py), written by
    the first worker that needs it."""
    from tests.spark_jvm import ensure_archive

    return ensure_archive()


@pytest.fixture(scope="session")
def spark(stack: Stack, spark_classes: Path | None) -> Iterator[SparkSession]:
    from pyspark.sql import SparkSession

    from readers import spark_conf as reader_spark_conf
    from tests.spark_jvm import driver_java_options

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.master("local[2]").appName("icesink-tests")
    conf = {**reader_spark_conf(), "spark.driver.extraJavaOptions": driver_java_options()}
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    yield session
    session.stop()


@pytest.fixture
def unique_name(request: pytest.FixtureRequest) -> Callable[[str], str]:
    """`unique_name("orders")` -> "orders_<test>_<random>": a lowercase identifier safe as an Iceberg
    namespace/table or a Kafka topic, different in every call and every test run."""

    test = re.sub(r"[^a-z0-9]+", "_", request.node.name.lower()).strip("_")[:30]

    def make(prefix: str) -> str:
        return f"{prefix}_{test}_{uuid.uuid4().hex[:8]}"

    return make
