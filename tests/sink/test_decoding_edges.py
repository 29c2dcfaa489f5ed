"""Decoding edges, one failure story per test, end to end against the real servers.

Each end-to-end test produces one batch that holds the awkward records next to ordinary ones, runs
the sink until it has caught up, proves from the sink's log that the records really were in one batch
(one commit counting all of them), then reads the table with Spark and DuckDB and the dead-letter topic.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from decimal import Decimal
from typing import Any

import pytest

from readers import duckdb_rows, spark_rows
from service.data import arrow_decode
from service.data.envelope import OFFSET
from service.model.columns import column_from_config
from tests.sink.conftest import Sink, SinkRun
from tests.sink.decoders import kafka_positions
from tests.sink.expect import topic_records
from tests.sink.test_decoding import _unscaled


def _envelope(schema: dict[str, Any], op: str, after: Any, before: Any = None) -> str:
    return json.dumps({"schema": schema, "payload": {"op": op, "after": after, "before": before}})


def _schema(fields: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "type": "struct",
        "fields": [
            {"type": "struct", "optional": True, "field": "before", "fields": fields},
            {"type": "struct", "optional": True, "field": "after", "fields": fields},
            {"type": "string", "optional": False, "field": "op"},
        ],
    }


def _key(i: int) -> str:
    return json.dumps({"payload": {"id": i}})


def _one_commit(run: SinkRun, records: int, dead_letters: int) -> str:
    """The run's only commit line; it counts every record of the batch, so they were in one batch."""
    commits = [line for line in run.log().splitlines() if "committed seq" in line]
    assert len(commits) == 1, "\n".join(commits) or run.log()[-4000:]
    match = re.search(r"(\d+) records \([^)]*\), (\d+) dead letters", commits[0])
    assert match, commits[0]
    assert (int(match.group(1)), int(match.group(2))) == (records, dead_letters), commits[0]
    return commits[0]


def _reasons(sink: Sink, bootstrap: str, expected: int) -> dict[int, str]:
    """Dead letters of the sink by source offset → their reason."""
    letters = topic_records(bootstrap, f"{sink.name}.dlq", expected)
    reasons = {}
    for m in letters:
        headers = {k: v.decode() for k, v in m.headers() or []}
        reasons[int(headers["icesink.source.offset"])] = headers["icesink.error"]
    assert len(letters) == len(reasons) == expected, reasons
    return reasons


def _both_readers(spark: Any, table: str) -> list[tuple[str, list[dict[str, Any]]]]:
    return [("spark", spark_rows(spark, table)), ("duckdb", duckdb_rows(table))]


# -- decimals wider than the column -----------------------------------------------------------------

DECIMAL_FIELDS = [
    {"field": "id", "type": "int64", "optional": False},
    {
        "field": "amount",
        "type": "bytes",
        "optional": True,
        "name": "org.apache.kafka.connect.data.Decimal",
        "parameters": {"scale": "2", "connect.decimal.precision": "38"},
    },
]


def test_a_decimal_wider_than_its_column_is_a_dead_letter(make_sink: Any, spark: Any, stack: Any) -> None:
    """A 39-digit value for decimal(38,2) used to fail the batch's Arrow conversion over and over; now
    it is a dead letter naming the column, and the batch's other records land with their exact values
    (38 digits: more than Python's default decimal precision of 28)."""
    sink: Sink = make_sink(partitions=1)
    schema = _schema(DECIMAL_FIELDS)
    widest = Decimal("123456789012345678901234567890123456.78")  # 38 digits
    negative = Decimal("-999999999999999999999999999999999999.99")  # the smallest decimal(38,2)
    too_wide = Decimal("1234567890123456789012345678901234567.89")  # 39 digits
    sink.send(
        [
            (_key(1), _envelope(schema, "c", {"id": 1, "amount": _unscaled(widest, 2)})),
            (_key(2), _envelope(schema, "c", {"id": 2, "amount": _unscaled(too_wide, 2)})),
            (_key(3), _envelope(schema, "c", {"id": 3, "amount": _unscaled(negative, 2)})),
        ],
    )
    run = sink.run_until_caught_up()
    _one_commit(run, records=3, dead_letters=1)
    log = run.log()
    assert re.search(r"declined by the Arrow decoder \(column amount: [^)]*out of range", log), log[-4000:]

    for reader, rows in _both_readers(spark, sink.table):
        got = sorted((r["id"], r["amount"]) for r in rows)
        assert got == [(1, widest), (3, negative)], f"{reader} read {got}"
    reasons = _reasons(sink, stack.kafka_bootstrap, 1)
    assert "column amount" in reasons[1] and "out of range for decimal(38, 2)" in reasons[1], reasons


def test_decimals_of_up_to_38_digits_keep_every_digit_in_the_arrow_decoder() -> None:
    """Python's decimal arithmetic rounds to 28 digits unless told otherwise."""
    columns = [
        column_from_config("id", "long", True, None),
        column_from_config("amount", "decimal(38,2)", False, None),
    ]
    values = [Decimal("123456789012345678901234567890123456.78"), Decimal("-0.01"), None]
    events = [
        _envelope(_schema(DECIMAL_FIELDS), "c", {"id": i, "amount": None if v is None else _unscaled(v, 2)})
        for i, v in enumerate(values)
    ]
    decoded = arrow_decode.decode(
        [e.encode() for e in events],
        [_key(i).encode() for i in range(len(values))],
        kafka_positions(list(range(len(values)))),
        columns,
        ["id"],
        schema_sections=True,
    )
    assert decoded.rows["amount"].to_pylist() == values


