"""The schema registry hangs mid-stream under an Avro sink.

The sink has decoded version 1 of the writer schema; version 2 (a new column) is registered, then the
registry's process is frozen (SIGSTOP: it accepts no answer, as a hung server) and records of version 2
are produced. The sink must notice (its requests for the new schema id time out and are retried), skip
nothing, and once the registry answers again land every record exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest

from tests.chaos import harness as h
from tests.sink.avro_stream import AccountsStream
from tests.sink.conftest import Sink
from tests.sink.expect import topic_records
from tests.sink.test_avro import assert_avro_rows

pytestmark = pytest.mark.chaos


def test_a_registry_outage_mid_stream_loses_nothing(
    make_sink: Callable[..., Sink], stack: Any, spark: Any
) -> None:
    sink = make_sink(
        source={
            "format": "debezium-avro",
            "schema_registry": {"url": stack.schema_registry_url, "timeout_s": 2, "retries": 60},
        },
        partitions=1,
    )
    stream = AccountsStream(stack.schema_registry_url, sink.topic)
    sink.send([r for k in range(1, 21) for r in stream.upsert(k, f"n{k}", Decimal(k))])  # type: ignore[misc]
    run = h.start(sink)
    h.wait_caught_up(sink, run)
    stream.evolve()
    with h.server_frozen("registry"):
        sink.send(
            [r for k in range(15, 31) for r in stream.upsert(k, f"m{k}", Decimal(k) / 4, tier=k % 3)]
            + stream.delete(3)  # type: ignore[operator]
        )
        needle = f"asking the schema registry for schema id {stream.ids['v2']} failed"
        run.wait_for_log(needle, timeout=120, count=2)  # the outage was seen, and retried
        held_back, produced = h.committed_offsets(sink), h.end_offsets(sink)
    h.wait_caught_up(sink, run)
    h.stop_gracefully(run)
    # while the registry hung, the new version's records were not committed (nor skipped)
    assert held_back.get(0, 0) < produced[0], (held_back, produced)
    assert_avro_rows(spark, sink.table, stream.expected())
    assert topic_records(stack.kafka_bootstrap, f"{sink.name}.dlq", 0) == []
    h.FIGURES.sink_starts += 1
    h.FIGURES.outages.append("schema registry hung (SIGSTOP) mid-stream")
    h.FIGURES.rows_verified += len(stream.rows)
