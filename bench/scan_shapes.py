"""What a DuckDB scan of a streaming table pays for: each snapshot shape of one table against a copy.

A table a sink commits to every second or two and a maintainer compacts in between has snapshots of a
few shapes: the compaction's (one data file, the delete manifests of the files it removed), and the
sink's on top of it (one more data file and equality-delete file per commit since). This times
``readside.QUERY`` through DuckDB as of the newest snapshot of each shape, side by side in rounds with a
one-file copy of the table's current rows (written with pyiceberg, dropped afterwards), the median of
each. ``--history`` then expires every snapshot but the current one (destructive, and it leaves the
files only they referenced behind as orphans: for bench tables) and times the current snapshot
again: the share of the scan that is the table's snapshot history, which the catalog returns with
the table's metadata at every scan.

    .venv/bin/python -m bench.scan_shapes bench_soak_xxxxxxxx.maintained [--rounds 25] [--history]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from bench.readside import QUERY
from bench.stack import load_stack

Shape = tuple[str, int, int, int]  # operation, data files, delete files, manifests


def shapes(table: Any) -> dict[Shape, int]:
    """The newest snapshot id of each shape among the table's snapshots."""
    newest: dict[Shape, int] = {}
    for snapshot in table.metadata.snapshots:
        manifests = snapshot.manifests(table.io)
        data = deletes = 0
        for manifest in manifests:
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
                if entry.data_file.content == 0:
                    data += 1
                else:
                    deletes += 1
        operation = snapshot.summary.operation.value if snapshot.summary else "?"
        newest[(operation, data, deletes, len(manifests))] = snapshot.snapshot_id
    return newest


def timed_rounds(con: Any, targets: dict[str, tuple[str, int]], rounds: int) -> dict[str, float]:
    """Median seconds of each ``label → (table, snapshot id)``, scanned in rounds (the first 3 dropped:
    DuckDB caches the files it read)."""
    seconds: dict[str, list[float]] = {label: [] for label in targets}
    for _ in range(rounds + 3):
        for label, (table, snapshot_id) in targets.items():
            namespace, name = table.split(".")
            started = time.perf_counter()
            con.execute(
                QUERY.format(table=f'"cat"."{namespace}"."{name}" AT (VERSION => {snapshot_id})')
            ).fetchone()
            seconds[label].append(time.perf_counter() - started)
    return {label: statistics.median(values[3:]) for label, values in seconds.items()}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.scan_shapes", description=__doc__.splitlines()[0])
    p.add_argument("table", help="<namespace>.<table>")
    p.add_argument("--rounds", type=int, default=25, help="timed rounds (at least 1), after 3 untimed")
    p.add_argument(
        "--history", action="store_true", help="then expire all but the current snapshot and scan again"
    )
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error("--rounds must be at least 1")

    from readers import duckdb_connect

    catalog = load_stack().catalog()
    table = catalog.load_table(args.table)
    current = table.current_snapshot().snapshot_id
    namespace, name = args.table.split(".")
    copy_name = f"{args.table}_scan_shapes_copy"
    if catalog.table_exists(copy_name):
        catalog.purge_table(copy_name)
    con = duckdb_connect()
    try:
        # The copy holds the rows of the snapshot measured as "current", whatever commits meanwhile.
        rows = con.execute(f'SELECT * FROM "cat"."{namespace}"."{name}" AT (VERSION => {current})').arrow()
        rows = (rows.read_all() if hasattr(rows, "read_all") else rows).cast(table.schema().as_arrow())
        copy = catalog.create_table(copy_name, schema=table.schema())
        copy.append(rows)
        copy_id = copy.refresh().current_snapshot().snapshot_id
        by_shape = shapes(table)
        print(
            f"{args.table}: {len(table.metadata.snapshots)} snapshots, {rows.num_rows} rows; copy: one file"
        )
        targets = {"copy": (copy_name, copy_id), "current": (args.table, current)} | {
            f"{op} {d}+{x} files, {m} manifests": (args.table, sid)
            for (op, d, x, m), sid in sorted(by_shape.items())
        }
        got = timed_rounds(con, targets, args.rounds)
        for label, s in got.items():
            print(f"  {label:42s} {s * 1000:7.2f} ms  {s / got['copy']:.2f}x")
        if args.history:
            # Metadata only: the files the expired snapshots alone referenced stay behind as orphans.
            table = catalog.load_table(args.table)
            current = table.current_snapshot().snapshot_id
            older = [s.snapshot_id for s in table.metadata.snapshots if s.snapshot_id != current]
            table.maintenance.expire_snapshots().by_ids(older).commit()
            got = timed_rounds(
                con, {"copy": (copy_name, copy_id), "current": (args.table, current)}, args.rounds
            )
            print(
                f"after expiring {len(older)} snapshots: current {got['current'] * 1000:.2f} ms, "
                f"copy {got['copy'] * 1000:.2f} ms ({got['current'] / got['copy']:.2f}x)"
            )
    finally:
        con.close()
        if catalog.table_exists(copy_name):
            catalog.purge_table(copy_name)


if __name__ == "__main__":
    main()
