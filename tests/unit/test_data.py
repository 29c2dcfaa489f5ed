"""Column mapping, partition parsing and the DataFile JSON round trip (no servers)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.transforms import (
    BucketTransform,
    DayTransform,
    HourTransform,
    IdentityTransform,
    MonthTransform,
    TruncateTransform,
    YearTransform,
)
from pyiceberg.typedef import Record
from pyiceberg.types import DecimalType, LongType, StringType, TimestampType, TimestamptzType, UUIDType

from service.iceberg.tables import parse_partition_field
from service.model.columns import (
    Encoding,
    SchemaError,
    column_from_config,
    column_from_connect,
    iceberg_schema,
    parse_iceberg_type,
)
from service.model.datafile_json import from_json, to_json


def test_connect_logical_types() -> None:
    dec = column_from_connect(
        {
            "field": "a",
            "type": "bytes",
            "name": "org.apache.kafka.connect.data.Decimal",
            "parameters": {"scale": "2", "connect.decimal.precision": "12"},
            "optional": True,
        }
    )
    assert dec.type == DecimalType(12, 2) and dec.encoding is Encoding.DECIMAL_BASE64 and not dec.required
    ts = column_from_connect(
        {"field": "t", "type": "int64", "name": "io.debezium.time.Timestamp", "optional": False}
    )
    assert ts.type == TimestampType() and ts.encoding is Encoding.TIMESTAMP_MILLIS and ts.required
    tz = column_from_connect({"field": "z", "type": "string", "name": "io.debezium.time.ZonedTimestamp"})
    assert tz.type == TimestamptzType()
    assert (
        column_from_connect({"field": "u", "type": "string", "name": "io.debezium.data.Uuid"}).type
        == UUIDType()
    )
    assert column_from_connect({"field": "n", "type": "int64"}).type == LongType()


def test_variable_scale_decimals_land_as_configured() -> None:
    """numeric without precision has no scale of its own: its exact text, or a configured decimal."""
    field = {"field": "v", "type": "struct", "name": "io.debezium.data.VariableScaleDecimal"}
    text = column_from_connect(field)
    assert text.type == StringType() and text.encoding is Encoding.VARIABLE_SCALE_DECIMAL
    assert column_from_connect(field, variable_scale=DecimalType(38, 10)).type == DecimalType(38, 10)
    configured = column_from_config("v", "decimal(20,4)", False, "io.debezium.data.VariableScaleDecimal")
    assert configured.encoding is Encoding.VARIABLE_SCALE_DECIMAL
    with pytest.raises(SchemaError, match="string or decimal"):
        column_from_config("v", "double", False, "io.debezium.data.VariableScaleDecimal")


def test_configured_columns() -> None:
    assert parse_iceberg_type("decimal(10, 2)") == DecimalType(10, 2)
    with pytest.raises(SchemaError, match="unknown column type"):
        parse_iceberg_type("varchar")
    col = column_from_config("t", "timestamp", False, "io.debezium.time.Timestamp")
    assert col.encoding is Encoding.TIMESTAMP_MILLIS
    with pytest.raises(SchemaError, match="unknown encoding"):
        column_from_config("t", "timestamp", False, "epoch-fortnights")


def test_key_columns_become_required_identifier_fields() -> None:
    schema = iceberg_schema(
        [column_from_config("id", "long", False, None), column_from_config("v", "string", False, None)],
        ["id"],
    )
    assert schema.find_field("id").required and schema.identifier_field_ids == [1]
    with pytest.raises(SchemaError, match="key column"):
        iceberg_schema([column_from_config("v", "string", False, None)], ["id"])


@pytest.mark.parametrize(
    ("text", "column", "transform"),
    [
        ("country", "country", IdentityTransform()),
        ("year(ts)", "ts", YearTransform()),
        ("month(ts)", "ts", MonthTransform()),
        ("day(ts)", "ts", DayTransform()),
        ("hour(ts)", "ts", HourTransform()),
        ("bucket(16, id)", "id", BucketTransform(16)),
        ("truncate(4, name)", "name", TruncateTransform(4)),
    ],
)
def test_partition_fields(text: str, column: str, transform: object) -> None:
    assert parse_partition_field(text) == (column, transform)


def test_bad_partition_field() -> None:
    with pytest.raises(SchemaError, match="partition_by"):
        parse_partition_field("bucket(id)")


def test_datafile_json_round_trip() -> None:
    original = DataFile.from_args(
        content=DataFileContent.EQUALITY_DELETES,
        file_path="s3://b/t/data/x.parquet",
        file_format=FileFormat.PARQUET,
        partition=Record(7, "fr", Decimal("1.50"), b"\x00\x01"),
        record_count=3,
        file_size_in_bytes=1234,
        column_sizes={1: 10},
        value_counts={1: 3},
        null_value_counts={1: 0},
        nan_value_counts={},
        lower_bounds={1: b"\x01"},
        upper_bounds={1: b"\x09"},
        split_offsets=[4],
        equality_ids=[1],
        sort_order_id=None,
        key_metadata=None,
    )
    original.spec_id = 3
    restored = from_json(to_json(original))
    assert restored.spec_id == 3 and restored.equality_ids == [1] and restored.content == original.content
    assert [restored.partition[i] for i in range(4)] == [7, "fr", Decimal("1.50"), b"\x00\x01"]
    assert restored.lower_bounds == {1: b"\x01"} and restored.file_size_in_bytes == 1234


def test_a_write_spec_carries_the_tables_layout_without_its_history() -> None:
    """A write spec is pickled to every task of every batch: the table's snapshots stay behind, its
    schema, partition specs, properties and location travel."""
    import pickle

    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.schema import Schema
    from pyiceberg.table.metadata import new_table_metadata
    from pyiceberg.table.snapshots import Operation, Snapshot, Summary
    from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
    from pyiceberg.types import NestedField

    from service.data.files import writable

    schema = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "name", StringType()))
    spec = PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "name"))
    base = new_table_metadata(
        schema, spec, UNSORTED_SORT_ORDER, "s3://warehouse/t", {"write.format.default": "parquet"}
    )
    snapshots = [
        Snapshot(
            snapshot_id=i,
            parent_snapshot_id=i - 1 if i > 1 else None,
            sequence_number=i,
            timestamp_ms=1_700_000_000_000 + i,
            manifest_list=f"s3://warehouse/t/metadata/snap-{i}.avro",
            summary=Summary(operation=Operation.APPEND),
            schema_id=0,
        )
        for i in range(1, 201)
    ]
    metadata = base.model_copy(update={"snapshots": snapshots, "current_snapshot_id": 200})

    slim = writable(metadata)

    assert slim.snapshots == [] and slim.current_snapshot_id is None
    assert slim.schema() == metadata.schema()
    assert slim.spec() == metadata.spec() and slim.specs() == metadata.specs()
    assert slim.properties == metadata.properties and slim.location == metadata.location
    assert slim.format_version == metadata.format_version
    assert len(pickle.dumps(slim)) * 10 < len(pickle.dumps(metadata))


def test_the_sinks_tables_write_s3_files_with_one_request_each() -> None:
    """The catalog's tables get a FileIO whose S3 files are opened at their first write (one PUT for a
    small file, not a multipart upload of three requests), keeping every other S3 setting; a FileIO
    named in the catalog's configuration wins."""
    from pyiceberg.io import PY_IO_IMPL, load_file_io

    from service.model.object_store import ObjectStoreIO, with_object_store_io

    properties = {
        "s3.endpoint": "http://127.0.0.1:1",
        "s3.access-key-id": "key",
        "s3.secret-access-key": "secret",
        "s3.region": "eu-west-3",
    }
    io = load_file_io(with_object_store_io(properties), "s3://warehouse/t")
    assert isinstance(io, ObjectStoreIO)
    _, (options,) = io.fs_by_scheme("s3", "warehouse").__reduce__()
    assert options["allow_delayed_open"] is True
    assert (options["endpoint_override"], options["access_key"], options["region"]) == (
        "http://127.0.0.1:1",
        "key",
        "eu-west-3",
    )

    named = with_object_store_io({**properties, PY_IO_IMPL: "pyiceberg.io.pyarrow.PyArrowFileIO"})
    assert type(load_file_io(named, "s3://warehouse/t")).__name__ == "PyArrowFileIO"


