"""DataFile ⇄ JSON, so written files can travel from Spark executors to the driver and into the txnlog.

A precommitted plan must be committable later by another process (rule 5 of the design), so the
payload holds every field Iceberg needs: path, partition values, stats, equality ids, spec id.
"""

from __future__ import annotations

import base64
import uuid
from datetime import date, datetime, time
from decimal import Decimal
from typing import Any

from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.typedef import Record


def _encode_value(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, Decimal):
        return {"decimal": str(value)}
    if isinstance(value, bytes):
        return {"bytes": base64.b64encode(value).decode()}
    if isinstance(value, uuid.UUID):
        return {"uuid": str(value)}
    if isinstance(value, date | datetime | time):
        raise TypeError(f"partition value {value!r} should be in Iceberg's internal form (days/micros)")
    raise TypeError(f"can't encode partition value {value!r} of type {type(value).__name__}")


def _decode_value(value: Any) -> Any:
    if isinstance(value, dict):
        if "decimal" in value:
            return Decimal(value["decimal"])
        if "bytes" in value:
            return base64.b64decode(value["bytes"])
        if "uuid" in value:
            return uuid.UUID(value["uuid"])
        raise ValueError(f"unknown encoded value {value}")
    return value


def _int_map(values: dict[int, int] | None) -> dict[str, int] | None:
    return None if values is None else {str(k): int(v) for k, v in values.items()}


def _bytes_map(values: dict[int, bytes] | None) -> dict[str, str] | None:
    return None if values is None else {str(k): base64.b64encode(v).decode() for k, v in values.items()}


def to_json(data_file: DataFile) -> dict[str, Any]:
    return {
        "content": int(data_file.content),
        "file_path": data_file.file_path,
        "file_format": data_file.file_format.value,
        "spec_id": data_file.spec_id,
        "partition": [_encode_value(data_file.partition[i]) for i in range(len(data_file.partition))],
        "record_count": data_file.record_count,
        "file_size_in_bytes": data_file.file_size_in_bytes,
        "column_sizes": _int_map(data_file.column_sizes),
        "value_counts": _int_map(data_file.value_counts),
        "null_value_counts": _int_map(data_file.null_value_counts),
        "nan_value_counts": _int_map(data_file.nan_value_counts),
        "lower_bounds": _bytes_map(data_file.lower_bounds),
        "upper_bounds": _bytes_map(data_file.upper_bounds),
        "split_offsets": data_file.split_offsets,
        "equality_ids": data_file.equality_ids,
        "sort_order_id": data_file.sort_order_id,
    }


def from_json(obj: dict[str, Any]) -> DataFile:
    def ints(key: str) -> dict[int, int] | None:
        value = obj.get(key)
        return None if value is None else {int(k): int(v) for k, v in value.items()}

    def blobs(key: str) -> dict[int, bytes] | None:
        value = obj.get(key)
        return None if value is None else {int(k): base64.b64decode(v) for k, v in value.items()}

    data_file = DataFile.from_args(
        content=DataFileContent(obj["content"]),
        file_path=obj["file_path"],
        file_format=FileFormat(obj["file_format"]),
        partition=Record(*[_decode_value(v) for v in obj["partition"]]),
        record_count=obj["record_count"],
        file_size_in_bytes=obj["file_size_in_bytes"],
        column_sizes=ints("column_sizes"),
        value_counts=ints("value_counts"),
        null_value_counts=ints("null_value_counts"),
        nan_value_counts=ints("nan_value_counts"),
        lower_bounds=blobs("lower_bounds"),
        upper_bounds=blobs("upper_bounds"),
        split_offsets=obj.get("split_offsets"),
        equality_ids=obj.get("equality_ids"),
        sort_order_id=obj.get("sort_order_id"),
        key_metadata=None,
    )
    # DataFile.from_args does not keep spec_id; it is a separate attribute.
    data_file.spec_id = obj["spec_id"]
    return data_file
