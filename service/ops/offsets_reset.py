"""``icesink offsets reset``, and ``icesink check``'s line on the committed offsets.

The committed offsets stop meaning anything when Kafka no longer holds them
(:mod:`service.kafka.retention`); the sink stops with exit 2 and an operator moves on here, which
commits the new offsets as a plan without files: the txnlog's history keeps it, with a note of what
moved from where.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from service.commit.plan import BatchPlan
from service.config import KafkaConfig, SinkConfig
from service.kafka.lookups import admin, consumer, partitions, topic_ids, watermarks
from service.kafka.retention import check_committed, find_problems
from service.model.offsets import Offsets
from service.ops.common import command_owner
from service.txnlog_client import open_txnlog
from txnlog import Phase, SinkState


class ResetRefused(RuntimeError):
    """``icesink offsets reset`` can't run now; the message says why and what to do."""


def describe(config: SinkConfig) -> str:
    """``icesink check``'s line: where the sink would resume, or why it would not start."""
    log = open_txnlog(config, "offsets")
    try:
        state = log.state(config.sink_id)
    finally:
        log.close()
    if state is None or state.committed_payload is None:
        return f"none committed yet: the sink starts from the {config.kafka.starting_offsets} offsets"
    committed = BatchPlan.from_payload(state.committed_payload)
    parts = partitions(config.kafka)
    check_committed(
        config.sink_id,
        config.kafka,
        parts,
        _topic_ids(config.kafka, parts),
        committed.offsets,
        committed.topic_ids,
    )
    count = sum(len(committed.offsets.get(t, {})) for t in parts)
    return f"Kafka still holds the committed offsets of {count} partition(s)"


def _topic_ids(kafka: KafkaConfig, parts: Mapping[str, list[int]]) -> dict[str, str]:
    return topic_ids(admin(kafka), list(parts))


def _refuse_unless_resettable(config: SinkConfig, state: SinkState | None) -> None:
    if state is not None and state.phase is Phase.PRECOMMIT:
        raise ResetRefused(
            f"sink {config.sink_id} has a plan pending (seq {state.seq}): start the sink once, it "
            "finishes the plan before it checks the offsets; then reset"
        )
    if state is None or state.committed_payload is None:
        raise ResetRefused(
            f"sink {config.sink_id} has no committed offsets: nothing to reset "
            f"(it starts from the {config.kafka.starting_offsets} offsets)"
        )


def reset(
    config: SinkConfig,
    to: Literal["earliest", "latest"],
    topic: str | None = None,
    partition: int | None = None,
) -> dict[str, Any]:
    """Move committed offsets to the earliest or the latest offsets Kafka holds; returns what moved.

    Without ``topic`` only what :func:`find_problems` reports moves (a re-created topic as a whole,
    with its new id); with it, that topic's partitions (or the one ``partition``), whatever their
    state: moving a healthy partition back re-reads records (upsert converges, append duplicates).
    The new offsets are committed as a plan without files by a new epoch of the sink, which fences
    any replica still running, so run it with the sink stopped.
    """
    kafka = config.kafka
    parts = partitions(kafka)
    current_ids = _topic_ids(kafka, parts)
    if topic is not None and topic not in parts:
        raise ResetRefused(f"topic {topic} is not one of kafka.topics {sorted(parts)}")
    if partition is not None and (topic is None or partition not in parts[topic]):
        raise ResetRefused(f"topic {topic} has no partition {partition} (it has {parts.get(topic or '')})")
    log = open_txnlog(config, "offsets")
    try:
        _refuse_unless_resettable(config, log.state(config.sink_id))
        lease = log.claim(config.sink_id, command_owner("offsets reset"))
        _refuse_unless_resettable(config, lease.state)  # a replica may have precommitted meanwhile
        assert lease.state.committed_payload is not None
        committed = BatchPlan.from_payload(lease.state.committed_payload)
        if topic is not None:
            whole = set() if partition is not None else {topic}
            chosen = {topic: [partition] if partition is not None else list(parts[topic])}
        else:
            problems = find_problems(kafka, parts, current_ids, committed.offsets, committed.topic_ids)
            whole = {p.topic for p in problems if p.partition is None}
            chosen = {t: list(parts[t]) for t in whole}
            for problem in problems:
                if problem.partition is not None and problem.topic not in whole:
                    chosen.setdefault(problem.topic, []).append(problem.partition)
        result: dict[str, Any] = {"sink_id": config.sink_id, "to": to, "moved": []}
        if not chosen:
            result["note"] = "nothing to reset: Kafka holds every committed offset"
            return result
        client = consumer(kafka, "reset")
        try:
            marks = watermarks(client, chosen)
        finally:
            client.close()
        offsets: Offsets = {t: dict(ps) for t, ps in committed.offsets.items()}
        for t in whole:  # a re-created topic: offsets of partitions it no longer has mean nothing
            offsets[t] = {p: o for p, o in offsets.get(t, {}).items() if p in parts[t]}
        moved = []
        for (t, p), (earliest, end) in sorted(marks.items()):
            target = earliest if to == "earliest" else end
            moved.append({"topic": t, "partition": p, "from": offsets.get(t, {}).get(p), "to": target})
            offsets.setdefault(t, {})[p] = target
        ids = dict(committed.topic_ids)
        ids.update({t: current_ids[t] for t in parts if t in whole or t not in ids})
        plan = committed.moved(
            offsets,
            ids,
            f"offsets reset to {to} by icesink offsets reset: "
            + ", ".join(f"{m['topic']}/{m['partition']} {m['from']} -> {m['to']}" for m in moved),
        )
        seq = log.precommit(lease, plan.to_payload()).seq
        log.commit(lease, seq=seq)
        result.update(seq=seq, epoch=lease.epoch, moved=moved, note=plan.note)
        return result
    finally:
        log.close()
