"""The table's own write settings: the codec of icesink's files is the one the table's properties name."""

from __future__ import annotations

import json
from typing import Any

import pyarrow.parquet as pq
from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadataUtil

from service.model.columns import columns_from_envelope_schema, iceberg_schema
from service.sample import envelope_schema
from tests.sink.conftest import Sink
from tests.sink.expect import assert_rows
from tests.sink.test_end_to_end import _catalog

CODEC = "write.parquet.compression-codec"


def _codecs(table: Table) -> dict[str, set[str]]:
    """The compression of every column chunk of the live files, by content (data, deletes)."""
    snapshot = table.current_snapshot()
    assert snapshot is not None
    found: dict[str, set[str]] = {}
    for manifest in snapshot.manifests(table.io):
        for entry in manifest.fetch_manifest_entry(table.io):
            with table.io.new_input(entry.data_file.file_path).open() as f:
                meta = pq.ParquetFile(f).metadata
            codecs = {
                meta.row_group(g).column(c).compression
                for g in range(meta.num_row_groups)
                for c in range(meta.num_columns)
            }
            found.setdefault(entry.data_file.content.name.lower(), set()).update(codecs)
    return found


def test_an_existing_tables_codec_is_honoured(make_sink: Any, spark: Any) -> None:
    """A table created elsewhere with gzip as its Parquet codec, and a sink that configures none:
    its data and delete files are gzip (they were zstd, the sink's default, whatever the table said)."""
    sink: Sink = make_sink(partitions=1, keys=30)
    catalog = _catalog(sink)
    catalog.create_namespace(sink.table.split(".")[0])
    schema = iceberg_schema(columns_from_envelope_schema(envelope_schema("t")), ["id"])
    catalog.create_table(sink.table, schema=schema, properties={"format-version": "2", CODEC: "gzip"})

    sink.produce(120)
    sink.run_until_caught_up()

    table = catalog.load_table(sink.table)
    assert table.properties[CODEC] == "gzip"
    assert _codecs(table) == {"data": {"GZIP"}, "equality_deletes": {"GZIP"}}
    assert_rows(spark, sink.table, sink.source.expected_rows())


def test_a_created_table_says_what_its_files_are(make_sink: Any) -> None:
    """``write.compression: snappy`` and a partition on a non-key column: the table is created in one
    catalog commit whose metadata already has the spec, the key and ``snappy`` as its codec, and its
    files (data, and its position deletes: written by the driver, not pyiceberg) are Snappy."""
    sink: Sink = make_sink(
        partitions=1,
        keys=30,
        partition_by=["country"],
        write={"compression": "snappy"},
        table={"delete_format": "position"},
    )
    sink.produce(60)
    sink.run_until_caught_up()
    sink.produce(60)  # a second run: its updates delete rows of the first one's files
    sink.run_until_caught_up()

    table = _catalog(sink).load_table(sink.table)
    first_file = (
        table.metadata.metadata_log[0].metadata_file
        if table.metadata.metadata_log
        else table.metadata_location
    )
    with table.io.new_input(first_file).open() as f:
        # pyiceberg types parse_raw's data as str; pydantic's model_validate_json under it takes bytes too
        first = TableMetadataUtil.parse_raw(f.read())  # type: ignore[arg-type]
    assert not first.snapshots  # the table as created
    assert [(f.name, str(f.transform)) for f in first.spec().fields] == [("country", "identity")]
    assert first.schema().identifier_field_names() == {"id"}
    assert first.sort_order_by_id(first.default_sort_order_id) is not None
    assert first.properties[CODEC] == "snappy", json.dumps(first.properties)
    assert table.properties[CODEC] == "snappy"
    assert _codecs(table) == {"data": {"SNAPPY"}, "position_deletes": {"SNAPPY"}}


def test_a_codec_the_writer_lacks_stops_start_up(make_sink: Any) -> None:
    """A table whose codec pyarrow can't write (Java's lzo): start-up stops (exit 2) naming it,
    before anything is read or written, instead of every batch failing."""
    sink: Sink = make_sink(partitions=1, keys=30)
    catalog = _catalog(sink)
    catalog.create_namespace(sink.table.split(".")[0])
    schema = iceberg_schema(columns_from_envelope_schema(envelope_schema("t")), ["id"])
    catalog.create_table(sink.table, schema=schema, properties={"format-version": "2", CODEC: "lzo"})
    sink.produce(10)

    run = sink.start()
    assert run.wait(120) == 2, run.log()[-3000:]
    assert "'write.parquet.compression-codec': 'lzo'" in run.log(), run.log()[-3000:]
    assert catalog.load_table(sink.table).current_snapshot() is None
