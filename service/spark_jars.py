"""The jars the sink's Spark job needs: the Kafka source and what it depends on.

They come from the first of these that is set:

1. jar files: ``spark.jars`` in the sink's configuration, else ``$ICESINK_SPARK_JARS`` (the image sets it);
2. Spark's own ``spark.jars`` or ``spark.jars.packages`` in ``spark.conf``: used as given;
3. Maven coordinates, as in any pip-installed PySpark application: Spark resolves the Kafka source
   ``org.apache.spark:spark-sql-kafka-0-10_<scala>:<spark>`` of the installed pyspark's Spark and Scala
   versions with its dependencies (``spark.jars.packages``) through Ivy, into ``spark.jars.ivy``
   (Spark's default ``~/.ivy2.5.2``), downloading only what that cache lacks.

In the third case one dependency is not left to Ivy. The Kafka source depends on
``spark-token-provider-kafka-0-10`` of its own version, which Maven Central lacks for some Spark
releases (4.1.3, the pinned one, among them), and a dependency Ivy can't find fails the whole
resolution. Ivy is told to leave it out (``spark.jars.excludes``) and the 4.0.0 jar, the one the image
ships (the classes the Kafka source uses are unchanged since), is fetched once into the same Ivy
directory, checked against the SHA-1 the repository publishes beside it, and given as ``spark.jars``.

A missing jar must stop start-up with a clear message before the sink is claimed, not later as a Java
stack trace: :func:`check_files` looks at jar files before Spark starts, :func:`check_session` loads
the classes through the running session's class loader (the only way to see what Ivy resolved).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from service.config import SparkConfig
from service.retrying import Backoff, log_failure, retry_call

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

logger = logging.getLogger(__name__)

JARS_ENV = "ICESINK_SPARK_JARS"
MAVEN_CENTRAL = "https://repo1.maven.org/maven2"
DEFAULT_IVY_HOME = Path("~/.ivy2.5.2")  # Spark 4's default for spark.jars.ivy
TOKEN_PROVIDER_VERSION = "4.0.0"  # the same jar as deploy/docker/spark-jars.txt
POSTGRES_JDBC = "org.postgresql:postgresql:42.7.7"  # the same jar as deploy/docker/spark-jars.txt
# The Azure SDK for ADLSFileIO: Maven Central has no 1.11.0 of this bundle (ADLSFileIO is in the runtime).
ICEBERG_AZURE_BUNDLE = "org.apache.iceberg:iceberg-azure-bundle:1.10.0"

# The classes the Kafka source needs, each with the artifact that holds it.
REQUIRED_CLASSES: tuple[tuple[str, str], ...] = (
    ("org.apache.spark.sql.kafka010.KafkaSourceProvider", "spark-sql-kafka-0-10"),
    ("org.apache.spark.kafka010.KafkaConfigUpdater", "spark-token-provider-kafka-0-10"),
    ("org.apache.kafka.clients.consumer.KafkaConsumer", "kafka-clients"),
    ("org.apache.commons.pool2.impl.GenericKeyedObjectPool", "commons-pool2"),
)

# What `icesink maintain` adds: Iceberg's Spark runtime (SparkCatalog and the maintenance procedures)
# and its AWS bundle (S3FileIO). The version is the one dev/maven/spark/pom.xml and the image ship.
ICEBERG_VERSION = "1.11.0"
ICEBERG_CLASSES: tuple[tuple[str, str], ...] = (
    ("org.apache.iceberg.spark.SparkCatalog", "iceberg-spark-runtime"),
    ("org.apache.iceberg.aws.s3.S3FileIO", "iceberg-aws-bundle"),
)


class SparkJarsError(RuntimeError):
    """The Spark jars can't be found, fetched or resolved, or lack a class the sink needs."""


