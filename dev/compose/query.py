#!/usr/bin/env python3
"""Look at an Iceberg table of the compose demo with DuckDB (equality deletes applied).

    icesink-query                         # row count, snapshots and a few rows of ICESINK_QUERY_TABLE
    icesink-query --table demo.customers --table demo.orders   # the same for each table named
    icesink-query --watch 10              # the same every 10 s (the compose `query` service does this)
    icesink-query --sql "SELECT country, count(*) FROM cat.demo.customers GROUP BY 1"

DuckDB's iceberg, avro and httpfs extensions are loaded from the files of their PyPI packages
(duckdb-extension-*), never downloaded. Endpoints and keys come from the environment:
ICESINK_REST_URI, ICESINK_S3_ENDPOINT, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION,
ICESINK_QUERY_TABLE (namespace.table, default demo.customers; `--table` wins and may be repeated).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from pathlib import Path
from typing import Any

EXTENSIONS = ("httpfs", "avro", "iceberg")


def extension_path(name: str) -> Path:
    import duckdb

    package = importlib.import_module(f"duckdb_extension_{name}")
    root = Path(package.__file__ or "").parent
    found = sorted(root.rglob(f"{name}.duckdb_extension"))
    matching = [p for p in found if f"v{duckdb.__version__}" in p.parts] or found
    if not matching:
        raise SystemExit(f"no {name}.duckdb_extension in the duckdb-extension-{name} package")
    return matching[0]


def connect() -> Any:
    import duckdb

    env = os.environ
    con = duckdb.connect(
        config={"autoinstall_known_extensions": "false", "autoload_known_extensions": "false"}
    )
    for name in EXTENSIONS:
        con.execute(f"LOAD '{extension_path(name)}'")
    endpoint = env.get("ICESINK_S3_ENDPOINT", "http://minio:9000")
    con.execute(
        """CREATE SECRET s3 (TYPE s3, KEY_ID $key, SECRET $secret, REGION $region,
           ENDPOINT $endpoint, URL_STYLE 'path', USE_SSL $ssl)""",
        {
            "key": env["AWS_ACCESS_KEY_ID"],
            "secret": env["AWS_SECRET_ACCESS_KEY"],
            "region": env.get("AWS_REGION", "us-east-1"),
            "endpoint": endpoint.split("://", 1)[-1].rstrip("/"),
            "ssl": endpoint.startswith("https://"),
        },
    )
    rest = env.get("ICESINK_REST_URI", "http://iceberg-rest:8181").rstrip("/")
    warehouse = env.get("ICESINK_QUERY_WAREHOUSE", "warehouse")
    con.execute(f"ATTACH '{warehouse}' AS cat (TYPE iceberg, ENDPOINT '{rest}', AUTHORIZATION_TYPE 'none')")
    return con


def quoted(table: str) -> str:
    return ".".join(['"cat"', *(f'"{p}"' for p in table.split("."))])


def show(con: Any, sql: str, limit: int = 20) -> None:
    cursor = con.execute(sql)
    columns = [d[0] for d in cursor.description or []]
    rows = cursor.fetchmany(limit)
    widths = [max(len(str(c)), *(len(str(r[i])) for r in rows)) for i, c in enumerate(columns)]
    print("  ".join(str(c).ljust(w) for c, w in zip(columns, widths, strict=True)))
    for row in rows:
        print("  ".join(str(v).ljust(w) for v, w in zip(row, widths, strict=True)))


def summary(con: Any, table: str) -> None:
    name = quoted(table)
    try:
        (count,) = con.execute(f"SELECT count(*) FROM {name}").fetchone()
    except Exception as exc:  # the sink has not created the table yet
        print(f"{table}: not readable yet ({type(exc).__name__}: {str(exc).splitlines()[0]})")
        return
    print(f"== {table}: {count} rows ({time.strftime('%H:%M:%S')})")
    show(
        con,
        f"SELECT sequence_number, snapshot_id, timestamp_ms FROM iceberg_snapshots({name}) ORDER BY 1 DESC",
        3,
    )
    show(con, f"SELECT * FROM {name} ORDER BY 1 LIMIT 5")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--table",
        action="append",
        help="namespace.table; repeat it for several tables (default: $ICESINK_QUERY_TABLE or demo.customers)",
    )
    p.add_argument("--sql", help="run this SQL instead (the catalog is attached as `cat`)")
    p.add_argument("--watch", type=float, metavar="SECONDS", help="repeat every SECONDS")
    args = p.parse_args(argv)
    tables = args.table or [os.environ.get("ICESINK_QUERY_TABLE", "demo.customers")]
    while True:
        con = connect()  # a fresh connection sees the newest snapshot
        try:
            if args.sql:
                show(con, args.sql, limit=1000)
            else:
                for table in tables:
                    summary(con, table)
        finally:
            con.close()
        if not args.watch:
            return 0
        time.sleep(args.watch)


if __name__ == "__main__":
    sys.exit(main())