def test_a_process_keeps_one_file_io_per_set_of_credentials() -> None:
    """Writers of the same table (or of tables with the same credentials) share one FileIO and so one
    S3 client; other credentials get their own; an object among the properties (a REST catalog's auth
    manager, unpickled anew in each task) is passed on but not keyed on."""
    import pickle

    from pyiceberg.partitioning import PartitionSpec
    from pyiceberg.schema import Schema
    from pyiceberg.table.metadata import new_table_metadata
    from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
    from pyiceberg.types import NestedField

    from service.data.files import WriteSpec, file_io

    schema = Schema(NestedField(1, "id", LongType(), required=True))
    metadata = new_table_metadata(schema, PartitionSpec(), UNSORTED_SORT_ORDER, "s3://warehouse/t", {})

    def spec(key_id: str) -> WriteSpec:
        properties: dict[str, Any] = {"s3.endpoint": "http://127.0.0.1:1", "s3.access-key-id": key_id}
        properties["auth"] = pickle.loads(pickle.dumps(_AuthManager()))
        return WriteSpec(metadata, properties, ["id"], upsert=True, delete_spec_id=0)

    first = file_io(spec("a"))
    assert file_io(spec("a")) is first
    assert isinstance(first.properties["auth"], _AuthManager)
    assert file_io(spec("b")) is not first


class _AuthManager:
    """Stands for a REST catalog's auth manager: a new object after every unpickling."""


def test_a_column_named_like_the_sinks_own_is_refused() -> None:
    """Decoded rows carry the sink's columns (__icesink_op, __icesink_offset ...) beside the table's."""
    with pytest.raises(
        SchemaError, match="column __icesink_offset: names starting with __icesink_ are icesink's own"
    ):
        column_from_config("__icesink_offset", "long", False, None)
    with pytest.raises(SchemaError, match="__icesink_op"):
        column_from_connect({"field": "__icesink_op", "type": "string"})
    assert column_from_config("offset", "long", False, None).name == "offset"