@dataclass(frozen=True)
class SparkJars:
    """Where the jars come from and the Spark settings that say so."""

    origin: str  # the setting that named them, for messages
    conf: dict[str, str]  # settings for the session builder (spark.conf is applied after them)
    files: tuple[str, ...] = ()  # jar files or URIs given to Spark as spark.jars (or its class path)
    packages: tuple[str, ...] = ()  # Maven coordinates Spark resolves through Ivy
    ivy_home: Path | None = None
    classes: tuple[tuple[str, str], ...] = REQUIRED_CLASSES  # (class, artifact) the session must load
    on_class_path: bool = False  # the files are on the driver's class path, not spark.jars

    @property
    def local_only(self) -> bool:
        """Whether the jars are all local files, so :func:`check_files` can see every class without Spark."""
        return bool(self.files) and not self.packages and all(_local_path(f) is not None for f in self.files)

    def describe(self) -> str:
        parts = []
        if self.packages:
            ivy = f" (Ivy: {self.ivy_home})" if self.ivy_home else ""
            parts.append(f"spark.jars.packages {','.join(self.packages)}{ivy}")
        if self.files:
            setting = "spark.driver.extraClassPath" if self.on_class_path else "spark.jars"
            parts.append(f"{setting} {','.join(self.files)}")
        return f"{self.origin}: " + "; ".join(parts) if parts else f"{self.origin}: none"


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def spark_version() -> str:
    import pyspark

    return pyspark.__version__


def scala_version() -> str:
    """The Scala binary version pyspark's Spark is built for, read from its spark-core jar's name."""
    import pyspark

    home = os.environ.get("SPARK_HOME") or str(Path(pyspark.__file__).parent)
    jars = Path(home) / "jars"
    for jar in sorted(jars.glob("spark-core_*.jar")):
        if match := re.fullmatch(r"spark-core_(\d+\.\d+)-.+\.jar", jar.name):
            return match[1]
    raise SparkJarsError(f"no spark-core jar in {jars}: can't tell which Scala version Spark is built for")


def kafka_source_coordinates() -> tuple[str, str]:
    """The Kafka source for the installed pyspark, and its token provider's module (group:artifact)."""
    scala = scala_version()
    return (
        f"org.apache.spark:spark-sql-kafka-0-10_{scala}:{spark_version()}",
        f"org.apache.spark:spark-token-provider-kafka-0-10_{scala}",
    )


def ivy_home(spark: SparkConfig) -> Path:
    return Path(spark.conf.get("spark.jars.ivy") or DEFAULT_IVY_HOME).expanduser().absolute()


def iceberg_coordinates() -> tuple[str, ...]:
    """Iceberg's Spark runtime for the installed pyspark's Spark and Scala versions, its AWS, GCP and
    Azure bundles (S3FileIO, GCSFileIO, ADLSFileIO), and the Postgres JDBC driver (a SQL catalog on Postgres is Iceberg's JdbcCatalog in Spark)."""
    spark_minor = ".".join(spark_version().split(".")[:2])
    return (
        f"org.apache.iceberg:iceberg-spark-runtime-{spark_minor}_{scala_version()}:{ICEBERG_VERSION}",
        f"org.apache.iceberg:iceberg-aws-bundle:{ICEBERG_VERSION}",
        f"org.apache.iceberg:iceberg-gcp-bundle:{ICEBERG_VERSION}",
        ICEBERG_AZURE_BUNDLE,
        POSTGRES_JDBC,
    )


