"""Avro in the Confluent wire format, produced from Python against the stack's schema registry: what
Debezium's own connector does not easily produce (bad payloads, a schema change at a chosen point).

The real connector's Avro is landed in tests/sink/test_debezium.py (``avro-precise``) and SIGKILLed
mid-commit in tests/chaos/test_chaos_debezium.py; a registry outage is tests/chaos/test_chaos_avro.py.
"""

from __future__ import annotations

import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest

from readers import duckdb_rows, spark_rows
from service.sample import SampleSource
from tests.cdc import differences
from tests.sink.avro_stream import AccountsStream
from tests.sink.conftest import Sink, open_cdc
from tests.sink.expect import topic_records


def assert_avro_rows(spark: Any, identifier: str, expected: list[dict[str, Any]]) -> None:
    problems = differences(expected, spark_rows(spark, identifier), "id", "spark")
    problems += differences(expected, duckdb_rows(identifier), "id", "duckdb")
    assert not problems, "\n".join(problems[:40])


def test_bad_avro_records_are_dead_letters_with_their_reason(
    make_sink: Callable[..., Sink], stack: Any, spark: Any
) -> None:
    """Among good records: a value without the magic byte, a schema id the registry does not know, a
    payload cut short, one with a byte left over, and a balance too wide for numeric(10,2). Each is a
    dead letter naming its fault; every good record lands."""
    sink = make_sink(
        source={"format": "debezium-avro", "schema_registry": {"url": stack.schema_registry_url}},
        partitions=1,
    )
    stream = AccountsStream(stack.schema_registry_url, sink.topic)
    good = [*stream.upsert(1, "ann", Decimal("10.50")), *stream.upsert(2, "bob", Decimal("-3.25"))]
    valid = stream._event("c", None, {"id": 9, "name": "x", "balance": Decimal("1.00")})
    unknown = b"\x00" + struct.pack(">I", 987_654) + valid[5:]
    too_wide = {"id": 8, "name": "wide", "balance": Decimal("123456789.00")}  # 11 digits
    bad = [
        (stream.key_of(5), b'{"op":"c","after":{"id":5}}'),
        (stream.key_of(6), unknown),
        (stream.key_of(7), valid[:-3]),
        (stream.key_of(9), valid + b"\x00"),
        (stream.key_of(8), stream._event("c", None, too_wide)),
    ]
    later = [*stream.upsert(3, "cy", None), *stream.upsert(1, "ann", Decimal("11.00")), *stream.delete(2)]
    sink.send([*good, *bad, *later])  # type: ignore[list-item]
    run = sink.run_until_caught_up()
    assert_avro_rows(spark, sink.table, stream.expected())

    letters = topic_records(stack.kafka_bootstrap, f"{sink.name}.dlq", len(bad))
    by_offset = {}
    for letter in letters:
        headers = {k: v.decode() for k, v in letter.headers() or [] if v is not None}
        by_offset[int(headers["icesink.source.offset"])] = headers["icesink.error"]
    assert sorted(by_offset) == [2, 3, 4, 5, 6], by_offset
    assert "not in the Confluent wire format" in by_offset[2], by_offset
    assert "schema id 987654 is not in the registry" in by_offset[3], by_offset
    assert "does not match schema id" in by_offset[4], by_offset
    assert "1 bytes left after the record" in by_offset[5], by_offset
    assert "column balance: a decimal out of range for decimal(10, 2)" in by_offset[6], by_offset
    assert "avro decoder" in run.log(), run.log()[-3000:]


def test_a_column_added_at_the_source_evolves_the_table(
    make_sink: Callable[..., Sink], stack: Any, spark: Any
) -> None:
    """A new writer schema id mid-stream (the source table gained ``tier``): the table gains the column,
    older rows read null in it, and each record is decoded with its own schema, in one batch or two."""
    sink = make_sink(
        source={"format": "debezium-avro", "schema_registry": {"url": stack.schema_registry_url}},
        partitions=1,
    )
    stream = AccountsStream(stack.schema_registry_url, sink.topic)
    sink.send([*stream.upsert(1, "ann", Decimal("1.00")), *stream.upsert(2, "bob", Decimal("2.00"))])  # type: ignore[list-item]
    sink.run_until_caught_up()
    assert_avro_rows(spark, sink.table, stream.expected())

    stream.evolve()
    records = [
        *stream.upsert(3, "cy", Decimal("3.00"), tier=2),
        *stream.upsert(1, "ann", Decimal("1.50"), tier=1),
    ]
    sink.send(records)  # type: ignore[arg-type]
    run = sink.run_until_caught_up()
    assert "evolved for the batch's new schema versions" in run.log(), run.log()[-3000:]
    assert_avro_rows(spark, sink.table, stream.expected())
    assert any(row["tier"] is None for row in stream.expected())


