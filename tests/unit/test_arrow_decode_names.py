"""The Arrow decoder keeps a record's Kafka position apart from table columns of the same names."""

from __future__ import annotations

import json

import pyarrow as pa

from service.data.arrow_decode import LatestPerKey, decode, latest_per_key
from service.data.envelope import KAFKA_POSITION
from service.model.columns import column_from_config

COLUMNS = [
    column_from_config("id", "long", True, None),
    column_from_config("topic", "string", False, None),
    column_from_config("partition", "string", False, None),
    column_from_config("offset", "long", False, None),
]


def test_columns_called_topic_partition_and_offset_keep_the_rows_values() -> None:
    rows = [{"id": i, "topic": f"orders-{i}", "partition": f"p{i}", "offset": -i} for i in range(4)]
    values = [
        json.dumps({"op": "c", "after": row, "source": {"lsn": 100 + row["id"]}}).encode() for row in rows
    ]
    keys = [json.dumps({"id": row["id"]}).encode() for row in rows]
    kafka = pa.table(
        {
            "topic": ["shop.public.orders"] * 4,
            "partition": pa.array([3] * 4, pa.int32()),
            "offset": pa.array([70, 71, 72, 73], pa.int64()),
        }
    )
    decoded = decode(values, keys, kafka, COLUMNS, ["id"]).rows
    names = [c.name for c in COLUMNS]
    assert decoded.select(names).to_pylist() == rows
    assert decoded.select(KAFKA_POSITION).to_pylist() == [
        dict(zip(KAFKA_POSITION, ("shop.public.orders", 3, offset), strict=True)) for offset in range(70, 74)
    ]
    assert latest_per_key(decoded, ["id"]).select(names).to_pylist() == rows
    chunked = LatestPerKey(["id"])
    chunked.add(decoded.slice(0, 2))
    chunked.add(decoded.slice(2))
    assert chunked.result().select(names).to_pylist() == rows
