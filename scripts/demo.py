"""Demo: a sample table's change stream → Kafka → icesink → Iceberg, shown as a reader sees it."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pyiceberg.catalog import load_catalog  # noqa: E402

from readers import duckdb_connect  # noqa: E402
from service.sample import SampleSource, ensure_topic, produce  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--events", type=int, default=5000)
    p.add_argument("--keys", type=int, default=1000)
    args = p.parse_args()
    env = os.environ
    run_id = time.strftime("%Y%m%d%H%M%S")
    topic, table, sink_id = f"demo.shop.customers.{run_id}", f"demo.customers_{run_id}", f"demo-{run_id}"
    workdir = REPO / ".cache" / "demo"
    workdir.mkdir(parents=True, exist_ok=True)
    config_path = workdir / f"{sink_id}.yaml"
    config = {
        "sink_id": sink_id,
        "kafka": {"bootstrap_servers": "${ICESINK_KAFKA_BOOTSTRAP}", "topics": [topic]},
        "table": {"identifier": table, "key": ["id"], "mode": "upsert", "partition_by": ["country"]},
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

    print(f"== 1. a sample database's change stream → Kafka topic {topic}")
    source = SampleSource(keys=args.keys, seed=int(run_id[-6:]))
    ensure_topic(env["ICESINK_KAFKA_BOOTSTRAP"], topic, 3)
    changes = [source.next_change() for _ in range(args.events)]
    produce(env["ICESINK_KAFKA_BOOTSTRAP"], topic, changes)
    ops = {op: sum(1 for c in changes if c.op == op) for op in "cud"}
    print(
        f"   {len(changes)} changes (inserts {ops['c']}, updates {ops['u']}, deletes {ops['d']}); "
        f"the source table now holds {len(source.rows)} rows"
    )

    print(f"== 2. icesink run --config {config_path.relative_to(REPO)} --until-caught-up")
    started = time.monotonic()
    code = subprocess.call(
        [str(REPO / ".venv/bin/icesink"), "run", "--config", str(config_path), "--until-caught-up"]
    )
    if code != 0:
        print(f"icesink exited {code}", file=sys.stderr)
        return code
    print(f"   caught up in {time.monotonic() - started:.1f}s")

    print(f"== 3. the table {table} as DuckDB reads it (merge-on-read: data + equality-delete files)")
    con = duckdb_connect()
    ident = ".".join(f'"{p}"' for p in ["cat", *table.split(".")])
    count = con.execute(f"SELECT count(*) FROM {ident}").fetchone()[0]
    print(f"   {count} rows")
    for row in con.execute(
        f"SELECT id, name, country, amount, updated_at FROM {ident} ORDER BY id LIMIT 5"
    ).fetchall():
        print("  ", row)
    by_country = con.execute(f"SELECT country, count(*) FROM {ident} GROUP BY 1 ORDER BY 1").fetchall()
    print("   rows per country partition:", dict(by_country))
    got = {r[0]: r[1] for r in con.execute(f"SELECT id, version FROM {ident}").fetchall()}
    want = {r["id"]: r["version"] for r in source.expected_rows()}
    print(f"   matches the source table exactly: {'yes' if got == want else 'NO'}")

    print("== 4. snapshot summaries (what each commit covered)")
    catalog = load_catalog(
        "rest", **{k: os.path.expandvars(v) for k, v in config["catalog"].items() if k != "name"}
    )
    for snap in catalog.load_table(table).snapshots():
        s = snap.summary
        keys = ("icesink.seq", "icesink.epoch", "added-records", "added-equality-deletes", "icesink.offsets")
        print(
            f"   snapshot {snap.snapshot_id}: " + ", ".join(f"{k}={s.get(k)}" for k in keys if s and s.get(k))
        )
    status = subprocess.run(
        [str(REPO / ".venv/bin/icesink"), "status", "--config", str(config_path)],
        capture_output=True,
        text=True,
        check=True,
    )
    print("== 5. icesink status")
    print("\n".join("   " + line for line in status.stdout.splitlines()))
    print(
        f'\nLook yourself: eval "$(dev/stack env)" && .venv/bin/python -c "from readers import duckdb_connect; '
        f"print(duckdb_connect().sql('SELECT * FROM cat.{table} LIMIT 10'))\""
    )
    return 0 if got == want else 1


if __name__ == "__main__":
    sys.exit(main())
