"""``icesink txnlog abandon``: drop a pending plan that can never be committed.

A batch's plan (its offsets, files and pre-generated snapshot id) is precommitted in the txnlog before
its snapshot goes to the catalog, and a restart finishes it with the same files, never re-reading
Kafka. When those files are gone (deleted by hand, by a bucket lifecycle rule, by an orphan clean-up
with too short a cut-off) the plan can never be committed: start-up stops with exit 2 and points here.

Abandoning is the log's ``abort`` under a claim of its own, so a replica still running is fenced
first. A plan whose snapshot is in the table is never abandoned: it landed, and starting the sink marks
it committed; dropping it would write its records twice. Nor is a plan none of whose files is missing
(it can still be committed: starting the sink does it) unless ``force`` is given. The txnlog's history keeps the claim and the
abort (with the dropped plan), both with this command as their owner.

What becomes of the batch's records: the sink resumes from the committed offsets, so they are read
from Kafka again and written anew. Only records Kafka no longer holds (retention) are lost; a
partition that was never committed is read from its earliest offset.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchTableError

from service.commit.committer import find_commit, missing_files
from service.commit.plan import BatchPlan
from service.config import SinkConfig
from service.iceberg.tables import open_catalog
from service.model.offsets import Offsets
from service.ops.common import command_owner
from service.txnlog_client import open_txnlog
from txnlog import Phase, SinkState


@dataclass(frozen=True)
class AbandonOutcome:
    report: str
    refused: bool = False  # a plan is pending but was not abandoned (it landed, or none of its files is gone)


def abandon(config: SinkConfig, force: bool = False) -> AbandonOutcome:
    """Abandon the sink's pending plan, unless it landed or (without ``force``) none of its files is
    missing; the report says what becomes of its records."""
    sink_id = config.sink_id
    log = open_txnlog(config, "abandon")
    try:
        state = log.state(sink_id)
        if state is None or state.pending is None:
            return AbandonOutcome(f"sink {sink_id}: no pending plan; nothing to abandon")
        catalog = open_catalog(config)
        if (landed := _landed(catalog, sink_id, state)) is not None:
            return AbandonOutcome(landed, refused=True)
        whole = BatchPlan.from_payload(state.pending)
        if not force and whole.has_files and not _missing_files(catalog, whole):
            return AbandonOutcome(
                f"sink {sink_id}: every file of the pending plan seq {state.seq} exists; it can still be "
                "committed (start the sink: its recovery commits it) and is not abandoned. Give --force to "
                "drop it anyway (its records are then read from Kafka again and written anew).",
                refused=True,
            )
        lease = log.claim(sink_id, command_owner("txnlog abandon"))  # fences a replica still running
        state = lease.state
        if state.phase is not Phase.PRECOMMIT or state.pending is None:
            return AbandonOutcome(f"sink {sink_id}: the plan was committed meanwhile; nothing abandoned")
        if (landed := _landed(catalog, sink_id, state)) is not None:
            return AbandonOutcome(landed, refused=True)
        pending = BatchPlan.from_payload(state.pending)
        missing = _missing_files(catalog, pending)
        log.abort(lease, seq=state.seq)
        return AbandonOutcome(_report(config, state, pending, missing))
    finally:
        log.close()


def _landed(catalog: Catalog, sink_id: str, state: SinkState) -> str | None:
    """Why the plan must not be abandoned (its snapshot is in the table), or None."""
    assert state.pending is not None
    for pending in BatchPlan.from_payload(state.pending).tables:
        if pending.snapshot_id is None:
            continue
        try:
            table = catalog.load_table(pending.table)
        except NoSuchTableError:
            continue
        found = find_commit(table, sink_id, pending.snapshot_id)
        if found is not None:
            return (
                f"sink {sink_id}: the pending plan seq {state.seq} landed in {pending.table} as snapshot "
                f"{pending.snapshot_id} ({found} shows it); it is not abandoned (its records would be "
                "written twice). Start the sink: its recovery marks the plan committed."
            )
    return None


def _missing_files(catalog: Catalog, plan: BatchPlan) -> list[str]:
    missing = []
    for pending in plan.tables:
        if not pending.has_files:
            continue
        try:
            missing += missing_files(catalog.load_table(pending.table).io, pending)
        except NoSuchTableError:
            missing += pending.file_paths()
    return missing


def _report(config: SinkConfig, state: SinkState, pending: BatchPlan, missing: list[str]) -> str:
    committed: Offsets = (
        BatchPlan.from_payload(state.committed_payload).offsets if state.committed_payload else {}
    )
    files = len(pending.file_paths())
    snapshots = (
        ", ".join(f"{t.table} snapshot {t.snapshot_id}" for t in pending.tables if t.has_files) or "no files"
    )
    lines = [
        f"sink {config.sink_id}: abandoned the pending plan seq {state.seq} ({snapshots}, "
        f"{files} file(s), {len(missing)} of them gone); nothing of it was committed.",
        f"Recorded in the txnlog's history: a claim (epoch {state.epoch}) and an abort holding the plan, "
        f"owner {command_owner('txnlog abandon')!r}; a replica still running was fenced.",
        "What becomes of the batch's records: the sink resumes from the committed offsets"
        + (f" (seq {state.committed_seq})" if state.committed_seq is not None else " (none yet)")
        + ", so they are read from Kafka again and written anew:",
    ]
    for topic, parts in sorted(pending.offsets.items()):
        for partition, end in sorted(parts.items()):
            start = committed.get(topic, {}).get(partition)
            where = f"  {topic}[{partition}]:"
            if start is not None:
                if start < end:
                    lines.append(f"{where} offsets {start}..{end - 1} are read and written again")
            else:
                lines.append(
                    f"{where} never committed: read again from the earliest offset Kafka holds, up to {end - 1}"
                )
    lines.append(
        "Records Kafka no longer holds (retention) can't be read again. Files of the plan that still "
        "exist are orphans now (`icesink orphans` lists them)."
    )
    return "\n".join(lines)
