"""What a user would otherwise build, on the same events in the same run.

* ``merge``: the Kafka source with ``foreachBatch`` running ``MERGE INTO`` (the hand-written upsert):
  decode with ``from_json``, keep the last change per key (``row_number`` over the offset), merge.
  The table is merge-on-read (position deletes), Iceberg's choice for frequent small upserts.
* ``append``: ``writeStream.format("iceberg")`` in append mode with the decoded inserts and updates.
* ``ceiling``: decode + last change per key + one Parquet write of the same rows, from memory to the
  local disk: no Kafka, no catalog, no commit. The same Spark, the same two cores.
* ``ceiling-arrow``: the same with icesink's Arrow decoder in ``mapInArrow`` tasks (what the sink's
  Arrow path does, minus Kafka, the object store, the catalog and the commit).

The decoding is what a user writes by hand: JVM expressions only (the Connect decimal's base64
two's complement turned into a decimal with ``unbase64``/``conv``), no Python UDF.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from bench.stack import Stack

_ROW = (
    "struct<id:bigint,name:string,country:string,amount:string,birthday:int,updated_at:bigint,"
    "active:boolean,version:int>"
)
_ENVELOPE = f"struct<before:{_ROW},after:{_ROW},op:string,ts_ms:bigint>"
DDL_COLUMNS = (
    "id bigint, name string, country string, amount decimal(10,2), birthday date, "
    "updated_at timestamp_ntz, active boolean, version int"
)
VALUE_COLUMNS = ["id", "name", "country", "amount", "birthday", "updated_at", "active", "version"]
TABLE_PROPERTIES = (
    "'format-version'='2', 'write.merge.mode'='merge-on-read', 'write.update.mode'='merge-on-read', "
    "'write.delete.mode'='merge-on-read', 'write.parquet.compression-codec'='zstd'"
)


def connect_decimal(wire: Any, scale: int) -> Any:
    """Kafka Connect Decimal (base64, big-endian two's complement) → decimal, for ≤ 18 digits."""
    from pyspark.sql import functions as F

    raw = F.unbase64(wire)
    hexed = F.hex(raw)
    unsigned = F.conv(hexed, 16, 10).cast("decimal(38,0)")
    negative = F.conv(F.substring(hexed, 1, 2), 16, 10).cast("int") >= 128
    modulus = F.pow(F.lit(2), F.length(raw) * 8).cast("decimal(38,0)")
    signed = F.when(negative, unsigned - modulus).otherwise(unsigned)
    return (signed / F.lit(10**scale)).cast(f"decimal(10,{scale})")


def decode_plain(records: Any) -> Any:
    """Kafka rows → (op, partition, offset, table columns), as a hand-written Spark job would."""
    from pyspark.sql import functions as F

    env = F.from_json(F.col("value").cast("string"), _ENVELOPE).alias("e")
    parsed = records.where(F.col("value").isNotNull()).select(env, "partition", "offset")
    image = F.when(F.col("e.op") == "d", F.col("e.before")).otherwise(F.col("e.after"))
    return parsed.select(
        F.col("e.op").alias("op"),
        "partition",
        "offset",
        image.getField("id").alias("id"),
        image.getField("name").alias("name"),
        image.getField("country").alias("country"),
        connect_decimal(image.getField("amount"), 2).alias("amount"),
        F.call_function("date_from_unix_date", image.getField("birthday")).alias("birthday"),
        F.call_function("timestamp_micros", image.getField("updated_at"))
        .cast("timestamp_ntz")
        .alias("updated_at"),
        image.getField("active").alias("active"),
        image.getField("version").alias("version"),
    )


def latest_changes(changes: Any) -> Any:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    last = Window.partitionBy("id").orderBy(F.col("offset").desc())
    return changes.withColumn("_rn", F.row_number().over(last)).where("_rn = 1").drop("_rn")


def merge_sql(table: str, view: str) -> str:
    sets = ", ".join(f"t.{c} = s.{c}" for c in VALUE_COLUMNS if c != "id")
    cols = ", ".join(VALUE_COLUMNS)
    vals = ", ".join(f"s.{c}" for c in VALUE_COLUMNS)
    return (
        f"MERGE INTO {table} t USING {view} s ON t.id = s.id "
        f"WHEN MATCHED AND s.op = 'd' THEN DELETE "
        f"WHEN MATCHED THEN UPDATE SET {sets} "
        f"WHEN NOT MATCHED AND s.op <> 'd' THEN INSERT ({cols}) VALUES ({vals})"
    )


@dataclass
class StreamBatch:
    batch_id: int
    committed_at: float  # wall clock: trigger start + trigger execution
    records: int
    duration_s: float
    end_offsets: dict[str, dict[str, int]] | None


@dataclass
class StreamRun:
    name: str
    table: str
    wall_s: float = 0.0
    batches: list[StreamBatch] = field(default_factory=list)


def _progress_batches(query: Any) -> list[StreamBatch]:
    out = []
    for progress in query.recentProgress:
        p = json.loads(progress.json)
        rows = int(p.get("numInputRows", 0))
        if rows == 0:
            continue
        started = datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp()
        duration = p.get("durationMs", {}).get("triggerExecution", 0) / 1000
        sources = p.get("sources") or [{}]
        end = sources[0].get("endOffset")
        out.append(
            StreamBatch(
                batch_id=int(p["batchId"]),
                committed_at=started + duration,
                records=rows,
                duration_s=duration,
                end_offsets=json.loads(end) if isinstance(end, str) else end,
            )
        )
    return out


class SparkStream:
    """One baseline streaming query in the bench's Spark session."""

    def __init__(
        self, spark: Any, stack: Stack, kind: str, topic: str, namespace: str, partition_by: str | None = None
    ) -> None:
        self.spark, self.stack, self.kind, self.topic = spark, stack, kind, topic
        self.table = f"rest.{namespace}.{kind}"
        self.run = StreamRun(kind, self.table)
        spark.sql(f"CREATE NAMESPACE IF NOT EXISTS rest.{namespace}")
        partitioned = f"PARTITIONED BY ({partition_by}) " if partition_by else ""
        spark.sql(
            f"CREATE TABLE {self.table} ({DDL_COLUMNS}) USING iceberg {partitioned}"
            f"TBLPROPERTIES ({TABLE_PROPERTIES})"
        )
        self.checkpoint = tempfile.mkdtemp(prefix=f"icesink-bench-{kind}-")
        self.query: Any = None

    def _merge_batch(self, batch: Any, batch_id: int) -> None:
        view = f"bench_changes_{self.kind}"
        latest_changes(decode_plain(batch)).createOrReplaceTempView(view)
        batch.sparkSession.sql(merge_sql(self.table, view))

    def start(self, max_offsets: int | None, trigger_s: float | None) -> None:
        reader = (
            self.spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", self.stack.kafka)
            .option("subscribe", self.topic)
            .option("startingOffsets", "earliest")
        )
        if max_offsets:
            reader = reader.option("maxOffsetsPerTrigger", str(max_offsets))
        records = reader.load()
        if self.kind == "merge":
            writer = records.writeStream.foreachBatch(self._merge_batch)
        else:
            rows = decode_plain(records).where("op <> 'd'").select(*VALUE_COLUMNS)
            writer = rows.writeStream.format("iceberg").outputMode("append").option("fanout-enabled", "true")
        writer = writer.option("checkpointLocation", self.checkpoint)
        writer = (
            writer.trigger(availableNow=True)
            if trigger_s is None
            else writer.trigger(processingTime=f"{trigger_s} seconds")
        )
        self._t0 = time.monotonic()
        self.query = writer.toTable(self.table) if self.kind == "append" else writer.start()

    def committed_offsets(self) -> dict[str, dict[str, int]]:
        batches = _progress_batches(self.query)
        return batches[-1].end_offsets or {} if batches else {}

    def wait(self, timeout: float) -> StreamRun:
        self.query.awaitTermination(timeout)
        return self.stop()

    def stop(self) -> StreamRun:
        if self.query.isActive:
            self.query.stop()
        self.run.wall_s = time.monotonic() - self._t0
        self.run.batches = _progress_batches(self.query)
        if self.query.exception() is not None:
            raise RuntimeError(f"baseline {self.kind} failed: {self.query.exception()}")
        shutil.rmtree(self.checkpoint, ignore_errors=True)
        return self.run


def _in_memory(spark: Any, stack: Stack, topic: str) -> Any:
    return (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", stack.kafka)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
        .select("key", "value", "topic", "partition", "offset", "timestamp")
        .persist()
    )


def _arrow_task(columns: list[Any], key: list[str], out: str, batches: Any) -> Any:
    """``mapInArrow`` body of ceiling-arrow: decode, last change per key, one Parquet file."""
    import uuid

    import pyarrow as pa
    import pyarrow.parquet as pq

    from service.data.arrow_decode import decode, latest_per_key

    table = pa.Table.from_batches(list(batches))
    rows = latest_per_key(
        decode(table["value"].to_pylist(), table["key"].to_pylist(), table, columns, key).rows, key
    )
    pq.write_table(rows, f"{out}/{uuid.uuid4().hex}.parquet", compression="zstd")
    yield pa.RecordBatch.from_pydict({"n": [rows.num_rows]})


def ceiling(spark: Any, stack: Stack, topic: str, repeats: int = 3, arrow: bool = False) -> dict[str, Any]:
    """Decode + last change per key + Parquet (zstd) on local disk, from records already in memory:
    with Spark's JVM expressions, or (``arrow``) with icesink's Arrow decoder in Python tasks."""
    from functools import partial

    from bench.workload import COLUMNS
    from service.model.columns import column_from_config

    records = _in_memory(spark, stack, topic)
    events = records.count()
    out = tempfile.mkdtemp(prefix="icesink-bench-ceiling-")
    columns = [
        column_from_config(c["name"], c["type"], c.get("required", False), c.get("encoding")) for c in COLUMNS
    ]
    times = []
    try:
        for attempt in range(repeats):
            started = time.monotonic()
            if arrow:
                os.makedirs(f"{out}/{attempt}")
                task = partial(_arrow_task, columns, ["id"], f"{out}/{attempt}")
                records.mapInArrow(task, "n long").collect()
            else:
                (
                    latest_changes(decode_plain(records))
                    .write.mode("overwrite")
                    .option("compression", "zstd")
                    .parquet(f"{out}/rows")
                )
            times.append(time.monotonic() - started)
    finally:
        records.unpersist()
        shutil.rmtree(out, ignore_errors=True)
    return {"events": events, "times_s": times}


def table_count(spark: Any, table: str) -> int:
    return int(spark.sql(f"SELECT count(*) AS n FROM {table}").collect()[0]["n"])
