"""Both decoders agree on what a real Debezium connector wrote.

Each file of tests/sink/corpus/ holds the records a real Debezium PostgreSQL connector published for a
source table (captured by the test that lands that table, see the folder's README). Spark's decoder
decodes every record of a file in one job; the Arrow decoder decodes each record on its own and may
decline one (the sink then hands the batch to Spark's decoder), but a record it accepts must decode to
the same value in every column. The columns are those of the events' own schema section, as the sink
maps them when it creates the table.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from service.data.arrow_decode import Declined, decode
from service.data.envelope import ERROR_COLUMN
from service.model.columns import Column, column_from_config, columns_from_envelope_schema
from tests.sink.decoders import comparable, kafka_positions, normalise, spark_decoded, value_columns

CORPUS = Path(__file__).parent / "corpus"
FILES = sorted(CORPUS.glob("*.jsonl"))
MAX_BYTES = 1 << 20


def _load(path: Path) -> tuple[dict[str, Any], list[tuple[bytes | None, bytes | None]]]:
    header, *lines = path.read_text().splitlines()
    records = []
    for line in lines:
        record = json.loads(line)
        records.append(tuple(None if record[f] is None else record[f].encode() for f in ("key", "value")))
    return json.loads(header), records  # type: ignore[return-value]


def _columns(header: dict[str, Any], records: list[tuple[bytes | None, bytes | None]]) -> list[Column]:
    """The columns a file's header configures, else those of its first schema section."""
    if "columns" in header:
        return [
            column_from_config(c["name"], c["type"], c.get("required", False), c.get("encoding"))
            for c in header["columns"]
        ]
    for _, value in records:
        if value is not None and "schema" in (event := json.loads(value)):
            return columns_from_envelope_schema(event["schema"])
    raise AssertionError("the corpus file has neither configured columns nor a schema section")


def test_the_corpus_is_not_empty() -> None:
    assert FILES, f"no corpus files in {CORPUS}"


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_both_decoders_agree_on_real_connector_output(spark: SparkSession, path: Path) -> None:
    header, records = _load(path)
    columns, key = _columns(header, records), header["key"]
    reference = spark_decoded(spark, records, columns, key, MAX_BYTES)
    letters = {o: r[ERROR_COLUMN] for o, r in reference.items() if r[ERROR_COLUMN] is not None}
    # A real connector's records of a supported table are never dead letters, unless the file says
    # which reasons it expects (a type the sink refuses by design).
    expected = header.get("dead_letters", [])
    unexpected = [
        f"record {o}: {reason}" for o, reason in letters.items() if not any(e in reason for e in expected)
    ]
    assert not unexpected, "\n".join(unexpected)

    accepted, declined, disagreements = 0, 0, []
    for offset, (k, value) in enumerate(records):
        try:
            got = comparable(
                decode([value], [k], kafka_positions([offset]), columns, key, schema_sections=True).rows
            )[0]
        except Declined:
            declined += 1
            continue
        accepted += 1
        if offset in letters:
            disagreements.append(
                f"record {offset}: Spark dead-letters it ({letters[offset]}), Arrow accepted it"
            )
            continue
        disagreements += [
            f"record {offset} column {name}: Arrow {got[name]!r}, Spark {reference[offset][name]!r}"
            for name in value_columns(columns)
            if normalise(got[name]) != normalise(reference[offset][name])
        ]
    assert not disagreements, "\n".join(disagreements[:40])
    print(f"{path.name}: {len(records)} records, Arrow accepted {accepted}, declined {declined}")
