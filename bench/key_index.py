"""`python -m bench.key_index --rows 10000000`: how long the key index of a table takes to build, and
what it costs in memory per key.

A table of ``--rows`` rows (a long key, a name, a country) is written into the stack's REST catalog
and object store in ``--files`` data files, ``--deleted`` of its rows are deleted by position-delete
files (so the build applies deletes, as it must on a sink's table), and the index is built from it
as a sink does at a table's first use (``service.keyindex.build``). Printed: build seconds, keys,
bytes per key (the index's own objects, counted; and the process's resident memory growth), load.
The table is dropped afterwards (with its files).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
import uuid
from typing import Any

import numpy as np
import pyarrow as pa
from pyiceberg.typedef import Record

from bench.stack import load_stack
from service.commit.plan import new_snapshot_id
from service.data.position_deletes import write_position_deletes
from service.iceberg.row_delta import RowDelta
from service.keyindex.build import build
from service.keyindex.index import KeyIndex


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def index_bytes(index: KeyIndex) -> int:
    """The index's own objects: the dict, its keys and values (small ints are shared, not counted)."""
    total = sys.getsizeof(index.rows)
    for k, v in index.rows.items():
        total += (sys.getsizeof(k) if not (isinstance(k, int) and -5 <= k <= 256) else 0) + sys.getsizeof(v)
    return total + sum(sys.getsizeof(f.path) for f in index.files)


def write_table(catalog: Any, identifier: str, rows: int, files: int, deleted: int) -> Any:
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StringType

    schema = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "name", StringType()),
        NestedField(3, "country", StringType()),
        identifier_field_ids=[1],
    )
    catalog.create_namespace_if_not_exists(identifier.split(".")[0])
    table = catalog.create_table(identifier, schema, properties={"format-version": "2"})
    per_file = rows // files
    rng = np.random.default_rng(7)
    countries = pa.array(["us", "fr", "de", "jp", "br"])
    for i in range(files):
        ids = np.arange(i * per_file, (i + 1) * per_file, dtype=np.int64)
        rng.shuffle(ids)
        chunk = pa.table(
            {
                "id": pa.array(ids),
                "name": pa.array([f"n{j}" for j in range(per_file)]),
                "country": countries.take(pa.array(rng.integers(0, 5, per_file))),
            },
            schema=schema.as_arrow(),
        )
        table.append(chunk)
        print(f"  wrote data file {i + 1}/{files} ({per_file:,} rows)", flush=True)
    if deleted:
        table = catalog.load_table(identifier)
        data = [t.file.file_path for t in table.scan().plan_files()]
        per = max(1, deleted // len(data))
        rows_deleted = pa.table(
            {
                "file_path": pa.array([p for p in data for _ in range(per)]),
                "pos": pa.array(
                    np.concatenate([np.sort(rng.choice(per_file, per, replace=False)) for _ in data])
                ),
            }
        )
        delete_file = write_position_deletes(table.io, table.metadata, rows_deleted, 0, Record())
        table = RowDelta(table, new_snapshot_id(), [], [delete_file], {}).commit()
    return catalog.load_table(identifier)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=10_000_000)
    p.add_argument("--files", type=int, default=20)
    p.add_argument("--deleted", type=int, default=100_000, help="rows deleted by position deletes")
    args = p.parse_args(argv)
    stack = load_stack()
    catalog = stack.catalog()
    identifier = f"bench_key_index_{uuid.uuid4().hex[:8]}.t"
    print(f"writing {args.rows:,} rows into {identifier} ({args.files} files) ...", flush=True)
    started = time.monotonic()
    table = write_table(catalog, identifier, args.rows, args.files, args.deleted)
    print(f"  written in {time.monotonic() - started:.1f} s", flush=True)
    try:
        gc.collect()
        before = rss_bytes()
        load = os.getloadavg()[0]
        started = time.monotonic()
        index = build(table, identifier, ["id"])
        seconds = time.monotonic() - started
        gc.collect()
        grown = rss_bytes() - before
        counted = index_bytes(index)
        result = {
            "rows": args.rows,
            "files": args.files,
            "deleted": args.deleted,
            "keys": len(index),
            "build_s": round(seconds, 2),
            "keys_per_s": round(len(index) / seconds),
            "index_bytes_per_key": round(counted / len(index), 1),
            "rss_growth_bytes_per_key": round(grown / len(index), 1),
            "load_1m": round(load, 2),
        }
        assert len(index) == args.rows - (args.deleted // args.files) * args.files, result
        print(json.dumps(result, indent=2))
    finally:
        catalog.purge_table(identifier)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