# -- truncate events ----------------------------------------------------------------------------------

PLAIN_FIELDS = [
    {"field": "id", "type": "int64", "optional": False},
    {"field": "name", "type": "string", "optional": True},
]


def test_a_truncate_event_is_a_dead_letter(make_sink: Any, spark: Any, stack: Any) -> None:
    """`op: t` (Debezium's truncate event: no key, no images) is not applied: it is a dead letter with a
    reason that says so, and the changes around it in the same batch land in order."""
    sink: Sink = make_sink(partitions=1)
    schema = _schema(PLAIN_FIELDS)
    truncate = json.dumps(
        {
            "schema": schema,
            "payload": {"op": "t", "before": None, "after": None, "source": {"table": "customers"}},
        }
    )
    sink.send(
        [
            (_key(1), _envelope(schema, "c", {"id": 1, "name": "a"})),
            (_key(2), _envelope(schema, "c", {"id": 2, "name": "b"})),
            (None, truncate),
            (_key(2), _envelope(schema, "u", {"id": 2, "name": "b2"}, {"id": 2, "name": "b"})),
        ],
    )
    run = sink.run_until_caught_up()
    _one_commit(run, records=4, dead_letters=1)
    assert "declined by the Arrow decoder (a truncate event" in run.log(), run.log()[-4000:]

    for reader, rows in _both_readers(spark, sink.table):
        got = sorted((r["id"], r["name"]) for r in rows)
        assert got == [(1, "a"), (2, "b2")], f"{reader} read {got}"
    reasons = _reasons(sink, stack.kafka_bootstrap, 1)
    assert reasons[2].startswith("truncate events are not applied"), reasons


# -- a schema version that changes a column's encoding ----------------------------------------------


def _timestamp_fields(logical: str) -> list[dict[str, Any]]:
    return [
        {"field": "id", "type": "int64", "optional": False},
        {"field": "updated", "type": "int64", "optional": True, "name": logical},
    ]


@pytest.mark.parametrize("decoder", ["auto", "spark"])
def test_a_batch_of_two_schema_versions_decodes_each_with_its_own_encoding(
    make_sink: Any, spark: Any, decoder: str
) -> None:
    """The source changed DATETIME(3) to DATETIME(6): the column's events switch from
    io.debezium.time.Timestamp (milliseconds) to MicroTimestamp (microseconds) while its Iceberg type
    stays timestamp. One batch holds events of both versions, interleaved; each must be read with its
    own version's unit, not with the one the sink learned last (1000 times off). auto: the Arrow path
    takes the batch (each task decodes every event with its own schema section's encodings)."""
    sink: Sink = make_sink(partitions=1, source={"decoder": decoder})
    millis = _schema(_timestamp_fields("io.debezium.time.Timestamp"))
    micros = _schema(_timestamp_fields("io.debezium.time.MicroTimestamp"))
    sink.send(
        [
            (_key(1), _envelope(millis, "c", {"id": 1, "updated": 1_600_000_000_001})),
            (_key(3), _envelope(micros, "c", {"id": 3, "updated": 1_650_000_000_000_001})),
            (_key(2), _envelope(millis, "c", {"id": 2, "updated": 1_600_000_000_789})),
            (_key(1), _envelope(micros, "u", {"id": 1, "updated": 1_700_000_000_123_456})),
        ],
    )
    run = sink.run_until_caught_up()
    commit = _one_commit(run, records=4, dead_letters=0)
    assert f"{'arrow' if decoder == 'auto' else 'spark'} decoder" in commit, commit

    expected = [
        (1, datetime(2023, 11, 14, 22, 13, 20, 123456)),
        (2, datetime(2020, 9, 13, 12, 26, 40, 789000)),
        (3, datetime(2022, 4, 15, 5, 20, 0, 1)),
    ]
    for reader, rows in _both_readers(spark, sink.table):
        got = sorted((r["id"], r["updated"]) for r in rows)
        assert got == expected, f"{reader} read {got}"


def test_the_arrow_decoder_reads_each_event_in_its_own_schema_versions_unit() -> None:
    """Events of both versions interleaved in one task's share: each decoded with its section's
    encoding, the rows kept in record order."""
    columns = [
        column_from_config("id", "long", True, None),
        column_from_config("updated", "timestamp", False, "io.debezium.time.Timestamp"),
    ]
    millis = _schema(_timestamp_fields("io.debezium.time.Timestamp"))
    micros = _schema(_timestamp_fields("io.debezium.time.MicroTimestamp"))
    events = [
        _envelope(micros, "c", {"id": 1, "updated": 1_700_000_000_123_456}),
        _envelope(millis, "c", {"id": 2, "updated": 1_600_000_000_789}),
        _envelope(micros, "u", {"id": 1, "updated": 1_700_000_000_123_457}),
    ]
    decoded = arrow_decode.decode(
        [e.encode() for e in events],
        [_key(i).encode() for i in (1, 2, 1)],
        kafka_positions([0, 1, 2]),
        columns,
        ["id"],
        schema_sections=True,
    )
    assert decoded.rows.select(["id", "updated", OFFSET]).to_pylist() == [
        {"id": 1, "updated": datetime(2023, 11, 14, 22, 13, 20, 123456), OFFSET: 0},
        {"id": 2, "updated": datetime(2020, 9, 13, 12, 26, 40, 789000), OFFSET: 1},
        {"id": 1, "updated": datetime(2023, 11, 14, 22, 13, 20, 123457), OFFSET: 2},
    ]
    assert decoded.by_op == {"c": 2, "u": 1} and len(decoded.schemas) == 2
