"""Committed offsets against what Kafka still holds, and ``icesink offsets reset``.

The txnlog's committed offsets are where the sink resumes. They stop meaning anything when
retention (or a delete-records call) removed records the sink had not read yet, or when the topic
was deleted and re-created under the same name: offsets start again at 0 in a topic with a new id.
Left alone, Spark's source fails the first case at every start (its data-loss check, a crash loop)
and reads the re-created topic from the old offsets, skipping its first records without a word.
The sink checks at start-up, stops with exit 2 naming each partition, and an operator moves on with
``icesink offsets reset``, which commits the new offsets as a plan without files: the txnlog's
history keeps it, with a note of what moved from where.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from service.channel.pending import BatchPlan
from service.config import KafkaConfig, SinkConfig
from service.kafka.source import SourceError, admin, consumer, partitions, topic_ids, watermarks
from service.model.offsets import Offsets
from service.operator import command_owner
from service.txnlog_client import open_txnlog
from txnlog import Phase, SinkState


@dataclass(frozen=True)
class Problem:
    """A committed offset Kafka no longer holds; ``partition`` is None when the whole topic is affected."""

    topic: str
    partition: int | None
    text: str

    def __str__(self) -> str:
        return self.text


class OffsetsGone(SourceError):
    """Committed offsets point at records Kafka no longer holds, or into a re-created topic."""

    def __init__(self, sink_id: str, problems: list[Problem]) -> None:
        self.problems = problems
        listed = "\n  ".join(str(p) for p in problems)
        super().__init__(
            f"sink {sink_id}: Kafka no longer holds what the committed offsets point at:\n  {listed}\n"
            "The sink stops rather than skip or re-read records unannounced. To move on: "
            "`icesink offsets reset --config <file> --to earliest` (read what is left; the missing "
            "records never reach the table) or `--to latest` (see docs/operations.md)."
        )


class ResetRefused(RuntimeError):
    """``icesink offsets reset`` can't run now; the message says why and what to do."""


def find_problems(
    kafka: KafkaConfig,
    parts: Mapping[str, list[int]],
    current_ids: Mapping[str, str],
    committed: BatchPlan | None,
) -> list[Problem]:
    """What in ``committed`` Kafka no longer holds, for the topics the sink reads.

    The end of a partition is taken as the log's end (read_uncommitted), not the last stable offset:
    an offset beyond the end is then beyond anything ever written, whatever the isolation level.
    Plans written before topic ids were recorded carry none; their topics are checked by offsets only.
    """
    if committed is None:
        return []
    problems: list[Problem] = []
    to_check: dict[str, dict[int, int]] = {}
    for topic, current in parts.items():
        offsets = committed.offsets.get(topic)
        if not offsets:
            continue
        old, new = committed.topic_ids.get(topic), current_ids.get(topic)
        gone = sorted(set(offsets) - set(current))
        if old is not None and new is not None and old != new:
            problems.append(recreated(topic, old, new, offsets))
        elif gone:
            problems.append(
                Problem(
                    topic,
                    None,
                    f"topic {topic}: partition(s) {gone} have committed offsets but no longer exist "
                    "(the topic was re-created with fewer partitions)",
                )
            )
        else:
            to_check[topic] = dict(offsets)
    if not to_check:
        return problems
    client = consumer(kafka, "check", isolation_level="read_uncommitted")
    try:
        marks = watermarks(client, {t: sorted(offsets) for t, offsets in to_check.items()})
    finally:
        client.close()
    for topic, offsets in to_check.items():
        for p, offset in sorted(offsets.items()):
            earliest, end = marks[(topic, p)]
            if offset < earliest:
                problems.append(
                    Problem(
                        topic,
                        p,
                        f"topic {topic} partition {p}: committed offset {offset}, earliest offset {earliest}: "
                        f"{earliest - offset} record(s) were deleted (retention or delete-records) before "
                        "the sink read them",
                    )
                )
            elif offset > end:
                problems.append(
                    Problem(
                        topic,
                        p,
                        f"topic {topic} partition {p}: committed offset {offset} is past the partition's "
                        f"end {end} (earliest offset {earliest}): the partition was truncated or the topic "
                        "re-created",
                    )
                )
    return problems


def recreated(topic: str, old_id: str, new_id: str, offsets: Mapping[int, int]) -> Problem:
    committed = json.dumps({str(p): o for p, o in sorted(offsets.items())})
    return Problem(
        topic,
        None,
        f"topic {topic} was deleted and re-created (topic id {old_id}, now {new_id}): its committed "
        f"offsets {committed} belong to the old topic",
    )


def check_committed(
    config: SinkConfig,
    parts: Mapping[str, list[int]],
    current_ids: Mapping[str, str],
    committed: BatchPlan | None,
) -> None:
    """Raise :class:`OffsetsGone` when Kafka no longer holds what ``committed`` points at."""
    problems = find_problems(config.kafka, parts, current_ids, committed)
    if problems:
        raise OffsetsGone(config.sink_id, problems)


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
    check_committed(config, parts, _topic_ids(config.kafka, parts), committed)
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
            problems = find_problems(kafka, parts, current_ids, committed)
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
