"""``icesink``: run the sink, show its state, check its configuration and servers."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from collections.abc import Callable
from datetime import timedelta

from service.config import ConfigError, SinkConfig, load_config
from service.logs import setup_logging
from service.model.columns import SchemaError
from service.units import parse_duration

logger = logging.getLogger("icesink")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_CONFIG = 2
EXIT_FENCED = 3


def _run(config: SinkConfig, args: argparse.Namespace) -> int:
    from service.commit.committer import LogBehindTable, PlanUncommittable
    from service.health import Health
    from service.job import SinkFenced, SinkJob
    from service.kafka.lookups import SourceError
    from service.kafka.retention import OffsetsGone
    from service.pipeline.routes import Unroutable
    from service.spark_jars import SparkJarsError
    from service.spark_session import SparkUnavailable

    health = Health()
    if config.health.port is not None:
        health.serve(config.health.host, config.health.port)
    job = SinkJob(config, health)
    signal.signal(signal.SIGTERM, lambda *_: job.request_stop())
    signal.signal(signal.SIGINT, lambda *_: job.request_stop())
    try:
        job.run(until_caught_up=args.until_caught_up)
    except SinkFenced as exc:
        logger.error("stopping: this replica was fenced by a newer one and wrote nothing more (%s)", exc)
        return EXIT_FENCED
    except (OffsetsGone, Unroutable) as exc:
        logger.error("stopping: %s", exc)
        return EXIT_CONFIG
    except (
        SchemaError,
        SourceError,
        SparkJarsError,
        SparkUnavailable,
        LogBehindTable,
        PlanUncommittable,
    ) as exc:
        logger.error("cannot start: %s", exc)
        return EXIT_CONFIG
    finally:
        # The run's connections and server end with it, so that a process that runs the sink again
        # (the test suite's warm Spark session, tests/sink/host.py) starts from none of them.
        job.log.close()
        health.close()
    return EXIT_OK


def _status(config: SinkConfig, args: argparse.Namespace) -> int:
    from service.ops.status import status

    print(json.dumps(status(config), indent=2))
    return EXIT_OK


def _check(config: SinkConfig, args: argparse.Namespace) -> int:
    from service.ops.check import Outcome, run_checks

    outcome = run_checks(config, args.timeout.total_seconds())
    if outcome is Outcome.ABANDONED:  # leave the check that did not answer behind, now
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(EXIT_FAILED)
    return EXIT_OK if outcome is Outcome.PASSED else EXIT_FAILED


def _orphans(config: SinkConfig, args: argparse.Namespace) -> int:
    from service.maintenance.orphans import delete_orphans, find_orphans, find_sink_orphans

    if not config.table.is_template:
        report = find_orphans(config, args.older_than)
        if args.delete:
            delete_orphans(config, report)
        print(json.dumps(report.to_json(), indent=2))
        return EXIT_OK
    reports = find_sink_orphans(config, args.older_than)
    for report in reports if args.delete else []:
        delete_orphans(config, report)
    print(json.dumps({"sink_id": config.sink_id, "tables": [r.to_json() for r in reports]}, indent=2))
    return EXIT_OK


def _maintain(config: SinkConfig, args: argparse.Namespace) -> int:
    from service.ops.maintain import maintain

    return maintain(config, once=args.once)


def _txnlog_reseed(config: SinkConfig, args: argparse.Namespace) -> int:
    from service.ops.reseed import NothingToReseed, reseed
    from txnlog import InvalidPhase

    try:
        done = reseed(config)
    except (NothingToReseed, InvalidPhase) as exc:
        logger.error("nothing re-seeded: %s", exc)
        return EXIT_CONFIG
    print(json.dumps(done, indent=2))
    return EXIT_OK


def _txnlog_abandon(config: SinkConfig, args: argparse.Namespace) -> int:
    from service.ops.abandon import abandon

    outcome = abandon(config, force=args.force)
    print(outcome.report)
    return EXIT_FAILED if outcome.refused else EXIT_OK


def _offsets_reset(config: SinkConfig, args: argparse.Namespace) -> int:
    from service.kafka.lookups import SourceError
    from service.ops.offsets_reset import ResetRefused, reset

    if args.partition is not None and args.topic is None:
        print("icesink: offsets reset: --partition needs --topic", file=sys.stderr)
        return EXIT_CONFIG
    try:
        result = reset(config, args.to, args.topic, args.partition)
    except (ResetRefused, SourceError) as exc:
        print(f"icesink: offsets reset: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    print(json.dumps(result, indent=2))
    return EXIT_OK


def _duration(text: str) -> timedelta:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive_duration(text: str) -> timedelta:
    duration = _duration(text)
    if duration <= timedelta(0):
        raise argparse.ArgumentTypeError(f"{text}: must be more than 0")
    return duration


COMMANDS: dict[str, Callable[[SinkConfig, argparse.Namespace], int]] = {
    "run": _run,
    "status": _status,
    "check": _check,
    "orphans": _orphans,
    "maintain": _maintain,
    "txnlog reseed": _txnlog_reseed,
    "txnlog abandon": _txnlog_abandon,
    "offsets reset": _offsets_reset,
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="icesink", description="Exactly-once Debezium CDC from Kafka into Iceberg."
    )
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the sink")
    run.add_argument(
        "--until-caught-up",
        action="store_true",
        help="exit 0 once everything in the topics at start-up is committed",
    )
    sub.add_parser("status", help="print the sink's state as JSON")
    check = sub.add_parser("check", help="validate the configuration and reach every server")
    check.add_argument(
        "--timeout",
        type=_positive_duration,
        default=timedelta(seconds=60),
        help="how long each server may take to answer its check (default 60s; jar downloads are not limited)",
    )
    orphans = sub.add_parser(
        "orphans",
        help="list data/delete files under the table's data location that no snapshot and no txnlog "
        "plan references (JSON); delete them with --delete",
    )
    orphans.add_argument("--delete", action="store_true", help="delete the orphans listed")
    orphans.add_argument(
        "--older-than",
        type=_duration,
        default=timedelta(hours=1),
        metavar="DURATION",
        help="only files older than this (default 1h): younger ones may belong to a batch in flight",
    )
    maintain = sub.add_parser(
        "maintain",
        help="keep the sink's tables healthy: compaction, snapshot expiry, manifest and orphan clean-up, "
        "each table under a maintenance lease in the txnlog; runs a pass every maintenance.interval",
    )
    maintain.add_argument(
        "--once",
        action="store_true",
        help="one pass running every task that has anything to do (all deletes applied), then exit",
    )
    txnlog = sub.add_parser("txnlog", help="operator commands on the sink's transaction log").add_subparsers(
        dest="txnlog_command", required=True
    )
    txnlog.add_parser(
        "reseed",
        help="when the table holds newer commits of the sink than the log (the log went back in time): "
        "record the table's last commit of the sink (seq, snapshot id, offsets) as the log's committed "
        "plan, so the sink resumes from the offsets the table covers; prints what was recorded (JSON)",
    )
    abandon = txnlog.add_parser(
        "abandon",
        help="drop a pending plan that can never be committed (its files are gone): the sink then reads "
        "the batch's records from Kafka again from the committed offsets; refused if the plan landed, "
        "and (exit 1) if none of its files is missing unless --force",
    )
    abandon.add_argument(
        "--force", action="store_true", help="drop the plan even though none of its files is missing"
    )
    offsets = sub.add_parser("offsets", help="move the sink's committed Kafka offsets").add_subparsers(
        dest="offsets_command", required=True
    )
    reset = offsets.add_parser(
        "reset",
        help="move committed offsets Kafka no longer holds (or those of --topic/--partition) to the "
        "earliest or latest offsets, recorded in the txnlog's history (JSON); fences a running sink",
    )
    reset.add_argument("--to", choices=("earliest", "latest"), required=True)
    reset.add_argument("--topic", help="reset this topic's partitions, whatever their state")
    reset.add_argument("--partition", type=int, help="only this partition of --topic")
    leaves = [
        *(sub.choices[n] for n in ("run", "status", "check", "orphans", "maintain")),
        *txnlog.choices.values(),
        reset,
    ]
    for leaf in leaves:
        leaf.add_argument("--config", "-c", required=True, help="the sink's YAML file")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"icesink: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    setup_logging(config.log)
    nested = (getattr(args, "txnlog_command", None), getattr(args, "offsets_command", None))
    command = " ".join(c for c in (args.command, *nested) if c)
    try:
        return COMMANDS[command](config, args)
    except ConfigError as exc:  # a command the configuration does not allow (reseed of many tables)
        print(f"icesink: {exc}", file=sys.stderr)
        return EXIT_CONFIG


if __name__ == "__main__":
    sys.exit(main())
