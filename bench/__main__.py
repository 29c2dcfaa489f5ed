"""`python -m bench --size small|medium|large`: icesink against its baselines, side by side, in one run.

Every configuration reads the same events, produced to Kafka before any timing starts. Throughput is
the steady rate after the first batch (the first one pays for the JVM's warm-up, reported separately
as the cold rate); freshness runs the sink as a service while a producer writes at a steady rate.
Runs one after the other, never at the same time, so they do not share the two cores.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import baselines, figures, partition_scan, readside, report, soak
from bench.sink import Sink, sink_config, snapshots, unique
from bench.stack import REPO, Stack, load_stack, machine, spark_session
from bench.workload import (
    SteadyProducer,
    Workload,
    as_avro,
    delete_created_topics,
    ensure_topic,
    produce,
    produce_many,
    record_times,
)

ALL = (
    "icesink-upsert",
    "icesink-many",
    "icesink-append",
    "merge-into",
    "spark-append",
    "ceiling",
    "ceiling-arrow",
    "freshness",
    "read-side",
    "trino-partition",
    "soak",
)
# The parts that run on tables of their own (not the throughput workload), after the throughput parts.
TABLE_PARTS = ("freshness", "read-side", "trino-partition", "soak")
# The soak (~55 min here) runs only when asked for (`--only soak`), never as part of a size.
SIZED = ALL[: ALL.index("soak")]


@dataclass(frozen=True)
class Size:
    events: int
    keys: int
    batch: int  # max_offsets_per_trigger (and the baselines' maxOffsetsPerTrigger)
    freshness_s: int  # seconds of steady production
    read_commits: int  # read side and trino-partition: commits of read_events_per_commit events
    read_events_per_commit: int
    parts: tuple[str, ...]


SIZES = {
    "small": Size(30_000, 6_000, 5_000, 0, 0, 0, ALL[:7]),
    "medium": Size(160_000, 32_000, 20_000, 20, 30, 1_000, SIZED),
    "large": Size(1_000_000, 200_000, 200_000, 120, 100, 1_000, SIZED),
}


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class Bench:
    def __init__(self, stack: Stack, size: Size, args: argparse.Namespace, workdir: Path) -> None:
        self.stack, self.size, self.args, self.workdir = stack, size, args, workdir
        self.partitions = args.partitions
        self.variants = {
            label: Path(path).resolve() for label, path in (v.split("=", 1) for v in args.variant or [])
        }
        self.spark: Any = None
        self.results: dict[str, Any] = {"runs": {}}

    def session(self) -> Any:
        if self.spark is None:
            log("starting the baselines' Spark session")
            self.spark = spark_session(self.stack)
        return self.spark

    # -- the workload ------------------------------------------------------------------------------

    def prepare(self) -> None:
        log(f"generating {self.size.events:,} events over {self.size.keys:,} keys")
        self.workload = Workload(keys=self.size.keys, seed=self.args.seed)
        self.workload.generate(self.size.events)
        self.topic = unique("bench_cdc")
        ensure_topic(self.stack.kafka, self.topic, self.partitions)
        took = produce(self.stack.kafka, self.topic, self.workload.events)
        self.value_bytes = self.workload.value_bytes / len(self.workload.events)
        log(f"produced to {self.topic} in {took:.1f}s (mean value {self.value_bytes:.0f} bytes)")
        if self.args.avro:
            self.avro_topic = unique("bench_avro")
            avro = as_avro(self.workload.events, self.stack.schema_registry_url, self.avro_topic)
            ensure_topic(self.stack.kafka, self.avro_topic, self.partitions)
            took = produce(self.stack.kafka, self.avro_topic, avro)
            self.avro_value_bytes = sum(len(e.value) for e in avro) / len(avro)
            log(
                f"produced the same events in Avro to {self.avro_topic} in {took:.1f}s (mean value {self.avro_value_bytes:.0f} bytes)"
            )
        self.results["workload"] = {
            "events": len(self.workload.events),
            "keys": self.size.keys,
            "mean_value_bytes": round(self.value_bytes, 1),
            "live_rows": len(self.workload.live),
            "appended_rows": self.workload.appended,
            "ops": {op: sum(1 for e in self.workload.events if e.op == op) for op in "cud"},
            "partitions": self.partitions,
        }
        if self.args.avro:
            self.results["workload"]["avro_mean_value_bytes"] = round(self.avro_value_bytes, 1)

    # -- icesink -----------------------------------------------------------------------------------

    def icesink(
        self, mode: str, repo: Path = REPO, extra: dict[str, Any] | None = None, topic: str | None = None
    ) -> dict[str, Any]:
        name = unique(f"bench_{mode}")
        table = f"{name}.t"
        config = sink_config(
            self.stack, name, topic or self.topic, table, mode, self.size.batch, 1, extra=extra
        )
        sink = Sink(self.stack, self.workdir, name, config, repo)
        log(f"icesink {mode} from {repo}: {name} (log {sink.run.log_path})")
        sink.start("--until-caught-up")
        run = sink.wait(timeout=3600)
        snaps = [s for s in snapshots(self.stack, table) if s["seq"] is not None]
        counted = self.count(table) if not self.args.no_check else None
        commits = [(b.committed_at, b.records) for b in run.batches]
        return {
            "throughput": {
                **self._streamed(
                    f"icesink {mode}", commits, run.wall_s, counted, mode == "upsert", run.stream_s
                ),
                "cpu_s": run.cpu_s,
                "steady_cpu_s": run.steady_cpu_s,
                "cpu_ms_per_event": (
                    1000 * run.steady_cpu_s / run.steady_records
                    if run.steady_cpu_s and run.steady_records
                    else None
                ),
                "batch_s": figures.summarise([b.write_s + b.commit_s for b in run.batches]),
                "write_s": figures.summarise([b.write_s for b in run.batches]),
                "commit_s": figures.summarise([b.commit_s for b in run.batches]),
                "data_files": sum(s["data_files"] for s in snaps),
                "delete_files": sum(s["delete_files"] for s in snaps),
                "bytes_written": sum(s["bytes"] for s in snaps),
            },
            "memory": run.memory,
        }

    def many_tables(self, concurrency: int, held: int | None = None) -> dict[str, Any]:
        """The same events spread over ``--tables`` topics (a key stays in one topic), one table each,
        through one sink (``table.identifier: <ns>.{topic}``), upsert, the same batch size; with
        ``held``, each table's changes are held until it has that many (``commit.table_min_records``,
        ``table_max_period`` 30 s)."""
        n = self.args.tables
        if not hasattr(self, "many_topics"):
            prefix = unique("bench_many")
            self.many_topics = [f"{prefix}_t{i:03d}" for i in range(n)]
            per_topic: list[list[Any]] = [[] for _ in range(n)]
            for event in self.workload.events:
                per_topic[json.loads(event.key)["id"] % n].append(event)
            for topic in self.many_topics:
                ensure_topic(self.stack.kafka, topic, 1)
            took = produce_many(self.stack.kafka, dict(zip(self.many_topics, per_topic, strict=True)))
            log(f"produced the same events to {n} topics in {took:.1f}s")
        name = unique("bench_many")
        pattern = self.many_topics[0].rsplit("_t", 1)[0] + r"_t\d+"
        config = sink_config(
            self.stack, name, self.many_topics[0], f"{name}.{{topic}}", "upsert", self.size.batch, 1
        )
        config["kafka"].pop("topics")
        config["kafka"]["topic_pattern"] = pattern
        config["commit"]["concurrency"] = concurrency
        if held is not None:
            config["commit"] |= {"table_min_records": held, "table_max_period": "30s"}
        sink = Sink(self.stack, self.workdir, f"{name}_c{concurrency}", config)
        log(
            f"icesink, {n} tables, commit.concurrency {concurrency}, table_min_records {held}: {name} "
            f"(log {sink.run.log_path})"
        )
        sink.start("--until-caught-up")
        run = sink.wait(timeout=3600)
        counted = None
        if not self.args.no_check:
            counted = sum(self.count(f"{name}.{topic}") for topic in self.many_topics)
        commits = [(b.committed_at, b.records) for b in run.batches]
        return {
            "throughput": {
                **self._streamed(f"icesink {n} tables", commits, run.wall_s, counted, True, run.stream_s),
                "tables": n,
                "table_min_records": held,
                "snapshots_per_table": sum(b.snapshots for b in run.batches) / n,  # "batches": its plans
                "cpu_s": run.cpu_s,
                "batch_s": figures.summarise([b.write_s + b.commit_s for b in run.batches]),
                "write_s": figures.summarise([b.write_s for b in run.batches]),
                "commit_s": figures.summarise([b.commit_s for b in run.batches]),
            },
            "memory": run.memory,
        }

    def count(self, table: str) -> int:
        from readers import duckdb_connect

        con = duckdb_connect()
        try:
            quoted = ".".join(['"cat"', *[f'"{p}"' for p in table.split(".")]])
            row = con.execute(f"SELECT count(*) FROM {quoted}").fetchone()
            return int(row[0]) if row else 0
        finally:
            con.close()

    # -- baselines ---------------------------------------------------------------------------------

    def baseline(self, kind: str) -> dict[str, Any]:
        spark = self.session()
        stream = baselines.SparkStream(spark, self.stack, kind, self.topic, unique("bench_base"))
        log(f"baseline {kind}: {stream.table}")
        stream.start(self.size.batch, None)
        run = stream.wait(timeout=3600)
        counted = baselines.table_count(spark, stream.table) if not self.args.no_check else None
        commits = [(b.committed_at, b.records) for b in run.batches]
        return {
            "throughput": {
                **self._streamed(f"baseline {kind}", commits, run.wall_s, counted, kind == "merge"),
                "batch_s": figures.summarise([b.duration_s for b in run.batches]),
            }
        }

    def _streamed(
        self,
        who: str,
        commits: list[tuple[float, int]],
        wall_s: float,
        counted: int | None,
        upsert: bool,
        stream_s: float | None = None,
    ) -> dict[str, Any]:
        """Figures every streaming run has, after checking its table's row count against the model."""
        expected = len(self.workload.live) if upsert else self.workload.appended
        if counted is not None and counted != expected:
            raise AssertionError(f"{who}: table has {counted} rows, the model says {expected}")
        rate = figures.steady_rate(commits)
        events = sum(n for _, n in commits)
        return {
            "events": events,
            "batches": len(commits),
            "events_per_s": rate,
            "mb_per_s": rate * self.value_bytes / 1e6 if rate else None,
            "cold_events_per_s": events / wall_s,
            # from the stream's start to the last commit: the same measure for every icesink run
            "stream_events_per_s": events / stream_s if stream_s else None,
            "wall_s": wall_s,
            "rows_checked": counted,
        }

    def ceiling(self, arrow: bool = False) -> dict[str, Any]:
        log(f"ceiling{'-arrow' if arrow else ''}: decode + latest per key + Parquet, from memory")
        out = baselines.ceiling(self.session(), self.stack, self.topic, repeats=3, arrow=arrow)
        best = sorted(out["times_s"])[len(out["times_s"]) // 2]
        rate = out["events"] / best
        return {
            "throughput": {
                "events": out["events"],
                "events_per_s": rate,
                "mb_per_s": rate * self.value_bytes / 1e6,
                "batch_s": figures.summarise(out["times_s"]),
            }
        }

    # -- freshness ---------------------------------------------------------------------------------

    def freshness(self, who: str) -> dict[str, Any]:
        rate, period = self.args.rate, self.args.period
        topic = unique("bench_fresh")
        ensure_topic(self.stack.kafka, topic, self.partitions)
        workload = Workload(keys=self.size.keys, seed=self.args.seed + 1)
        produce(self.stack.kafka, topic, workload.generate(5_000))  # warm-up: the first batch
        steady = workload.generate(int(rate * self.size.freshness_s))
        log(f"freshness {who}: {len(steady):,} events at {rate:,}/s, commit period {period}s")
        if who == "icesink":
            name = unique("bench_fresh")
            config = sink_config(self.stack, name, topic, f"{name}.t", "upsert", None, period)
            sink = Sink(self.stack, self.workdir, name, config)
            sink.start()
            self._wait(lambda: bool(sink.batches()) or not sink.alive(), 600, "the first commit")
            if not sink.alive():
                raise RuntimeError(f"icesink stopped:\n{sink.run.log_tail()}")
        else:
            stream = baselines.SparkStream(self.session(), self.stack, "merge", topic, unique("bench_fresh"))
            stream.start(None, period)
            self._wait(lambda: bool(baselines._progress_batches(stream.query)), 600, "the first batch")
        producer = SteadyProducer(self.stack.kafka, topic, steady, rate)
        producer.start()
        producer.join()
        if producer.error:
            raise producer.error
        total = 5_000 + len(steady)
        if who == "icesink":
            table = f"{name}.t"

            def committed() -> int:
                snaps = [s for s in snapshots(self.stack, table) if s["offsets"]]
                return sum(int(v) for v in snaps[-1]["offsets"].get(topic, {}).values()) if snaps else 0

            self._wait(
                lambda: committed() >= total, self.args.drain_timeout, "the sink to catch up", fail=False
            )
            run = sink.stop()
            seq_time = {b.seq: b.committed_at for b in run.batches}
            commits = [
                (seq_time[s["seq"]], {int(p): int(o) for p, o in s["offsets"].get(topic, {}).items()})
                for s in snapshots(self.stack, table)
                if s["seq"] in seq_time
            ]
            batch_s = [b.write_s + b.commit_s for b in run.batches[1:]]
            memory = run.memory
        else:

            def committed() -> int:
                return sum(int(v) for v in stream.committed_offsets().get(topic, {}).values())

            self._wait(lambda: committed() >= total, self.args.drain_timeout, "MERGE to catch up", fail=False)
            srun = stream.stop()
            commits = [
                (b.committed_at, {int(p): int(o) for p, o in (b.end_offsets or {}).get(topic, {}).items()})
                for b in srun.batches
            ]
            batch_s = [b.duration_s for b in srun.batches[1:]]
            memory = {}
        times = record_times(self.stack.kafka, topic)
        values, missing = figures.freshness(times, commits, producer.started_at or 0)
        return {
            "freshness": {
                "rate": rate,
                "commit_period_s": period,
                "events": len(steady),
                "producer_behind_s": producer.behind_s,
                "freshness_s": figures.summarise(values),
                "not_committed": missing,
                "batch_s": figures.summarise(batch_s),
            },
            **({"memory": memory} if memory else {}),
        }

    @staticmethod
    def _wait(done: Any, timeout: float, what: str, fail: bool = True) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if done():
                return
            time.sleep(1)
        if fail:
            raise TimeoutError(f"waited {timeout}s for {what}")
        log(f"gave up waiting for {what} after {timeout}s")

    # -- read side ---------------------------------------------------------------------------------

    def _landed_in_commits(
        self, prefix: str, seed: int, what: str, extra: dict[str, Any] | None = None
    ) -> tuple[str, Workload, str]:
        """A fresh topic of read_commits x read_events_per_commit upsert events, landed by icesink in that
        many commits (one per batch): the topic, the workload that made it, the table."""
        commits, per = self.size.read_commits, self.size.read_events_per_commit
        topic = unique(prefix)
        ensure_topic(self.stack.kafka, topic, self.partitions)
        workload = Workload(keys=max(per * 5, 5_000), seed=self.args.seed + seed)
        produce(self.stack.kafka, topic, workload.generate(commits * per))
        name = unique(prefix)
        table = f"{name}.t"
        log(f"{what}: {commits} commits of {per} events into {table}")
        config = sink_config(self.stack, name, topic, table, "upsert", per, 1, extra=extra)
        sink = Sink(self.stack, self.workdir, name, config)
        sink.start("--until-caught-up")
        sink.wait(timeout=3600)
        return topic, workload, table

    def read_side(self) -> dict[str, Any]:
        per = self.size.read_events_per_commit
        _, workload, table = self._landed_in_commits("bench_read", 2, "read side")
        spark = self.session()
        before = readside.scan_times(spark, self.stack, table)
        if before["rows"] != len(workload.live):
            raise AssertionError(f"read side: {before['rows']} rows, the model says {len(workload.live)}")
        compaction_s = readside.compact(spark, table)
        after = readside.scan_times(spark, self.stack, table)
        if after["rows"] != before["rows"]:
            raise AssertionError(f"compaction changed the row count: {before['rows']} → {after['rows']}")
        return {
            "commits": before["snapshots"],
            "events_per_commit": per,
            "before": before,
            "after": after,
            "compaction_s": compaction_s,
        }

    def trino_partition(self) -> dict[str, Any]:
        """The icesink table partitioned by country (global deletes) vs the same batches by MERGE INTO
        (partition-scoped deletes), itself compacted and a copy, read by Trino with WHERE country = 'de'
        (bench/partition_scan.py)."""
        commits, per = self.size.read_commits, self.size.read_events_per_commit
        extra = {"table": {"partition_by": [partition_scan.PARTITION_BY]}}
        topic, workload, table = self._landed_in_commits(
            "bench_trino", 3, "trino partition predicate (partitioned by country)", extra
        )
        stream = baselines.SparkStream(
            self.session(), self.stack, "merge", topic, unique("bench_trino"), partition_scan.PARTITION_BY
        )
        log(f"trino partition predicate: the same batches by MERGE INTO {stream.table}")
        stream.start(per, None)
        stream.wait(timeout=3600)
        tables = {"icesink": table, "merge-into": stream.table.removeprefix("rest.")}
        out = {label: partition_scan.measure(self.stack, t) for label, t in tables.items()}
        compaction_s = readside.compact(self.session(), table)
        out["icesink compacted"] = partition_scan.measure(self.stack, table)
        out["copy"] = partition_scan.measure(self.stack, partition_scan.copy(table))
        results = {label: r["result"] for label, r in out.items()}
        if len({json.dumps(r) for r in results.values()}) != 1:
            raise AssertionError(f"trino partition predicate: the tables disagree: {results}")
        return {
            "commits": commits,
            "events_per_commit": per,
            "live_rows": len(workload.live),
            "predicate": partition_scan.PREDICATE,
            "tables": out,
            "compaction_s": compaction_s,
        }

    def _throughput_part(self, part: str, runs: dict[str, Any]) -> None:
        load = os.getloadavg()[0]
        if part in ("icesink-upsert", "icesink-append"):
            mode = part.split("-", 1)[1]
            runs[part] = self.icesink(mode)
            for label, repo in self.variants.items():
                key = f"{part}@{label}"
                runs[key] = self.icesink(mode, repo)
                runs[key]["load_1m"] = round(os.getloadavg()[0], 2)
                log(f"{key}: {runs[key]['throughput'].get('events_per_s') or 0:,.0f} events/s")
            settings = {
                "spark-reader": {"source": {"reader": "spark"}},
                "spark-decoder": {"source": {"decoder": "spark"}},
                "equality": {"table": {"delete_format": "equality"}},
                "cluster": {"spark": cluster_spark()},
            }
            if self.args.avro:
                settings["avro"] = {
                    "source": {
                        "format": "debezium-avro",
                        "schema_registry": {"url": self.stack.schema_registry_url},
                    },
                    "table": {"columns": []},  # from the writer schema, as in production
                }
            for label, extra in settings.items():
                if not getattr(self.args, label.replace("-", "_")) or (
                    label == "position" and mode != "upsert"
                ):
                    continue
                key = f"{part}@{label}"
                runs[key] = self.icesink(
                    mode, extra=extra, topic=self.avro_topic if label == "avro" else None
                )
                runs[key]["load_1m"] = round(os.getloadavg()[0], 2)
                log(f"{key}: {runs[key]['throughput'].get('events_per_s') or 0:,.0f} events/s")
        elif part == "icesink-many":
            if not self.args.held_only:
                runs[f"icesink-{self.args.tables}-tables"] = self.many_tables(concurrency=8)
            for held in self.args.held:
                key = f"icesink-{self.args.tables}-tables@held{held}"
                runs[key] = self.many_tables(concurrency=8, held=held)
                runs[key]["load_1m"] = round(os.getloadavg()[0], 2)
                log(
                    f"{key}: {runs[key]['throughput'].get('stream_events_per_s') or 0:,.0f} events/s (stream)"
                )
            if self.args.many_serial:
                key = f"icesink-{self.args.tables}-tables@c1"
                runs[key] = self.many_tables(concurrency=1)
                log(f"{key}: {runs[key]['throughput'].get('events_per_s') or 0:,.0f} events/s")
            if self.args.held_only:
                return
            part = f"icesink-{self.args.tables}-tables"
        elif part == "merge-into":
            runs[part] = self.baseline("merge")
        elif part == "spark-append":
            runs[part] = self.baseline("append")
        elif part in ("ceiling", "ceiling-arrow"):
            runs[part] = self.ceiling(arrow=part == "ceiling-arrow")
        runs[part]["load_1m"] = round(load, 2)
        log(f"{part}: {runs[part]['throughput'].get('events_per_s') or 0:,.0f} events/s")

    # -- all of it ---------------------------------------------------------------------------------

    def run(self, parts: list[str]) -> dict[str, Any]:
        r = self.results
        r["load_start"] = [round(x, 2) for x in os.getloadavg()]
        r["machine"] = machine()
        r["params"] = {
            "size": self.args.size,
            **{k: v for k, v in self.size.__dict__.items() if k != "parts"},
            "partitions": self.partitions,
            "freshness_rate": self.args.rate,
            "commit_period_s": self.args.period,
            "parts": parts,
        }
        r["started"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
        started = time.monotonic()
        throughput_parts = [p for p in parts if p not in TABLE_PARTS]
        if throughput_parts:
            self.prepare()
        runs = r["runs"]
        for part in throughput_parts:
            try:
                self._throughput_part(part, runs)
            except Exception as exc:  # keep the other figures
                log(f"{part} failed: {exc!r}")
                r.setdefault("errors", []).append(f"{part}: {exc!r}")
        if "freshness" in parts:
            for who, key in (("icesink", "icesink-upsert"), ("merge", "merge-into")):
                try:
                    runs.setdefault(key, {}).update(self.freshness(who))
                except Exception as exc:  # keep the other figures
                    log(f"freshness {who} failed: {exc!r}")
                    r.setdefault("errors", []).append(f"freshness {who}: {exc!r}")
        for part, key, what, measure in (
            ("read-side", "read_side", "read side", self.read_side),
            ("trino-partition", "trino_partition", "trino partition predicate", self.trino_partition),
        ):
            if part in parts:
                try:
                    r[key] = measure()
                except Exception as exc:  # keep the other figures
                    log(f"{what} failed: {exc!r}")
                    r.setdefault("errors", []).append(f"{what}: {exc!r}")
        if "soak" in parts:
            try:
                r["soak"] = soak.Soak(self.stack, self.workdir, self.soak_params(), self.session).run()
            except Exception as exc:  # keep the other figures
                log(f"soak failed: {exc!r}\n{traceback.format_exc()}")
                r.setdefault("errors", []).append(f"soak: {exc!r}")
        r["ratios"] = self.ratios()
        r["load_end"] = [round(x, 2) for x in os.getloadavg()]
        r["duration_s"] = round(time.monotonic() - started, 1)
        return r

    def soak_params(self) -> soak.SoakParams:
        a = self.args
        return soak.SoakParams(
            commits=a.soak_commits,
            every=a.soak_every,
            per_commit=a.soak_per_commit,
            period_s=a.soak_period,
            keys=a.soak_keys,
            scan_timeout_s=a.soak_scan_timeout,
            seed=a.seed,
            delete_format=a.soak_delete_format,
            beside_equality=a.soak_beside_equality,
            compact_every=a.soak_compact_every,
        )

    def ratios(self) -> dict[str, str]:
        runs = self.results["runs"]

        def rate(name: str, measure: str = "events_per_s") -> float | None:
            return runs.get(name, {}).get("throughput", {}).get(measure)

        out = {}
        pairs = [
            ("icesink-upsert", "merge-into", "upsert vs MERGE INTO (target ≥ 5x)"),
            (
                f"icesink-{self.args.tables}-tables",
                "icesink-upsert",
                f"{self.args.tables} tables vs one table, upsert (target ≥ 0.5x)",
            ),
            ("icesink-append", "spark-append", "append vs Spark writeStream"),
            ("ceiling", "icesink-upsert", "ceiling vs icesink upsert (target ≤ 3x)"),
            ("ceiling-arrow", "icesink-upsert", "ceiling (Arrow decoder) vs icesink upsert"),
        ]
        for a, b, label in pairs:
            if rate(a) and rate(b):
                out[label] = f"{rate(a) / rate(b):.2f}x"  # type: ignore[operator]
        # Held tables commit in bursts: compared by the rate from the stream's start to the last commit.
        one = rate("icesink-upsert", "stream_events_per_s")
        for name in [
            f"icesink-{self.args.tables}-tables",
            *(f"icesink-{self.args.tables}-tables@held{h}" for h in self.args.held),
        ]:
            many = rate(name, "stream_events_per_s")
            if one and many:
                out[f"{name} vs icesink-upsert, stream start to last commit (target ≥ 0.5x)"] = (
                    f"{many / one:.2f}x"
                )
        fresh = runs.get("icesink-upsert", {}).get("freshness")
        if fresh and fresh["freshness_s"]["p99"] is not None:
            out["icesink freshness p99 / commit period (target ≤ 2)"] = (
                f"{fresh['freshness_s']['p99'] / fresh['commit_period_s']:.2f}"
            )
        return out


def cluster_spark() -> dict[str, Any]:
    """The ``spark`` section of a sink on the stack's standalone cluster: the driver on loopback with
    the bench's driver memory, executors that fit a 1 GB worker (the tests' cluster sinks use less)."""
    return {
        "master": os.environ.get("ICESINK_SPARK_MASTER", ""),
        "conf": {
            "spark.driver.memory": "2g",
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.executor.memory": "768m",
        },
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument("--size", choices=sorted(SIZES), default="small")
    p.add_argument(
        "--only", help=f"comma-separated parts to run (default: the size's); any of {','.join(ALL)}"
    )
    p.add_argument("--rate", type=int, default=10_000, help="steady produce rate for freshness (events/s)")
    p.add_argument(
        "--period", type=float, default=5.0, help="commit period (trigger interval) for freshness, s"
    )
    p.add_argument("--partitions", type=int, default=2, help="Kafka partitions of the bench topics")
    p.add_argument("--events", type=int, help="override the size's number of events")
    p.add_argument("--batch", type=int, help="override the size's max_offsets_per_trigger")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--tables", type=int, default=100, help="tables (and topics) of the icesink-many part")
    p.add_argument(
        "--held",
        type=int,
        nargs="*",
        default=[1000],
        help="also run the many-tables part holding each table's changes until it has this many "
        "(commit.table_min_records; one run per value, none with --held alone)",
    )
    p.add_argument(
        "--held-only",
        action="store_true",
        help="run the many-tables part only with --held (not also without commit.table_min_records)",
    )
    p.add_argument(
        "--many-serial",
        action="store_true",
        help="also run the many-tables part with commit.concurrency 1 (tables committed one by one)",
    )
    p.add_argument(
        "--spark-reader",
        action="store_true",
        help="also run each icesink configuration with source.reader=spark (Spark's Kafka source reads "
        "the records in the JVM, as before the task reader)",
    )
    p.add_argument(
        "--spark-decoder",
        action="store_true",
        help="also run each icesink configuration with source.decoder=spark (every batch through Spark's decoder)",
    )
    p.add_argument(
        "--avro",
        action="store_true",
        help="also run each icesink configuration on the same events in Avro (Confluent wire format, "
        "schemas in the stack's registry), side by side with the JSON run",
    )
    p.add_argument(
        "--cluster",
        action="store_true",
        help="also run icesink-upsert and icesink-append on the stack's Spark standalone cluster (a master, "
        "two 1-core workers: $ICESINK_SPARK_MASTER), side by side with local[2]; the cluster's workers use "
        "the same two cores, so this measures what the cluster costs, not what more machines give",
    )
    p.add_argument(
        "--equality",
        action="store_true",
        help="also run icesink-upsert with table.delete_format=equality (the tables the bench creates get "
        "position deletes by default)",
    )
    p.add_argument(
        "--variant",
        action="append",
        metavar="LABEL=PATH",
        help="also run icesink from another checkout (e.g. a git worktree with a change), side by side",
    )
    p.add_argument(
        "--soak-commits", type=int, default=2000, help="soak: commits per table (one per micro-batch)"
    )
    p.add_argument("--soak-every", type=int, default=200, help="soak: measure both tables every N commits")
    p.add_argument(
        "--soak-per-commit", type=int, default=25, help="soak: events per commit (max_offsets_per_trigger)"
    )
    p.add_argument(
        "--soak-period",
        type=float,
        default=2.0,
        help="soak: seconds between the sinks' micro-batches (commit.trigger_interval), one commit each",
    )
    p.add_argument("--soak-keys", type=int, default=10_000, help="soak: keys of the soak's workload")
    p.add_argument(
        "--soak-scan-timeout",
        type=float,
        default=180,
        help="soak: a scan still running after this many seconds is cancelled and reported as timed out",
    )
    p.add_argument(
        "--soak-delete-format",
        choices=("equality", "position"),
        default="equality",
        help="soak: table.delete_format of the maintained and the unmaintained table",
    )
    p.add_argument(
        "--soak-beside-equality",
        action="store_true",
        help="soak: also a third sink into a table with equality deletes and no maintenance, measured like "
        "the unmaintained one (with --soak-delete-format position)",
    )
    p.add_argument(
        "--soak-compact-every",
        type=int,
        default=None,
        help="soak: compact the maintained table every N commits instead of after every delete file",
    )
    p.add_argument("--drain-timeout", type=float, default=300)
    p.add_argument("--no-check", action="store_true", help="skip the row-count check of each table")
    p.add_argument("--out", default="bench/results", help="directory for <size>-<time>.json/.png and logs")
    args = p.parse_args(argv)
    size = SIZES[args.size]
    if args.events or args.batch:
        size = Size(
            **{**size.__dict__, "events": args.events or size.events, "batch": args.batch or size.batch}
        )
    parts = args.only.split(",") if args.only else list(size.parts)
    unknown = [x for x in parts if x not in ALL]
    if unknown:
        p.error(f"unknown part(s): {', '.join(unknown)}")
    reads = "read-side" in parts or "trino-partition" in parts
    if ("freshness" in parts and not size.freshness_s) or (reads and not size.read_commits):
        size = Size(
            **{
                **size.__dict__,
                "freshness_s": size.freshness_s or 20,
                "read_commits": size.read_commits or 10,
                "read_events_per_commit": size.read_events_per_commit or 1_000,
            }
        )
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    workdir = Path(tempfile.mkdtemp(prefix=f"bench-{stamp}-", dir=out))
    stack = load_stack()
    bench = Bench(stack, size, args, workdir)
    try:
        results = bench.run(parts)
    finally:
        if bench.spark is not None:
            bench.spark.stop()
        delete_created_topics(stack.kafka)
    base = out / f"{'soak' if parts == ['soak'] else args.size}-{stamp}"
    report.write_json(results, base.with_suffix(".json"))
    written = [base.with_suffix(".json")]
    if any(r.get("throughput") for r in results["runs"].values()):
        report.plot(results, base.with_suffix(".png"))
        written.append(base.with_suffix(".png"))
    if results.get("soak"):
        soak.plot(results["soak"], base.with_name(f"{base.name}-soak.png"))
        written.append(base.with_name(f"{base.name}-soak.png"))
    print(report.table(results))
    print(f"\nwrote {', '.join(map(str, written))} (sink configs and logs in {workdir})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