def resolve(
    spark: SparkConfig, environ: Mapping[str, str] = os.environ, *, iceberg: bool = False, local: bool = False
) -> SparkJars:
    """The jars for this configuration (see the module's docstring); fetches the token provider if needed.

    ``spark.conf`` is applied last by the session builder, so its ``spark.jars`` wins over the others.
    ``iceberg`` (``icesink maintain``): the jars must also hold Iceberg's Spark runtime and AWS bundle;
    resolved from Maven coordinates, they are added to the packages.

    ``local`` (a ``local[...]`` master): jar files named by ``spark.jars`` or ``$ICESINK_SPARK_JARS``
    go on the driver's class path (``spark.driver.extraClassPath``), where the JVM reads them in place.
    Given as ``spark.jars``, Spark would copy every one into the process's scratch (``spark-*/userFiles-*``,
    116 MB for the image's jars) at each start, a copy a killed process leaves behind.
    """
    classes = REQUIRED_CLASSES + (ICEBERG_CLASSES if iceberg else ())
    packages = tuple(_split(spark.conf.get("spark.jars.packages", "")))
    named = [
        (origin, files)
        for origin, files in (
            ("spark.conf", _split(spark.conf.get("spark.jars", ""))),
            ("spark.jars", list(spark.jars)),
            (JARS_ENV, _split(environ.get(JARS_ENV, ""))),
        )
        if files
    ]
    if named or packages:
        origin, files = named[0] if named else ("spark.conf", [])
        if packages and origin != "spark.conf":
            origin += " and spark.conf"
        on_class_path = (
            local
            and bool(files)
            and origin != "spark.conf"
            and not packages  # Ivy's jars go to Spark's own loader, which must see these too
            and "spark.driver.extraClassPath" not in spark.conf
            and all(_local_path(f) is not None for f in files)
        )
        if on_class_path:
            conf = {"spark.driver.extraClassPath": os.pathsep.join(str(_local_path(f)) for f in files)}
        else:
            conf = {"spark.jars": ",".join(files)} if files else {}
        return SparkJars(
            origin,
            conf,
            files=tuple(files),
            packages=packages,
            ivy_home=ivy_home(spark) if packages else None,
            classes=classes,
            on_class_path=on_class_path,
        )
    kafka_source, token_provider = kafka_source_coordinates()
    home = ivy_home(spark)
    repositories = [*_split(spark.conf.get("spark.jars.repositories", "")), MAVEN_CENTRAL]
    token_jar = fetch_jar(f"{token_provider}:{TOKEN_PROVIDER_VERSION}", repositories, home / "jars")
    all_packages = (kafka_source, *(iceberg_coordinates() if iceberg else ()))
    return SparkJars(
        f"Maven coordinates (spark.jars and {JARS_ENV} are unset)",
        {
            "spark.jars.packages": ",".join(all_packages),
            "spark.jars.excludes": token_provider,
            "spark.jars": str(token_jar),
        },
        files=(str(token_jar),),
        packages=all_packages,
        ivy_home=home,
        classes=classes,
    )


def fetch_jar(coordinate: str, repositories: list[str], directory: Path) -> Path:
    """The jar of ``group:artifact:version``, downloaded into ``directory`` unless it is there already.

    Named as Spark names the jars it resolves (``<group>_<artifact>-<version>.jar``); checked against
    the ``.sha1`` file beside it in the repository, as Ivy checks what it downloads.
    """
    group, artifact, version = coordinate.split(":")
    target = directory / f"{group}_{artifact}-{version}.jar"
    if target.is_file():
        return target
    path = f"{group.replace('.', '/')}/{artifact}/{version}/{artifact}-{version}.jar"
    problems = []
    for repository in repositories:
        url = f"{repository.rstrip('/')}/{path}"
        try:
            data = _download(url)
            want = _download(url + ".sha1").decode().split()[0].lower()
        except urllib.error.HTTPError as exc:
            problems.append(f"{url}: HTTP {exc.code}")
            continue
        except OSError as exc:
            problems.append(f"{url}: {exc}")
            continue
        if hashlib.sha1(data).hexdigest() != want:
            problems.append(f"{url}: SHA-1 {hashlib.sha1(data).hexdigest()} is not the published {want}")
            continue
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, suffix=".part", delete=False) as out:
            out.write(data)
        os.replace(out.name, target)  # another sink starting at once writes the same bytes
        logger.info("fetched %s from %s into %s", coordinate, repository, target)
        return target
    raise SparkJarsError(f"can't fetch the jar {coordinate}: " + "; ".join(problems))