@pytest.mark.slow  # the demo's producer and routing; the Avro decoding is the other tests'
def test_the_demo_producer_in_avro_lands_table_by_table(
    make_sink: Callable[..., Sink], stack: Any, spark: Any, unique_name: Callable[[str], str]
) -> None:
    """The compose demo with ICESINK_DEMO_FORMAT=avro, on the stack: `python -m service.sample --format
    avro` writes two tables' streams, one sink of a topic pattern routes each by its Avro envelope's
    source.table into a table of its own, and each table is the sample model's rows."""
    prefix = unique_name("demo")
    ns = unique_name("ns")
    sink = make_sink(
        kafka={"topics": None, "topic_pattern": f"{prefix}\\..*"},
        table={"identifier": f"{ns}.{{source.table}}", "key": []},
        source={"format": "debezium-avro", "schema_registry": {"url": stack.schema_registry_url}},
    )
    sink.config["kafka"].pop("topics")
    runs = {"customers": (400, 300, 3), "orders": (250, 100, 4)}
    for table, (events, keys, seed) in runs.items():
        produced = subprocess.run(
            [
                sys.executable,
                "-m",
                "service.sample",
                "--bootstrap",
                stack.kafka_bootstrap,
                "--topic",
                f"{prefix}.{table}",
                "--table",
                table,
                "--events",
                str(events),
                "--keys",
                str(keys),
                "--seed",
                str(seed),
                "--format",
                "avro",
                "--registry",
                stack.schema_registry_url,
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert produced.returncode == 0, produced.stderr[-3000:]
    sink.run_until_caught_up()
    for table, (events, keys, seed) in runs.items():
        model = SampleSource(keys=keys, seed=seed, table=table)
        for _ in range(events):
            model.next_change()
        assert_avro_rows(spark, f"{ns}.{table}", model.expected_rows())


def test_a_column_debezium_adds_in_avro_evolves_the_table(
    make_sink: Callable[..., Sink], stack: Any, spark: Any, unique_name: Callable[[str], str]
) -> None:
    """ALTER TABLE ... ADD COLUMN at the source while Debezium writes Avro: the converter registers a
    new writer schema and the records after the change carry its id. The running sink's next batches
    evolve the table; rows from before read null in the new column, the table is the source's rows."""
    name = f"grow_{uuid.uuid4().hex[:8]}"
    table = f"public.{name}"
    with open_cdc(stack) as cdc:
        cdc.execute(
            f"CREATE TABLE {table} (id bigint PRIMARY KEY, note text)",
            f"INSERT INTO {table} VALUES (1, 'a'), (2, 'b')",
        )
        connector = cdc.register(f"dbz_{name}", [table], avro_registry=stack.schema_registry_url)
        connector.wait_snapshot_done()
        sink = make_sink(
            kafka={"topics": [connector.topic(table)]},
            table={"identifier": f"{unique_name('ns')}.{name}", "key": ["id"]},
            source={"format": "debezium-avro", "schema_registry": {"url": stack.schema_registry_url}},
        )
        run = sink.start()
        run.wait_for_log("committed seq", timeout=240)
        cdc.execute(
            f"ALTER TABLE {table} ADD COLUMN score numeric(6,2)",
            f"UPDATE {table} SET score = 1.25 WHERE id = 1",
            f"INSERT INTO {table} VALUES (3, 'c', 99.5)",
        )
        connector.wait_for_events(table, 2 + 2)
        run.wait_for_log("evolved for the batch's new schema versions", timeout=240)
        source = cdc.rows(table)
        deadline = time.monotonic() + 240
        while differences(source, duckdb_rows(sink.table), "id", "duckdb") and time.monotonic() < deadline:
            time.sleep(2)
        run.kill()
    assert_avro_rows(spark, sink.table, source)
