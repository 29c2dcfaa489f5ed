"""``icesink check``: one line per check, stopping at the first problem with what to fix.

Each check that reaches a server has a time limit (``--timeout``): the clients behind them retry for
long when nothing answers, or when they find no credentials (pyarrow's GCS client asks a metadata
server that is not there for 15 minutes), and a check is run to learn that quickly.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from service.config import SinkConfig


def _kafka(config: SinkConfig) -> str:
    from service.kafka.lookups import partitions

    parts = partitions(config.kafka)
    return ", ".join(f"{t} ({len(p)} partitions)" for t, p in parts.items())


def _txnlog(config: SinkConfig) -> str:
    from service.txnlog_client import open_txnlog

    log = open_txnlog(config, "check")
    try:
        version = log.ensure_schema()
        state = log.state(config.sink_id)
    finally:
        log.close()
    where = "new sink" if state is None else f"epoch {state.epoch}, phase {state.phase}"
    return f"schema version {version}, {where}"


def _offsets(config: SinkConfig) -> str:
    from service.ops.offsets_reset import describe

    return describe(config)


def _catalog(config: SinkConfig) -> str:
    from pyiceberg.exceptions import NoSuchTableError

    from service.iceberg.tables import check_writable, check_write_properties, open_catalog

    catalog = open_catalog(config)
    if config.table.is_template:
        catalog.list_namespaces()
        return f"reachable; tables named {config.table.identifier} are created on first sight"
    try:
        table = catalog.load_table(config.table.identifier)
        check_writable(table, config.table.identifier)
    except NoSuchTableError:
        if not config.table.create:
            raise RuntimeError(
                f"table {config.table.identifier} does not exist and table.create is false"
            ) from None
        catalog.list_namespaces()
        return f"reachable; table {config.table.identifier} will be created"
    check_write_properties(table, config.write.table_properties())
    return f"table {config.table.identifier} (format v{table.metadata.format_version}) at {table.location()}"


class ObjectStoreCheck:
    """Write and delete a small object where the table's files go; :meth:`hint` says why the store
    may not have answered, from the location the probe was for."""

    def __init__(self) -> None:
        self.location = ""

    def run(self, config: SinkConfig) -> str:
        import uuid

        from pyiceberg.exceptions import NoSuchTableError

        from service.iceberg.tables import open_catalog

        catalog = open_catalog(config)
        try:
            if config.table.is_template:  # the tables are named by the topics they come from
                raise NoSuchTableError(config.table.identifier)
            table = catalog.load_table(config.table.identifier)
            io, location = table.io, table.location()
        except NoSuchTableError:
            from pyiceberg.io import load_file_io

            from service.model.object_store import with_object_store_io

            location = config.catalog.get("warehouse", "")
            if not location or ("://" not in location and not location.startswith("/")):
                return "skipped: table not created yet and no warehouse location configured"
            io = load_file_io(with_object_store_io(config.catalog_properties), location)
        self.location = location
        probe = f"{location.rstrip('/')}/.icesink-check-{uuid.uuid4().hex}"
        with io.new_output(probe).create() as out:
            out.write(b"ok")
        io.delete(probe)
        return f"wrote and deleted {probe}"

    def hint(self, config: SinkConfig) -> str:
        location = self.location or str(config.catalog.get("warehouse", ""))
        if location.startswith("gs://") and not config.catalog_properties.get("gcs.oauth2.token"):
            return (
                "; with no gcs.oauth2.token, GCS credentials come from GOOGLE_APPLICATION_CREDENTIALS, "
                "gcloud's application-default login or the metadata server (GCE_METADATA_ROOT), and "
                "pyarrow's client waits up to 15 minutes for one of them"
            )
        return ""


def _spark_jars(config: SinkConfig) -> str:
    """The check ``icesink run`` makes before it claims the sink: jar files are looked into without
    Spark; packages can only be resolved by Spark, so then a local session is started and stopped."""
    from service import spark_jars
    from service.spark_session import build_spark

    jars = spark_jars.resolve(config.spark)
    detail = spark_jars.check_files(jars)
    if not jars.local_only:
        build_spark(config, master="local[1]").stop()
        detail += " (resolved, classes loaded)"
    return detail


def _spark_master(config: SinkConfig) -> str:
    from service.spark_session import check_master

    return check_master(config.spark.master)


@dataclass(frozen=True)
class Check:
    name: str
    run: Callable[[SinkConfig], str]
    bounded: bool = True  # False: takes as long as it needs (downloading jars)
    hint: Callable[[SinkConfig], str] = lambda config: ""


def checks() -> list[Check]:
    store = ObjectStoreCheck()
    return [
        Check("configuration", lambda c: f"sink {c.sink_id} → {c.table.identifier} ({c.table.mode.value})"),
        Check("spark jars", _spark_jars, bounded=False),
        Check("spark master", _spark_master),
        Check("kafka", _kafka),
        Check("txnlog (postgres)", _txnlog),
        Check("committed offsets", _offsets),
        Check("catalog", _catalog),
        Check("object store", store.run, hint=store.hint),
    ]


class NoAnswer(Exception):
    pass


def _within(seconds: float, check: Check, config: SinkConfig) -> str:
    """``check`` run in a thread of its own for at most ``seconds``. A check that has not returned by
    then is left running (the thread is a daemon: the process does not wait for it at exit)."""
    results: list[str] = []
    errors: list[BaseException] = []

    def attempt() -> None:
        try:
            results.append(check.run(config))
        except BaseException as exc:  # handed to the caller's thread
            errors.append(exc)

    worker = threading.Thread(target=attempt, name=f"check {check.name}", daemon=True)
    worker.start()
    worker.join(seconds if check.bounded else None)
    if errors:
        raise errors[0]
    if results:
        return results[0]
    raise NoAnswer(f"no answer within {seconds:g} s{check.hint(config)}")


class Outcome(Enum):
    PASSED = "passed"
    FAILED = "failed"
    # A check did not answer in time and was left running: the process must not wait for it at exit
    # (pyarrow's S3 finalizer, run at exit, waits for the calls in flight, for minutes).
    ABANDONED = "abandoned"


def run_checks(config: SinkConfig, timeout_s: float) -> Outcome:
    for check in checks():
        try:
            detail = _within(timeout_s, check, config)
        except Exception as exc:  # every failure becomes one readable line
            print(f"FAIL {check.name}: {type(exc).__name__}: {exc}", flush=True)
            return Outcome.ABANDONED if isinstance(exc, NoAnswer) else Outcome.FAILED
        print(f"ok   {check.name}: {detail}", flush=True)
    return Outcome.PASSED