def _download(url: str) -> bytes:
    """One GET, tried again after a network error (not after an HTTP answer such as 404)."""

    def get() -> bytes:
        with urllib.request.urlopen(url, timeout=60) as response:
            data: bytes = response.read()
            return data

    return retry_call(
        get,
        Backoff(attempts=3, initial_s=1.0, max_s=5.0),
        retry_on=lambda exc: isinstance(exc, OSError) and not isinstance(exc, urllib.error.HTTPError),
        on_failure=log_failure(logger, f"downloading {url}", 3),
    )


def _local_path(entry: str) -> Path | None:
    """The local file of a spark.jars entry, or None for one Spark fetches itself (hdfs://, https://, ...)."""
    parsed = urllib.parse.urlparse(entry)
    if parsed.scheme == "file":
        return Path(urllib.request.url2pathname(parsed.path))
    return Path(entry) if not parsed.scheme else None


def check_files(jars: SparkJars) -> str:
    """Before Spark starts: every local jar file exists, and (with no packages and no remote jars to
    add more) together they hold every class the Kafka source needs."""
    local = {entry: _local_path(entry) for entry in jars.files}
    missing = [entry for entry, path in local.items() if path is not None and not path.is_file()]
    if missing:
        raise SparkJarsError(f"{jars.origin}: no such jar file: {', '.join(missing)}")
    if not jars.local_only:
        return jars.describe()
    sizes: dict[str, tuple[int, Path]] = {}
    not_zip = []
    for entry, path in local.items():
        if path is None:
            continue
        try:
            with path.open("rb") as file:  # the zip's end record only
                if not zipfile.is_zipfile(file):
                    not_zip.append(entry)
            sizes[entry] = (path.stat().st_size, path)
        except OSError as exc:
            raise SparkJarsError(f"{jars.origin}: {entry} is not a jar: {exc}") from None
    if not_zip:
        raise SparkJarsError(f"{jars.origin}: not a jar (no zip directory): {', '.join(not_zip)}")
    # The classes are looked for in the smallest jars first, until all are found: a jar's whole listing
    # costs ~6 µs an entry, and the catalog and cloud bundles hold 10,000-30,000 entries each, none of
    # the Kafka source's classes.
    wanted = {_class_file(cls) for cls, _ in jars.classes}
    for entry, (_, path) in sorted(sizes.items(), key=lambda item: item[1][0]):
        if not wanted:
            break
        try:
            with zipfile.ZipFile(path) as jar:
                wanted.difference_update(jar.namelist())
        except (zipfile.BadZipFile, OSError) as exc:
            raise SparkJarsError(f"{jars.origin}: {entry} is not a jar: {exc}") from None
    absent = [(cls, artifact) for cls, artifact in jars.classes if _class_file(cls) in wanted]
    if absent:
        raise SparkJarsError(_lacking(jars, absent))
    return jars.describe()


def check_session(spark: SparkSession, jars: SparkJars) -> None:
    """In the running session: every class the Kafka source needs loads through Spark's class loader."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    loader = jvm.org.apache.spark.util.Utils.getContextOrSparkClassLoader()
    absent = []
    for cls, artifact in jars.classes:
        try:
            jvm.java.lang.Class.forName(cls, False, loader)
        except Exception:  # py4j's error for the JVM's ClassNotFoundException
            absent.append((cls, artifact))
    if absent:
        raise SparkJarsError(_lacking(jars, absent))


def _class_file(cls: str) -> str:
    return cls.replace(".", "/") + ".class"


def _lacking(jars: SparkJars, absent: list[tuple[str, str]]) -> str:
    named = ", ".join(f"{artifact} ({cls})" for cls, artifact in absent)
    return f"the Spark jars lack {named}; they are {jars.describe()}"
