"""Demo: a sample database's change stream → Kafka → icesink → one Iceberg table per source table,
shown as a reader sees them."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pyiceberg.catalog import load_catalog  # noqa: E402

from readers import duckdb_connect  # noqa: E402
from service.sample import SampleSource, ensure_topic, produce  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--events", type=int, default=5000, help="changes per table")
    p.add_argument("--keys", type=int, default=1000)
    args = p.parse_args()
    env = os.environ
    run_id = time.strftime("%Y%m%d%H%M%S")
    # One sink, two source tables: each table's topic as a Debezium connector with this topic.prefix
    # names it, each landing in a table of its own named from the events' source section.
    prefix, namespace, sink_id = f"demo{run_id}", f"demo_{run_id}", f"demo-{run_id}"
    names = ("customers", "orders")
    topics = {name: f"{prefix}.public.{name}" for name in names}
    tables = {name: f"{namespace}.{name}" for name in names}
    workdir = REPO / ".cache" / "demo"
    workdir.mkdir(parents=True, exist_ok=True)
    config_path = workdir / f"{sink_id}.yaml"
    config: dict[str, Any] = {
        "sink_id": sink_id,
        "kafka": {
            "bootstrap_servers": "${ICESINK_KAFKA_BOOTSTRAP}",
            "topic_pattern": rf"{prefix}\.public\..*",
        },
        # every table: upsert, keyed by the fields of the Kafka record key (Debezium's primary key)
        "table": {"identifier": f"{namespace}.{{source.table}}", "mode": "upsert"},
        # what differs for one table
        "tables": {tables["customers"]: {"partition_by": ["country"]}},
        "catalog": {
            "name": "rest",
            "type": "rest",
            "uri": "${ICESINK_REST_URI}",
            "s3.endpoint": "${ICESINK_S3_ENDPOINT}",
            "s3.access-key-id": "${AWS_ACCESS_KEY_ID}",
            "s3.secret-access-key": "${AWS_SECRET_ACCESS_KEY}",
            "s3.region": "${AWS_REGION}",
        },
        "txnlog": {"dsn": "${ICESINK_PG_DSN}"},
        "spark": {"master": "local[2]"},
    }
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))

    print(f"== 1. a sample database's change stream → Kafka topics {', '.join(topics.values())}")
    sources = {
        name: SampleSource(keys=args.keys, seed=int(run_id[-6:]) + i, table=name)
        for i, name in enumerate(names)
    }
    for name, source in sources.items():
        ensure_topic(env["ICESINK_KAFKA_BOOTSTRAP"], topics[name], 3)
        changes = [source.next_change() for _ in range(args.events)]
        produce(env["ICESINK_KAFKA_BOOTSTRAP"], topics[name], changes)
        ops = {op: sum(1 for c in changes if c.op == op) for op in "cud"}
        print(
            f"   {name}: {len(changes)} changes (inserts {ops['c']}, updates {ops['u']}, deletes {ops['d']}); "
            f"the source table now holds {len(source.rows)} rows"
        )

    print(f"== 2. icesink run --config {config_path.relative_to(REPO)} --until-caught-up")
    print(
        f"   (topic_pattern {config['kafka']['topic_pattern']}, table.identifier {config['table']['identifier']})"
    )
    started = time.monotonic()
    code = subprocess.call(
        [str(REPO / ".venv/bin/icesink"), "run", "--config", str(config_path), "--until-caught-up"]
    )
    if code != 0:
        print(f"icesink exited {code}", file=sys.stderr)
        return code
    print(f"   caught up in {time.monotonic() - started:.1f}s")

    con = duckdb_connect()
    catalog = load_catalog(
        "rest", **{k: os.path.expandvars(v) for k, v in config["catalog"].items() if k != "name"}
    )
    exact = True
    for step, name in enumerate(names, start=3):
        table = tables[name]
        print(
            f"== {step}. the table {table} as DuckDB reads it (merge-on-read: data + equality-delete files)"
        )
        ident = ".".join(f'"{p}"' for p in ["cat", *table.split(".")])
        (count,) = con.execute(f"SELECT count(*) FROM {ident}").fetchone() or (0,)
        iceberg_table = catalog.load_table(table)
        key = sorted(iceberg_table.schema().identifier_field_names())
        spec = [f.name for f in iceberg_table.spec().fields]
        print(f"   {count} rows; key {key} (from the record keys), partitioned by {spec or 'nothing'}")
        for row in con.execute(
            f"SELECT id, name, country, amount, updated_at FROM {ident} ORDER BY id LIMIT 3"
        ).fetchall():
            print("  ", row)
        got = {r[0]: r[1] for r in con.execute(f"SELECT id, version FROM {ident}").fetchall()}
        want = {r["id"]: r["version"] for r in sources[name].expected_rows()}
        print(f"   matches the source table exactly: {'yes' if got == want else 'NO'}")
        exact = exact and got == want
        for snap in iceberg_table.snapshots():
            s = snap.summary
            keys = (
                "icesink.seq",
                "icesink.epoch",
                "added-records",
                "added-equality-deletes",
                "icesink.offsets",
            )
            print(
                f"   snapshot {snap.snapshot_id}: "
                + ", ".join(f"{k}={s.get(k)}" for k in keys if s and s.get(k))
            )
    status = subprocess.run(
        [str(REPO / ".venv/bin/icesink"), "status", "--config", str(config_path)],
        capture_output=True,
        text=True,
        check=True,
    )
    print(f'== {len(names) + 3}. icesink status (one entry per table under "tables")')
    print("\n".join("   " + line for line in status.stdout.splitlines()))
    print(
        f'\nLook yourself: eval "$(dev/stack env)" && .venv/bin/python -c "from readers import duckdb_connect; '
        f"print(duckdb_connect().sql('SELECT * FROM cat.{tables[names[0]]} LIMIT 10'))\""
    )
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
