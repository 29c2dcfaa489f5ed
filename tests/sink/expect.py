"""What a reader must see, checked through both reference readers."""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any, Protocol, cast

from confluent_kafka import Consumer, Message
from pyiceberg.catalog import Catalog
from pyspark.sql import SparkSession
from sqlalchemy import create_engine, delete, update

from readers import duckdb_rows, pyiceberg_rows, spark_rows, trino_rows
from service.sample import Change
from txnlog import SinkState
from txnlog.dsn import parse_dsn
from txnlog.schema import tables


def _key(row: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(sorted((k, str(v)) for k, v in row.items()))


def diff(expected: list[dict[str, Any]], actual: list[dict[str, Any]], reader: str) -> str:
    want, got = Counter(map(_key, expected)), Counter(map(_key, actual))
    missing, extra = want - got, got - want
    if not missing and not extra:
        return ""
    return (
        f"{reader}: {sum(missing.values())} row(s) missing, {sum(extra.values())} unexpected "
        f"(of {len(expected)} expected, {len(actual)} read)\n"
        f"  missing e.g. {list(missing)[:2]}\n  unexpected e.g. {list(extra)[:2]}"
    )


def assert_rows(
    spark: SparkSession, table: str, expected: list[dict[str, Any]], every_reader: bool = False
) -> None:
    """The table read by Spark (Iceberg runtime) and by DuckDB equals ``expected`` exactly; with
    ``every_reader`` (a table without equality deletes) through Trino and pyiceberg too."""
    problems = [
        diff(expected, spark_rows(spark, table), "spark"),
        diff(expected, duckdb_rows(table), "duckdb"),
    ]
    if every_reader:
        problems.append(diff(expected, trino_rows(table), "trino"))
        problems.append(diff(expected, pyiceberg_rows(table), "pyiceberg"))
    problems = [p for p in problems if p]
    assert not problems, "\n".join(problems)


def appended_rows(history: list[Change]) -> list[dict[str, Any]]:
    """Append mode: every insert and update once, deletes ignored."""
    return [c.row for c in history if c.op != "d" and c.row is not None]


def sink_snapshots(catalog: Catalog, table: str, sink_id: str) -> list[dict[str, str]]:
    """Summaries of the sink's snapshots along the main branch, oldest first."""
    t = catalog.load_table(table)
    chain = []
    snapshot = t.current_snapshot()
    while snapshot is not None:
        chain.append(snapshot)
        snapshot = (
            t.metadata.snapshot_by_id(snapshot.parent_snapshot_id) if snapshot.parent_snapshot_id else None
        )
    summaries = [
        dict(s.summary.additional_properties) if s.summary is not None else {} for s in reversed(chain)
    ]
    return [s for s in summaries if s.get("icesink.sink-id") == sink_id]


def assert_seqs_increasing(catalog: Catalog, table: str, sink_id: str) -> list[int]:
    seqs = [int(s["icesink.seq"]) for s in sink_snapshots(catalog, table, sink_id)]
    assert seqs, f"no snapshot of sink {sink_id} in {table}"
    assert len(seqs) == len(set(seqs)), f"duplicate icesink.seq in {table}: {seqs}"
    assert seqs == sorted(seqs), f"icesink.seq not increasing along the history of {table}: {seqs}"
    return seqs


def send_txnlog_back(dsn: str, schema: str, sink_id: str, to: SinkState | None) -> None:
    """Make the sink's txnlog row what it was at ``to`` (a backup restored, a standby promoted), or
    delete it (``to=None``), behind the log's back: the history is left as it is."""
    sinks = tables(schema).sinks
    engine = create_engine(parse_dsn(dsn))
    try:
        with engine.begin() as conn:
            if to is None:
                conn.execute(delete(sinks).where(sinks.c.sink_id == sink_id))
                return
            columns = {c.name for c in sinks.c} - {"sink_id", "claim_token"}
            conn.execute(
                update(sinks).where(sinks.c.sink_id == sink_id).values(**{c: getattr(to, c) for c in columns})
            )
    finally:
        engine.dispose()


Headers = list[tuple[str, bytes]]  # a consumed record's headers (see Record)


class Record(Protocol):
    """A consumed Kafka record, as the tests read it. confluent_kafka's stubs type ``headers()`` as what a
    producer accepts (a dict, or pairs of str, bytes or None); a consumer's record has a list of pairs, or
    None, and the values of icesink's headers are bytes (service/kafka/dead_letter.py ``_header``)."""

    def key(self) -> bytes | None: ...

    def value(self) -> bytes | None: ...

    def headers(self) -> Headers | None: ...


def topic_records(bootstrap: str, topic: str, expected: int) -> list[Record]:
    """Every record of ``topic``: at least ``expected`` are awaited, then a further poll collects any
    beyond them, so a duplicate or an extra record shows in the count."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"t-{uuid.uuid4()}", "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([topic])
    messages: list[Message] = []
    try:
        for _ in range(30):
            messages += [m for m in consumer.consume(100, timeout=1) if m.error() is None]
            if len(messages) >= expected:
                messages += [m for m in consumer.consume(100, timeout=2) if m.error() is None]
                break
    finally:
        consumer.close()
    return cast(list[Record], messages)
